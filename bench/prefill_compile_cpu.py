"""What the engine's compiled prefill costs a process on its first call, on a CPU: the converted SmolLM2-135M shape
(random bf16 weights), the engine's build, one prompt, three prefills, and torch.compile's own account of the first
(`torch._dynamo.utils.compile_times`). Run it twice: the second run reads inductor's cache the first one filled, as
every process after the first on a machine does.

    python bench/prefill_compile_cpu.py [--length 1024] [--eager]

A stand-in for the GPU's first-prefill cost (the GPU loads Triton kernels where the CPU loads C++ ones, and has
cuDNN's and fla's first calls besides): `bench/engine_first_call.py` measures that on the GPU.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--eager", action="store_true", help="the prefill uncompiled")
    args = parser.parse_args()

    from torch._dynamo.utils import compile_times

    from hyla.bench import shapes
    from hyla.bench.model import build_hypenet
    from hyla.inference.engine import InferenceEngine

    torch.manual_seed(0)
    config = shapes.converted_135m_config(toy=False, rnn_mixer="lightning")
    model = build_hypenet(config, device=torch.device("cpu"), dtype=torch.bfloat16)
    started = time.perf_counter()
    engine = InferenceEngine(model, batch_size=1, max_length=args.length + 8, compile_prefill=not args.eager,
                             prefill_chunk=65536)
    print(f"engine build: {time.perf_counter() - started:.2f} s", flush=True)
    ids = torch.randint(2, config.vocab_size, (1, args.length))
    for index in range(3):
        engine.reset()
        started = time.perf_counter()
        engine.prefill(ids)
        print(f"prefill {index}: {time.perf_counter() - started:.2f} s", flush=True)
    if not args.eager:
        print(compile_times(repr="str", aggregate=True))


if __name__ == "__main__":
    main()
