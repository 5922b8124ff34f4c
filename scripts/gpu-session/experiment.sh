#!/usr/bin/env bash
# An experiment plan (`hyla experiment run`, default configs/experiments/smollm2.json) on this project's GPU machine,
# which has no internet, takes at most 64 MiB per call, ends a call after 10 minutes and keeps files ~30 s after it.
# Elsewhere, one command does the whole run: `hyla experiment run PLAN --out RUN --set text=DIR`.
# The machine goes back 30 s after a call ends, and with it the run: send the next call at once (`wait` is always a
# safe next call), and write any other command before the call in flight returns. Every mode but part1, stash and
# start fails at once on a fresh machine instead of waiting for a run that is gone. Device calls sent together in
# one batch run one after the other with no gap: send `start` with two or three `wait` calls behind it (a `wait`
# after the run has ended returns at once), so that nothing between two calls can cost the run (sitting O's first
# attempt lost its run when the session paused between a `start` that returned and the `wait` after it).
#
# Inputs, made here first: `bash scripts/gpu-session/pack_inputs.sh` (the teacher GGUF in three parts of <= 35 MB,
# training text, CSR requests and RULER's essays, wheels); `bash scripts/gpu-session/carry_size.sh` checks each
# call's size against the 64 MiB (the repository travels with every call and grows with each sitting's results).
# Then device calls started back to back:
#   call 1  carry [".gpu-teacher/p0", ".whl"] (+ ".gpu-inputs/a" for plans with a corpus job)   experiment.sh part1
#           (PROBE=0 skips the throughput probe, ~9 minutes)
#   call 2  carry [".gpu-teacher/p1"]                           experiment.sh stash
#   call 3  carry [".gpu-teacher/p2"]                           experiment.sh stash
#   call 4  carry [".gpu-teacher/p3"]                           experiment.sh stash
#   call 5  carry [".gpu-inputs/c1"]                            experiment.sh stash   (recipe plans only)
#   call 6  carry [".gpu-inputs/c2"]                            experiment.sh stash   (recipe plans only)
#   call 7  carry [".gpu-inputs/b"]                             experiment.sh stash   (SMOKE=1 here, if wanted)
#   call 8  carry [".gpu-teacher/p4"]                           experiment.sh start
#   call 9+ (no carry)                                          experiment.sh wait
# (The teacher went in three parts of 35 MB and the text cache in one of 33 MB until the repository reached 28 MiB:
# a call then came within 2.2 MiB of the 64 MiB; in four parts of 25 MB, with c1 and b in one call, until it reached
# 36 MiB. Plans without the text cache skip calls 5 and 6; carry_size.sh checks each call.)
# part1, stash and start keep the teacher parts they carry; `start` joins them in order and checks the sha256. A
# recipe plan (PLAN=configs/experiments/halo-smollm2.json) reads the offline English of `hyla data fetch`
# (.gpu-inputs/c1 and c2: english.tar.xz in two parts, ~33 MB); `start` joins and unpacks it into $keep/textcache.
#
# `part1` keeps teacher part 0 (and .gpu-inputs/a's text) under /root/keep, installs the wheels and (PROBE=1, the default) measures
# each stage's training throughput at this teacher's shape (`hyla bench train`, at most PROBE_TIMEOUT_S=520 s;
# $OUT/probe.json; PROBE_ARGS passes options, e.g. "--cases distill:16x4096 --no-losses"). `start` joins the
# teacher, unpacks the inputs, copies the repository to
# /root/keep/repo and starts `hyla experiment run` there in its own session (it outlives the call), then waits like
# `wait`: up to WAIT_S seconds (default 540; never past CALL_S=600 less REPORT_S=90 from the call's start: a call that
# reaches the device's limit loses the machine) or until the run ends, printing `hyla experiment status` every 2 minutes,
# and writes `hyla experiment report` into $OUT. `restart` stops the runner (it stops its jobs; finished jobs stay
# finished) and starts it again with this call's src/ and configs/. Variables: PLAN (the plan file), PLAN_ARGS (more
# `hyla experiment run` arguments, e.g. "--only csr-main --set niah_samples=10"), DISTILL_SECONDS (the plan's
# distillation tokens from part1's measured throughput: `hyla experiment budget`, at most DISTILL_MAX_TOKENS=80e6;
# plans with a `distill_tokens` variable: a recipe plan's budget is its preset's, scaled by its `token_scale`).
# The plan's `teacher` (or `tokenizer`) is set to the joined GGUF, its `text` to the unpacked text and its
# `text_cache` (recipe plans) to the unpacked offline English.
# `SMOKE=1 ... stash` (after part1, with .gpu-inputs/b carried now or stashed before) also starts the recipe plan's CUDA smoke test
# (tests/experiment/test_smoke_run_gpu.py, toy sizes, over 7 minutes) in the background: it reaches the later stages
# (selection, scaling, the converted model's evaluations) minutes before the real run does, and every `collect`
# prints its jobs ($OUT/smoke.log and smoke-report.txt, each outcome and traceback, at the end). SMOKE_TESTS="FILES"
# runs other GPU test files there instead: correctness tests that need no device call of their own. `patch` copies this call's src/ and configs/ into the run's repository
# without stopping the runner: jobs that start later (the evaluations) run the fix; restart for the running ones.
# AFTER="COMMANDS" (with start, restart, patch or wait): once the run has ended, the call goes on with COMMANDS, at
# most AFTER_S=300 s and what is left of the call's CALL_S=600, once (a later call with the same AFTER skips it):
# the next step needs no call of its own, and leaves no gap in which the machine goes back. The call brings back 7
# files of its own (the report's 6 and logs.tar.gz: runner.log, smoke.log, smoke-report.txt): AFTER may write one more
# under $OUT, or print.
# `WARM=1 ... part1` also starts, in the background, one step of each stage at the recipe's shapes on random weights
# (`hyla bench train --paths fast`, WARM_CASES; WARM_PATHS=fast-whole-blocks for a plan that pins the float32
# teacher; WARM_MIXERS="lightning gla gdn" for a plan that converts with each, in that order, one after the other:
# GLA's first training step once took 286 s of fla autotuning): a fresh machine's compiler and fla's autotuning fill their on-disk
# caches while the teacher check and the data stage run, so each stage's first step reads them instead (sitting C's
# stage-1 first step took 148 s fresh; a warm cache's, 37 s). $keep/warm.log; every `collect` prints its last line.
# `start` stops a warm-up that is still running when the plan's first training job starts (they would share the GPU).
# `args` (here, before a sitting: `PLAN=... PLAN_ARGS=... bash scripts/gpu-session/experiment.sh args`) prints the
# arguments `start` would pass after the plan: the inputs, `--set warm_engine=false` on a GPU under 100 GiB, PLAN_ARGS.
# `hyla ARGS` runs one hyla command with this call's code and part1's wheels (a benchmark after the run, say:
# `bash scripts/gpu-session/experiment.sh hyla bench train --out \$OUT/bench --cases align:128x512`).
set -uo pipefail
keep=/root/keep
run=$keep/run
mode=${1:?usage: experiment.sh part1|stash|start|restart|patch|wait|args|hyla ARGS}
plan=${PLAN:-configs/experiments/smollm2.json}
wait_s=${WAIT_S:-540}
export PYTHONUNBUFFERED=1 PYTHONPATH=$keep/site:$keep/repo/src
# Every Python process writes and reads its bytecode under $keep (sitting O's cProfile of an evaluation process: 9.5
# s of its 35 compiling the sources of torch, transformers and fla, in the run's sixth such process: nothing had been
# cached); the prefix also covers folders the machine mounts read-only.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=$keep/pycache

