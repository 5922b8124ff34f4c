#!/usr/bin/env bash
# Issue 24 on one H200 in one device call (~7 minutes): where `hyla eval niah`'s first 64K prompt goes, and the
# end-to-end speedup of the engine over transformers' generate, without a conversion: a random-weight hybrid of the
# converted 135M shape (bench/random_hybrid_export.py; timings depend on the shapes, not the weights) and SmolLM2's
# tokenizer, with SK2 prompts at 64K from a samples cache built beforehand (`hyla eval niah-samples`).
#   0. bench/attention_first_call.py: cuDNN's and flash's prefill attention at nearby 64K lengths, first and second
#      call each (does every new prompt length pay a cuDNN plan?) (attention/), unless ATTENTION=0;
#   1. a cold run (fresh machine, the COLD variant, default eager-cudnn-padded: what `hyla eval niah` runs on an
#      H200 since 2026-12-06, the shipped settings with their `evaluation` fields; 2 prompts): what a user's first evaluation
#      costs; it fills the compile caches the timed runs then read, as a conversion's machine has them (cold/);
#   1b. bench/first_prefill_probe.py, unless PROBE=0: in one process the engine (the device's evaluation settings)
#      prefills 256, 256, then 64K-long prompts of three lengths, each timed alone, the first short and the first
#      long one profiled: a per-process cost lands on the first 256, a size-bound one on the first 64K (probe/);
#   2. bench/engine_first_call.py, NUM prompts: each of VARIANTS (default: all of the script's) in a fresh process,
#      + the first variant under cProfile on 2 prompts unless PROFILE= (first-call/);
#   3. `hyla eval niah --generation hf` on the same NUM prompts in a fresh process (hf/results.json), unless HF=0:
#      the denominator of every variant's end-to-end ratio (first-call.md has each variant's seconds);
#   3b. with LIKE=CONFIG_JSON (a converted model's config.json: the hybrid of every step takes its layer types, a and
#      epsilon, `bench/random_hybrid_export.py --like`, saved in EXPORT_DTYPE, default bfloat16), `hyla eval niah
#      --generation hf` on the first HF_FIXED (default 4) prompts of the fixed layout's hybrid too (hf-fixed/): does
#      transformers' time depend on the layout?
#   4. `hyla bench loss` (issue 23), if LOSS=1 (default) and the call has time left (loss/).
# Run from the repository root on the GPU machine with $OUT set; carry [".whl", ".gpu-inputs/bench", ".gpu-inputs/b",
# ".gpu-inputs/fc"] (.gpu-inputs/b: RULER's data package, which `hyla eval niah` checks before reading a samples
# cache, since the cache's key hashes RULER's essays), where .gpu-inputs/fc holds tok/ (`python
# bench/random_hybrid_export.py --tokenizer TEACHER.gguf --out .gpu-inputs/fc/tok --no-weights`) and niah-samples/ (`hyla eval niah-samples --tokenizer
# TEACHER.gguf --samples-cache .gpu-inputs/fc/niah-samples --tasks SK2 --lengths 64K --num-samples 25`).
# At most 8 files come back from a call: everything is written under /tmp/first-call-out and packed at the end
# (also when BUDGET_S, default 420 s, runs out: each step runs under what is left of it) into $OUT/all.tar.xz, with
# the tables beside it (attention-attention-first-call.md, cold-first-call.md, probe-first-prefill.md, first-call-first-call.md, first-call-first-call-profile.txt,
# loss-loss.md). Give the device call a limit ~60 s above BUDGET_S: a call cut by its own limit packs nothing.
set -uo pipefail
: "${OUT:?set OUT to the folder that comes back}"
NUM=${NUM:-25}
# step 2's variants (COLD, default shipped: step 1's)
VARIANTS=${VARIANTS:-eager-flash-prefill,eager-flash,eager-cudnn-padded,eager-cudnn-padded-batch8}
HF=${HF:-1}          # step 3
ATTENTION=${ATTENTION:-1}  # step 0
BUDGET_S=${BUDGET_S:-420}
site=/tmp/site
work=/tmp/first-call-out
rm -rf $work && mkdir -p $work
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl/*.whl \
  .gpu-inputs/bench/*.whl || exit 1
tar -xJf .gpu-inputs/b/evaldata.tar.xz -C $site || { echo "error: carry .gpu-inputs/b (RULER's data)"; exit 2; }
export PYTHONPATH=$site:$PWD/src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache  # bytecode written once, read by each later process (also for read-only folders)
log() { echo "[$(date +%T) +$SECONDS s] $*"; }
quiet() { grep -v -E "Warning|warnings.warn" | tail -n "$1"; }
left() { echo $((BUDGET_S - SECONDS > 5 ? BUDGET_S - SECONDS : 5)); }
pack() {
  find $work -name "heatmap*.png" -delete
  for f in attention/attention-first-call.md cold/first-call.md probe/first-prefill.md first-call/first-call.md first-call/first-call-profile.txt loss/loss.md; do
    [ -f "$work/$f" ] && cp "$work/$f" "$OUT/$(echo "$f" | tr / -)"
  done
  tar -cJf "$OUT/all.tar.xz" -C $work . && log "packed $(du -sh "$OUT/all.tar.xz" | cut -f1)"
}
trap pack EXIT
python3 bench/random_hybrid_export.py --tokenizer .gpu-inputs/fc/tok --out /tmp/rm --device cuda \
  --dtype "${EXPORT_DTYPE:-bfloat16}" ${LIKE:+--like "$LIKE"} 2>&1 | tail -n 1
if [ "$ATTENTION" = 1 ]; then
  log "0. attention backends' first call per length"
  timeout "$(left)" python3 bench/attention_first_call.py --out $work/attention 2>&1 | quiet 12
fi
cells=(--model /tmp/rm --samples-cache .gpu-inputs/fc/niah-samples --tasks SK2 --lengths 64K)
log "1. cold run"
timeout "$(left)" python3 bench/engine_first_call.py "${cells[@]}" --num-samples 2 --variants "${COLD:-eager-cudnn-padded}" --out $work/cold 2>&1 | quiet 3
if [ "${PROBE:-1}" = 1 ]; then
  log "1b. first-prefill probe"
  timeout "$(left)" python3 bench/first_prefill_probe.py --model /tmp/rm --profile --out $work/probe 2>&1 | quiet 12
fi
log "2. first call, $NUM prompts"
timeout "$(left)" python3 bench/engine_first_call.py "${cells[@]}" --num-samples "$NUM" --variants "$VARIANTS" ${PROFILE---profile} --out $work/first-call 2>&1 | quiet 8
cat $work/first-call/first-call.md 2>/dev/null | head -n 20
if [ "$HF" = 1 ]; then
  log "3. transformers' generate, $NUM prompts"
  started=$SECONDS
  timeout "$(left)" python3 -m hyla.cli eval niah "${cells[@]}" --out $work/hf --device cuda --dtype bfloat16 \
    --num-samples "$NUM" --batch-size 1 --generation hf 2>&1 | quiet 3
  log "hf: $((SECONDS - started)) s in its process; $(python3 -c "import json,sys; g=json.load(open(sys.argv[1]))['generation']; print({k: g.get(k) for k in ('path', 'seconds', 'first_batch_s', 'calls')})" $work/hf/results.json 2>&1)"
fi
if [ -n "${LIKE:-}" ] && [ "${HF_FIXED:-4}" -gt 0 ]; then
  log "3b. transformers' generate on the fixed layout, ${HF_FIXED:-4} prompts"
  python3 bench/random_hybrid_export.py --tokenizer .gpu-inputs/fc/tok --out /tmp/rm-fixed --device cuda \
    --dtype "${EXPORT_DTYPE:-bfloat16}" 2>&1 | tail -n 1
  timeout "$(left)" python3 -m hyla.cli eval niah --model /tmp/rm-fixed "${cells[@]:2}" --out $work/hf-fixed \
    --device cuda --dtype bfloat16 --num-samples "${HF_FIXED:-4}" --batch-size 1 --generation hf 2>&1 | quiet 3
  log "hf-fixed: $(python3 -c "import json,sys; g=json.load(open(sys.argv[1]))['generation']; print({k: g.get(k) for k in ('path', 'seconds', 'first_batch_s', 'calls')})" $work/hf-fixed/results.json 2>&1)"
fi
if [ "${LOSS:-1}" = 1 ]; then
  log "4. hyla bench loss"
  timeout "$(left)" python3 -m hyla.cli bench loss --out $work/loss 2>&1 | quiet 16
fi
log done
