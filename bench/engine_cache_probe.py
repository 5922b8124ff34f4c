"""What the engine's compilation costs a fresh process, on any device: does an engine compiled as the scaling stage
runs it (the trained student cast to bfloat16, the candidate's a given as an InferenceOptions) leave torch.compile's
on-disk cache warm for the engine as `hyla eval niah` runs it (the exported folder loaded in bfloat16, a from its
config)? And what do a second engine and a second candidate's a cost inside one process?

    python bench/engine_cache_probe.py [--device cuda] [--cache DIR]

Prints one line per process: seconds of its first generation and inductor's FX-graph cache hits and misses, then,
in one process, the new graphs of a second engine (same a) and of another a. On a 2-core CPU (2026-12-02): scaling-like
32.6 s and 9 misses, eval-like 4.6 s and 9 hits; a second engine 0 new graphs, another a 2 (attention's prefill and
decode inputs: a is a constant of the compiled code).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

LAYER_TYPES = ["lightning", "attention", "lightning", "attention"]


def _model(device: str):
    from hyla import HypeNetConfig, HypeNetForCausalLM

    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32, layer_types=LAYER_TYPES,
                           lightning_qk_norm=True, lightning_rope=True)
    return HypeNetForCausalLM(config).float().eval().to(device)


def _generate(model, device: str) -> float:
    from hyla.inference.generate import GenerationSession
    from hyla.inference.settings import EngineSettings, tuned_settings

    settings = (tuned_settings(device) if device.startswith("cuda")
                else EngineSettings(decode_step="fused-projections", compile_prefill=True, compile_decode=True))
    ids = torch.randint(0, 512, (1, 200), generator=torch.Generator().manual_seed(1))
    started = time.perf_counter()
    GenerationSession(model, settings=settings).generate(ids, max_new_tokens=4)
    return time.perf_counter() - started


def one_process(mode: str, folder: Path, device: str) -> dict:
    from torch._dynamo.utils import counters

    from hyla import InferenceOptions

    if mode == "scaling":
        model = _model(device)
        model.config.attention_logit_scaling_a = 10000.0
        model.save_pretrained(folder)
        model.config.attention_logit_scaling_a = None
        model.to(torch.bfloat16)
        model.inference_options = InferenceOptions(logit_scaling_a=10000.0)
    else:
        from transformers import AutoModelForCausalLM

        from hyla.models.hf import register

        register()
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval().to(device)
    seconds = _generate(model, device)
    result = {"process": mode, "first_generation_s": round(seconds, 1),
              **{name: counters["inductor"].get(name, 0) for name in ("fxgraph_cache_hit", "fxgraph_cache_miss")}}
    if mode == "eval":
        graphs = counters["stats"]
        before = graphs["unique_graphs"]
        _generate(model, device)
        second = graphs["unique_graphs"] - before
        model.inference_options = InferenceOptions(logit_scaling_a=5000.0)
        _generate(model, device)
        result.update(new_graphs_second_engine=second, new_graphs_other_a=graphs["unique_graphs"] - before - second)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache", type=Path, default=None, help="TORCHINDUCTOR_CACHE_DIR (default: a new folder)")
    parser.add_argument("--process", choices=["scaling", "eval"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.process is not None:
        print(json.dumps(one_process(args.process, args.folder, args.device)))
        return
    import os

    work = Path(tempfile.mkdtemp(prefix="engine-cache-probe-"))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(args.cache or work / "inductor")}
    for mode in ("scaling", "eval"):
        done = subprocess.run([sys.executable, __file__, "--process", mode, "--folder", str(work / "model"),
                               "--device", args.device], env=env, capture_output=True, text=True, check=True)
        print(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
