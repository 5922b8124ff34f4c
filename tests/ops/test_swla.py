"""SWLA (sliding-window linear attention, docs/method.md, "EME"): W >= T is the plain op exactly; W < T gives each
position the output of a fresh run over the window that serves it; cached chunks equal one pass; padding and packing."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from hyla.ops.gdn import gdn_attention, gdn_decode_step
from hyla.ops.gdn.reference import gdn_recurrent
from hyla.ops.gla import gla_attention, gla_decode_step
from hyla.ops.gla.reference import gla_recurrent
from hyla.ops.lightning import (
    lightning_attention,
    lightning_decode_step,
    lightning_log_decay,
)
from hyla.ops.lightning.reference import lightning_recurrent
from hyla.ops.swla import (
    ring_size,
    serving_window_start,
    sliding_window_linear_attention,
    sliding_window_linear_attention_ring,
    swla_decode_step,
)

# float64: the windowed result and the brute-force one differ only by rounding.
RTOL = 1e-10
B, H, K, V = 2, 2, 4, 3


def inputs(name, length, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, length, H, K, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, length, H, V, generator=gen, dtype=torch.float64)
    if name == "lightning":
        return q, k, v, {}, dict(log_decay=lightning_log_decay(H))
    if name == "gla":
        return q, k, v, dict(g=F.logsigmoid(torch.randn(B, length, H, K, generator=gen, dtype=torch.float64))), {}
    g = -F.softplus(torch.randn(B, length, H, generator=gen, dtype=torch.float64))
    beta = torch.rand(B, length, H, generator=gen, dtype=torch.float64)
    return F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, dict(g=g, beta=beta), {}


OPS = {
    "lightning": (lightning_attention, lightning_recurrent),
    "gla": (gla_attention, gla_recurrent),
    "gdn": (gdn_attention, gdn_recurrent),
}


def relative_error(actual, expected):
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-300)).item()


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("length", [1, 13, 40])
def test_window_covering_the_sequence_is_the_plain_op_exactly(name, length):
    q, k, v, token_inputs, constants = inputs(name, length)
    op = OPS[name][0]
    plain, _ = op(q, k, v, **token_inputs, **constants)
    for window in (length, length + 5):
        windowed, _ = sliding_window_linear_attention(
            op, q, k, v, window=window, stride=max(1, window // 3), token_inputs=token_inputs, **constants
        )
        assert torch.equal(windowed, plain)


def brute_force(name, q, k, v, token_inputs, constants, window, stride):
    """Each position t recomputed from a zero state over [start(t), t] with the recurrent definition."""
    recurrent = OPS[name][1]
    starts = serving_window_start(torch.arange(q.shape[1]), window=window, stride=stride).tolist()
    out = torch.empty_like(v)
    for t, s in enumerate(starts):
        piece = {n: x[:, s : t + 1] for n, x in token_inputs.items()}
        o, _ = recurrent(q[:, s : t + 1], k[:, s : t + 1], v[:, s : t + 1], **piece, **constants)
        out[:, t] = o[:, -1]
    return out


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize(("length", "window", "stride"), [(37, 10, 3), (29, 8, 8), (21, 5, 1), (70, 16, 4)])
def test_each_output_equals_a_fresh_run_over_its_window(name, length, window, stride):
    q, k, v, token_inputs, constants = inputs(name, length, seed=length)
    op = OPS[name][0]
    windowed, _ = sliding_window_linear_attention(
        op, q, k, v, window=window, stride=stride, token_inputs=token_inputs, **constants
    )
    expected = brute_force(name, q, k, v, token_inputs, constants, window, stride)
    assert relative_error(windowed, expected) <= RTOL
    # and it is not the plain op: the windows change the result (strong gates forget fast, so by little; still
    # far above the 1e-10 rounding bound)
    plain, _ = op(q, k, v, **token_inputs, **constants)
    assert relative_error(windowed, plain) > 1e-8


def test_serving_window_keeps_between_w_minus_s_plus_one_and_w_tokens():
    window, stride = 4096, 1024
    t = torch.arange(20000)
    start = serving_window_start(t, window=window, stride=stride)
    prefix = t - start + 1
    assert bool((start % stride == 0).all())
    assert int(prefix[window:].min()) == window - stride + 1 and int(prefix.max()) == window
    assert bool((start[:window] == 0).all())


@pytest.mark.parametrize("name", OPS)
def test_cached_chunks_equal_one_pass(name):
    q, k, v, token_inputs, constants = inputs(name, 41, seed=1)
    op = OPS[name][0]
    full, _ = sliding_window_linear_attention(op, q, k, v, window=9, stride=4, token_inputs=token_inputs, **constants)
    states = [{} for _ in range(B)]
    pieces = []
    for start, end in [(0, 2), (2, 6), (6, 23), *[(t, t + 1) for t in range(23, 41)]]:
        positions = torch.arange(start, end)[None].expand(B, -1)
        piece = {n: x[:, start:end] for n, x in token_inputs.items()}
        out, states = sliding_window_linear_attention(
            op, q[:, start:end], k[:, start:end], v[:, start:end], window=9, stride=4, token_inputs=piece,
            positions=positions, window_states=states, **constants,
        )
        pieces.append(out)
    assert relative_error(torch.cat(pieces, 1), full) <= RTOL
    # only the windows that can still take tokens are kept: starts in (41 - 9, 40]
    assert [sorted(s) for s in states] == [[36, 40]] * B


def test_left_padding_shifts_windows_by_row():
    q, k, v, token_inputs, constants = inputs("gla", 30, seed=2)
    mask = torch.ones(B, 30, dtype=torch.bool)
    mask[1, :7] = False
    positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    out, _ = sliding_window_linear_attention(
        gla_attention, q, k, v, window=8, stride=3, token_inputs=token_inputs, positions=positions, token_mask=mask
    )
    alone, _ = sliding_window_linear_attention(
        gla_attention, q[1:, 7:], k[1:, 7:], v[1:, 7:], window=8, stride=3,
        token_inputs={n: x[1:, 7:] for n, x in token_inputs.items()},
    )
    assert relative_error(out[1:, 7:], alone) <= RTOL
    assert bool((out[1, :7] == 0).all())


def test_continuing_without_window_states_is_rejected():
    q, k, v, token_inputs, constants = inputs("gla", 5)
    positions = torch.arange(20, 25)[None].expand(B, -1)
    with pytest.raises(ValueError, match="without"):
        sliding_window_linear_attention(
            gla_attention, q, k, v, window=8, stride=2, token_inputs=token_inputs, positions=positions
        )
    with pytest.raises(ValueError, match="stride"):
        sliding_window_linear_attention(gla_attention, q, k, v, window=4, stride=5, token_inputs=token_inputs)


def decode_step_of(name, constants):
    """The single-token step of op `name` as `swla_decode_step` calls it."""
    if name == "lightning":
        decay = constants["log_decay"].exp()[:, None, None]
        return lambda q, k, v, state: lightning_decode_step(q, k, v, decay=decay, state=state)
    return gla_decode_step if name == "gla" else gdn_decode_step


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize(("window", "stride"), [(8, 2), (6, 3), (5, 5), (7, 3)])
def test_ring_prefill_in_chunks_then_decode_steps_equal_one_pass(name, window, stride):
    """The window ring through prefill chunks (of 1, 3, 7 and 6 tokens: inside window 0, across window openings)
    and then token by token, with the two rows at different positions while decoding (row 1 prefills 5 tokens
    fewer). The ring starts NaN-filled: a slot read before it is written (or opened) poisons the output."""
    length = 31
    q, k, v, token_inputs, constants = inputs(name, length, seed=window + stride)
    op = OPS[name][0]
    expected, _ = sliding_window_linear_attention(
        op, q, k, v, window=window, stride=stride, token_inputs=token_inputs, **constants
    )
    ring = torch.full((B, ring_size(window=window, stride=stride), H, K, V), float("nan"), dtype=torch.float64)
    prefilled = [17, 12]
    outputs = torch.full_like(v, float("nan"))
    for row, end in enumerate(prefilled):
        bounds = [0, 1, 4, 11, end] if end > 11 else [0, 1, 4, end]
        for first, last in itertools.pairwise(bounds):
            piece = {n: x[row : row + 1, first:last] for n, x in token_inputs.items()}
            outputs[row, first:last] = sliding_window_linear_attention_ring(
                op, q[row : row + 1, first:last], k[row : row + 1, first:last], v[row : row + 1, first:last],
                window=window, stride=stride, ring=ring[row : row + 1], start=first, token_inputs=piece, **constants,
            )[0]
    step = decode_step_of(name, constants)
    rows = torch.arange(B)
    for offset in range(length - max(prefilled)):
        positions = torch.tensor(prefilled) + offset
        token = {n: x[rows, positions] for n, x in token_inputs.items()}
        o, ring = swla_decode_step(step, q[rows, positions], k[rows, positions], v[rows, positions], ring=ring,
                                   positions=positions, window=window, stride=stride, **token)
        outputs[rows, positions] = o
    outputs[1, length - 5 :] = expected[1, length - 5 :]  # row 1 decodes 5 positions short of the end
    assert relative_error(outputs, expected) <= RTOL


def test_ring_has_exactly_the_open_windows_slots():
    assert [ring_size(window=w, stride=s) for w, s in ((8, 2), (6, 3), (5, 5), (7, 3), (4096, 1024))] == [
        4, 2, 1, 3, 4]
    with pytest.raises(ValueError, match="slots"):
        sliding_window_linear_attention_ring(
            lightning_attention, *inputs("lightning", 4)[:3], window=8, stride=2,
            ring=torch.zeros(B, 5, H, K, V, dtype=torch.float64), start=0, log_decay=lightning_log_decay(H),
        )
