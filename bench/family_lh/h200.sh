#!/usr/bin/env bash
# The hybrid position family on one H200: its GPU tests, and the family-LH experiment (bench/family_lh/run.sh) as a
# detached job that outlives a device call, so a long training spans chained calls.
#
# Prepare here (ignored folders; bash bench/smollm2/pack_inputs.sh makes .whl and .gpu-inputs/b):
#   hyla data prepare --tokenizer smollm2-135m --source TEXT --source stdlib --out .gpu-inputs/lh/corpus \
#     --max-tokens 9000000
#   python -c "from hyla.convert.teacher import load_tokenizer as t; \
#     t('smollm2-135m').save_pretrained('.gpu-inputs/lh/tokenizer')"
# Then device calls (timeout 600 s), started back to back (the machine keeps files ~30 s after a call):
#   bash bench/family_lh/h200.sh tests   carry [".whl"]                                    GPU tests of the family
#   bash bench/family_lh/h200.sh start   carry [".whl", ".gpu-inputs/b", ".gpu-inputs/lh"]  launch run.sh, then wait
#   bash bench/family_lh/h200.sh wait    (no carry)                                        wait, collect
# `start` and `wait` return after WAIT_S seconds (default 540) or when run.sh ends, with $OUT/family-lh.log and
# $OUT/family-lh.tar.gz (summary, settings, commands, step times, logs, evaluation results; no weights, no data).
# LH_* variables pass through to run.sh; for a run longer than one call set LH_DEADLINE_S (e.g. 1500) and call
# `wait` until it ends (RUN_ARGS=--smoke rehearses `start` on a CPU machine). `tests` runs TESTS (default: the
# family's GPU test files and the inference GPU tests) in TEST_WORKERS (8) xdist workers for at most
# TESTS_TIMEOUT_S (540) seconds; $OUT/gpu-test-report.txt holds each outcome and failure traceback as it happens
# (tests/report_log.py), so a run cut by its limit still says why. Add ".gpu-inputs/cache" to the first call's
# carry when an earlier session saved its compiled kernels (bench/gpu_cache.sh).
set -uo pipefail
keep=/root/keep-lh site=/root/keep-lh/site lh=/root/keep-lh/run
mode=${1:?usage: h200.sh tests|start|wait}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

install() {
  mkdir -p $keep
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl/*.whl || exit 1
  bash bench/gpu_cache.sh restore  # an earlier session's compiled kernels, if carried
  nvidia-smi -L
  PYTHONPATH=$site python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton",
    triton.__version__, "transformers", transformers.__version__)'
}

collect() {
  local start=$SECONDS
  while [ $((SECONDS - start)) -lt "${WAIT_S:-540}" ] && pgrep -f "bench/family_lh/run.sh" >/dev/null; do
    sleep 10
  done
  pgrep -f "bench/family_lh/run.sh" >/dev/null && echo "run.sh still running after ${WAIT_S:-540} s: call wait again"
  cp $keep/run.out "$OUT/family-lh.log" 2>/dev/null
  tail -n 40 $keep/run.out
  ( cd $lh && tar -czf "$OUT/family-lh.tar.gz" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
      --exclude=checkpoints ./*.json ./*.md ./*.png ./*.sh ./*.tsv ./*.log ./*/*.log ./*/eval-* ./*/stopped-at-step \
      ./*/train/metrics.jsonl ./*/train/model/training.json ./*/train/model/config.json ./data/mix/manifest.json \
      2>/dev/null )
  ls -la "$OUT"
}

case $mode in
tests)
  install
  export PYTHONPATH=$site:$PWD/src
  # shellcheck disable=SC2086 # TESTS holds several paths
  HYLA_TEST_REPORT="$OUT/gpu-test-report.txt" timeout "${TESTS_TIMEOUT_S:-540}" python3 -m pytest \
    ${TESTS:-tests/ops/test_gla_gdn_swa_gpu.py tests/models/test_family_gpu.py tests/inference/test_inference_gpu.py} \
    -m gpu -n "${TEST_WORKERS:-8}" -v -rA --tb=short -p no:cacheprovider >"$OUT/gpu-tests.txt" 2>&1
  echo "pytest exit $?" | tee -a "$OUT/gpu-tests.txt"
  grep -E "^(PASSED|FAILED|SKIPPED|ERROR) " "$OUT/gpu-test-report.txt" | cut -d' ' -f1 | sort | uniq -c
  grep -A30 "^FAILED \|^ERROR " "$OUT/gpu-test-report.txt" | head -n 120
  ;;
start)
  install
  tar -xJf .gpu-inputs/b/evaldata.tar.xz -C $site || exit 1
  rm -rf $keep/repo $keep/inputs && mkdir -p $keep/repo $keep/inputs || exit 1
  cp -r src bench tests configs pyproject.toml $keep/repo/ && cp -r .gpu-inputs/lh/corpus .gpu-inputs/lh/tokenizer \
    $keep/inputs/ || exit 1
  cd $keep/repo || exit 1
  LH_TOKENIZER=${LH_TOKENIZER:-$keep/inputs/tokenizer} PYTHONPATH=$site:$keep/repo/src setsid nohup \
    bash bench/family_lh/run.sh $keep/inputs/corpus $lh ${RUN_ARGS:-} >>$keep/run.out 2>&1 </dev/null &
  sleep 5; tail -n 3 $keep/run.out
  cd - >/dev/null && collect
  ;;
wait)
  [ -f $keep/run.out ] || { echo "error: no family-LH run on this machine (it was given back); start again"; exit 2; }
  collect
  ;;
*) echo "usage: h200.sh tests|start|wait" >&2; exit 2 ;;
esac
