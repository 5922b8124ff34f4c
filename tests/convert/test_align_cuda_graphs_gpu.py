"""Stage 1's compiled twins replayed as CUDA graphs (`align.cuda_graphs`), on CUDA.

A replay runs the kernels recorded at the second call on whatever the static input buffers hold: a stale input (a
batch copied nowhere, the previous step's teacher recording) or a gradient written to memory the next replay
reuses would give the loss, errors or gradients of another batch. So each step here runs a new random batch through
the replayed path and through the same compiled functions without CUDA graphs (the default path, held to the eager
reference by tests/train/test_fast_path_gpu.py), on the same weights, and compares all three, with whole batches
and with two micro-batches a step; the profile of a replayed step shows the graphs launched, and releasing the
graphs afterwards frees their memory."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hyla.bench.train import SMOLLM2_135M
from hyla.compile import compile_blocks, release_cuda_graphs
from hyla.convert.align import AlignmentTwins, compiled_twin_error
from hyla.convert.align_batched import choose_alignment_path
from hyla.convert.distill import bf16_teacher
from hyla.models.transfer import to_hypenet
from hyla.ops.lightning import chunk_kernel_as_custom_op
from hyla.train.step import training_autocast

pytestmark = pytest.mark.gpu

LAYERS = 4
STEPS = 5  # a warm-up call, a recording, then replays
# The two paths run the same compiled kernels on the same inputs: they differ by the order of atomic additions at
# most (bitwise equal where no kernel uses them). The batches alternate between random tokens and rows of one
# repeated token, whose losses differ by far more (asserted below): a replay of the previous step's inputs would fail.
RTOL = 1e-3


def _step(loss_fn, model, batch, params, micro_batches: int = 1):
    """Loss, per-layer errors (of the last micro-batch) and the gradients accumulated over `micro_batches` parts of
    `batch`, as hyla.train.step.TrainStep accumulates them."""
    rows = batch["input_ids"].shape[0] // micro_batches
    total = 0
    for start in range(0, batch["input_ids"].shape[0], rows):
        with training_autocast(torch.device("cuda")):
            loss, metrics = loss_fn(model, {"input_ids": batch["input_ids"][start:start + rows]})
        (loss / micro_batches).backward()
        total = total + loss.detach().float() / micro_batches
    grads = [p.grad.detach().clone() for p in params]
    for p in params:
        p.grad = None
    errors = torch.stack([metrics[f"mse_{i:02d}"] for i in range(LAYERS)]).float()
    return total, errors, grads


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def test_each_replay_gives_the_loss_errors_and_gradients_of_its_own_batch(request):
    request.addfinalizer(torch._dynamo.reset)
    request.addfinalizer(compiled_twin_error.cache_clear)
    torch.manual_seed(0)
    device = torch.device("cuda")
    hf_teacher = LlamaForCausalLM(LlamaConfig(**dict(SMOLLM2_135M, num_hidden_layers=LAYERS))).to(device).eval()
    base = to_hypenet(hf_teacher, attention_rope=True).to(device).eval()
    teacher = bf16_teacher(base)
    twins = AlignmentTwins.for_training(teacher, hf_teacher, None, device)
    graphs = choose_alignment_path(twins, compile=True, batched=False, whole_twins=True, cuda_graphs=True)
    plain = choose_alignment_path(twins, compile=True, batched=False, whole_twins=True)
    assert graphs.cuda_graphs and not plain.cuda_graphs
    compile_blocks(teacher.model.layers)  # as hyla convert and hyla bench train do
    params = list(twins.parameters())
    generator = torch.Generator(device=device).manual_seed(1)
    losses = []
    # Whole batches, then each batch in two micro-batches (new shapes: recorded anew; the second micro-batch's
    # replays must leave the first one's gradients alone).
    schedule = [1] * STEPS + [2] * STEPS
    with chunk_kernel_as_custom_op(True):
        for step, micro_batches in enumerate(schedule):
            vocab = hf_teacher.config.vocab_size
            if step % 2:  # each row one token repeated: errors unlike those of random tokens
                ids = torch.randint(0, vocab, (4, 1), device=device, generator=generator).expand(4, 256)
            else:
                ids = torch.randint(0, vocab, (4, 256), device=device, generator=generator)
            batch = {"input_ids": ids}
            if step == STEPS - 1:
                activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                with torch.profiler.profile(activities=activities) as profile:
                    replayed = _step(graphs.loss_fn, twins, batch, params)
                launches = sum(event.count for event in profile.key_averages() if event.key == "cudaGraphLaunch")
                assert launches >= 2 * LAYERS, launches  # a forward and a backward graph per twin
            else:
                replayed = _step(graphs.loss_fn, twins, batch, params, micro_batches)
            reference = _step(plain.loss_fn, twins, batch, params, micro_batches)
            assert torch.isfinite(replayed[0])
            assert _relative(replayed[0], reference[0]) <= RTOL, (step, replayed[0], reference[0])
            assert _relative(replayed[1], reference[1]) <= RTOL, (step, replayed[1], reference[1])
            for got, want in zip(replayed[2], reference[2]):
                assert _relative(got, want) <= RTOL, step
            losses.append(reference[0].item())
            with torch.no_grad():  # an update between steps, as training makes: the static weights change in place
                for p, grad in zip(params, reference[2]):
                    p -= 1e-3 * grad
    # Successive batches' losses differ by far more than RTOL: a replay on the previous step's inputs would show.
    assert min(abs(a - b) / b for a, b in zip(losses, losses[1:])) > 10 * RTOL, losses
    del replayed, reference
    torch.cuda.empty_cache()  # what the caching allocator can give back without the graphs
    held = torch.cuda.memory_reserved(device)
    release_cuda_graphs(device)
    assert torch.cuda.memory_reserved(device) < held, held  # the graphs' pool is free again
