"""The dispatch rule (hyla.ops.dispatch) inside compiled code."""

from __future__ import annotations

import warnings

from hyla.ops.dispatch import fla_available


def test_fla_available_traces_under_torch_compile_in_one_graph_without_warnings():
    import torch._dynamo

    torch._dynamo.reset()
    expected = fla_available()
    compiled = torch.compile(lambda x: x + int(fla_available()), backend="eager", fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dynamo's warning on an lru_cache-wrapped function becomes a failure
        assert torch.equal(compiled(torch.zeros(3)), torch.full((3,), float(expected)))
