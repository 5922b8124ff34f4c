"""Memory traffic of the engine's eager prefill outside its matrix products and mixing kernels, per layer kind, for
the HypeNet-2B and Qwen3-1.7B shapes: what the elementwise work (norms, RoPE, casts, gates, activations, residuals)
must move, and so the least time it can take at the copy bandwidth. Run: `python bench/prefill_bytes.py`.

Each operation dispatched while a chunk of T tokens passes one block (`InferenceEngine._prefill_chunk` on a model of
that single block, at full width, bfloat16, CPU) is recorded with the bytes of its tensor inputs and outputs. Matrix
products (the floor counts their FLOPs) and the mixing kernels themselves (Lightning, chunked attention; fused
kernels on the GPU) are left out. Per-token work scales with T, so the bytes are scaled from T to a 64K chunk and
summed over the layers of each shape. Eager PyTorch runs each operation as its own kernel, which reads its inputs and
writes its output through memory: bytes / 4.22 TB/s is a lower bound on that work's time on the H200, not a
measurement.
"""

from __future__ import annotations

import argparse
from collections import Counter

import decode_op_count
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hyla.bench import shapes
from hyla.bench.floors import COPY_BANDWIDTH
from hyla.bench.model import build_hypenet
from hyla.inference import InferenceEngine

# decode_op_count's metadata-only operations (views: no traffic).
VIEWS = decode_op_count.VIEWS
MATMULS = {"mm", "addmm", "bmm", "matmul", "linear", "baddbmm", "embedding"}


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class Traffic(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.paused = False
        self.bytes, self.ops = Counter(), Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not self.paused and name not in VIEWS and name not in MATMULS:
            self.bytes[name] += _nbytes(args) + _nbytes(list((kwargs or {}).values())) + _nbytes(out)
            self.ops[name] += 1
        return out


def block_traffic(config, layer_type: str, tokens: int) -> tuple[int, int, Counter]:
    """(bytes, operations, bytes by operation) of one `layer_type` block passing a chunk of `tokens` tokens."""
    config.num_hidden_layers, config.layer_types = 1, [layer_type]
    engine = InferenceEngine(build_hypenet(config, device="cpu", dtype=torch.bfloat16), batch_size=1,
                             max_length=2 * tokens, prefill_chunk=tokens)
    engine.prefill(torch.randint(0, config.vocab_size, (1, tokens)))  # the chunk after `tokens` cached positions
    traffic = Traffic()
    for name in ("_lightning_mix", "_attention_mix"):  # the mixing kernels: not counted
        mix = getattr(engine, name)

        def paused(*args, _mix=mix, **kwargs):
            traffic.paused = True
            try:
                return _mix(*args, **kwargs)
            finally:
                traffic.paused = False

        setattr(engine, name, paused)
    ids = torch.randint(0, config.vocab_size, (1, tokens))
    # The chunk's RoPE tables (once per chunk, [T, D]) are counted with the block: small beside its [T, width] work.
    with torch.no_grad(), traffic:
        engine._prefill_chunk(slice(0, 1), ids, tokens)
    return sum(traffic.bytes.values()), sum(traffic.ops.values()), traffic.bytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256, help="chunk length measured on CPU (default 256)")
    parser.add_argument("--chunk", type=int, default=65536, help="chunk length the bytes are scaled to (64K)")
    parser.add_argument("--context", type=int, default=524288, help="prefill length for the totals (512K)")
    args = parser.parse_args()
    scale = args.chunk / args.tokens
    print(f"eager prefill traffic outside matrix products and mixing kernels, bf16, scaled from {args.tokens} to "
          f"{args.chunk}-token chunks; lower bound at {COPY_BANDWIDTH / 1e12:.2f} TB/s\n")
    print(f"{'shape':13s} {'layer':15s} {'layers':>6s} {'ops/block':>9s} {'GB/chunk/block':>14s} "
          f"{'s at {0}K'.format(args.context // 1024):>9s}  largest operations")
    for name, config_fn in (("hypenet", shapes.hypenet_config), ("qwen3-engine", shapes.qwen3_engine_config)):
        kinds = Counter(config_fn().layer_types)
        total = 0.0
        for kind, layers in kinds.items():
            nbytes, ops, by_op = block_traffic(config_fn(), kind, args.tokens)
            per_chunk = nbytes * scale
            seconds = per_chunk * layers * (args.context / args.chunk) / COPY_BANDWIDTH
            total += seconds
            top = ", ".join(f"{op} {b * scale / 1e9:.2f}" for op, b in by_op.most_common(4))
            print(f"{name:13s} {kind:15s} {layers:6d} {ops:9d} {per_chunk / 1e9:14.2f} {seconds:9.2f}  {top}")
        print(f"{name:13s} {'all blocks':15s} {'':6s} {'':9s} {'':14s} {total:9.2f}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