hyla() { ( cd $keep/repo && python3 -m hyla.cli "$@" ); }

install_wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $keep/site .whl/*.whl
}

runner_alive() { [ -f $run/runner.pid ] && kill -0 "$(cat $run/runner.pid)" 2>/dev/null; }

smoke=$keep/smoke
smoke_tests=${SMOKE_TESTS:-tests/experiment/test_smoke_run_gpu.py}
start_smoke() {  # GPU tests (default: the recipe plan's CUDA smoke test) in a session of their own (they outlive the call)
  rm -rf $smoke && mkdir -p $smoke/tmp && cp -r src tests configs docs bench pyproject.toml README.md $smoke/ || exit 1
  # shellcheck disable=SC2086 # $smoke_tests holds several paths
  ( cd $smoke && TOKENIZERS_PARALLELISM=false HYLA_TEST_REPORT=$keep/smoke-report.txt PYTHONPATH=$keep/site:$smoke/src \
      setsid nohup python3 -m pytest $smoke_tests -m gpu -q -rA --tb=short -p no:cacheprovider \
      --basetemp $smoke/tmp > $keep/smoke.log 2>&1 < /dev/null & )
  echo "GPU tests started in the background: $smoke_tests"
}

smoke_status() {
  [ -f $keep/smoke.log ] || return 0
  local state=finished
  pgrep -f "basetemp $smoke/tmp" >/dev/null && state=running  # (setsid may fork: no pid to keep)
  echo "--- background GPU tests ($state): $(tail -n 1 $keep/smoke.log | cut -c1-200)"
  [ -f $keep/smoke-report.txt ] && grep -E "^(PASSED|FAILED|SKIPPED|ERROR) " $keep/smoke-report.txt | cut -d' ' -f1 \
    | sort | uniq -c | tr '\n' ' ' && echo
  local smoke_run
  smoke_run=$(compgen -G "$smoke/tmp/*/run" | head -n 1)
  [ -n "$smoke_run" ] && hyla experiment status "$smoke_run" 2>/dev/null | head -n 12
}

