"""Correctness first: load a teacher, save it as a plain HF folder for the evaluations, and check that hyla's
teacher-equivalent HypeNet (every layer softmax attention with RoPE; docs/method.md, "Weight transfer") reproduces
its logits, and that the saved folder reloads to the same logits and tokenizer."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from hyla.outputs import write_json

# float32 with TF32 off: the two forwards differ only by summation order.
TOLERANCE_RELATIVE = 1e-3


def save_plain(model, folder: Path) -> None:
    """Save a model loaded from GGUF (de-quantized, but flagged as quantized) as a plain float HF folder."""
    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    if unexpected or any(name != "lm_head.weight" for name in missing):
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    plain.save_pretrained(folder)


def check_teacher(spec: str, out: Path, *, device: str = "cpu", seq_len: int = 1024,
                  report: Path | None = None) -> dict[str, Any]:
    """Write `out` (model + tokenizer, unless it holds them already) and the check's report (default
    `out/teacher-check.json`); the report's `passed` says whether every comparison is within TOLERANCE_RELATIVE of
    the logits' scale."""
    import torch

    from hyla.models.loading import load_model, load_teacher, teacher_fingerprint
    from hyla.models.transfer import to_hypenet

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, tokenizer = load_teacher(spec, dtype="float32", device=device)
    student = to_hypenet(model, attention_rope=True).to(device).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, seq_len), generator=generator).to(device)
    with torch.no_grad():
        expected = model(ids).logits.float()
        got = student(ids, use_cache=False).logits.float()
    scale = expected.abs().max().item()
    diff = (got - expected).abs().max().item()
    if not (out / "config.json").exists():
        staging = out.with_name(out.name + ".tmp")
        save_plain(model, staging)
        tokenizer.save_pretrained(staging)
        staging.rename(out)
    saved, saved_tokenizer = load_model(str(out), dtype="float32", device=device)
    with torch.no_grad():
        saved_diff = (saved(ids).logits.float() - expected).abs().max().item()
    probe = "The grass is green."
    same_tokens = saved_tokenizer(probe).input_ids == tokenizer(probe).input_ids
    passed = (diff <= TOLERANCE_RELATIVE * scale and saved_diff <= TOLERANCE_RELATIVE * scale and same_tokens
              and saved_tokenizer.eos_token_id == tokenizer.eos_token_id)
    result = {"teacher": spec, "max_abs_logit_diff": diff, "logit_scale": scale, "relative": diff / scale,
              "saved_folder_max_abs_logit_diff": saved_diff, "saved_tokenizer_matches": same_tokens,
              "tolerance_relative": TOLERANCE_RELATIVE, "passed": passed, "fingerprint": teacher_fingerprint(model),
              "tokens": list(ids.shape), "device": device, "folder": str(out)}
    write_json(report or out / "teacher-check.json", result)
    return result
