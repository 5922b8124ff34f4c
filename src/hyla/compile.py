"""torch.compile helpers shared by training and inference.

Every block of a model runs the same code on different weights, and dynamo guards on the Python values a block's
forward reads: one that differs from layer to layer (an int attribute it uses, the length of a list it appends to)
compiles a graph per layer. The conversion's training steps read none, and compile one graph per kind of block and
grad mode (tests/train/test_compile.py counts them). `raise_recompile_limits` keeps dynamo's default of 8 entries
of one function, past which it silently runs the remaining calls uncompiled, from capping a process that compiles
many kinds of block, grad modes and shapes.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def raise_recompile_limits(limit: int = 256) -> None:
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(limit, getattr(torch._dynamo.config, name)))


def compile_blocks(blocks: Iterable[torch.nn.Module]) -> int:
    """torch.compile each block in place (`nn.Module.compile`: parameter names, state dicts and checkpoints stay as
    they are). What dynamo cannot trace (a custom kernel's Python wrapper, say) runs eagerly between compiled
    regions. Returns the number of blocks compiled."""
    raise_recompile_limits()
    blocks = list(blocks)
    for block in blocks:
        block.compile()
    return len(blocks)
