#!/usr/bin/env bash
# The speed benchmarks on one H200, in stages that each fit one 10-minute device call.
# On the GPU machine, from the repository root, with the fla wheels in .whl/ (carry: [".whl"], and
# ".gpu-inputs/cache" when an earlier session saved its compiled kernels: bench/gpu_cache.sh) and $OUT set:
#   bash bench/h200_speed.sh a   # gate: Triton decode + fused chunk attention tests; then HypeNet-2B (~5 min)
#   bash bench/h200_speed.sh b   # the Qwen3-1.7B shape: hyla engine, HF StaticCache+graph, HF default (~5 min;
#                                # SYSTEMS=... picks systems, CONTEXTS=32K,512K contexts)
#   bash bench/h200_speed.sh c   # mixer kernels, 4K..1M, forward and forward+backward (~3 min)
#   bash bench/h200_speed.sh d   # one decode step kernel by kernel: HypeNet at 8K and 512K (plain and with fused
#                                # projections), Qwen3 shape at 512K
#   bash bench/h200_speed.sh e   # prefill: the last 64K chunk of a 512K prompt kernel by kernel, HypeNet and the
#                                # Qwen3 shape, eager and with --compile-prefill; then both systems at 512K with
#                                # --compile-prefill (~8 min)
#   bash bench/h200_speed.sh f   # decode A/B of torch.compile's mode for the decode blocks (default vs
#                                # max-autotune-no-cudagraphs), HypeNet fused and the Qwen3 shape at 8K and 512K
#                                # over synthetic caches, then the autotuned HypeNet step profiled at 512K (~8 min)
#   bash bench/h200_speed.sh g   # every target from one run, fast settings on both systems: HypeNet and the Qwen3
#                                # shape at 512K with --compile-prefill --fuse-projections --matvec triton-fused
#                                # (the committed table), three timed 512K
#                                # prefills each (--long-prefill-repeats 3), batch 32 at 32K (~7 min, estimate)
#   bash bench/h200_speed.sh h   # the decode attention kernel's launch settings (block, warps, stages, programs
#                                # per SM), each checked then timed at 32K/128K/512K and B=32 at 32K (~3 min)
#   bash bench/h200_speed.sh i   # decode only, over synthetic caches, with fused projections: HypeNet and the Qwen3
#                                # shape at 128K and 512K, batch 1, and batch 32 at 32K (~4 min)
#   bash bench/h200_speed.sh j   # batch-1 matrix-vector products: the Triton kernel's GPU tests, then cuBLAS vs the
#                                # kernel in 36 settings on every shape of a decode step (bench/matvec_sweep.py),
#                                # then HypeNet's 512K step profiled with the kernel where the sweep found it faster
#   bash bench/h200_speed.sh k   # stage i's decode with --matvec triton (MATVEC=triton-fused: the fused kernels)
#                                # and --matvec-table (MATVEC_TABLE=..., default: the committed H200 sweep)
#   bash bench/h200_speed.sh m   # the fused decode kernels' launch settings (bench/fused_sweep.py; a --matvec-table)
#   bash bench/h200_speed.sh l   # the fused decode kernels' GPU tests, then HypeNet's and the Qwen3 shape's 512K
#                                # steps profiled with --matvec triton-fused
#   bash bench/h200_speed.sh o   # stage m's sweep with programmatic dependent launch (--pdl), then both systems'
#                                # 512K decode with that table and, for the A/B, with the committed one
#   bash bench/h200_speed.sh p   # the Lightning step's GPU tests and its sweep with --pdl (state read before the
#                                # wait or not), then stage g (~8 min)
#   bash bench/h200_speed.sh n   # programmatic dependent launch: the fused kernels' GPU tests (each with and
#                                # without it, and a decode bitwise-equal either way), then stage k's decode with it
#                                # (the default on this GPU), then both systems at 512K with --no-pdl (the A/B)
# A call brings back at most 8 files: each stage leaves its log and one $OUT/<stage>.tar.gz of its result folders.
# The A/B of fused decode projections in one run: SYSTEMS=hypenet,hypenet-fused,qwen3-engine bash bench/h200_speed.sh b
# Then, here (after unpacking each stage's archive): hyla bench report hypenet/model.json qwen3/model.json \
#   --out docs/results/speed/<date>
# Add --no-compile to the model commands if torch.compile of the decode blocks is too slow on a cold machine.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
bash bench/gpu_cache.sh restore  # an earlier session's compiled kernels, if carried
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
# Since issue 24 the engine's defaults are the tuned settings shipped for the GPU (hyla/inference/tuned/, for the H200
# stage o's sweep table, the fifth run's settings): the stages below were rewritten for that (--fuse-projections ->
# --decode-step fused-projections; --matvec triton-fused --matvec-table T -> the defaults, or SETTINGS=FILE for
# --engine-settings FILE, a `hyla bench sweep` settings.json); the bench/*_sweep.py scripts are `hyla bench sweep`.
pack() {  # pack STAGE FOLDER...: one archive per stage, whatever the number of files the stage wrote
  local stage=$1; shift
  (cd "$OUT" && tar -czf "$stage.tar.gz" "$@" && rm -rf "$@") 2>/dev/null
}
case "$1" in
  a)
    HYLA_TEST_REPORT=$OUT/gate-report.txt python3 -m pytest tests/inference/test_inference_gpu.py -q -m gpu -x \
      -k "triton or fused" 2>&1 | tee $OUT/gate.txt || exit 1
    python3 -m hyla.cli bench model --systems hypenet --out $OUT/hypenet 2>&1 | tee $OUT/hypenet.log
    pack a hypenet ;;
  b)
    python3 -m hyla.cli bench model --systems "${SYSTEMS:-qwen3-engine,qwen3-hf-graph,qwen3-hf-default}" \
      ${CONTEXTS:+--contexts "$CONTEXTS"} --out $OUT/qwen3 2>&1 | tee $OUT/qwen3.log
    pack b qwen3 ;;
  c)
    python3 -m hyla.cli bench kernels --out $OUT/kernels 2>&1 | tee $OUT/kernels.log
    pack c kernels ;;
  d)
    for spec in "hypenet 8K" "hypenet 512K" "hypenet 512K --decode-step fused-projections" "qwen3-engine 512K"; do
      set -- $spec
      python3 -m hyla.cli bench profile --system "$1" --context "$2" ${3:-} --out $OUT/profile 2>&1 \
        | tee -a $OUT/profile.log
    done
    pack d profile ;;
  e)
    for spec in "hypenet" "hypenet --compile-prefill" "qwen3-engine" "qwen3-engine --compile-prefill"; do
      set -- $spec
      python3 -m hyla.cli bench profile --phase prefill --system "$1" --context 448K --chunk 64K ${2:-} \
        --out $OUT/prefill-profile 2>&1 | tee -a $OUT/prefill-profile.log
    done
    python3 -m hyla.cli bench model --systems hypenet,qwen3-engine --contexts 512K --large-batch-contexts 32K \
      --compile-prefill --out $OUT/compiled-prefill 2>&1 | tee $OUT/compiled-prefill.log
    pack e prefill-profile compiled-prefill ;;
  f)
    for mode in default max-autotune-no-cudagraphs; do
      python3 -m hyla.cli bench model --systems hypenet-fused,qwen3-engine --contexts 8K,512K \
        --hypenet-max-prefill 1 --qwen3-engine-max-prefill 1 --large-batch-contexts 32K --compile-mode $mode \
        --out $OUT/decode-$mode 2>&1 | tee -a $OUT/compile-mode.log
    done
    python3 -m hyla.cli bench profile --system hypenet --context 512K --decode-step fused-projections \
      --compile-mode max-autotune-no-cudagraphs --out $OUT/profile 2>&1 | tee -a $OUT/compile-mode.log
    pack f decode-default decode-max-autotune-no-cudagraphs profile ;;
  g)
    python3 -m hyla.cli bench model --systems hypenet,qwen3-engine --contexts 512K --large-batch-contexts 32K \
      --compile-prefill ${SETTINGS:+--engine-settings "$SETTINGS"} \
      --long-prefill-repeats 3 --out $OUT/fast 2>&1 | tee $OUT/fast.log
    pack g fast ;;
  h)
    python3 -m hyla.cli bench sweep decode-attention --out $OUT/sweep 2>&1 | tee $OUT/sweep.log
    pack h sweep ;;
  i)
    python3 -m hyla.cli bench model --systems hypenet,qwen3-engine --contexts 128K,512K --hypenet-max-prefill 1 \
      --qwen3-engine-max-prefill 1 --large-batch-contexts 32K --decode-step fused-projections --out $OUT/decode 2>&1 \
      | tee $OUT/decode.log
    pack i decode ;;
  j)  # SKIP_TESTS=1: the kernel's GPU tests passed already in this version
    if [ -z "${SKIP_TESTS:-}" ]; then
      python3 -m pytest tests/inference/test_inference_gpu.py -q -m gpu -k matvec 2>&1 | tee $OUT/matvec-test.txt \
        | tail -n 3 || exit 1
    fi
    python3 -m hyla.cli bench sweep matvec --out $OUT/matvec 2>&1 | tee $OUT/matvec.log || exit 1
    python3 -m hyla.cli bench profile --system hypenet --context 512K --decode-step fused-projections --matvec triton \
      --engine-settings $OUT/matvec/settings.json --out $OUT/profile 2>&1 | tee $OUT/profile.log
    pack j matvec profile ;;
  k)
    python3 -m hyla.cli bench model --systems hypenet,qwen3-engine --contexts 128K,512K --hypenet-max-prefill 1 \
      --qwen3-engine-max-prefill 1 --large-batch-contexts 32K --decode-step "${STEP:-triton-fused}" \
      ${SETTINGS:+--engine-settings "$SETTINGS"} --out $OUT/decode-matvec 2>&1 | tee $OUT/decode-matvec.log
    pack k decode-matvec ;;
  m)
    python3 -m hyla.cli bench sweep fused --out $OUT/fused-sweep 2>&1 | tee $OUT/fused-sweep.log
    pack m fused-sweep ;;
  l)
    python3 -m pytest tests/inference/test_inference_gpu.py -q -m gpu -k "matvec or lightning_step or triton_fused" \
      2>&1 | tee $OUT/fused-test.txt | tail -n 3 || exit 1
    for system in hypenet qwen3-engine; do
      python3 -m hyla.cli bench profile --system $system --context 512K --decode-step triton-fused \
        ${SETTINGS:+--engine-settings "$SETTINGS"} --out $OUT/profile 2>&1 | tee -a $OUT/profile.log
    done
    pack l profile ;;
  n)
    python3 -m pytest tests/inference/test_inference_gpu.py -q -m gpu \
      -k "matvec or lightning_step or triton_fused or programmatic" 2>&1 | tee $OUT/pdl-test.txt | tail -n 3 || exit 1
    fused=(--decode-step triton-fused ${SETTINGS:+--engine-settings "$SETTINGS"})
    python3 -m hyla.cli bench model --systems hypenet,qwen3-engine --contexts 128K,512K --hypenet-max-prefill 1 \
      --qwen3-engine-max-prefill 1 --large-batch-contexts 32K "${fused[@]}" --out $OUT/decode-pdl 2>&1 \
      | tee $OUT/decode-pdl.log
    pack n-pdl decode-pdl
    python3 -m hyla.cli bench model --systems hypenet,qwen3-engine --contexts 512K --hypenet-max-prefill 1 \
      --qwen3-engine-max-prefill 1 --large-batch-contexts 8K "${fused[@]}" --no-pdl --out $OUT/decode-no-pdl 2>&1 \
      | tee $OUT/decode-no-pdl.log
    pack n-no-pdl decode-no-pdl ;;
  o)
    python3 -m hyla.cli bench sweep fused --pdl --out $OUT/fused-sweep-pdl 2>&1 | tee $OUT/fused-sweep-pdl.log || exit 1
    cp $OUT/fused-sweep-pdl/settings.json $OUT/settings-pdl.json
    pack o-sweep fused-sweep-pdl
    for settings in $OUT/settings-pdl.json shipped; do  # the new sweep's settings, then the shipped ones (A/B)
      python3 -m hyla.cli bench model --systems hypenet,qwen3-engine --contexts 512K --hypenet-max-prefill 1 \
        --qwen3-engine-max-prefill 1 --large-batch-contexts 8K --decode-step triton-fused \
        $([ "$settings" = shipped ] || echo --engine-settings "$settings") --out $OUT/decode-$(basename $settings .json) \
        2>&1 | tee -a $OUT/decode-tables.log
    done
    pack o-decode decode-settings-pdl decode-shipped ;;
  p)
    python3 -m pytest tests/inference/test_inference_gpu.py -q -m gpu -k "lightning_step or programmatic or triton_fused" \
      2>&1 | tee $OUT/step-test.txt | tail -n 3 || exit 1
    python3 -m hyla.cli bench sweep fused --pdl --step-only --out $OUT/step-sweep 2>&1 | tail -n 4
    pack p-step step-sweep
    bash bench/h200_speed.sh g ;;
  *)
    echo "usage: bash bench/h200_speed.sh a|b|c|d|e|f|g|h|i|j|k|l|m|n|o|p" >&2; exit 2 ;;
esac
