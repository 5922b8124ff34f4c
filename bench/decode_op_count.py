"""Operations (each one kernel launch on CUDA) in one eager decode step of the engine, for the HypeNet-2B and Qwen3-1.7B
layer patterns. Widths do not change the count, so toy widths on CPU suffice. Run: `python bench/decode_op_count.py`.
"""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hyla.bench import shapes
from hyla.bench.model import build_hypenet
from hyla.inference import InferenceEngine

# Metadata-only operations launch no kernel (splits return views too).
VIEWS = {"view", "_unsafe_view", "expand", "transpose", "slice", "select", "unsqueeze", "t", "detach", "alias",
         "squeeze", "permute", "_reshape_alias", "as_strided", "split", "split_with_sizes", "unbind", "chunk"}


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in VIEWS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def main():
    for name, full in (("hypenet", shapes.hypenet_config()), ("qwen3-engine", shapes.qwen3_engine_config())):
        toy = shapes.hypenet_config(toy=True) if name == "hypenet" else shapes.qwen3_engine_config(toy=True)
        toy.num_hidden_layers, toy.layer_types = full.num_hidden_layers, full.layer_types
        engine = InferenceEngine(build_hypenet(toy, device="cpu", dtype=torch.bfloat16), batch_size=1, max_length=64)
        engine.prefill(torch.randint(0, toy.vocab_size, (1, 20)))
        counter = CountOps()
        with torch.no_grad(), counter:
            engine.decode()
        print(f"{name}: {counter.count} non-view operations per eager decode step")


if __name__ == "__main__":
    main()
