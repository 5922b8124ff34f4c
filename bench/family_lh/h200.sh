#!/usr/bin/env bash
# One H200 call for the hybrid position family: every GPU test (pytest -m gpu, in parallel workers) beside the
# family-LH experiment (bench/family_lh/run.sh). Results come back under $OUT: gpu-tests.txt, family-lh.log and
# family-lh.tar.gz (summary, settings, commands, step times, logs, evaluation results; no weights, no data).
#
# Prepare here (ignored folders; bash bench/smollm2/pack_inputs.sh makes .whl and .gpu-inputs/b):
#   hyla data prepare --tokenizer smollm2-135m --source TEXT --source stdlib --out .gpu-inputs/lh/corpus \
#     --max-tokens 9000000
#   python -c "from hyla.convert.teacher import load_tokenizer as t; t('smollm2-135m').save_pretrained('.gpu-inputs/lh/tokenizer')"
# Then, as one device call (timeout 600 s), carry [".whl", ".gpu-inputs/b", ".gpu-inputs/lh"]:
#   bash bench/family_lh/h200.sh
# gpu-test-report.txt holds each test outcome and failure traceback as it happens (tests/report_log.py), so a
# test run cut by its time limit still says why its failures failed.
# Environment: LH_* variables pass through to run.sh (LH_DEADLINE_S defaults to 480 there); TESTS_TIMEOUT_S (520),
# TEST_WORKERS (6).
set -uo pipefail
site=/tmp/site lh=/tmp/lh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl/*.whl || exit 1
tar -xJf .gpu-inputs/b/evaldata.tar.xz -C $site || exit 1
export PYTHONPATH=$site:$PWD/src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi -L
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'

( HYLA_TEST_REPORT="$OUT/gpu-test-report.txt" timeout "${TESTS_TIMEOUT_S:-520}" python3 -m pytest tests -m gpu -n "${TEST_WORKERS:-6}" -v -rA --tb=short \
    -p no:cacheprovider >"$OUT/gpu-tests.txt" 2>&1
  echo "pytest exit $?" >>"$OUT/gpu-tests.txt" ) &
tests_pid=$!

# A stuck training shows where it is stuck: hyla prints every thread's stack on SIGUSR1 (into its log).
( for at in 200 330; do sleep $((at - SECONDS)); pkill -USR1 -f "^python3 -m hyla.cli train" || true; done ) &
stacks_pid=$!

LH_TOKENIZER=${LH_TOKENIZER:-$PWD/.gpu-inputs/lh/tokenizer} bash bench/family_lh/run.sh .gpu-inputs/lh/corpus $lh \
  2>&1 | tee "$OUT/family-lh.log"
kill $stacks_pid 2>/dev/null
wait $tests_pid
( cd $lh && tar -czf "$OUT/family-lh.tar.gz" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
    --exclude=checkpoints ./*.json ./*.md ./*.png ./*.sh ./*.tsv ./*.log ./*/*.log ./*/eval-* \
    ./*/stopped-at-step ./*/train/metrics.jsonl ./*/train/model/training.json \
    ./*/train/model/config.json ./data/mix/manifest.json 2>/dev/null )
tail -n 25 "$OUT/gpu-tests.txt"
ls -la "$OUT"
