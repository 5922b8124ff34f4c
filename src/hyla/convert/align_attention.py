"""Attention alignment (an option beyond the paper, `model.align_attention=true`): before distillation, the kept
attention layers, now NoPE with their new output gate, are trained to reproduce the teacher's RoPE attention output
on the teacher's own input to that layer, as stage 1 trains the Lightning twins (MSE per layer, all layers in one
pass, the teacher's activations flowing on unchanged).

Why: removing RoPE is what costs distillation its start. Run 2's distillation began at KL 2.48 with NoPE attention
and at 0.61 with RoPE kept (docs/results/smollm2-135m.md, ablations), and removing RoPE from the kept layers alone
erased the teacher's retrieval at 2K. Aligning each NoPE layer to its RoPE original, locally and cheaply, lets
distillation start from layers that already imitate their teacher as far as NoPE can, instead of relearning that
through the end-to-end KL. It runs inside the distill stage (its own checkpoints and output under
`03-distill/attention-align/`), with its own budget `attn_align` (tokens, shape, lr); the ablation at equal budget
takes those tokens off `distill.tokens`.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from hyla.convert.align import record_mixers

OUTPUT = "attention.safetensors"


class AttentionAlignment(nn.Module):
    """Copies of the student's attention mixers at `layers` (trainable) beside the frozen teacher-equivalent."""

    def __init__(self, teacher: nn.Module, student: nn.Module, layers: list[int]):
        super().__init__()
        self.teacher = [teacher]  # not a submodule: frozen, not saved
        self.layers = sorted(layers)
        self.mixers = nn.ModuleList(copy.deepcopy(student.model.layers[i].mixer) for i in self.layers)
        for param in self.mixers.parameters():
            param.data = param.data.float()
            param.requires_grad_(True)

    def mixer_state(self) -> dict[str, torch.Tensor]:
        """`{layer}.{name}` → tensor, the layout `load_into` reads."""
        return {f"{i}.{k}": v for i, mixer in zip(self.layers, self.mixers) for k, v in mixer.state_dict().items()}


def attention_alignment_loss(model: AttentionAlignment, batch: dict) -> tuple[torch.Tensor, dict]:
    """Sum over the kept layers of MSE(NoPE attention_i(x_i), teacher RoPE attention_i(x_i)); per layer in the
    metrics, with the teacher's output energy beside each."""
    recorder, context = record_mixers(model.teacher[0], batch["input_ids"])
    losses, metrics = [], {}
    for layer, mixer in zip(model.layers, model.mixers):
        target = recorder.outputs[layer].float()
        prediction = mixer(recorder.inputs[layer].to(mixer.q_proj.weight.dtype), context).float()
        losses.append(F.mse_loss(prediction, target))
        metrics[f"mse_{layer:02d}"] = losses[-1].detach()
        metrics[f"energy_{layer:02d}"] = target.pow(2).mean()
    return torch.stack(losses).sum(), metrics


@torch.no_grad()
def load_into(student: nn.Module, path) -> list[int]:
    """Copy aligned attention weights (written by `align_attention_layers`) into the student; the layers set."""
    weights = load_file(str(path))
    layers = sorted({int(key.split(".", 1)[0]) for key in weights})
    for layer in layers:
        prefix = f"{layer}."
        mixer = student.model.layers[layer].mixer
        state = {k[len(prefix):]: v.to(next(mixer.parameters()).dtype) for k, v in weights.items()
                 if k.startswith(prefix)}
        mixer.load_state_dict(state)
    return layers


def relative_errors(metrics: dict, layers: list[int]) -> dict[str, float]:
    return {f"{layer:02d}": metrics[f"mse_{layer:02d}"] / max(metrics[f"energy_{layer:02d}"], 1e-30)
            for layer in layers if f"mse_{layer:02d}" in metrics}


def align_attention_layers(run, stage, student: nn.Module) -> dict:
    """Train the student's attention layers to the teacher's RoPE attention outputs (budget `attn_align`), in
    `stage.path/attention-align`, and load the result into `student`; resumable, skipped once its output exists."""
    from hyla.convert.runners import stage_fast_path, train_budget
    from hyla.train.weights import full_state_dict, save_weights

    folder = stage.path / "attention-align"
    output = folder / OUTPUT
    # The student's softmax attention layers: NoPE, or RoPE under model.attention_rope.
    layers = [i for i, kind in enumerate(student.config.layer_types) if kind in ("attention", "attention_rope")]
    summary = {"layers": layers, "skipped": output.exists()}
    if not output.exists():
        model = AttentionAlignment(run.teacher_equivalent(), student, layers).to(run.env.device)
        budget = run.plan.attn_align
        # No LM head in this loss: nothing to fuse.
        fast = dataclasses.replace(stage_fast_path(run, budget), fused_loss=False)
        result = train_budget(run, folder, "attn-align", model, attention_alignment_loss, budget,
                              list(model.mixers), fast=fast)
        state = {k.removeprefix("mixers."): v for k, v in full_state_dict(model).items()}
        # full_state_dict names the mixers by their position; store them by layer index.
        by_layer = {}
        for key, value in state.items():
            position, name = key.split(".", 1)
            by_layer[f"{layers[int(position)]}.{name}"] = value
        save_weights(by_layer, output, run.env)
        summary.update(steps=result["steps"], tokens=result["tokens"],
                       relative_error_first=relative_errors(result["first"], layers),
                       relative_error_last=relative_errors(result["last"], layers),
                       median_tok_per_s=result["median_tok_per_s"])
    load_into(student, output)
    return summary
