"""What hyla's fla wrapper for GLA (`hyla.ops.gla.gpu`) hands fla, on CPU: calls shorter than one chunk of 64 tokens
are zero-padded to it (fla's chunk_gla would run them at chunk 16 or 32, where one of its output kernel's autotuned
configurations faults on the H200 in float32: docs/method.md, "Kernel notes"), and the padding changes nothing,
checked here through the pure-torch reference in float64.

GPU-only, in tests/ops/test_gla_gdn_swa_gpu.py: that fla itself runs the padded calls (lengths 1, 23 and 63, with
gradients, and packed sequences of 23 tokens) and matches the reference; fla_interpreter_check.py runs them through
Triton's CPU interpreter (tests/ops/test_fla_interpreter.py), which has no faults to show."""

import pytest
import torch
import torch.nn.functional as F

from hyla.ops.gla.gpu import FLA_GLA_CHUNK, pad_to_one_chunk
from hyla.ops.gla.reference import gla_recurrent

HEADS, KEY_DIM, VALUE_DIM = 3, 8, 5
# float64, and the padded call adds exact zeros (a zero key and value, a zero log-gate) to the same sums: only the
# unpadded call's own rounding can differ.
RTOL = 1e-12


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def inputs(batch, length, num_states, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, length, HEADS)
    q, k = (torch.randn(*shape, KEY_DIM, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(*shape, VALUE_DIM, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(torch.randn(*shape, KEY_DIM, generator=gen, dtype=torch.float64))
    state = torch.randn(num_states, HEADS, KEY_DIM, VALUE_DIM, generator=gen, dtype=torch.float64)
    return [x.requires_grad_() for x in (q, k, v, g, state)]


def outputs_and_gradients(leaves, cu_seqlens, *, pad):
    """The reference's output (first T tokens), final state and the gradients of the leaves (q, k, v, g, state) of
    <output, weights> + sum(final state), with or without the padding."""
    q, k, v, g, state = leaves
    length = q.shape[1]
    weights = torch.randn(q.shape[:3] + (VALUE_DIM,), generator=torch.Generator().manual_seed(9), dtype=q.dtype)
    if pad:
        q, k, v, g, cu_seqlens = pad_to_one_chunk(q, k, v, g, cu_seqlens)
        assert q.shape[1] == v.shape[1] == g.shape[1] == FLA_GLA_CHUNK and q.is_contiguous()
    output, final = gla_recurrent(q, k, v, g=g, initial_state=state, output_final_state=True, cu_seqlens=cu_seqlens)
    output = output[:, :length]
    return output, final, torch.autograd.grad((output * weights).sum() + final.sum(), leaves)


@pytest.mark.parametrize("batch,length,cu_seqlens", [(2, 23, None), (2, 1, None), (3, 63, None),
                                                     (1, 23, [0, 5, 6, 23]), (1, 2, [0, 1, 2])])
def test_padding_to_one_chunk_changes_no_output_state_or_gradient(batch, length, cu_seqlens):
    cu = torch.tensor(cu_seqlens) if cu_seqlens is not None else None
    num_states = batch if cu is None else len(cu_seqlens) - 1
    leaves = inputs(batch, length, num_states, seed=length)
    plain = outputs_and_gradients(leaves, cu, pad=False)
    padded = outputs_and_gradients(leaves, cu, pad=True)
    assert rel(padded[0], plain[0]) <= RTOL, "output"
    assert rel(padded[1], plain[1]) <= RTOL, "final state"
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dh0"), padded[2], plain[2]):
        assert a.shape == b.shape and rel(a, b) <= RTOL, name


def test_packed_padding_goes_to_the_last_sequence():
    q, k, v, g, _ = inputs(1, 10, 2, seed=0)
    cu = torch.tensor([0, 4, 10])
    padded = pad_to_one_chunk(q, k, v, g, cu)
    assert padded[4].tolist() == [0, 4, FLA_GLA_CHUNK]
    assert torch.equal(padded[0][:, :10], q) and not padded[0][:, 10:].any() and not padded[3][:, 10:].any()
