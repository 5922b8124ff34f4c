"""Kernels that inductor generates for each compiled function of the engine's decode step, on CPU (C++ kernels,
`cpp_fused_*`, and calls into external kernels such as matrix products), for a toy HypeNet with fused projections.
CPU fusion is not GPU fusion, but a kernel boundary between compiled functions is one on both: this shows how the
step's functions split the work. Run: `python bench/decode_kernel_count.py`."""

import re

import torch
import torch._inductor.config
import torch._inductor.graph as inductor_graph

from hyla.bench import shapes
from hyla.bench.model import build_hypenet
from hyla.inference import InferenceEngine


def main():
    graphs = []
    compile_to_module = inductor_graph.GraphLowering.compile_to_module

    def counting(self, *args, **kwargs):
        module = compile_to_module(self, *args, **kwargs)
        source = open(module.__file__).read()
        body = source[source.index("def call("):]
        graphs.append((len(re.findall(r"^\s+cpp_fused_\w+\(", body, re.M)),
                       len(re.findall(r"extern_kernels\.\w+\(", body))))
        return module

    inductor_graph.GraphLowering.compile_to_module = counting
    torch._inductor.config.force_disable_caches = True  # a cached graph would not be generated, so not counted
    config = shapes.hypenet_config(toy=True)
    engine = InferenceEngine(build_hypenet(config, device="cpu", dtype=torch.float32), batch_size=1, max_length=64,
                             compile_decode=True, decode_step="fused-projections")
    engine.prefill(torch.randint(0, config.vocab_size, (1, 20)))
    engine.decode()
    print(f"layers: {config.layer_types}")
    print("compiled graphs in the order first called (generated kernels, external calls):")
    for kernels, extern in graphs:
        print(f"  {kernels} generated, {extern} external")


if __name__ == "__main__":
    main()
