"""Correctness first: load the teacher, save it as an HF folder for the evaluations, and check that hyla's
teacher-equivalent HypeNet (every layer attention with RoPE, SPEC §1) reproduces its logits.

    python bench/smollm2/teacher_check.py TEACHER OUT_FOLDER DEVICE

Writes OUT_FOLDER (model + tokenizer) and OUT_FOLDER/../teacher-check.json; exits 1 when the HypeNet's logits, or
those of the saved folder reloaded, differ from the teacher's by more than 1e-3 relative to their scale (float32,
TF32 off), or the saved tokenizer differs."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch

from hyla.convert.teacher import load_teacher, teacher_fingerprint
from hyla.convert.transfer import to_hypenet
from hyla.outputs import write_json


def save_plain(model, folder: Path) -> None:
    """Save a model loaded from GGUF (de-quantized, but flagged as quantized) as a plain float HF folder."""
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


def main() -> int:
    spec, out, device = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, tokenizer = load_teacher(spec, dtype="float32", device=device)
    student = to_hypenet(model, attention_rope=True).to(device).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 1024), generator=generator).to(device)
    with torch.no_grad():
        expected = model(ids).logits.float()
        got = student(ids, use_cache=False).logits.float()
    scale = expected.abs().max().item()
    diff = (got - expected).abs().max().item()
    ok = diff <= 1e-3 * scale
    if not (out / "config.json").exists():
        tmp = out.with_name(out.name + ".tmp")
        save_plain(model, tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(out)
    from hyla.evals.loading import load_model

    saved, saved_tokenizer = load_model(str(out), dtype="float32", device=device)
    with torch.no_grad():
        saved_diff = (saved(ids).logits.float() - expected).abs().max().item()
    same_tokens = saved_tokenizer("The grass is green.").input_ids == tokenizer("The grass is green.").input_ids
    ok = ok and saved_diff <= 1e-3 * scale and same_tokens and saved_tokenizer.eos_token_id == tokenizer.eos_token_id
    report = {"teacher": spec, "max_abs_logit_diff": diff, "logit_scale": scale, "relative": diff / scale,
              "saved_folder_max_abs_logit_diff": saved_diff, "saved_tokenizer_matches": same_tokens,
              "tolerance_relative": 1e-3, "passed": ok, "fingerprint": teacher_fingerprint(model),
              "tokens": list(ids.shape), "device": device}
    write_json(out.parent / "teacher-check.json", report)
    print(json.dumps({k: report[k] for k in ("max_abs_logit_diff", "relative", "passed")}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
