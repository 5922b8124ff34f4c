"""Full (unsharded) weights of a possibly FSDP-sharded module, written by the main process."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from hyla.outputs import write_atomic
from hyla.train.distributed import Distributed, barrier


def full_state_dict(module: torch.nn.Module, *, everywhere: bool = False) -> dict[str, torch.Tensor]:
    """The whole state of `module`, gathered to the main process's CPU (`everywhere`: on every process, on the
    weights' device)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)
    return {k: v.contiguous() for k, v in get_model_state_dict(module, options=options).items()}


def without_shared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop later names of tensors that share storage (tied embeddings): safetensors stores each tensor once."""
    seen, kept = set(), {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            kept[name] = tensor
    return kept


def save_weights(state: dict[str, torch.Tensor], path: Path, env: Distributed) -> None:
    """Write `state` as safetensors atomically (main process), then wait for everyone."""
    if env.is_main:
        write_atomic(path, save(without_shared(state)))
    barrier(env)


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load weights saved by `save_weights`; only the names of tied parameters may be absent."""
    from safetensors.torch import load_file

    load_state(model, load_file(str(path)), str(path))


def load_state(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str = "the state") -> None:
    """Load `state` into `model`; only the names of tied parameters may be absent."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or {}) if model.config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"{source} does not fit the model: missing {sorted(set(missing) - tied)}, "
                         f"unexpected {sorted(unexpected)}")


