"""Correctness first: load the teacher, save it as an HF folder for the evaluations, and check that hyla's
teacher-equivalent HypeNet (every layer attention with RoPE, SPEC §1) reproduces its logits.

    python bench/smollm2/teacher_check.py TEACHER OUT_FOLDER DEVICE

Writes OUT_FOLDER (model + tokenizer) and OUT_FOLDER/../teacher-check.json; exits 1 when the logits differ by more
than 1e-3 relative to their scale (float32, TF32 off)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from hyla.convert.teacher import load_teacher, teacher_fingerprint
from hyla.convert.transfer import to_hypenet


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
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(out)
    report = {"teacher": spec, "max_abs_logit_diff": diff, "logit_scale": scale, "relative": diff / scale,
              "tolerance_relative": 1e-3, "passed": ok, "fingerprint": teacher_fingerprint(model),
              "tokens": list(ids.shape), "device": device}
    (out.parent / "teacher-check.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("max_abs_logit_diff", "relative", "passed")}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
