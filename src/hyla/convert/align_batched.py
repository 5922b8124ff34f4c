"""Stage 1's loss with every Lightning twin computed as one batched problem: the same math as `alignment_loss`
(the reference: one twin after the other), in a few large kernels instead of thirty small sets of them.

The twins are independent given the teacher's recorded inputs. When they are all Lightning layers of one shape and
one config, their inputs stack to [L, B, T, C] and their weights, stacked at every step from the twins' own
parameters (`torch.stack`: the gradients flow back to each twin's parameters; modules, state dicts, checkpoints and
the optimizer stay as they are), turn the q/k/v/z projections and o_proj into batched products over the layer
axis. Every Lightning layer has the same fixed per-head decay, so the recurrence is one `lightning_attention` call
on a batch of L * B rows.

Memory: the products keep one copy of the stacked input for the weights' gradients ([L, B, T, C] in the compute
dtype: 2.3 GB in bf16 at 30 x 128 x 512 x 576), where the loop keeps one per projection and layer (q, k, v, z: about
four times that), and the MSE keeps the float32 difference where `F.mse_loss` keeps prediction and target (half);
every other activation has the size it has in the loop, and all of them live until the backward pass in both (the
layers' losses are summed before it). The stacked weights add a float32 copy of the twins' weights and its bf16 cast
(about 0.3 GB for 30 SmolLM2-135M twins) until the backward pass has used them. Compiled, the partitioner decides
what is kept: these are the eager sizes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from hyla.convert.align import AlignmentTwins, alignment_loss, compiled_twin_error, compute_dtype, record_mixers
from hyla.layers.lightning import LightningAttention
from hyla.ops.rms_norm import rms_norm
from hyla.layers.rope import apply_rotary
from hyla.ops.lightning import lightning_attention

# The input-side maps in the order of the fused product's output columns (z_proj only with the output gate).
INPUT_MAPS = ("q_proj", "k_proj", "v_proj", "z_proj")


def _layout(twin: LightningAttention) -> dict:
    """Everything the batched math assumes the twins share: sizes, config flags, norms' eps, the decay, and each
    parameter's shape, dtype and device."""
    norms = {name: getattr(twin, name).eps for name in ("q_norm", "k_norm", "o_norm")
             if getattr(twin, name) is not None}
    return {"sizes": (twin.num_heads, twin.head_dim), "rope": twin.use_rope, "output gate": twin.z_proj is not None,
            "norms": norms, "decay": tuple(twin._log_decay.tolist()), "chunk_safe": twin.chunk_safe,
            "parameters": {name: (tuple(p.shape), p.dtype, p.device) for name, p in twin.named_parameters()}}


def batching_obstacle(twins: Sequence[nn.Module]) -> str | None:
    """None when the twins can run as one batched problem; else why not (one line)."""
    if not twins:
        return "there are no twins"
    reference = None
    for index, twin in enumerate(twins):
        if type(twin) is not LightningAttention:
            return f"twin {index} is {type(twin).__name__}, not LightningAttention"
        if twin._forward_hooks or twin._forward_pre_hooks:
            return f"twin {index} has forward hooks, which the batched loss would not run"
        layout = _layout(twin)
        reference = reference or layout
        differing = [key for key in layout if layout[key] != reference[key]]
        if differing:
            return f"twin {index} differs from twin 0 in {', '.join(differing)}"
    return None


def _stacked(twins: Sequence[LightningAttention], name: str) -> torch.Tensor:
    return torch.stack([twin.get_parameter(name) for twin in twins])


def _input_projections(twins, x: torch.Tensor, names: list[str]) -> torch.Tensor:
    """x: [L, N, C] -> [L, N, len(names) * width]: every twin's input maps of `names` as one product per layer."""
    weight = torch.cat([_stacked(twins, f"{name}.weight") for name in names], dim=1)  # [L, n * width, C]
    first = twins[0]
    if first.q_proj.bias is None:
        return torch.bmm(x, weight.transpose(1, 2))
    # The output gate has no bias: zeros in its columns add nothing.
    biases = [_stacked(twins, f"{name}.bias") if getattr(first, name).bias is not None
              else weight.new_zeros(len(twins), getattr(first, name).out_features) for name in names]
    return torch.baddbmm(torch.cat(biases, dim=1)[:, None], x, weight.transpose(1, 2))


