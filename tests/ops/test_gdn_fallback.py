"""`gdn_fla`'s pure-torch fallback (where fla cannot run the backward) under torch.compile: the compiled caller breaks
its graph around it, as around fla's own kernels, rather than unrolling its loop over chunks.

fla is not needed: its blocker is forced, and the fallback branch never imports fla. Dynamo traces on CPU with a
backend that only counts, so nothing is compiled."""

import pytest
import torch
import torch.nn.functional as F

from hyla.bench.timing import saved_tensor_bytes
from hyla.ops.gdn import gpu
from hyla.ops.gdn.reference import gdn_chunked

HEADS, DIM = 2, 8


def inputs(length):
    gen = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(1, length, HEADS, DIM, generator=gen) for _ in range(3))
    g, beta = (torch.randn(1, length, HEADS, generator=gen) for _ in range(2))
    return q.requires_grad_(), k, v, g, beta


def block(q, k, v, g, beta):
    """Stands for a compiled layer: work before and after the op, which dynamo captures."""
    o, _ = gpu.gdn_fla(F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, g=F.logsigmoid(g), beta=beta.sigmoid())
    return o.sum() * 2


def captured_graphs(length):
    """The graphs dynamo captures from `block` (as lists of their op targets) and block's result."""
    torch._dynamo.reset()
    graphs = []

    def counting_backend(graph_module, example_inputs):
        ops = ("call_function", "call_method")
        graphs.append([str(node.target) for node in graph_module.graph.nodes if node.op in ops])
        return graph_module.forward

    result = torch.compile(block, backend=counting_backend, dynamic=False)(*inputs(length))
    torch._dynamo.reset()
    return graphs, result


@pytest.fixture
def blocked_fla(monkeypatch):
    monkeypatch.setattr(gpu, "fla_backward_blocker", lambda: "fla's backward forced off for this test")


@pytest.mark.filterwarnings("ignore:GDN runs its pure-torch chunked form")
def test_compiled_caller_does_not_trace_into_the_fallback(blocked_fla):
    # 1 and 8 chunks of 64: traced into, the loop over chunks would add ops per chunk.
    short, short_result = captured_graphs(64)
    long, long_result = captured_graphs(512)
    assert short == long
    assert not any("solve_triangular" in op for graph in long for op in graph)
    # The ops before and after the fallback were captured: the graph broke around it, it was not all skipped.
    assert any("normalize" in op for graph in long for op in graph)
    q, k, v, g, beta = inputs(512)
    o, _ = gdn_chunked(F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, g=F.logsigmoid(g), beta=beta.sigmoid())
    torch.testing.assert_close(long_result, o.sum() * 2, rtol=0, atol=0)


def test_fallback_warns_and_equals_the_chunked_form(blocked_fla):
    q, k, v, g, beta = inputs(70)
    with pytest.warns(UserWarning, match="GDN runs its pure-torch chunked form: fla's backward forced off"):
        out, final = gpu.gdn_fla(q, k, v, g=F.logsigmoid(g), beta=beta.sigmoid(), output_final_state=True)
    expected, expected_final = gdn_chunked(q, k, v, g=F.logsigmoid(g), beta=beta.sigmoid(), output_final_state=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(final, expected_final, rtol=0, atol=0)
    assert out.requires_grad


def test_fallback_keeps_its_inputs_not_its_intermediates_and_gives_the_same_gradients(blocked_fla):
    q, k, v, g, beta = (x.detach().requires_grad_() for x in inputs(256))
    args = (F.normalize(q, dim=-1), F.normalize(k, dim=-1), v)
    gates = dict(g=F.logsigmoid(g), beta=beta.sigmoid())
    plain_bytes, (plain, _) = saved_tensor_bytes(lambda: gdn_chunked(*args, **gates))
    with pytest.warns(UserWarning, match="GDN runs its pure-torch chunked form"):
        fallback_bytes, (fallback, _) = saved_tensor_bytes(lambda: gpu.gdn_fla(*args, **gates))
    input_bytes = sum(x.nbytes for x in (*args, *gates.values()))
    assert plain_bytes > 10 * input_bytes  # the chunked form's [C, C] products of every chunk
    assert fallback_bytes <= input_bytes
    weights = torch.randn(plain.shape, generator=torch.Generator().manual_seed(3))
    leaves = (q, k, v, g, beta)
    expected = torch.autograd.grad((plain * weights).sum(), leaves, retain_graph=True)  # the shared normalisation
    for got, want in zip(torch.autograd.grad((fallback * weights).sum(), leaves), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