start_warm() {  # the stages' first steps compiled and autotuned in the background (outlives the call)
  rm -rf $keep/warm && mkdir -p $keep/warm && cp -r src $keep/warm/ || exit 1
  # One `hyla bench train` per mixer of WARM_MIXERS, one after the other, in the order the plan converts them.
  local mixer commands=""
  for mixer in ${WARM_MIXERS:-lightning}; do
    commands+="python3 -m hyla.cli bench train --out $keep/warm/out-$mixer --rnn-mixer $mixer"
    commands+=" --cases ${WARM_CASES:-align:128x512,distill:16x4096,finetune:4x16384} --paths ${WARM_PATHS:-fast}"
    commands+=" --steps 1 --warmup 0 --no-profile --no-losses; "
  done
  ( cd $keep/warm && PYTHONPATH=$keep/site:$keep/warm/src setsid nohup bash -c "$commands" > $keep/warm.log 2>&1 \
      < /dev/null & )
  echo "compile warm-up started in the background (${WARM_MIXERS:-lightning}): $keep/warm.log"
}

stop_warm_at_training() {  # part1's warm-up must not compile beside the plan's first training job
  # Sitting 2 of seed 003: GDN's warm-up was still compiling when the conversion started; the two shared the GPU's
  # memory (the warm-up fell back to 8 rows) and the compile workers' CPUs. A warm-up still running when a training
  # job starts is stopped: from then on the training fills the same caches itself. (`ou[t]`: the pattern does not
  # match this watcher's own command line.)
  pgrep -f "$keep/warm/ou[t]" >/dev/null || return 0
  ( setsid nohup bash -c "
      while pgrep -f '$keep/warm/ou[t]' >/dev/null; do
        if python3 -c 'import json, sys; jobs = json.load(open(\"$run/status.json\"))[\"jobs\"].values(); sys.exit(0 if any(j[\"kind\"] == \"train\" and j[\"state\"] == \"running\" for j in jobs) else 1)' 2>/dev/null; then
          pkill -f '$keep/warm/ou[t]'; echo 'stopped: the plan started a training job' >> $keep/warm.log; break
        fi
        sleep 5
      done" > /dev/null 2>&1 < /dev/null & )
}

warm_status() {
  [ -f $keep/warm.log ] || return 0
  local state=finished
  pgrep -f "$keep/warm/ou[t]" >/dev/null && state=running
  echo "--- compile warm-up ($state): $(grep -v '^\s*$' $keep/warm.log | tail -n 1 | cut -c1-160)"
}

collect() {
  local start=$SECONDS
  # A call that reaches the device's limit loses the machine, and the run with it: the waiting ends WAIT_S after it
  # began or REPORT_S (default 90: status, report, logs) before the call's CALL_S from this script's start, earlier of
  # the two. (Sitting E's `start` with WAIT_S=570 spent 30-76 s before waiting and was killed at 600 s.)
  local deadline=$(( ${CALL_S:-600} - ${REPORT_S:-90} ))
  while [ $((SECONDS - start)) -lt "$wait_s" ] && [ $((SECONDS + 15)) -le "$deadline" ] && runner_alive; do
    sleep 15
    if [ $(( (SECONDS - start) % 120 )) -lt 15 ]; then
      hyla experiment status $run | head -n 3
      nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
      smoke_status | head -n 3
      warm_status
    fi
  done
  runner_alive && echo "the run goes on after $((SECONDS - start)) s of waiting ($SECONDS s into this call): call wait again"
  hyla experiment status $run
  hyla experiment report $run --out "$OUT" 2>&1 | tail -n 60
  smoke_status
  # A call brings back at most 8 files and the report writes 6 (summary.json, report.md, 3 plots, results.tar.xz):
  # the runner's log and the background tests' log and report travel as one more.
  local logs=()
  [ -f $run/runner.log ] && logs+=(run/runner.log)
  [ -f $keep/smoke.log ] && logs+=(smoke.log)
  [ -f $keep/smoke-report.txt ] && logs+=(smoke-report.txt)
  [ ${#logs[@]} -gt 0 ] && tar -czf "$OUT/logs.tar.gz" -C $keep "${logs[@]}"
  # The run is over: this call's remaining minutes go to AFTER, once (a later call with the same AFTER skips it).
  local marker
  marker=$keep/after-$(echo "${AFTER:-}" | md5sum | cut -c1-12)
  if [ -n "${AFTER:-}" ] && ! runner_alive && [ ! -f "$marker" ]; then
    touch "$marker"
    # at most AFTER_S, and never past the call's own limit (CALL_S, the device call's timeout_s, default 600)
    local limit=$(( ${CALL_S:-600} - SECONDS - 20 ))
    [ "$limit" -gt "${AFTER_S:-300}" ] && limit=${AFTER_S:-300}
    echo "--- after the run: $AFTER (at most $limit s)"
    timeout "$limit" bash -c "$AFTER"
  fi
}

# The plan's arguments for this machine's inputs: the GGUF as its teacher or tokenizer, the unpacked text. On a GPU
# of less than 100 GiB (an H100's 79 GiB) a plan's `warm_engine` is switched off: in sitting P (H100) its
# warm-niah job ran out of memory beside the distillation (49 GiB) and part1's warm-up (26 GiB), and a warm-up that
# starts first could as well take the memory from the conversion. PLAN_ARGS, which come after, can set it again.
plan_arguments() {  # $1: the plan file
  local gpu_mib
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
  python3 - "$1" "$keep" "${gpu_mib:-0}" <<'PY'
import json, sys
variables, keep = json.load(open(sys.argv[1])).get("variables", {}), sys.argv[2]
sets = {"teacher": f"{keep}/smol.gguf", "tokenizer": f"{keep}/smol.gguf", "text": f"{keep}/text",
        "text_cache": f"{keep}/textcache"}
arguments = [f"--set {name}={value}" for name, value in sets.items() if name in variables]
gpu_mib = int(sys.argv[3].strip() or 0)
if "warm_engine" in variables and 0 < gpu_mib < 100 * 1024:
    arguments.append("--set warm_engine=false")
    print(f"warm_engine=false: this GPU has {gpu_mib} MiB (< 100 GiB), too little beside the training", file=sys.stderr)
print(" ".join(arguments))
PY
}

launch() {
  mkdir -p $run || exit 1
  local args
  args="$(plan_arguments "$keep/repo/$plan") ${PLAN_ARGS:-}"
  if [ -n "${DISTILL_SECONDS:-}" ]; then  # distillation tokens from part1's measured throughput at this shape
    [ -f $keep/probe.json ] || { echo "error: DISTILL_SECONDS needs part1's probe.json (run part1 with PROBE=1)";
                                 exit 2; }
    # shellcheck disable=SC2086 # $args holds several arguments
    tokens=$(hyla experiment budget "$plan" $args --probe $keep/probe.json --seconds "$DISTILL_SECONDS" \
      --max-tokens "${DISTILL_MAX_TOKENS:-80e6}" | tail -n 1) || exit 1
    echo "distillation budget: $tokens tokens (${DISTILL_SECONDS} s at part1's measured tokens/s)"
    args="$args --set distill_tokens=$tokens"
  fi
  runner_alive || rm -f $run/runner.pid  # a stale lock would end `collect` at once
  cd $keep/repo || exit 1
  # shellcheck disable=SC2086
  setsid nohup python3 -m hyla.cli experiment run "$plan" --out $run $args >> $keep/runner.out 2>&1 < /dev/null &
  local pid=$!
  cd - >/dev/null || exit 1
  # The runner takes its lock (runner.pid) only after its imports, which can take more than 10 s; until then
  # `collect` would see no runner and return at once.
  for _ in $(seq 180); do
    [ -f $run/runner.pid ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  tail -n 3 $keep/runner.out
}

keep_teacher_parts() {  # the teacher's GGUF parts this call carries (.gpu-teacher/pN/smol.partNN), kept for `start`
  local part
  for part in .gpu-teacher/p*/smol.part*; do
    if [ -f "$part" ]; then cp "$part" $keep/ || return 1; fi
  done
}

copy_repository() {
  rm -rf $keep/repo && mkdir -p $keep/repo && cp -r src bench tests configs pyproject.toml $keep/repo/
}

case $mode in
args)  # what `start` would pass to `hyla experiment run` after the plan, on this machine (no GPU: as on a big one)
  [ -f "$plan" ] || { echo "error: no plan file $plan (PLAN)" >&2; exit 2; }
  echo "$(plan_arguments "$plan") ${PLAN_ARGS:-}"
  ;;
part1)
  # .gpu-inputs/a (the text of the plans with a corpus job) is optional: recipe plans read .gpu-inputs/c1, c2 instead.
  # Each step's seconds are printed (sitting K's second part1 took 185 s where the first took 11, on fresh machines).
  mkdir -p $keep && keep_teacher_parts || exit 1
  [ -f $keep/smol.part00 ] || { echo "error: part1 carries the teacher's first part (.gpu-teacher/p0)"; exit 2; }
  if [ -f .gpu-inputs/a/text-a.tar.xz ]; then cp .gpu-inputs/a/text-a.tar.xz $keep/ || exit 1; fi
  ls -l $keep; echo "[part1 +${SECONDS} s] inputs kept"
  nvidia-smi -L; echo "[part1 +${SECONDS} s] nvidia-smi"
  python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__)'
  echo "[part1 +${SECONDS} s] torch and transformers imported"
  install_wheels || exit 1
  echo "[part1 +${SECONDS} s] wheels installed"
  # train.json is rewritten after each case, so a cut run keeps what it measured.
  [ "${WARM:-0}" = 1 ] && start_warm
  # shellcheck disable=SC2086 # PROBE_ARGS holds several arguments
  [ "${PROBE:-1}" = 1 ] && PYTHONPATH=$keep/site:src timeout "${PROBE_TIMEOUT_S:-520}" python3 -m hyla.cli bench train \
    --out "$keep/bench-train" ${PROBE_ARGS:-} 2>&1
  cp "$keep/bench-train/train.json" "$OUT/probe.json" 2>/dev/null && cp "$OUT/probe.json" $keep/ || true
  ;;
stash)  # .gpu-inputs/b and/or the text cache's parts (.gpu-inputs/c1, c2), for `start` to find under $keep; .gpu-inputs/cache/gN: a group of
        # an earlier sitting's compiled kernels and autotuning choices (`bash bench/gpu_cache.sh save` there, then
        # `place` here), one stash call per group, all before `start`: they are unpacked once all have come
  mkdir -p $keep && keep_teacher_parts || exit 1
  bash bench/gpu_cache.sh restore
  for file in .gpu-inputs/b/text-b.tar.xz .gpu-inputs/b/evaldata.tar.xz .gpu-inputs/c/english.tar.xz \
              .gpu-inputs/c[0-9]/english.tar.xz.part[0-9][0-9]; do
    if [ -f $file ]; then cp $file $keep/ || exit 1; fi
  done
  ls -l $keep
  if [ "${SMOKE:-0}" = 1 ]; then
    [ -d $keep/site/fla ] || { echo "error: SMOKE=1 needs part1's wheels"; exit 2; }
    evaldata=.gpu-inputs/b/evaldata.tar.xz  # carried now, or by an earlier stash call
    [ -f $evaldata ] || evaldata=$keep/evaldata.tar.xz
    [ -f $evaldata ] || { echo "error: SMOKE=1 needs .gpu-inputs/b (RULER's data), now or stashed"; exit 2; }
    tar -xJf $evaldata -C $keep/site || exit 1
    start_smoke
  fi
  ;;
