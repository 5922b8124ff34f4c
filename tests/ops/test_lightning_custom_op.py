"""`hyla::lightning_chunk` (Lightning's training call as a torch custom op, `chunk_kernel_as_custom_op`) on CPU:
its output and every gradient against autograd through the chunked reference, torch's own checks of a custom op,
which calls take it, and a compiled model that keeps it inside its blocks: one graph per kind of block, the eager
loss and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hyla.ops.lightning import chunk_kernel_as_custom_op, lightning_attention, lightning_log_decay
from hyla.ops.lightning.reference import lightning_chunked
from offline_models import tiny_mixed_hypenet

# float64 end to end; the op's backward is three more chunked calls (reversed in time for dk and dv) where the
# reference's is autograd through one: only the summation order differs.
RTOL = 1e-10
LENGTHS = [2, 7, 63, 64, 65, 130]


def relative_error(actual, expected):
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-300)).item()


def inputs(length, *, batch=2, heads=3, key_dim=8, value_dim=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, length, heads, dim, generator=gen, dtype=torch.float64, requires_grad=True)
            for dim in (key_dim, key_dim, value_dim)]


class OpCalls(TorchDispatchMode):
    """The names of the ops that run under it."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("length", LENGTHS)
def test_custom_op_gives_the_reference_output_and_gradients(length):
    q, k, v = inputs(length, seed=length)
    log_decay = lightning_log_decay(3)
    weights = torch.randn(2, length, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    expected = lightning_chunked(q, k, v, log_decay=log_decay, scale=0.3)[0]
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    with chunk_kernel_as_custom_op(), OpCalls() as calls:
        output, state = lightning_attention(q, k, v, log_decay=log_decay, scale=0.3, chunk_safe=True)
        grads = torch.autograd.grad((output * weights).sum(), (q, k, v))
    assert "hyla.lightning_chunk" in calls.names and "hyla.lightning_chunk_backward" in calls.names
    assert state is None
    assert relative_error(output, expected) <= RTOL
    for name, got, want in zip(("dq", "dk", "dv"), grads, expected_grads):
        assert relative_error(got, want) <= RTOL, name


def test_custom_op_passes_torchs_custom_op_checks():
    """Schema, fake (meta) implementation, autograd registration and AOT tracing (torch.library.opcheck)."""
    import hyla.ops.lightning.custom_op as custom

    q, k, v = inputs(9)
    log_decay = lightning_log_decay(3)
    torch.library.opcheck(custom.lightning_chunk, (q, k, v, log_decay, 0.3))
    grad = torch.randn(2, 9, 3, 5, dtype=torch.float64)
    detached = [t.detach() for t in (q, k, v)]
    torch.library.opcheck(custom.lightning_chunk_backward, (*detached, log_decay, 0.3, grad))


@pytest.mark.parametrize("call", ["initial_state", "final_state", "packed", "unknown_decay", "one_token", "off"])
def test_calls_with_state_packing_or_unknown_decay_keep_the_plain_path(call):
    length = 1 if call == "one_token" else 9
    q, k, v = inputs(length, batch=1)
    kwargs = {"log_decay": lightning_log_decay(3), "scale": 0.3, "chunk_safe": True}
    if call == "initial_state":
        kwargs["initial_state"] = torch.zeros(1, 3, 8, 5, dtype=torch.float64)
    elif call == "final_state":
        kwargs["output_final_state"] = True
    elif call == "packed":
        kwargs["cu_seqlens"] = torch.tensor([0, 4, 9])
    elif call == "unknown_decay":
        kwargs["chunk_safe"] = None
    with chunk_kernel_as_custom_op(call != "off"), OpCalls() as calls:
        output, _ = lightning_attention(q, k, v, **kwargs)
    assert not any(name.startswith("hyla.") for name in calls.names)
    if call != "packed":
        expected = lightning_chunked(q, k, v, **{key: value for key, value in kwargs.items() if key != "chunk_safe"})
        assert relative_error(output, expected[0]) <= RTOL


def test_the_setting_is_restored_after_the_block():
    from hyla.ops import lightning

    with chunk_kernel_as_custom_op():
        assert lightning._custom_op
        with chunk_kernel_as_custom_op(False):
            assert not lightning._custom_op
        assert lightning._custom_op
    assert not lightning._custom_op


@pytest.mark.slow
def test_compiled_model_keeps_the_op_inside_one_graph_per_kind_of_block(monkeypatch):
    """What the fast path gains on CUDA, where fla's own function splits each compiled Lightning block: with the op,
    no graph break, one graph per kind of block, the compiled code calling the op (forward and backward, for both
    Lightning blocks), and the eager model's loss and gradients (float64, inductor)."""
    import hyla.ops.lightning.custom_op as custom
    from hyla.compile import compile_blocks

    reference_calls = []
    reference = custom._reference
    monkeypatch.setattr(custom, "_reference", lambda *args: reference_calls.append(1) or reference(*args))

    eager = tiny_mixed_hypenet()
    compiled = copy.deepcopy(eager)
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compile_blocks(compiled.model.layers)
    tokens = torch.randint(0, 60, (2, 37), generator=torch.Generator().manual_seed(1))
    losses, op_calls = [], []
    with chunk_kernel_as_custom_op():
        for model in (eager, compiled):
            reference_calls.clear()
            loss = model(tokens, labels=tokens, use_cache=False).loss
            loss.backward()
            losses.append(loss.item())
            op_calls.append(len(reference_calls))
    # Two Lightning blocks, each one forward and three backward calls of the chunked form.
    assert op_calls == [8, 8]
    assert counters["stats"]["unique_graphs"] == 2  # a Lightning block and an attention block
    assert not counters["graph_break"]
    assert losses[1] == pytest.approx(losses[0], rel=1e-12)
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        assert ((a.grad - b.grad).norm() / a.grad.norm()).item() <= 1e-9, name
    torch._dynamo.reset()
