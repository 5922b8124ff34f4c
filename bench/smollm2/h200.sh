#!/usr/bin/env bash
# SmolLM2-135M -> HypeNet on one H200, with evaluation of teacher and hybrids (docs/results/smollm2-135m.md).
# The machine keeps files ~30 s after a call and takes 64 MiB per call, so the work is chained calls started back
# to back (inputs from `bash bench/smollm2/pack_inputs.sh`):
#   call 1  carry [".gpu-teacher/p0", ".gpu-inputs/a", ".whl"]  bash bench/smollm2/h200.sh part1
#   call 2  carry [".gpu-teacher/p1", ".gpu-inputs/b"]          bash bench/smollm2/h200.sh start
#   call 3+ (no carry)                                          bash bench/smollm2/h200.sh wait
# When the repository has grown so that call 2 would pass 64 MiB, send .gpu-inputs/b in a call of its own between
# calls 1 and 2 (`carry [".gpu-inputs/b"]  bash bench/smollm2/h200.sh stash`) and call 2 carries .gpu-teacher/p1
# alone; `start` takes the inputs from either place.
# Each call also sends the repository's tracked files; `bash bench/smollm2/carry_size.sh` checks, here, that calls 1
# and 2 stay under the 64 MiB a call may carry.
# `start` unpacks everything under /root/keep, copies the repository there, starts bench/smollm2/driver.py in its
# own session (it outlives the call) and then waits like `wait`: up to WAIT_S seconds (default 540) or until the
# driver ends, then writes $OUT/summary.json, plots and results.tar.gz (bench/smollm2/summarize.py).
# `part1` also measures each stage's training throughput alone on the GPU at this teacher's shape with random weights
# (bench/smollm2/probe.py, ~2 min, then the same compiled (torch.compile) for distillation and fine-tuning: at most
# PROBE_TIMEOUT_S, default 520 s; $OUT/probe.json); `DISTILL_SECONDS=S bash h200.sh start` then sets the main
# distillation's tokens to what that throughput gives in S seconds (at most DISTILL_MAX_TOKENS, default 80e6).
set -uo pipefail
keep=/root/keep
mode=${1:?usage: h200.sh part1|stash|start|restart|wait}
wait_s=${WAIT_S:-540}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false
# The offline English of `hyla data fetch` (pack_inputs.sh: .gpu-inputs/c/english.tar.xz), for recipe presets.
export HYLA_TEXT_DIR=$keep/textcache

collect() {
  local start=$SECONDS
  while [ $((SECONDS - start)) -lt "$wait_s" ]; do
    if ! pgrep -f "bench/smollm2/driver.py" >/dev/null; then echo "driver finished"; break; fi
    sleep 15
    if [ $(( (SECONDS - start) % 120 )) -lt 15 ]; then tail -n 4 $keep/run/driver.log; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader; fi
  done
  cd $keep/repo && PYTHONPATH=$keep/site:$keep/repo/src python3 bench/smollm2/summarize.py $keep/run "$OUT" 2>&1 | tail -n 60
  cp $keep/run/driver.log "$OUT/" 2>/dev/null
  grep -c "" $keep/run/driver.log; tail -n 25 $keep/run/driver.log
}

# Start the driver in a session of its own (it outlives the call) over $keep/run; $1: extra driver arguments.
launch() {
  mkdir -p $keep/run && cd $keep/repo || exit 1
  # shellcheck disable=SC2086 # $1 holds several arguments
  PYTHONPATH=$keep/site:$keep/repo/src setsid nohup python3 bench/smollm2/driver.py --teacher $keep/smol.gguf \
    --text $keep/text --run $keep/run $1 >> $keep/run/driver.out 2>&1 < /dev/null &
  sleep 5; tail -n 3 $keep/run/driver.out
}

