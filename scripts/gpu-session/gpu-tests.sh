#!/usr/bin/env bash
# GPU tests on this project's GPU machine (no internet): one device call with carry [".whl"] (the fla wheels and
# what else the image lacks; add ".gpu-inputs/b" for RULER's data, which the NIAH tests need, and a group of
# ".gpu-inputs/cache" when an earlier session saved its compiled kernels: bench/gpu_cache.sh).
#   bash scripts/gpu-session/gpu-tests.sh
# TESTS: the test files (default: every file with GPU tests); TEST_WORKERS (8) xdist workers, `--dist loadgroup`:
# tests marked with one `xdist_group` run on one worker, one after another (the engine tests group those that
# autotune the same fla kernels, tests/inference/test_engine_mixers_gpu.py), the others as they come. pytest-xdist
# 3.8 groups by renaming the tests (`name@group` in the report); under pytest 9.2, which no longer takes the new
# name, the groups are silently ignored (the image has 9.1.1). At most TESTS_TIMEOUT_S (540) seconds.
# $OUT/gpu-test-report.txt holds each outcome and failure traceback as it happens (tests/report_log.py), so a run
# cut by its limit still says why; $OUT/gpu-tests.txt is pytest's own output.
# The lm-eval bridge's GPU test (the image has no lm-eval): carry [".whl", ".gpu-inputs/lmeval"] (the wheels of
# `bash scripts/gpu-session/pack_inputs.sh lmeval`, installed with the others) and run
#   TESTS=tests/evals/test_lm_eval_bridge_gpu.py TEST_WORKERS=1 bash scripts/gpu-session/gpu-tests.sh
set -uo pipefail
site=/root/keep-tests/site
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p $site
wheels=(.whl/*.whl)
# lm-eval-harness and the packages it needs that the image lacks, when .gpu-inputs/lmeval is carried. One install:
# a second --upgrade into the same target would replace the first one's bin/.
if [ -d .gpu-inputs/lmeval ]; then wheels+=(.gpu-inputs/lmeval/*.whl); fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site "${wheels[@]}" \
  || exit 1
# RULER's data package (NIAH), when .gpu-inputs/b (scripts/gpu-session/pack_inputs.sh) is carried too.
if [ -f .gpu-inputs/b/evaldata.tar.xz ]; then tar -xJf .gpu-inputs/b/evaldata.tar.xz -C $site || exit 1; fi
bash bench/gpu_cache.sh restore  # an earlier session's compiled kernels, if carried
nvidia-smi -L
export PYTHONPATH=$site:$PWD/src
python3 -c 'import torch, triton, transformers, pytest, xdist; print("torch", torch.__version__, "triton",
  triton.__version__, "transformers", transformers.__version__, "pytest", pytest.__version__, "xdist",
  xdist.__version__)'
tests=${TESTS:-$(grep -rl "pytest.mark.gpu\|pytestmark = pytest.mark.gpu" tests --include="*.py" | sort | tr '\n' ' ')}
# shellcheck disable=SC2086 # $tests holds several paths
HYLA_TEST_REPORT="$OUT/gpu-test-report.txt" timeout "${TESTS_TIMEOUT_S:-540}" python3 -m pytest $tests \
  -m gpu -n "${TEST_WORKERS:-8}" --dist loadgroup -v -rA --tb=short -p no:cacheprovider >"$OUT/gpu-tests.txt" 2>&1
status=$?
echo "pytest exit $status" | tee -a "$OUT/gpu-tests.txt"
grep -E "^(PASSED|FAILED|SKIPPED|ERROR) " "$OUT/gpu-test-report.txt" | cut -d' ' -f1 | sort | uniq -c
grep -A30 "^FAILED \|^ERROR " "$OUT/gpu-test-report.txt" | head -n 120
exit $status  # pytest's outcome (the greps above end with 1 when nothing failed)
