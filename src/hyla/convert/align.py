"""Stage 1, alignment: every layer gets a twin built from its attention weights (Lightning, or the plan's
`model.rnn_mixer`: GLA, GDN, SWA), trained with MSE against the attention output on the teacher's own input to that
layer. All twins train in one pass while the teacher's activations flow on unchanged; only the twins have
gradients."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from hyla.models import HypeNetForCausalLM
from hyla.models.transfer import TWIN_BUILDERS


class AlignmentTwins(nn.Module):
    """The trainable twins, one per layer (a ModuleList, so that optimizer, checkpoint and FSDP treat them as a
    model)."""

    def __init__(self, teacher: HypeNetForCausalLM, hf_teacher: nn.Module, config=None, *,
                 rnn_mixer: str = "lightning"):
        """`config`: what the twins are built with (default: the teacher-equivalent's, Lightning defaults);
        `rnn_mixer`: their kind, a key of `hyla.models.transfer.TWIN_BUILDERS`."""
        super().__init__()
        self.teacher = [teacher]  # not a submodule: frozen, not saved with the twins
        config = config if config is not None else teacher.config
        build = TWIN_BUILDERS[rnn_mixer]
        self.twins = nn.ModuleList(build(layer.self_attn, config, i) for i, layer in enumerate(hf_teacher.model.layers))

    @classmethod
    def for_training(cls, teacher: HypeNetForCausalLM, hf_teacher: nn.Module, config, device, *,
                     rnn_mixer: str = "lightning") -> AlignmentTwins:
        """The twins as stage 1 trains them: on `device`, float32 master weights."""
        twins = cls(teacher, hf_teacher, config, rnn_mixer=rnn_mixer).to(device)
        for param in twins.parameters():
            param.data = param.data.float()
        return twins

    def twin_state_dict(self) -> dict[str, torch.Tensor]:
        return {f"{i}.{k}": v for i, twin in enumerate(self.twins) for k, v in twin.state_dict().items()}


class MixerRecording:
    """Every block's mixer input and output from one pass of the teacher's decoder stack (`record_mixers`)."""

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]):
        self.inputs = {i: pair[0] for i, pair in enumerate(pairs)}
        self.outputs = {i: pair[1] for i, pair in enumerate(pairs)}


def record_mixers(teacher: HypeNetForCausalLM, input_ids: torch.Tensor):
    """One no-grad pass of the teacher's decoder stack (the recorded mixers are all the alignment needs; the LM
    head's logits would be the largest tensor of the step): every mixer's input and output, recorded by the blocks
    themselves (compiled blocks too), and the mixers' context for the same tokens."""
    model = teacher.model
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    with torch.no_grad():
        hidden_states = model.embed_tokens(input_ids)
        context = model._context(hidden_states, None, None, None, None, model.inference_options)
        for block in model.layers:
            # A new list for every block: a compiled block guards on the length of the list it appends to, so one
            # list growing from block to block would compile the teacher's block once per layer.
            recorded: list[tuple[torch.Tensor, torch.Tensor]] = []
            hidden_states = block(hidden_states, context, recorded)
            pairs.extend(recorded)
    return MixerRecording(pairs), model._context(pairs[0][0], None, None, None, None)


def compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype a twin's matmuls run in: autocast's where it is on (a bf16 teacher's recording goes in as it is),
    else the twin's own."""
    device_type = weight.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype


def twin_error(twin: nn.Module, mixer_input: torch.Tensor, target: torch.Tensor,
               context) -> tuple[torch.Tensor, torch.Tensor]:
    """One twin's MSE against the teacher's mixer output on the teacher's mixer input, and the target's energy (mean
    square), float32 scalars; compiled whole by the fast path (`compiled_twin_error`)."""
    prediction = twin(mixer_input.to(compute_dtype(twin.q_proj.weight)), context)
    target = target.float()
    return F.mse_loss(prediction.float(), target), target.pow(2).mean()


@functools.cache
def compiled_twin_error(cuda_graphs: bool = False) -> Callable:
    """`twin_error` under torch.compile with static shapes: the twin and its loss in one graph, shared by every twin
    of one kind (made on first use: nothing at import). cuda_graphs: in mode "reduce-overhead", where each call's
    forward and backward graphs are recorded once as CUDA graphs (torch's CUDA graph trees: one recording per twin,
    their parameters are static inputs) and then replayed, one launch each."""
    return torch.compile(twin_error, dynamic=False, **({"mode": "reduce-overhead"} if cuda_graphs else {}))


def alignment_loss(model: AlignmentTwins, batch: dict, *, error: Callable = twin_error,
                   cuda_graphs: bool = False) -> tuple[torch.Tensor, dict]:
    """Sum over layers of MSE(twin_i(x_i), attention_i(x_i)); per-layer values in the metrics (tensors: the training
    step reads them back once), with the teacher's output energy (mean square) of each layer beside them, so that
    `mse_i / energy_i` is the fraction of the output the twin misses. error: `twin_error` or its compiled form.
    cuda_graphs: the error is replayed as CUDA graphs (`compiled_twin_error`); the call starts a new step of
    torch's CUDA graph trees, which keep every output of the graphs of one step until the next. A step's later
    micro-batches copy the gradients accumulated so far first: autograd keeps a parameter's first gradient as it
    comes, here an output of a graph, which the next replay overwrites (torch's CUDA graph trees do not guard
    gradient accumulation)."""
    if cuda_graphs:
        for param in model.twins.parameters():
            if param.grad is not None:
                param.grad = param.grad.clone()
        torch.compiler.cudagraph_mark_step_begin()
    recorder, context = record_mixers(model.teacher[0], batch["input_ids"])
    losses, energies = [], []
    for i, twin in enumerate(model.twins):
        loss, energy = error(twin, recorder.inputs[i], recorder.outputs[i], context)
        losses.append(loss)
        energies.append(energy)
    per_layer = torch.stack(losses)
    metrics = {f"mse_{i:02d}": loss for i, loss in enumerate(per_layer.detach())}
    metrics.update({f"energy_{i:02d}": energy for i, energy in enumerate(torch.stack(energies))})
    return per_layer.sum(), metrics
