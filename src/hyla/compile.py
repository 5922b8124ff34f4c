"""torch.compile helpers shared by training and inference.

Every block of a model runs the same code on different weights, and dynamo guards on the Python values a block's
forward reads: one that differs from layer to layer (an int attribute it uses, the length of a list it appends to)
compiles a graph per layer. The conversion's training steps read none, and compile one graph per kind of block and
grad mode (tests/train/test_compile.py counts them). `raise_recompile_limits` keeps dynamo's default of 8 entries
of one function, past which it silently runs the remaining calls uncompiled, from capping a process that compiles
many kinds of block, grad modes and shapes. `share_triton_cache` gives every hyla process one Triton cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch


def raise_recompile_limits(limit: int = 256) -> None:
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(limit, getattr(torch._dynamo.config, name)))


def compile_blocks(blocks: Iterable[torch.nn.Module], mode: str = "default") -> int:
    """torch.compile each block in place (`nn.Module.compile`: parameter names, state dicts and checkpoints stay as
    they are), in torch.compile's `mode`. What dynamo cannot trace (a custom kernel's Python wrapper, say) runs
    eagerly between compiled regions. Returns the number of blocks compiled."""
    raise_recompile_limits()
    blocks = list(blocks)
    for block in blocks:
        block.compile(**({} if mode == "default" else {"mode": mode}))
    return len(blocks)


def release_cuda_graphs(device: torch.device) -> None:
    """Free what torch's CUDA graph trees hold on `device` (the graphs that torch.compile's mode "reduce-overhead"
    recorded, and their memory pool, which stays reserved while they exist): after stage 1's replayed twins
    (`hyla.convert.align.compiled_twin_error`), before the next stage needs the memory. Their compiled code stays;
    a later call would record anew."""
    if device.type != "cuda":
        return
    from torch._inductor.cudagraph_trees import reset_cudagraph_trees

    reset_cudagraph_trees()
    torch.cuda.empty_cache()


def triton_default_cache_dir() -> str:
    """Where Triton keeps compiled kernels and autotuning results unless told otherwise (triton.knobs.cache)."""
    return os.path.join(os.environ.get("TRITON_HOME", os.path.expanduser("~/")), ".triton", "cache")


def share_triton_cache() -> str:
    """Set TRITON_CACHE_DIR, unless it is set, to Triton's own default, for this process and those it starts;
    returns the folder.

    Without it the folder depends on what a process compiled first: the first torch.compile kernel a process loads
    sets TRITON_CACHE_DIR to inductor's folder (torch/_inductor/runtime/triton_heuristics.py), and Triton reads the
    variable at every compile, so fla's and hyla's kernels and fla's autotuning choices land there in a process
    that compiled a block first (a conversion, the engine) and in ~/.triton/cache in one that did not (`hyla eval
    csr`, `hyla eval ppl` on a HypeNet): those evaluations then compiled and autotuned again every kernel the
    conversion had (sitting D: their first batch took 57-59 s, the teacher's whole job 44-56 s)."""
    return os.environ.setdefault("TRITON_CACHE_DIR", triton_default_cache_dir())
