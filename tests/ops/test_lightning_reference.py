"""The two reference forms of Lightning attention against each other and against the quadratic formula
o_t = scale * sum_{i<=t} gamma^(t-i) (q_t . k_i) v_i, in float64."""

import math

import pytest
import torch

from hyla.ops.lightning import lightning_attention, lightning_log_decay
from hyla.ops.lightning.reference import lightning_chunked, lightning_recurrent

# float64 end to end: only rounding differs between the forms, so 1e-10 relative is a tight but safe bound.
RTOL = 1e-10
LENGTHS = [1, 7, 63, 65, 1000]


def relative_error(actual, expected):
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-300)).item()


def quadratic(q, k, v, log_decay, scale, initial_state=None):
    """The unrolled recurrence, written independently of the op: decay matrix times (q k^T) times v, plus the
    initial state decayed t + 1 times."""
    length = q.shape[1]
    t = torch.arange(length, dtype=torch.float64)
    lag = t[:, None] - t[None, :]
    decay = torch.where(lag >= 0, torch.exp(log_decay[:, None, None] * lag.clamp(min=0)), 0.0)
    out = torch.einsum("bihk,bjhk,hij,bjhv->bihv", q * scale, k, decay, v)
    if initial_state is not None:
        carried = torch.exp(log_decay[None, :] * (t[:, None] + 1))  # [T, H]
        out = out + torch.einsum("bihk,ih,bhkv->bihv", q * scale, carried, initial_state)
    return out


def inputs(batch, length, heads=3, key_dim=8, value_dim=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, length, heads)
    q = torch.randn(*shape, key_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(*shape, key_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(*shape, value_dim, generator=gen, dtype=torch.float64)
    state = torch.randn(batch, heads, key_dim, value_dim, generator=gen, dtype=torch.float64)
    return q, k, v, state


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_state", [False, True])
def test_forms_agree_with_quadratic_formula(length, with_state):
    q, k, v, state = inputs(2, length)
    state = state if with_state else None
    g = lightning_log_decay(3)
    scale = 8**-0.5
    expected = quadratic(q, k, v, g, scale, state)
    for form in (lightning_recurrent, lightning_chunked):
        out, _ = form(q, k, v, log_decay=g, initial_state=state)
        assert relative_error(out, expected) <= RTOL, form.__name__


@pytest.mark.parametrize("length", LENGTHS)
def test_final_states_agree(length):
    q, k, v, state = inputs(2, length, seed=1)
    g = lightning_log_decay(3)
    _, s_rec = lightning_recurrent(q, k, v, log_decay=g, initial_state=state, output_final_state=True)
    _, s_chunk = lightning_chunked(q, k, v, log_decay=g, initial_state=state, output_final_state=True)
    assert s_rec.dtype == torch.float64
    assert relative_error(s_chunk, s_rec) <= RTOL
    # The state as a closed form: sum_i gamma^(T-1-i) k_i^T v_i + gamma^T S_0.
    t = torch.arange(length, dtype=torch.float64)
    weights = torch.exp(g[None, :] * (length - 1 - t)[:, None])
    closed = torch.einsum("bihk,ih,bihv->bhkv", k, weights, v) + torch.exp(g * length)[None, :, None, None] * state
    assert relative_error(s_rec, closed) <= RTOL


def test_continuing_from_state_equals_one_pass():
    q, k, v, _ = inputs(2, 130, seed=2)
    g = lightning_log_decay(3)
    full, full_state = lightning_chunked(q, k, v, log_decay=g, output_final_state=True)
    first, state = lightning_chunked(q[:, :77], k[:, :77], v[:, :77], log_decay=g, output_final_state=True)
    second, end_state = lightning_recurrent(
        q[:, 77:], k[:, 77:], v[:, 77:], log_decay=g, initial_state=state, output_final_state=True
    )
    assert relative_error(torch.cat([first, second], 1), full) <= RTOL
    assert relative_error(end_state, full_state) <= RTOL


@pytest.mark.parametrize("form", [lightning_recurrent, lightning_chunked])
def test_packed_sequences_equal_separate_runs(form):
    lengths = [7, 1, 65, 63]
    q, k, v, states = inputs(1, sum(lengths), seed=3)
    states = torch.randn(len(lengths), 3, 8, 5, dtype=torch.float64)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)))
    g = lightning_log_decay(3)
    packed, packed_states = form(q, k, v, log_decay=g, initial_state=states, output_final_state=True, cu_seqlens=cu)
    for n, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        alone, alone_state = form(
            q[:, start:end], k[:, start:end], v[:, start:end],
            log_decay=g, initial_state=states[n : n + 1], output_final_state=True,
        )
        assert relative_error(packed[:, start:end], alone) <= RTOL
        assert relative_error(packed_states[n : n + 1], alone_state) <= RTOL


def test_float32_inputs_accumulate_in_float32_state():
    q, k, v, _ = inputs(1, 70, seed=4)
    g = lightning_log_decay(3)
    out, state = lightning_attention(q.float(), k.float(), v.float(), log_decay=g, output_final_state=True)
    assert out.dtype == torch.float32 and state.dtype == torch.float32
    expected = quadratic(q, k, v, g, 8**-0.5)
    assert relative_error(out.double(), expected) <= 1e-5  # float32 rounding over 70 steps


def test_bad_packing_is_rejected():
    q, k, v, _ = inputs(2, 10)
    with pytest.raises(ValueError, match="batch size 1"):
        lightning_chunked(q, k, v, log_decay=lightning_log_decay(3), cu_seqlens=torch.tensor([0, 10]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        lightning_chunked(q[:1], k[:1], v[:1], log_decay=lightning_log_decay(3), cu_seqlens=torch.tensor([0, 9]))


def test_decay_constants_for_16_heads():
    """docs/method.md, "Lightning layer": gamma_h = exp(-2^(-8h/H)), h = 1..H; for H = 16 the log-decay runs from -0.707
    to -0.0039."""
    g = lightning_log_decay(16)
    assert g.shape == (16,)
    assert g[0].item() == pytest.approx(-1 / math.sqrt(2), abs=1e-15)
    assert g[7].item() == pytest.approx(-(2.0**-4), abs=1e-15)
    assert g[-1].item() == pytest.approx(-(2.0**-8), abs=1e-15)
    # longest 1/e horizon: 256 tokens
    assert (-1 / g[-1]).item() == pytest.approx(256.0)
    expected = [-(2.0 ** (-8 * h / 16)) for h in range(1, 17)]
    assert g.tolist() == pytest.approx(expected, abs=1e-15)
