"""The training step: micro-batches give the whole batch's update, the automatic micro-batch halves itself on out of
memory and redoes the step, a non-finite loss or gradient applies no update, the stage losses read nothing back to
the host, and the fast path resolves per device."""

import copy
import functools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hyla.convert.align import AlignmentTwins, alignment_loss
from hyla.convert.distill import StudentWithTeacher, build_student, distill_loss, finetune_loss
from hyla.models.transfer import to_hypenet
from hyla.train.distributed import Distributed
from hyla.train.fast import EAGER, resolve_bf16_activations, resolve_fast_path, resolve_teacher_bf16
from hyla.train.optim import OptimSettings, build_optimizer
from hyla.train.step import TrainStep

VOCAB = 64


@pytest.fixture(scope="module")
def teacher():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).double().eval()


def batch(rows=6, length=17, seed=3):
    ids = torch.randint(0, VOCAB, (rows, length + 1), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}


def pair(teacher, with_teacher=True):
    student = build_student(teacher, [1], None, lightning_rope=True, lightning_qk_norm=True).double().train()
    return StudentWithTeacher(student, to_hypenet(teacher, attention_rope=True).double().eval() if with_teacher
                              else None)


def one_step(model, loss_fn, data, micro_batch_rows=None, lr=1e-2):
    settings = OptimSettings(lr=lr, warmup_steps=0, schedule="constant")
    optimizer, scheduler = build_optimizer(model.parameters(), settings, 10)
    outcome = TrainStep(model, loss_fn, optimizer, scheduler, settings, Distributed(),
                        micro_batch_rows=micro_batch_rows, log=lambda line: None)(data)
    return outcome, [p.detach().clone() for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("fused", [False, True])
def test_micro_batches_give_the_whole_batch_update(teacher, fused):
    model = pair(teacher)
    loss_fn = functools.partial(distill_loss, fused=fused)
    whole, after_whole = one_step(copy.deepcopy(model), loss_fn, batch())
    split, after_split = one_step(copy.deepcopy(model), loss_fn, batch(), micro_batch_rows=4)  # 4 + 2 rows
    assert split.micro_batch_rows == 4 and whole.micro_batch_rows == 6
    # The step reports its loss summed in float32; the gradients and weights stay float64 here.
    assert split.loss == pytest.approx(whole.loss, rel=1e-6)
    assert split.grad_norm == pytest.approx(whole.grad_norm, rel=1e-10)
    assert split.metrics["student_ce"] == pytest.approx(whole.metrics["student_ce"], rel=1e-10)
    for a, b in zip(after_whole, after_split):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_fused_and_plain_losses_give_the_same_step(teacher):
    model = pair(teacher)
    plain = one_step(copy.deepcopy(model), functools.partial(distill_loss, fused=False), batch())[0]
    fused = one_step(copy.deepcopy(model), functools.partial(distill_loss, fused=True), batch())[0]
    # The plain path's loss over materialised logits works in float32 (as on the GPU), the fused one in the inputs'
    # float64: they agree to float32 rounding.
    assert fused.loss == pytest.approx(plain.loss, rel=1e-5)
    assert fused.grad_norm == pytest.approx(plain.grad_norm, rel=1e-5)
    assert fused.metrics["student_ce"] == pytest.approx(plain.metrics["student_ce"], rel=1e-5)
    model = pair(teacher, with_teacher=False)
    plain = one_step(copy.deepcopy(model), functools.partial(finetune_loss, fused=False), batch())[0]
    fused = one_step(copy.deepcopy(model), functools.partial(finetune_loss, fused=True), batch())[0]
    assert fused.loss == pytest.approx(plain.loss, rel=1e-5)


def test_automatic_micro_batch_halves_on_out_of_memory_and_redoes_the_step(teacher):
    model = pair(teacher, with_teacher=False)
    loss_fn = functools.partial(finetune_loss, fused=True)
    calls = []

    def small_memory(model, part):  # "runs out of memory" above 2 rows
        calls.append(part["input_ids"].shape[0])
        if part["input_ids"].shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return loss_fn(model, part)

    expected, after_expected = one_step(copy.deepcopy(model), loss_fn, batch())
    outcome, after = one_step(copy.deepcopy(model), small_memory, batch())
    assert calls == [6, 3, 2, 2, 2] and outcome.micro_batch_rows == 2
    assert outcome.loss == pytest.approx(expected.loss, rel=1e-6)
    for a, b in zip(after_expected, after):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)
    with pytest.raises(torch.OutOfMemoryError):  # a fixed micro-batch is the user's choice: no retry
        one_step(copy.deepcopy(model), small_memory, batch(), micro_batch_rows=3)


