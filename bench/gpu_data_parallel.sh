#!/usr/bin/env bash
# Data-parallel scaling on one host of several GPUs (docs/results/multigpu.md, "To measure"): `hyla bench
# data-parallel` under torchrun on every GPU of the machine, which measures 1, 2, 4, 8 of them (up to the count
# there) at the same batch per GPU, under DDP and FSDP2, for the alignment and distillation steps at the SmolLM2-135M
# shape. More than one 10-minute device call, so the work runs in its own session on the machine (it outlives the
# call) and later calls wait for it:
#   call 1  kind nvidia-h200-x8, carry [".whl"] (the fla wheels)   bash bench/gpu_data_parallel.sh start
#   call 2+ (no carry)                                               bash bench/gpu_data_parallel.sh wait
# First the wrappers' GPU test on one GPU (tests/train/test_parallel_gpu.py: DDP and FSDP2 with the whole fast path
# against the unwrapped fast path), cut at TESTS_TIMEOUT_S (default 300); then the benchmark, whatever the test said.
# Each call waits up to WAIT_S seconds (default 540) and copies what is finished to $OUT: tests.txt, bench.log and
# data-parallel.json / .md / .png (the JSON is rewritten after every measurement, so a cut run keeps what it
# measured). BENCH_ARGS adds options to `hyla bench data-parallel` (e.g. --cases distill:16x512 --modes ddp).
# Stop the work with `bash bench/gpu_data_parallel.sh stop`, never with a pkill pattern (it matches the calling shell).
set -uo pipefail
keep=/root/keep-dp
wait_s=${WAIT_S:-540}

# shellcheck source=bench/gpu_background.sh
source "$(dirname "$0")/gpu_background.sh"

case ${1:-} in
start)
  mkdir -p $keep && rm -rf $keep/repo $keep/out $keep/done && mkdir -p $keep/repo || exit 1
  nvidia-smi -L; python3 -c 'import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)'
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $keep/site .whl/*.whl || exit 1
  cp -r src tests pyproject.toml $keep/repo/ || exit 1
  cd $keep/repo || exit 1
  # NVLink multicast stays off, as the machine sets it, in every process started here.
  export PYTHONPATH=$keep/site:$keep/repo/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1
  gpus=$(nvidia-smi -L | wc -l)
  setsid nohup bash -c "timeout ${TESTS_TIMEOUT_S:-300} python3 -m pytest -rA -m gpu tests/train/test_parallel_gpu.py \
      > $keep/tests.txt 2>&1; \
    python3 -m torch.distributed.run --standalone --nproc-per-node $gpus -m hyla.cli bench data-parallel \
      --out $keep/out ${BENCH_ARGS:-} > $keep/bench.log 2>&1; echo \"exit \$?\" > $keep/done" \
    > /dev/null 2>&1 < /dev/null &
  echo $! > $keep/pid
  sleep 5
  collect $keep/out/data-parallel.json $keep/out/data-parallel.md $keep/out/data-parallel.png
  ;;
wait) collect $keep/out/data-parallel.json $keep/out/data-parallel.md $keep/out/data-parallel.png ;;
stop) kill -- -"$(cat $keep/pid)" && echo "stopped" ;;  # the whole session started by `start`
*) echo "usage: bash bench/gpu_data_parallel.sh start|wait|stop" >&2; exit 2 ;;
esac
