"""How far bf16 rounding alone puts the converted SmolLM2-135M shape's last-position logits from float32, on a CPU:
the model's own forward (torch ops, no engine) in bf16 against the same random weights in float32, over random
tokens. The bar `tests/inference/test_generate_gpu.py` holds the engine's bf16 prefill to is relative to this.

    python bench/bf16_logits_error_cpu.py --lengths 2048,8190   # ~1 minute on 2 cores
"""

from __future__ import annotations

import argparse
import time

import torch

from hyla import HypeNetForCausalLM
from hyla.bench.shapes import converted_135m_config
from hyla.ops.dispatch import use_backend


def relative_errors(lengths: list[int], seed: int = 7) -> list[dict]:
    torch.manual_seed(0)
    reference = HypeNetForCausalLM(converted_135m_config()).float().eval()
    bf16 = HypeNetForCausalLM(converted_135m_config()).eval()
    bf16.load_state_dict(reference.state_dict())
    bf16 = bf16.bfloat16()
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for length in lengths:
        ids = torch.randint(3, reference.config.vocab_size, (1, length), generator=generator)
        started = time.perf_counter()
        with torch.no_grad(), use_backend("torch"):
            want = reference(ids).logits[:, -1].float()
            got = bf16(ids).logits[:, -1].float()
        rows.append({"length": length, "relative_error": ((got - want).norm() / want.norm()).item(),
                     "seconds": time.perf_counter() - started})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="2048,8190", help="comma list of prompt lengths")
    args = parser.parse_args(argv)
    try:
        lengths = [int(n) for n in args.lengths.split(",")]
    except ValueError:
        parser.error(f"--lengths: expected a comma list of token counts, got {args.lengths!r}")
    if min(lengths) < 1:
        parser.error(f"--lengths: each length must be >= 1, got {args.lengths!r}")
    for row in relative_errors(lengths):
        print(f"{row['length']:>6} tokens: bf16 vs float32 last-position logits, relative error "
              f"{row['relative_error']:.4f} ({row['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
