"""One dispatch rule for every op: the GPU path (fla / SDPA kernels) on CUDA tensors, the pure-torch reference on
CPU. Tests and benchmarks override it with `use_backend(...)` or the environment variable `HYLA_BACKEND`."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from collections.abc import Iterator

import torch

BACKENDS = ("auto", "torch", "fla")
_override: list[str] = []


def current_backend() -> str:
    """The requested backend: innermost `use_backend`, else `$HYLA_BACKEND`, else "auto"."""
    if _override:
        return _override[-1]
    name = os.environ.get("HYLA_BACKEND", "auto").lower()
    if name not in BACKENDS:
        raise ValueError(f"HYLA_BACKEND={name!r} is not one of {', '.join(BACKENDS)}")
    return name


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force a backend inside a `with` block ("torch" = reference, "fla" = GPU kernels, "auto")."""
    if name not in BACKENDS:
        raise ValueError(f"backend {name!r} is not one of {', '.join(BACKENDS)}")
    _override.append(name)
    try:
        yield
    finally:
        _override.pop()


@functools.cache
def _fla_found() -> bool:
    return importlib.util.find_spec("fla") is not None and importlib.util.find_spec("triton") is not None


@torch.compiler.assume_constant_result
def fla_available() -> bool:
    """True when flash-linear-attention and triton can be imported (checked without importing them). Compiled code
    takes its value as a constant (dynamo would otherwise trace the package search, or warn about a cache wrapper)."""
    return _fla_found()


def resolve_backend(tensor: torch.Tensor) -> str:
    """The backend an op runs for `tensor`: "fla" or "torch"."""
    name = current_backend()
    if name == "auto":
        return "fla" if tensor.is_cuda and fla_available() else "torch"
    if name == "fla":
        if not tensor.is_cuda:
            raise ValueError("backend 'fla' needs CUDA tensors")
        if not fla_available():
            raise ValueError("backend 'fla' needs flash-linear-attention: pip install 'hyla[gpu]'")
    return name
