#!/usr/bin/env bash
# Issue 24 on one H200 in one device call (<= 8 minutes): generation and evaluation on the inference engine.
#   1. GPU tests (74 of them, ~305 s on a fresh machine in sitting E; at most 360 s): engine generation against
#      transformers' generate (float32, converted SmolLM2-135M shape, 4K-64K, ragged batch with EOS, sampling,
#      model.generate routing, the tuned bf16 settings) and the engine's kernel and decode-step
#      tests after the refactor (tests/inference/test_inference_gpu.py). A failure stops the script.
#   2. `hyla bench generate`: NIAH prompts through the engine and through transformers' generate, side by side, at
#      4K, 16K and 64K on the converted 135M shape (random bf16 weights): seconds per prompt and the speedup.
#   3. `hyla bench model`, the ratio re-measurement of docs/results/speed.md's fifth run (its settings
#      now ship as hyla/inference/tuned/nvidia-h200.json, so it needs no flags):
#      HypeNet-2B and the Qwen3-1.7B shape at 512K, prefill and decode, when the time left allows it (~200 s);
#      otherwise decode only over synthetic caches (and the log says so).
#   4. (only when named in STAGES) `hyla bench generate --rnn-mixer ... --variants ...`: each inference mode's cost on
#      the engine at 64K (4 prompts, batch 1), one random bf16 model of the converted 135M shape per recurrent mixer
#      (Lightning, GDN, GLA; the same 7 attention layers) under direct (no EME, no logit scaling), swla (W = 4K,
#      S = 1K) and swla+log (EME): prefill and decode seconds a prompt, ms a decode step, and the ratios to direct.
#      Every row on the fused-projections decode step (the tuned H200 settings take triton-fused for Lightning
#      without EME only), so that the ratios compare SWLA's work alone. GLA runs last: fla's chunk_gla faulted
#      (misaligned address) in an earlier sitting's ragged-batch test, and a CUDA fault ends the process. At most
#      200 s; generate.json keeps every finished row.
# Run from the repository root on the GPU machine with $OUT set; carry [".whl"] (the fla 0.6.0 wheels), and
# ".gpu-inputs/cache" if an earlier session saved compiled kernels (bench/gpu_cache.sh):
#   bash bench/gpu_generate.sh
#   STAGES=4 bash bench/gpu_generate.sh   # the inference modes at 64K alone
# Brings back (7 files): run.log, tests.txt, generate/generate.{json,md}, model/model.{json,md,png}; stage 4 adds
# variants/generate.{json,md}.
# STAGES=2,3 runs a subset (default 1,2,3); BUDGET_S (default 470) is the whole run's limit; stage 1 alone
# fills most of it (run it as STAGES=1 with BUDGET_S=400, and stages 2,3 in a second call).
set -uo pipefail
: "${OUT:?set OUT to the folder that comes back}"
stages=",${STAGES:-1,2,3},"
budget=${BUDGET_S:-470}
log=$OUT/run.log
say() { echo "== $* ($SECONDS s)" | tee -a "$log"; }
left() { echo $((budget - SECONDS)); }

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { say "cannot install the fla wheels from .whl/ (carry .whl)"; exit 1; }
bash bench/gpu_cache.sh restore 2>&1 | tee -a "$log"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
python3 -c "import torch, triton, transformers, fla, hyla; from hyla.inference import tuned_settings; \
print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, \
'fla', getattr(fla, '__version__', '?'), torch.cuda.get_device_name(), tuned_settings('cuda').summary())" \
  2>&1 | tee -a "$log" || { say "environment check failed"; exit 1; }

if [[ $stages == *,1,* ]]; then
  say "stage 1: GPU tests"
  timeout 360 python3 -m pytest tests/inference/test_generate_gpu.py tests/inference/test_inference_gpu.py -q -m gpu \
    --maxfail=5 --durations=15 -p no:cacheprovider 2>&1 | tee "$OUT/tests.txt" | tail -n 40 | tee -a "$log"
  status=${PIPESTATUS[0]}
  [ "$status" -eq 0 ] || { say "GPU tests failed or timed out (exit $status): stopping"; exit 1; }
fi

if [[ $stages == *,2,* ]]; then
  # 64K first: it is the length the target is set at. The rest of the budget, not a fixed 200 s: on a machine with no
  # compile cache the warm-ups alone took 111 s at 4K (engine 66 s, transformers 45 s; sitting D), and a length
  # whose transformers row is cut off loses its engine row too (generate.json keeps finished lengths).
  limit=$(($(left) - 5))
  say "stage 2: NIAH through the engine and through transformers' generate (at most $limit s)"
  timeout "$limit" python3 -m hyla.cli bench generate --lengths 64K,16K,4K --num-prompts 8,8,8 --batch-sizes 1,4,4 \
    --out "$OUT/generate" 2>&1 | grep -v "^generate:" | tee -a "$log"
  status=${PIPESTATUS[0]}
  [ "$status" -eq 0 ] || { say "bench generate failed or timed out (exit $status): stopping"; exit 1; }
fi

if [[ $stages == *,3,* ]]; then
  remaining=$(left)
  [ "$remaining" -ge 60 ] || { say "stage 3 skipped: $remaining s left"; exit 1; }
  if [ "$remaining" -ge 200 ]; then
    say "stage 3: bench model, 512K prefill and decode, both systems ($remaining s left)"
    args=(--contexts 512K)
  else
    say "stage 3: bench model, 512K decode only over synthetic caches ($remaining s left; prefill did not fit)"
    args=(--contexts 512K --hypenet-max-prefill 1 --qwen3-engine-max-prefill 1)
  fi
  timeout $((remaining - 5)) python3 -m hyla.cli bench model --systems hypenet,qwen3-engine "${args[@]}" \
    --large-batch-contexts "" --out "$OUT/model" 2>&1 | tee -a "$log"
  status=${PIPESTATUS[0]}
  [ "$status" -eq 0 ] || { say "bench model failed or timed out (exit $status; model.json keeps finished systems)"; \
    exit 1; }
fi
if [[ $stages == *,4,* ]]; then
  remaining=$(left)
  [ "$remaining" -ge 60 ] || { say "stage 4 skipped: $remaining s left"; exit 1; }
  limit=$((remaining < 200 ? remaining - 5 : 200))
  say "stage 4: inference modes on the engine at 64K, three recurrent mixers (at most $limit s)"
  timeout "$limit" python3 -m hyla.cli bench generate --lengths 64K --num-prompts 4 --batch-sizes 1 --paths engine \
    --rnn-mixer lightning,gdn,gla --variants direct,swla,swla+log --decode-step fused-projections \
    --out "$OUT/variants" 2>&1 | grep -v "^generate:" | tee -a "$log"
  status=${PIPESTATUS[0]}
  [ "$status" -eq 0 ] || { say "bench generate failed or timed out (exit $status; generate.json keeps its rows)"; \
    exit 1; }
fi
say "done"
