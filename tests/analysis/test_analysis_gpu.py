"""The analysis on CUDA (where Lightning layers run fla kernels) gives the CPU's statistics."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from hyla.analysis.heads import measure_probe
from hyla.analysis.probes import niah_probes

# float32 on both devices, different matmul kernels and summation orders: ~1e-6 relative in q·k, amplified by
# the softmax of logits of size ~10 to ~1e-5 in α~; 1e-4 on entropies in [0, 1] is well above that and far below
# a wrong position or head (≥ 1e-2).
ATOL = 1e-4


@pytest.mark.gpu
def test_cuda_statistics_equal_cpu(tiny_model_folder, tokenizer):
    probe = niah_probes(tokenizer, task="SK1", length=1024, num_samples=1)[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_folder).eval()
    on_cpu = measure_probe(model, probe, num_query_positions=64, top_k=16)
    on_cuda = measure_probe(model.cuda(), probe, num_query_positions=64, top_k=16)
    for cpu_layer, cuda_layer in zip(on_cpu, on_cuda):
        torch.testing.assert_close(cuda_layer.entropy, cpu_layer.entropy, atol=ATOL, rtol=0)
        torch.testing.assert_close(cuda_layer.answer_entropy, cpu_layer.answer_entropy, atol=ATOL, rtol=0)
