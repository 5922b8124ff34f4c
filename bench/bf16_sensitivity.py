"""How far a random-weight HypeNet-2B-wide model moves under bf16, and how far the inference engine moves from it.

CPU, pure torch: the first 8 layers of HypeNet-2B (7 attention layers at [2, 3, 6] among them), vocab cut to 4096,
130 tokens; prefill 100 in chunks of 34, then 30 decode steps. Run: `python bench/bf16_sensitivity.py`.
"""

import copy

import torch

from hyla.bench import shapes
from hyla.bench.model import build_hypenet
from hyla.bench.timing import relative_error
from hyla.inference import InferenceEngine


def engine_logits(model, ids):
    engine = InferenceEngine(model, batch_size=1, max_length=140, prefill_chunk=34)
    logits = [engine.prefill(ids[:, :100]).float()]
    logits += [engine.decode(ids[:, t : t + 1]).float() for t in range(100, 130)]
    return torch.stack(logits, 1)


def main():
    config = shapes.hypenet_config()
    config.num_hidden_layers, config.layer_types, config.vocab_size = 8, config.layer_types[:8], 4096
    fp32 = build_hypenet(config, device="cpu", dtype=torch.float32)
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    ids = torch.randint(0, 4096, (1, 130), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = fp32(ids, use_cache=False).logits[:, 99:].float()
        own_bf16 = bf16(ids, use_cache=False).logits[:, 99:].float()
    print(f"model bf16 forward vs model fp32 forward: {relative_error(own_bf16, reference):.3e}")
    print(f"engine bf16 vs model fp32 forward:        {relative_error(engine_logits(bf16, ids), reference):.3e}")
    print(f"engine bf16 vs model bf16 forward:        {relative_error(engine_logits(bf16, ids), own_bf16):.3e}")
    print(f"engine fp32 vs model fp32 forward:        {relative_error(engine_logits(fp32, ids), reference):.3e}")


if __name__ == "__main__":
    main()
