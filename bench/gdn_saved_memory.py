"""What GDN's chunked form keeps for its backward, per token and layer, plain and as the GPU fallback runs it
(checkpointed), measured on the CPU with autograd's saved-tensor hooks (distinct storages, bf16 inputs).

    python bench/gdn_saved_memory.py [--batch 2] [--length 4096] [--heads 9] [--layers 23] [--tokens 65536]

Prints the bytes a token and layer and what `--layers` layers keep at `--tokens` tokens a step (default: the
SmolLM2-135M GDN hybrid's 23 GDN layers at 16 x 4,096).
"""

from __future__ import annotations

import argparse
import warnings

import torch
import torch.nn.functional as F

from hyla.bench.timing import saved_tensor_bytes
from hyla.ops.gdn import gpu
from hyla.ops.gdn.reference import gdn_chunked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=23)
    parser.add_argument("--tokens", type=int, default=16 * 4096)
    args = parser.parse_args()
    shape = (args.batch, args.length, args.heads)
    generator = torch.Generator().manual_seed(0)
    q, k = (F.normalize(torch.randn(*shape, args.dim, generator=generator), dim=-1).bfloat16().requires_grad_()
            for _ in range(2))
    v = torch.randn(*shape, args.dim, generator=generator).bfloat16().requires_grad_()
    g = F.logsigmoid(torch.randn(*shape, generator=generator)).bfloat16().requires_grad_()
    beta = torch.rand(*shape, generator=generator).bfloat16().requires_grad_()
    tokens = args.batch * args.length
    print(f"B={args.batch} T={args.length} H={args.heads} K=V={args.dim}, bf16 inputs; "
          f"{args.layers} layers at {args.tokens} tokens a step")
    # gdn_fla's fallback, called directly: fla is not needed on the CPU.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, form in (("gdn_chunked", gdn_chunked), ("gdn_chunked_eager (fallback)", gpu.gdn_chunked_eager)):
            per_token = saved_tensor_bytes(lambda: form(q, k, v, g=g, beta=beta))[0] / tokens
            print(f"{name}: {per_token / 1024:.1f} KiB a token and layer, "
                  f"{per_token * args.layers * args.tokens / 2**30:.1f} GiB for the step")


if __name__ == "__main__":
    main()