def batched_twin_outputs(twins: Sequence[LightningAttention], inputs: Sequence[torch.Tensor],
                         rope: tuple[torch.Tensor, torch.Tensor], log_decay: torch.Tensor,
                         compute_dtype: torch.dtype) -> torch.Tensor:
    """Every twin's output on its own input, [L, B * T, C] (what `twin(input, context)` gives, stacked). inputs: L
    tensors [B, T, C], the recorded inputs of the teacher's mixers; rope: (cos, sin) [B, T, D]; compute_dtype: what
    the products read their input in (autocast's dtype, else the weights')."""
    first = twins[0]
    num_heads, head_dim = first.num_heads, first.head_dim
    width = num_heads * head_dim
    # The loop casts each input to the weights' dtype, and autocast casts it on to bf16 in each product: a bf16
    # recording goes through float32 and back unchanged, so casting straight to the compute dtype is the same value.
    x = torch.stack(list(inputs)).to(compute_dtype)  # [L, B, T, C]
    num_layers, batch, length, hidden = x.shape
    names = [name for name in INPUT_MAPS if getattr(first, name) is not None]
    projected = _input_projections(twins, x.view(num_layers, batch * length, hidden), names)
    q, k, v, *gate = (projected[..., i * width:(i + 1) * width].view(num_layers, batch, length, num_heads, head_dim)
                      for i in range(len(names)))
    if first.q_norm is not None:
        q = rms_norm(q, _stacked(twins, "q_norm.weight")[:, None, None, None], eps=first.q_norm.eps)
        k = rms_norm(k, _stacked(twins, "k_norm.weight")[:, None, None, None], eps=first.k_norm.eps)
    if first.use_rope:
        # cos, sin [B, T, D] broadcast over the layer axis: every layer sees the same positions.
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
    rows = (num_layers * batch, length, num_heads, head_dim)
    q, k = q.to(v.dtype), k.to(v.dtype)
    output, _ = lightning_attention(q.reshape(rows), k.reshape(rows), v.reshape(rows), log_decay=log_decay,
                                    scale=head_dim**-0.5, chunk_safe=first.chunk_safe)
    output = output.reshape(num_layers, batch * length, width)
    output = rms_norm(output, _stacked(twins, "o_norm.weight")[:, None], eps=first.o_norm.eps)
    if gate:
        output = output * torch.sigmoid(gate[0].reshape(num_layers, batch * length, width))
    o_weight = _stacked(twins, "o_proj.weight").transpose(1, 2)  # [L, width, C]
    if first.o_proj.bias is None:
        return torch.bmm(output, o_weight)
    return torch.baddbmm(_stacked(twins, "o_proj.bias")[:, None], output, o_weight)


