"""HypeNet on CUDA: the fla/SDPA path against the reference path, and generation on GPU."""

import pytest
import torch

from hyla import HypeNetConfig, HypeNetForCausalLM
from hyla.ops.dispatch import use_backend

pytestmark = pytest.mark.gpu


def model(dtype):
    torch.manual_seed(0)
    config = HypeNetConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, layer_types=["lightning", "attention", "lightning", "lightning"],
        attention_logit_scaling_a=500.0, attention_output_gate=True,
    )
    return HypeNetForCausalLM(config).to("cuda", dtype).eval()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-3), (torch.bfloat16, 2e-2)])
def test_fla_model_logits_match_reference(dtype, tol):
    m = model(dtype)
    tokens = torch.randint(0, 1000, (2, 333), device="cuda")
    with torch.no_grad():
        with use_backend("torch"):
            ref = m(tokens, use_cache=False).logits.float()
        with use_backend("fla"):
            fast = m(tokens, use_cache=False).logits.float()
    assert ((fast - ref).norm() / ref.norm()).item() <= tol


def test_gpu_cached_decode_matches_full_forward():
    m = model(torch.float32)
    tokens = torch.randint(0, 1000, (2, 200), device="cuda")
    with torch.no_grad():
        full = m(tokens, use_cache=False).logits
        out = m(tokens[:, :150], use_cache=True)
        pieces, cache = [out.logits], out.past_key_values
        for t in range(150, 200):
            out = m(tokens[:, t : t + 1], past_key_values=cache, use_cache=True)
            pieces.append(out.logits)
    assert ((torch.cat(pieces, 1) - full).norm() / full.norm()).item() <= 2e-3


def test_compiled_blocks_match_eager_training_step_on_fla():
    """`STAGE.compile=true` on CUDA: blocks compiled around fla's kernels, under bf16 autocast as the training loop
    runs them, against the float32 eager step; they may not add more than half again the eager bf16 step's own
    error (the rule of hyla.bench.model.check_engine), nor exceed 2e-2 where that is larger."""
    import copy

    from hyla.compile import compile_blocks

    reference = model(torch.float32).train()
    eager, compiled = copy.deepcopy(reference), copy.deepcopy(reference)
    compile_blocks(compiled.model.layers)
    tokens = torch.randint(0, 1000, (2, 512), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    losses = []
    for m, autocast in ((reference, False), (eager, True), (compiled, True)):
        with use_backend("fla"), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = m(tokens, labels=tokens, use_cache=False).loss
        loss.backward()
        losses.append(loss.item())

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    assert abs(losses[2] - losses[0]) <= max(1e-3 * losses[0], 1.5 * abs(losses[1] - losses[0]))
    for (name, ref), own, fast in zip(reference.named_parameters(), eager.parameters(), compiled.parameters()):
        assert rel(fast.grad, ref.grad) <= max(2e-2, 1.5 * rel(own.grad, ref.grad)), name
