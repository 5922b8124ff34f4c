"""GLA and gated-delta-rule references: recurrent vs chunked forms in float64 on odd lengths, with initial states,
continuation and packed sequences (for GDN, every gradient too), and GLA against its unrolled closed form."""

import pytest
import torch
import torch.nn.functional as F

from hyla.ops.gdn import gdn_attention
from hyla.ops.gdn.reference import _StateScan, gdn_chunked, gdn_decode_step, gdn_recurrent
from hyla.ops.gla import gla_attention
from hyla.ops.gla.reference import gla_chunked, gla_decode_step, gla_recurrent

# float64 end to end: only rounding differs between the forms, so 1e-10 relative is a tight but safe bound.
RTOL = 1e-10
LENGTHS = [1, 7, 63, 65, 131]
HEADS, KEY_DIM, VALUE_DIM = 3, 8, 5


def relative_error(actual, expected):
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-300)).item()


def gla_inputs(batch, length, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, length, HEADS)
    q, k = (torch.randn(*shape, KEY_DIM, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(*shape, VALUE_DIM, generator=gen, dtype=torch.float64)
    # fla's GLA gate: logsigmoid(x) / 16, here without the normaliser half the time so that decays are strong too
    g = F.logsigmoid(torch.randn(*shape, KEY_DIM, generator=gen, dtype=torch.float64) * 3) / (16 if seed % 2 else 1)
    state = torch.randn(batch, HEADS, KEY_DIM, VALUE_DIM, generator=gen, dtype=torch.float64)
    return dict(q=q, k=k, v=v, g=g), state


def gdn_inputs(batch, length, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, length, HEADS)
    q, k = (F.normalize(torch.randn(*shape, KEY_DIM, generator=gen, dtype=torch.float64), dim=-1) for _ in range(2))
    v = torch.randn(*shape, VALUE_DIM, generator=gen, dtype=torch.float64)
    g = -F.softplus(torch.randn(*shape, generator=gen, dtype=torch.float64))
    beta = torch.rand(*shape, generator=gen, dtype=torch.float64)
    state = torch.randn(batch, HEADS, KEY_DIM, VALUE_DIM, generator=gen, dtype=torch.float64)
    return dict(q=q, k=k, v=v, g=g, beta=beta), state


OPS = {"gla": (gla_recurrent, gla_chunked, gla_inputs), "gdn": (gdn_recurrent, gdn_chunked, gdn_inputs)}


def call(form, inputs, **kwargs):
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    gates = {name: x for name, x in inputs.items() if name not in ("q", "k", "v")}
    return form(q, k, v, **gates, **kwargs)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_state", [False, True])
def test_recurrent_and_chunked_forms_agree(name, length, with_state):
    recurrent, chunked, make = OPS[name]
    inputs, state = make(2, length, seed=length)
    state = state if with_state else None
    out_r, state_r = call(recurrent, inputs, initial_state=state, output_final_state=True)
    out_c, state_c = call(chunked, inputs, initial_state=state, output_final_state=True)
    assert state_r.dtype == torch.float64
    assert relative_error(out_c, out_r) <= RTOL
    assert relative_error(state_c, state_r) <= RTOL


def test_gla_equals_its_unrolled_formula():
    """o_t = scale * sum_{i<=t} (q_t * exp(G_t - G_i)) . k_i v_i + scale * (q_t * exp(G_t)) S_0, G the cumsum of g."""
    inputs, state = gla_inputs(2, 77, seed=1)
    q, k, v, g = inputs["q"], inputs["k"], inputs["v"], inputs["g"]
    cum = g.cumsum(1)
    t = torch.arange(77)
    causal = (t[:, None] >= t[None, :])[None, :, :, None, None]
    decay = torch.where(causal, cum[:, :, None] - cum[:, None, :], float("-inf")).exp()  # [B, t, i, H, K]
    scale = KEY_DIM**-0.5
    expected = torch.einsum("bthk,bihk,btihk,bihv->bthv", q * scale, k, decay, v)
    expected = expected + torch.einsum("bthk,bhkv->bthv", q * scale * cum.exp(), state)
    for form in (gla_recurrent, gla_chunked):
        out, _ = call(form, inputs, initial_state=state)
        assert relative_error(out, expected) <= RTOL, form.__name__


def test_gdn_with_unit_decay_and_beta_one_overwrites_the_key_slot():
    """With g = 0 and beta = 1 writing v for a unit key k and reading with q = k returns exactly v."""
    inputs, _ = gdn_inputs(1, 2, seed=2)
    k = inputs["k"][:, :1].expand(1, 2, HEADS, KEY_DIM).contiguous()
    v = inputs["v"]
    zeros = torch.zeros(1, 2, HEADS, dtype=torch.float64)
    out, _ = gdn_chunked(k, k, v, g=zeros, beta=zeros + 1, scale=1.0)
    assert relative_error(out[:, 1], v[:, 1]) <= RTOL


@pytest.mark.parametrize("name", OPS)
def test_continuing_from_state_equals_one_pass(name):
    recurrent, chunked, make = OPS[name]
    inputs, _ = make(2, 130, seed=3)
    first = {n: x[:, :77] for n, x in inputs.items()}
    second = {n: x[:, 77:] for n, x in inputs.items()}
    full, full_state = call(chunked, inputs, output_final_state=True)
    out1, state = call(chunked, first, output_final_state=True)
    out2, end_state = call(recurrent, second, initial_state=state, output_final_state=True)
    assert relative_error(torch.cat([out1, out2], 1), full) <= RTOL
    assert relative_error(end_state, full_state) <= RTOL


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("form_index", [0, 1])
def test_packed_sequences_equal_separate_runs(name, form_index):
    form, make = OPS[name][form_index], OPS[name][2]
    lengths = [7, 1, 65, 63]
    inputs, _ = make(1, sum(lengths), seed=4)
    states = torch.randn(len(lengths), HEADS, KEY_DIM, VALUE_DIM, dtype=torch.float64)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
    packed, packed_states = call(form, inputs, initial_state=states, output_final_state=True, cu_seqlens=cu)
    for n, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        alone, alone_state = call(
            form, {x: t[:, start:end] for x, t in inputs.items()},
            initial_state=states[n : n + 1], output_final_state=True,
        )
        assert relative_error(packed[:, start:end], alone) <= RTOL
        assert relative_error(packed_states[n : n + 1], alone_state) <= RTOL


def gdn_values_and_gradients(form, inputs, state, cu_seqlens=None):
    """Output, final state and the gradients of a random weighting of both w.r.t. every input and the state."""
    leaves = {n: x.detach().clone().requires_grad_() for n, x in inputs.items()}
    init = None if state is None else state.detach().clone().requires_grad_()
    out, final = call(form, leaves, initial_state=init, output_final_state=True, cu_seqlens=cu_seqlens)
    gen = torch.Generator().manual_seed(11)
    loss = (out * torch.randn(out.shape, generator=gen, dtype=out.dtype)).sum()
    loss = loss + (final * torch.randn(final.shape, generator=gen, dtype=final.dtype)).sum()
    wrt = dict(leaves) if init is None else dict(leaves, initial_state=init)
    return out, final, dict(zip(wrt, torch.autograd.grad(loss, list(wrt.values()))))


def assert_gdn_forms_agree(inputs, state, cu_seqlens=None):
    out_r, final_r, grads_r = gdn_values_and_gradients(gdn_recurrent, inputs, state, cu_seqlens)
    out_c, final_c, grads_c = gdn_values_and_gradients(gdn_chunked, inputs, state, cu_seqlens)
    assert relative_error(out_c, out_r) <= RTOL, "output"
    assert relative_error(final_c, final_r) <= RTOL, "final state"
    assert grads_c.keys() == grads_r.keys()
    for name, grad in grads_r.items():
        assert relative_error(grads_c[name], grad) <= RTOL, f"d{name}"


# Not multiples of the chunk size (64): the chunked form pads the last chunk.
@pytest.mark.parametrize("length", [1, 63, 65, 130])
@pytest.mark.parametrize("with_state", [False, True])
def test_gdn_chunked_gradients_equal_the_recurrent_forms(length, with_state):
    inputs, state = gdn_inputs(2, length, seed=20 + length)
    assert_gdn_forms_agree(inputs, state if with_state else None)


def test_gdn_chunked_gradients_equal_the_recurrent_forms_on_packed_sequences():
    # An empty sequence too: its state passes through unchanged.
    lengths = [65, 1, 0, 63, 130]
    inputs, _ = gdn_inputs(1, sum(lengths), seed=21)
    states = torch.randn(len(lengths), HEADS, KEY_DIM, VALUE_DIM, dtype=torch.float64)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
    assert_gdn_forms_agree(inputs, states, cu)


def test_gdn_state_scan_backward_is_its_forwards_gradient():
    # The chunked form's scan over chunks has a backward of its own: checked against finite differences (float64).
    gen = torch.Generator().manual_seed(23)
    transitions = (0.5 * torch.randn(5, 3, 4, 4, generator=gen, dtype=torch.float64)).requires_grad_()
    inputs = torch.randn(5, 3, 4, 2, generator=gen, dtype=torch.float64).requires_grad_()
    state = torch.randn(3, 4, 2, generator=gen, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(_StateScan.apply, (transitions, inputs, state))


@pytest.mark.parametrize("name", OPS)
def test_dispatch_runs_the_reference_on_cpu_in_float32(name):
    op = {"gla": gla_attention, "gdn": gdn_attention}[name]
    recurrent, _, make = OPS[name]
    inputs, state = make(1, 70, seed=5)
    out, final = call(op, {n: x.float() for n, x in inputs.items()}, initial_state=state.float(),
                      output_final_state=True)
    assert out.dtype == torch.float32 and final.dtype == torch.float32
    expected, _ = call(recurrent, inputs, initial_state=state)
    assert relative_error(out.double(), expected) <= 1e-5  # float32 rounding over 70 steps


def test_bad_initial_state_shape_is_rejected():
    inputs, state = gla_inputs(2, 5)
    with pytest.raises(ValueError, match="initial_state"):
        call(gla_chunked, inputs, initial_state=state[:1])


@pytest.mark.parametrize("name", ["gla", "gdn"])
def test_decode_steps_continue_the_chunked_form_token_by_token(name):
    """The inference engine's single-token steps, run over a sequence from a state, give the chunked form's outputs
    and final state (a token's inputs [B, H, ...] without the time axis)."""
    inputs, state = (gla_inputs if name == "gla" else gdn_inputs)(2, 9, seed=3)
    chunked, step = (gla_chunked, gla_decode_step) if name == "gla" else (gdn_chunked, gdn_decode_step)
    expected, expected_state = chunked(**inputs, scale=0.4, initial_state=state, output_final_state=True)
    outputs, running = [], state.clone()
    for t in range(9):
        output, running = step(**{key: value[:, t] for key, value in inputs.items()}, state=running, scale=0.4)
        outputs.append(output)
    assert relative_error(torch.stack(outputs, 1), expected) <= RTOL
    assert relative_error(running, expected_state) <= RTOL
