"""Data parallelism: the mode rule (DDP while the replica takes at most half the device, FSDP2 beyond), and the
training step under two gloo processes in every mode: the weights of one process over the global batch, gradients
all-reduced once a step over micro-batches, an out-of-memory on one process halving the micro-batch on both, a
non-finite loss on one process skipping the update (or stopping the run) on both, a checkpoint resumed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hyla.train.parallel import (DDP_MEMORY_SHARE, TRAINABLE_BYTES_PER_PARAM, choose_data_parallel,
                                 device_memory_bytes, replica_bytes)

GIB = 2**30
H200 = 143_771 * 2**20  # an H200's memory as nvidia-smi shows it (143771 MiB)


def test_a_model_that_fits_one_device_comfortably_gets_ddp():
    # SmolLM2-135M distilled: 135M trainable parameters and the 135M-parameter float32 teacher.
    replica = 135_000_000 * TRAINABLE_BYTES_PER_PARAM + 135_000_000 * 4
    choice = choose_data_parallel("auto", world_size=8, replica=replica, device_memory=H200)
    assert choice.mode == "ddp"
    assert choice.describe().startswith("ddp (auto: 2.51 GiB of weights, gradients and optimizer state per process "
                                        "<= 50% of the device's 140.40 GiB")
    assert choice.as_dict()["replica_bytes"] == replica and choice.world_size == 8


def test_a_model_that_does_not_fit_comfortably_gets_fsdp():
    # A 7B student with its 7B bf16 teacher on an 80 GB GPU: 126 GiB, more than the whole device.
    replica = 7_000_000_000 * TRAINABLE_BYTES_PER_PARAM + 7_000_000_000 * 2
    assert choose_data_parallel("auto", world_size=8, replica=replica, device_memory=80 * GIB).mode == "fsdp"
    # A 1.7B student and teacher on an H200: 31.7 GiB of 140.4, DDP; on a 40 GiB A100, FSDP.
    replica = 1_700_000_000 * (TRAINABLE_BYTES_PER_PARAM + 4)
    assert choose_data_parallel("auto", world_size=8, replica=replica, device_memory=H200).mode == "ddp"
    assert choose_data_parallel("auto", world_size=8, replica=replica, device_memory=40 * GIB).mode == "fsdp"


def test_the_limit_is_half_the_device_and_a_set_mode_or_one_process_wins():
    device = 80 * GIB
    limit = int(DDP_MEMORY_SHARE * device)
    assert choose_data_parallel("auto", world_size=2, replica=limit, device_memory=device).mode == "ddp"
    assert choose_data_parallel("auto", world_size=2, replica=limit + 1, device_memory=device).mode == "fsdp"
    for mode in ("ddp", "fsdp", "fsdp-no-reshard"):
        choice = choose_data_parallel(mode, world_size=2, replica=10 * device, device_memory=device)
        assert choice.mode == mode and choice.reason == f"data_parallel={mode}"
    one = choose_data_parallel("fsdp", world_size=1, replica=1, device_memory=device)
    assert one.describe() == "none (one process)"
    with pytest.raises(ValueError, match="must be one of auto, ddp, fsdp, fsdp-no-reshard"):
        choose_data_parallel("zero3", world_size=2, replica=1, device_memory=device)


def test_replica_bytes_count_trainable_states_and_frozen_weights_once():
    student = torch.nn.Linear(10, 10)  # 110 trainable parameters
    student.bias.requires_grad_(False)  # 10 frozen float32
    teacher = torch.nn.Linear(10, 10).to(torch.bfloat16).requires_grad_(False)  # 110 frozen bf16
    expected = 100 * TRAINABLE_BYTES_PER_PARAM + 10 * 4 + 110 * 2
    assert replica_bytes(student, [teacher]) == expected
    assert replica_bytes(student, [teacher, student]) == expected
    assert device_memory_bytes(torch.device("cpu")) > 0


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> list[dict]:
    """tests/parallel_worker.py under torchrun with 2 gloo processes: what each process saw."""
    out = tmp_path_factory.mktemp("parallel")
    worker = Path(__file__).parents[1] / "parallel_worker.py"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(worker), str(out)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert completed.returncode == 0, completed.stderr[-3000:]
    return [json.loads((out / f"{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="module")
def one_process() -> dict:
    """The same steps in this process, over the whole global batch at once."""
    import functools

    from parallel_worker import train

    from hyla.convert.distill import distill_loss
    from hyla.train.distributed import Distributed

    return train(Distributed(), "none", functools.partial(distill_loss, fused=True))


def close(a: list[float], b: list[float], rtol: float) -> bool:
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return bool(((a - b).norm() / b.norm()).item() <= rtol)


# float64 throughout: the modes differ from one process only in summation order (halves of the batch all-reduced,
# micro-batches accumulated), ~1e-16 relative per operation; 1e-10 after 3 steps of AdamW leaves room for that and
# catches any real difference (a missed or doubled gradient reduction changes the weights by ~1e-3).
TOLERANCE = 1e-10
# The loss and gradient norm a step reports are float32 sums: float32 rounding.
REPORTED_TOLERANCE = 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp", "fsdp-no-reshard"])
def test_every_mode_trains_the_weights_of_one_process_with_or_without_micro_batches(two_processes, one_process,
                                                                                   mode):
    for rank_results in two_processes:
        for rows in (4, 1):
            run = rank_results["sync"][f"{mode}/{rows}"]
            assert [o["micro_batch_rows"] for o in run["outcomes"]] == [rows] * 3
            assert close(run["weights"], one_process["weights"], TOLERANCE), (mode, rows)
            for got, expected in zip(run["outcomes"], one_process["outcomes"]):
                assert got["loss"] == pytest.approx(expected["loss"], rel=REPORTED_TOLERANCE)
                assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=REPORTED_TOLERANCE)


@pytest.mark.slow
def test_ddp_reduces_the_gradients_once_a_step_over_micro_batches(two_processes):
    for rank_results in two_processes:
        whole, micro = rank_results["sync"]["ddp/4"], rank_results["sync"]["ddp/1"]
        assert whole["allreduce_calls"] > 0
        # Four micro-batches a step, the first three under no_sync: as many bucket all-reduces as one micro-batch.
        assert micro["allreduce_calls"] == whole["allreduce_calls"]


@pytest.mark.slow
def test_out_of_memory_on_one_process_halves_the_micro_batch_on_both(two_processes, one_process):
    for rank_results in two_processes:
        run = rank_results["oom"]
        assert [o["micro_batch_rows"] for o in run["outcomes"]] == [1] * 3  # 4 and 2 rows fail on process 1
        assert close(run["weights"], one_process["weights"], TOLERANCE)


@pytest.mark.slow
def test_a_non_finite_loss_on_one_process_skips_or_stops_on_both(two_processes):
    skipped = [rank_results["skip"] for rank_results in two_processes]
    for run in skipped:
        assert [o["applied"] for o in run["outcomes"]] == [True, False, True]
    assert skipped[0]["weights"] == skipped[1]["weights"]
    for rank_results in two_processes:
        stopped = rank_results["stop"]
        assert stopped["stopped_at"] == 2 and len(stopped["outcomes"]) == 1


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp", "fsdp-no-reshard"])
def test_every_mode_resumes_from_a_checkpoint_to_the_uninterrupted_weights(two_processes, mode):
    for rank_results in two_processes:
        resumed, uninterrupted = rank_results["resume"][mode], rank_results["sync"][f"{mode}/4"]
        assert len(resumed["outcomes"]) == 2  # steps 2 and 3, after the checkpoint of step 1
        assert resumed["weights"] == uninterrupted["weights"]  # the same arithmetic: bitwise equal