case $mode in
part1)
  mkdir -p $keep && cp .gpu-teacher/p0/smol.part00 .gpu-inputs/a/text-a.tar.xz $keep/ && ls -l $keep
  nvidia-smi -L; python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__)'
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $keep/site .whl/*.whl || exit 1
  # The eager cases come first and probe.json is rewritten after each case, so a cut run keeps what it measured.
  [ "${PROBE:-1}" = 1 ] && PYTHONPATH=$keep/site:src timeout "${PROBE_TIMEOUT_S:-520}" python3 bench/smollm2/probe.py \
    --out "$OUT/probe.json" ${PROBE_ARGS:-} 2>&1  # e.g. PROBE_ARGS="--compiled distill:4x4096" or "--compiled none"
  cp "$OUT/probe.json" $keep/ 2>/dev/null || true  # none with PROBE=0
  ;;
start)
  cat $keep/smol.part00 .gpu-teacher/p1/smol.part01 > $keep/smol.gguf || exit 1
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $keep/smol.gguf" | sha256sum -c - || exit 1
  # part1 installed the wheels already; carrying them again can put the call over its 64 MiB.
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $keep/site .whl/*.whl || exit 1
  else
    [ -d $keep/site/fla ] || { echo "error: no wheels carried and none installed by part1"; exit 2; }
  fi
  inputs_b=.gpu-inputs/b  # carried now, or by an earlier `stash` call
  [ -f $inputs_b/text-b.tar.xz ] || inputs_b=$keep
  mkdir -p $keep/text && tar -xJf $keep/text-a.tar.xz -C $keep/text && tar -xJf $inputs_b/text-b.tar.xz -C $keep/text || exit 1
  tar -xJf $inputs_b/evaldata.tar.xz -C $keep/site || exit 1
  english=.gpu-inputs/c/english.tar.xz  # carried now or stashed; only recipe presets need it
  [ -f $english ] || english=$keep/english.tar.xz
  if [ -f $english ]; then mkdir -p $HYLA_TEXT_DIR && tar -xJf $english -C $HYLA_TEXT_DIR || exit 1; fi
  rm -rf $keep/repo && mkdir -p $keep/repo && cp -r src bench tests configs pyproject.toml $keep/repo/ || exit 1
  args=${DRIVER_ARGS:-}
  if [ -n "${DISTILL_SECONDS:-}" ]; then  # distillation tokens from part1's measured throughput at this shape
    [ -f $keep/probe.json ] || { echo "error: DISTILL_SECONDS needs part1's probe.json (run part1 with PROBE=1)"; exit 2; }
    tokens=$(PYTHONPATH=$keep/site:src python3 bench/smollm2/plan_tokens.py $keep/probe.json "$DISTILL_SECONDS" "${DISTILL_MAX_TOKENS:-80e6}" $args) || exit 1
    echo "distillation budget: $tokens tokens (${DISTILL_SECONDS} s at part1's measured tokens/s)"
    args="$args --main-set distill.tokens=$tokens"
  fi
  launch "$args"  # the GPU tests and family-LH have their own calls: bench/family_lh/h200.sh
  collect
  ;;
stash)  # .gpu-inputs/b (and/or .gpu-inputs/c) sent in a call of its own, for `start` to find under $keep
  mkdir -p $keep || exit 1
  for file in .gpu-inputs/b/text-b.tar.xz .gpu-inputs/b/evaldata.tar.xz .gpu-inputs/c/english.tar.xz; do
    [ -f $file ] && { cp $file $keep/ || exit 1; }
  done
  ls -l $keep
  ;;
restart)  # a new driver (this call's bench/smollm2) over the same run folder: finished jobs stay finished
  pkill -f "bench/smollm2/driver.py"; pkill -f "hyla.cli convert"; sleep 3
  cp -r bench/smollm2 $keep/repo/bench/ || exit 1
  launch "${DRIVER_ARGS:-}"
  collect
  ;;
wait)
  [ -d $keep/run ] || { echo "error: no run on this machine (it was given back); start again"; exit 2; }
  collect
  ;;
*) echo "usage: h200.sh part1|stash|start|restart|wait" >&2; exit 2 ;;
esac