def batched_twin_errors(twins: Sequence[LightningAttention], inputs: Sequence[torch.Tensor],
                        targets: Sequence[torch.Tensor], rope: tuple[torch.Tensor, torch.Tensor],
                        log_decay: torch.Tensor, compute_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Each twin's MSE against its target and the target's energy (mean square), float32 [L] each, as the loop
    computes them; targets: L tensors [B, T, C], the recorded outputs of the teacher's mixers."""
    prediction = batched_twin_outputs(twins, inputs, rope, log_decay, compute_dtype)
    target = torch.stack(list(targets)).view(prediction.shape[0], prediction.shape[1], -1).float()
    mse = (prediction.float() - target).pow(2).mean(dim=(1, 2))
    return mse, target.pow(2).mean(dim=(1, 2))


@functools.cache
def compiled_twin_errors() -> Callable:
    """`batched_twin_errors` under torch.compile with static shapes (made on first use: nothing at import)."""
    return torch.compile(batched_twin_errors, dynamic=False)


def batched_alignment_loss(model: AlignmentTwins, batch: dict, *,
                           errors: Callable = batched_twin_errors) -> tuple[torch.Tensor, dict]:
    """`alignment_loss` (same value, gradients and metrics, up to rounding) with the twins as one batched problem;
    the twins must pass `batching_obstacle`. errors: `batched_twin_errors` or its compiled form."""
    recorder, context = record_mixers(model.teacher[0], batch["input_ids"])
    # The teacher's pass records unpadded, unpacked rows without a cache: the context the batched math assumes.
    assert context.token_mask is None and context.cu_seqlens is None and context.cache is None
    assert context.options.eme_window is None
    twins = list(model.twins)
    weight = twins[0].q_proj.weight
    indices = range(len(twins))
    mse, energy = errors(twins, [recorder.inputs[i] for i in indices], [recorder.outputs[i] for i in indices],
                         context.rope, twins[0].log_decay(weight.device), compute_dtype(weight))
    metrics = {f"mse_{i:02d}": loss for i, loss in enumerate(mse.detach())}
    metrics.update({f"energy_{i:02d}": value for i, value in enumerate(energy.detach())})
    return mse.sum(), metrics


@dataclass(frozen=True)
class AlignmentPath:
    """The loss stage 1 trains with, and why: the batched loss, or the reference loop over the twins."""

    loss_fn: Callable
    batched: bool
    compiled: bool  # the batched loss compiled whole, or (the loop) each twin compiled block by block
    reason: str
    # The loop with each twin and its loss compiled as one function (`compiled_twin_error`), not the twin alone.
    whole_twins: bool = False
    # Those functions replayed as CUDA graphs (`compiled_twin_error`); `hyla.compile.release_cuda_graphs` after.
    cuda_graphs: bool = False

    @property
    def compile_twins(self) -> bool:
        """Whether the twins are to be compiled one by one (`hyla.compile.compile_blocks`): the loop's fast path."""
        return self.compiled and not self.batched and not self.whole_twins

    def describe(self) -> str:
        if self.batched:
            how = "one compiled function" if self.compiled else "eager"
            return f"batched, every twin in one problem, {how} ({self.reason})"
        how = ", each twin compiled" if self.compiled else ""
        how += " with its loss" if self.whole_twins else ""
        how += ", replayed as CUDA graphs" if self.cuda_graphs else ""
        return f"per-twin loop{how} ({self.reason})"

    def as_dict(self) -> dict:
        return {"batched": self.batched, "compiled": self.compiled, "whole_twins": self.whole_twins,
                "cuda_graphs": self.cuda_graphs, "reason": self.reason}


def choose_alignment_path(twins: AlignmentTwins, *, compile: bool, data_parallel_mode: str = "none",
                          batched: bool | None = None, whole_twins: bool = False,
                          cuda_graphs: bool = False) -> AlignmentPath:
    """Stage 1's loss for the fast-path setting `compile` and the data-parallel mode the twins train under
    (`hyla.train.parallel`). batched: None follows `compile` (the batched loss is the fast path's, the loop the
    reference's); True asks for it where the twins allow it. whole_twins: the compiled loop compiles each twin
    together with its loss (one function, `compiled_twin_error`) instead of the twin alone; not under FSDP2, whose
    per-twin hooks the loop keeps as they are. cuda_graphs: and replays those functions as CUDA graphs, on one
    process only (the path says so where it cannot)."""
    wanted = compile if batched is None else batched
    if not wanted:
        if compile and whole_twins and not data_parallel_mode.startswith("fsdp"):
            reason = "the per-twin loop, each twin compiled with its loss (align.batched_twins=false)"
            if cuda_graphs and data_parallel_mode != "none":
                cuda_graphs, reason = False, f"{reason}; no CUDA graphs under {data_parallel_mode}"
            loss_fn = functools.partial(alignment_loss, error=compiled_twin_error(cuda_graphs), cuda_graphs=cuda_graphs)
            return AlignmentPath(loss_fn, False, True, reason, whole_twins=True, cuda_graphs=cuda_graphs)
        return AlignmentPath(alignment_loss, False, compile, "the reference path" if not compile
                             else "the per-twin loop, each twin compiled (align.batched_twins=false)")
    obstacle = batching_obstacle(list(twins.twins))
    if obstacle is None and data_parallel_mode.startswith("fsdp"):
        obstacle = "FSDP2 gathers each twin's weights in the twin's own forward, which the batched loss does not call"
    if obstacle is not None:
        return AlignmentPath(alignment_loss, False, compile, obstacle)
    count = f"{len(twins.twins)} Lightning twins of one shape"
    if not compile:
        return AlignmentPath(batched_alignment_loss, True, False, count)
    return AlignmentPath(functools.partial(batched_alignment_loss, errors=compiled_twin_errors()), True, True, count)