def test_a_non_finite_loss_or_gradient_applies_no_update(teacher):
    model = pair(teacher, with_teacher=False)
    before = [p.detach().clone() for p in model.parameters()]

    def nan_loss(model, part):
        loss, metrics = finetune_loss(model, part, fused=True)
        return loss * float("nan"), metrics

    outcome, after = one_step(model, nan_loss, batch())
    assert not outcome.applied
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert all(p.grad is None for p in model.parameters())


def test_stage_losses_read_nothing_back_to_the_host(teacher, monkeypatch):
    """The step's one host read is its own; the losses keep their metrics on the device."""
    def refuse(*args, **kwargs):
        raise AssertionError("a loss read a tensor back to the host")

    equivalent = to_hypenet(teacher, attention_rope=True).double().eval()
    twins = AlignmentTwins(equivalent, teacher).double()
    data = batch()
    cases = [(pair(teacher), functools.partial(distill_loss, fused=True)),
             (pair(teacher), functools.partial(distill_loss, fused=False)),
             (pair(teacher, with_teacher=False), functools.partial(finetune_loss, fused=True)),
             (twins, alignment_loss)]
    for model, loss_fn in cases:
        with monkeypatch.context() as patch:
            for name in ("item", "tolist", "__bool__", "__float__"):
                patch.setattr(torch.Tensor, name, refuse)
            loss, metrics = loss_fn(model, data)
        assert all(isinstance(value, torch.Tensor) for value in metrics.values())
        assert torch.isfinite(loss).item()


def test_fast_path_is_on_by_default_on_cuda_and_the_eager_path_stays_selectable():
    cuda = resolve_fast_path(compile=None, fused_loss=None, fused_optimizer=None, micro_batch_size=None,
                             device=torch.device("cuda"))
    assert cuda.compile and cuda.fused_loss and cuda.fused_optimizer and cuda.micro_batch_size is None
    assert cuda.whole_blocks and "whole" in cuda.describe()
    cpu = resolve_fast_path(compile=None, fused_loss=None, fused_optimizer=None, micro_batch_size=None,
                            device=torch.device("cpu"))
    assert not cpu.compile and cpu.fused_loss and not cpu.fused_optimizer and not cpu.whole_blocks
    # Whole blocks follow compiling unless set; compiled, the blocks can be split again.
    assert resolve_fast_path(compile=True, fused_loss=None, fused_optimizer=None, micro_batch_size=None,
                             device=torch.device("cpu")).whole_blocks
    split = resolve_fast_path(compile=None, fused_loss=None, fused_optimizer=None, micro_batch_size=None,
                              device=torch.device("cuda"), whole_blocks=False)
    assert split.compile and not split.whole_blocks and "split" in split.describe()
    # The frozen teacher's precision: bf16 on CUDA by default, float32 on CPU, either when set.
    assert resolve_teacher_bf16(None, torch.device("cuda")) and not resolve_teacher_bf16(None, torch.device("cpu"))
    assert resolve_teacher_bf16(True, torch.device("cpu")) and not resolve_teacher_bf16(False, torch.device("cuda"))
    # The hybrid's activations (stages 2-3) likewise: bf16 on CUDA, float32 on CPU, either when set.
    assert resolve_bf16_activations(None, torch.device("cuda"))
    assert not resolve_bf16_activations(None, torch.device("cpu"))
    assert resolve_bf16_activations(True, torch.device("cpu"))
    assert not resolve_bf16_activations(False, torch.device("cuda"))
    chosen = resolve_fast_path(compile=False, fused_loss=False, fused_optimizer=False, micro_batch_size=None,
                               device=torch.device("cuda"))
    assert chosen == EAGER
    with pytest.raises(ValueError, match="micro_batch_size"):
        resolve_fast_path(compile=None, fused_loss=None, fused_optimizer=None, micro_batch_size=0,
                          device=torch.device("cpu"))
