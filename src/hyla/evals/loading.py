"""Resolve a model spec (HF folder, hub id, GGUF file, or teacher alias) to (model, tokenizer) for evaluation.

Specs are resolved by `hyla.convert.teacher.resolve_teacher`, so evaluations accept exactly the teacher specs that
conversion does. GGUF files and aliases load through `load_teacher`; a folder or hub id loads with
`AutoModelForCausalLM`, so any causal LM (a hybrid student included) is evaluated the same way, not only the
teacher families that conversion supports.
"""

from __future__ import annotations

from typing import Any


def load_model(spec: str, *, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """Load the model of `spec` in eval mode on `device` with parameters in `dtype`, and its tokenizer.

    Raises FileNotFoundError or ValueError with one line for a spec that does not resolve or does not load.
    """
    import torch

    from hyla.convert.teacher import load_teacher, resolve_teacher

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r} (use float32, bfloat16 or float16)")
    source = resolve_teacher(spec)
    try:
        if source.gguf_file:
            model, tokenizer = load_teacher(spec, dtype=dtype, device=device)
        else:
            model, tokenizer = _load_any_causal_lm(source.location, torch_dtype)
    except OSError as err:
        # transformers reports a missing or unreadable model as OSError with a multi-line hint; one line is enough.
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FileNotFoundError(f"cannot load model {spec}: {first_line}") from err
    return model.to(device).eval(), tokenizer


def _load_any_causal_lm(location: str, torch_dtype: Any) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hyla.models.hf import register

    # Makes hyla's own model folders (model_type "hypenet") loadable by the Auto classes.
    register()
    model = AutoModelForCausalLM.from_pretrained(location, dtype=torch_dtype)
    return model, AutoTokenizer.from_pretrained(location)