start)
  # The parts in order, from part1, the stash calls and this call (pack_inputs.sh: five of <= 20 MB).
  keep_teacher_parts || exit 1
  cat $keep/smol.part[0-9][0-9] > $keep/smol.gguf || exit 1
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $keep/smol.gguf" | sha256sum -c - || exit 1
  # part1 installed the wheels already; carrying them again can put the call over its 64 MiB.
  if compgen -G ".whl/*.whl" >/dev/null; then
    install_wheels || exit 1
  else
    [ -d $keep/site/fla ] || { echo "error: no wheels carried and none installed by part1"; exit 2; }
  fi
  inputs_b=.gpu-inputs/b  # carried now, or by an earlier `stash` call
  [ -f $inputs_b/text-b.tar.xz ] || inputs_b=$keep
  mkdir -p $keep/text
  if [ -f $keep/text-a.tar.xz ]; then tar -xJf $keep/text-a.tar.xz -C $keep/text || exit 1; fi
  tar -xJf $inputs_b/text-b.tar.xz -C $keep/text || exit 1
  tar -xJf $inputs_b/evaldata.tar.xz -C $keep/site || exit 1
  english=.gpu-inputs/c/english.tar.xz  # carried now or stashed (whole, or in parts); only recipe plans read it
  [ -f $english ] || english=$keep/english.tar.xz
  for part in .gpu-inputs/c[0-9]/english.tar.xz.part[0-9][0-9]; do
    if [ -f "$part" ]; then cp "$part" $keep/ || exit 1; fi
  done
  if compgen -G "$keep/english.tar.xz.part[0-9][0-9]" >/dev/null; then
    cat $keep/english.tar.xz.part[0-9][0-9] > $keep/english.tar.xz || exit 1
    english=$keep/english.tar.xz
  fi
  if [ -f $english ]; then mkdir -p $keep/textcache && tar -xJf $english -C $keep/textcache || exit 1; fi
  copy_repository || exit 1
  launch
  stop_warm_at_training
  collect
  ;;
restart)
  [ -d $keep/repo ] || { echo "error: no run on this machine (it was given back); start again"; exit 2; }
  if runner_alive; then kill -TERM "$(cat $run/runner.pid)"; while runner_alive; do sleep 2; done; fi
  rm -rf $keep/repo/src $keep/repo/configs && cp -r src configs $keep/repo/ || exit 1
  launch
  collect
  ;;
patch)
  [ -d $keep/repo ] || { echo "error: no run on this machine (it was given back); start again"; exit 2; }
  cp -r src configs $keep/repo/ || exit 1
  echo "patched $keep/repo with this call's src/ and configs/ (the runner goes on)"
  collect
  ;;
hyla)
  [ -d $keep/site/fla ] || { echo "error: no wheels on this machine (it was given back?); run part1 first"; exit 2; }
  shift
  PYTHONPATH=$keep/site:$PWD/src python3 -m hyla.cli "$@"
  ;;
wait)
  [ -d $run ] || { echo "error: no run on this machine (it was given back); start again"; exit 2; }
  collect
  ;;
*) echo "usage: experiment.sh part1|stash|start|restart|patch|wait|args|hyla ARGS" >&2; exit 2 ;;
esac
