"""The analysis on CUDA gives the CPU's statistics."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from hyla.analysis.heads import measure_probe
from hyla.analysis.probes import niah_probes
from hyla.ops.dispatch import use_backend

# Same reference ops on both devices, float32, different matmul kernels and summation orders: ~1e-6 relative in q·k,
# ~1e-5 in α~; 1e-4 on entropies in [0, 1] is well above that and far below a wrong position or head (≥ 1e-2).
REFERENCE_ATOL = 1e-4
# With the fla kernels, Lightning layers run their float32 matmuls in TF32 (~1.5e-3 relative, docs/method.md, "Kernel
# notes"), which reaches the q/k of every later layer: a few 1e-3 in entropy; 2e-2 still catches a wrong position or
# head.
FLA_ATOL = 2e-2


def statistics_on_both_devices(tiny_model_folder, tokenizer, backend: str):
    probe = niah_probes(tokenizer, task="SK1", length=1024, num_samples=1)[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_folder).eval()
    on_cpu = measure_probe(model, probe, num_query_positions=64, top_k=16)
    with use_backend(backend):
        on_cuda = measure_probe(model.cuda(), probe, num_query_positions=64, top_k=16)
    return on_cpu, on_cuda


@pytest.mark.gpu
@pytest.mark.parametrize("backend, atol", [("torch", REFERENCE_ATOL), ("auto", FLA_ATOL)])
def test_cuda_statistics_equal_cpu(tiny_model_folder, tokenizer, backend, atol):
    on_cpu, on_cuda = statistics_on_both_devices(tiny_model_folder, tokenizer, backend)
    for cpu_layer, cuda_layer in zip(on_cpu, on_cuda):
        torch.testing.assert_close(cuda_layer.entropy, cpu_layer.entropy, atol=atol, rtol=0)
        torch.testing.assert_close(cuda_layer.answer_entropy, cpu_layer.answer_entropy, atol=atol, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("mixer", ["gla", "gdn"])
@pytest.mark.parametrize("backend, atol", [("torch", REFERENCE_ATOL), ("auto", FLA_ATOL)])
@pytest.mark.parametrize("eme", [False, True], ids=["as-saved", "eme"])
def test_gla_and_gdn_hybrids_cuda_statistics_equal_cpu(make_tiny_config, tokenizer, mixer, backend, atol, eme):
    """The gated (GLA) and delta (GDN) forms from the q/k/gates the layers produce on CUDA (fla's chunk kernels in
    the forward with `auto`), plain and under EME (SWLA windows well below the prompt, c(L) > 1), against the CPU."""
    from hyla import HypeNetForCausalLM
    from hyla.layers.context import InferenceOptions

    torch.manual_seed(0)
    model = HypeNetForCausalLM(make_tiny_config(layer_types=[mixer] * 3 + ["attention"])).eval()
    if eme:
        model.inference_options = InferenceOptions(eme_window=128, eme_stride=32, logit_scaling="per_length",
                                                   logit_scaling_train_length=256)
    probe = niah_probes(tokenizer, task="SK1", length=1024, num_samples=1)[0]
    on_cpu = measure_probe(model, probe, num_query_positions=64, top_k=16)
    with use_backend(backend):
        on_cuda = measure_probe(model.cuda(), probe, num_query_positions=64, top_k=16)
    for cpu_layer, cuda_layer in zip(on_cpu, on_cuda):
        assert cuda_layer.layer_type == cpu_layer.layer_type
        torch.testing.assert_close(cuda_layer.entropy, cpu_layer.entropy, atol=atol, rtol=0)
        torch.testing.assert_close(cuda_layer.answer_entropy, cpu_layer.answer_entropy, atol=atol, rtol=0)
        # near-tied keys at the edge of the top 16 may swap: at most one of the needle's tokens in or out
        torch.testing.assert_close(cuda_layer.hit_rate, cpu_layer.hit_rate, atol=1 / len(probe.needle_positions) + 1e-6,
                                   rtol=0)
