#!/usr/bin/env bash
# Training speed on one H200 (docs/results/train-speed.md): the fast path's GPU tests, then `hyla bench train` at
# the SmolLM2-135M shape. More than one 10-minute device call, so the work runs in its own session on the machine
# (it outlives the call) and a second call, started as soon as the first returns, waits for it:
#   call 1  carry [".whl"] (the fla wheels)   bash bench/gpu_train.sh start
#   call 2  (no carry)                         bash bench/gpu_train.sh wait
# Both wait up to WAIT_S seconds (default 540) and copy what is finished to $OUT: tests.txt, bench.log and
# train.json / train.md / train.png. BENCH_ARGS adds options to `hyla bench train`.
# The tests are the fast path's own (the fused losses on CUDA, 30-step loss curves of each stage both ways) and are
# cut at TESTS_TIMEOUT_S (default 300): on 2026-12-01 a run that also took the Lightning and model GPU tests spent
# over 16 minutes on them (fla autotunes its kernels for every new shape) and the benchmark never started.
# Stop the work with `bash bench/gpu_train.sh stop`, never with a pkill pattern (it matches the calling shell).
set -uo pipefail
keep=/root/keep
wait_s=${WAIT_S:-540}

# shellcheck source=bench/gpu_background.sh
source "$(dirname "$0")/gpu_background.sh"

case ${1:-} in
start)
  mkdir -p $keep && rm -rf $keep/repo $keep/done && mkdir -p $keep/repo || exit 1
  nvidia-smi -L; python3 -c 'import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)'
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $keep/site .whl/*.whl || exit 1
  cp -r src tests pyproject.toml $keep/repo/ || exit 1
  cd $keep/repo || exit 1
  export PYTHONPATH=$keep/site:$keep/repo/src PYTHONUNBUFFERED=1
  # Correctness first: the fused losses and the 30-step loss curves both ways, and the Lightning kernels and model
  # the fast path calls into; then the benchmark, whatever the tests said (the report says both).
  setsid nohup bash -c "timeout ${TESTS_TIMEOUT_S:-300} python3 -m pytest -rA -m gpu \
      tests/ops/test_linear_loss_gpu.py tests/train/test_fast_path_gpu.py > $keep/tests.txt 2>&1; \
    python3 -m hyla.cli bench train --out $keep/bench-train ${BENCH_ARGS:-} > $keep/bench.log 2>&1; \
    echo \"exit \$?\" > $keep/done" > /dev/null 2>&1 < /dev/null &
  echo $! > $keep/pid
  sleep 5
  collect $keep/bench-train/train.json $keep/bench-train/train.md $keep/bench-train/train.png
  ;;
wait) collect $keep/bench-train/train.json $keep/bench-train/train.md $keep/bench-train/train.png ;;
stop) kill -- -"$(cat $keep/pid)" && echo "stopped" ;;  # the whole session started by `start`
*) echo "usage: bash bench/gpu_train.sh start|wait|stop" >&2; exit 2 ;;
esac
