#!/usr/bin/env bash
# Issue 23 on one H200, a device call per part (the plan: docs/log/2026-12-05-speed-sitting-s.md). Run from the
# repository root on the GPU machine with $OUT set; carry [".whl", ".gpu-inputs/bench"] (fla's wheel and Liger's).
#   train:    `hyla bench loss` (hyla's KL chunks through torch and through hyla's Triton kernel, fla's and Liger's
#             losses), then `hyla bench train` on distillation at 16x4096: the default against the bf16 activations,
#             the KL's Triton kernel, and both (~5 minutes);
#   autotune: `hyla bench train` on distillation: the default against the blocks compiled in mode
#             max-autotune-no-cudagraphs, alone and with the other two candidates (compiling takes minutes: each
#             measurement is saved as it ends, under $OUT, so a call cut by its limit keeps those before);
#   tests:    the GPU tests of the evaluation settings against float32, the fused losses and the engine's
#             generation, cuDNN on bucketed lengths;
#   eme:      issue 26's item 4 on random weights of the converted shape: what each inference mode (direct, SWLA,
#             SWLA + log: EME) costs at 64K on the engine, per recurrent mixer (Lightning, GLA, GDN).
#   fused:    `hyla bench train` on distillation at 16x4096: the default against the fused input projections, alone
#             and with the bf16 activations (issue 23's candidates of 2026-12-06);
#   activations: `hyla bench train` on distillation at 16x4096: the default against the bf16 activations (issue 23's
#             last 2.5% on sitting T's H200);
#   record:   `hyla bench train` on every stage at the recipe's shapes, the default (bf16 activations since
#             2026-12-06) beside float32 activations (PATHS overrides the paths): issue 23's run of record, on an
#             H200 (it says so and stops on any other card unless ANY_CARD=1);
#   tests-train: the GPU loss-curve tests of the fast path: the fused projections' (first: they decide its default),
#             then the default against the eager reference in every stage (the Triton KL is the default since
#             2026-12-06);
#   graphs:   `hyla bench train` on alignment at 128x512: the default against stage 1's compiled twins and teacher
#             blocks replayed as CUDA graphs (align.cuda_graphs), then their GPU tests: each replay against the default
#             path on its own batch, and the 30-step loss curve against the eager reference; on an H200 also the run
#             of record (`record`);
#   code:     `hyla bench train` on distillation at 16x4096 (the default path) with inductor's cache in $OUT, then the
#             generated code of its graphs packed as code.tar.xz: the profile's kernel names (triton_*_N) are defined
#             there, for reading what the elementwise kernels move;
#   prefill:  RMSNorm's two forms at a 64K prefill's shapes (bench/rms_norm.py) and their GPU test, RoPE's two
#             forms (bench/rope.py) and their GPU test, then where a
#             64K prefill of the converted shape goes, kernel by kernel, against its FLOP floor, uncompiled, through
#             flash and through cuDNN on bucketed lengths (the evaluation settings: issue 24).
# Each part runs under BUDGET_S (default 540 s; give the call a limit ~40 s above it).
set -uo pipefail
: "${OUT:?set OUT to the folder that comes back}"
part=${1:?usage: speed.sh train|autotune|fused|activations|record|graphs|code|tests|tests-train|eme|prefill}
BUDGET_S=${BUDGET_S:-540}
site=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl/*.whl \
  .gpu-inputs/bench/*.whl || exit 1
export PYTHONPATH=$site:$PWD/src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache
log() { echo "[$(date +%T) +$SECONDS s] $*"; }
left() { echo $((BUDGET_S - SECONDS > 5 ? BUDGET_S - SECONDS : 5)); }
quiet() { grep -v -E "Warning|warnings.warn" | tail -n "$1"; }
gpu_tests() {  # says so when the budget cut the run (sitting S's last one left no line at all)
  timeout "$(left)" python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tail -n 8
  [ "${PIPESTATUS[0]}" = 124 ] && echo "cut by BUDGET_S before it finished: pytest $*"
  return 0
}
distill=(--cases distill:16x4096 --no-losses)
case $part in
  train)
    log "hyla bench loss"
    timeout "$(left)" python3 -m hyla.cli bench loss --out "$OUT/loss" 2>&1 | quiet 20
    log "hyla bench train: bf16 activations and the KL's Triton kernel"
    timeout "$(left)" python3 -m hyla.cli bench train "${distill[@]}" --out "$OUT/train" \
      --paths fast,fast-bf16-activations,fast-triton-kl,fast-bf16-activations-triton-kl 2>&1 | quiet 30
    ;;
  autotune)
    log "hyla bench train: max-autotune"
    timeout "$(left)" python3 -m hyla.cli bench train "${distill[@]}" --out "$OUT/autotune" \
      --paths fast,fast-max-autotune,fast-bf16-activations-triton-kl-max-autotune 2>&1 | quiet 30
    ;;
  fused)
    log "hyla bench train: fused input projections"
    timeout "$(left)" python3 -m hyla.cli bench train "${distill[@]}" --out "$OUT/fused" \
      --paths fast,fast-fused-projections,fast-bf16-activations-fused-projections 2>&1 | quiet 30
    ;;
  activations)
    log "hyla bench train: the bf16 activations beside the default"
    timeout "$(left)" python3 -m hyla.cli bench train "${distill[@]}" --out "$OUT/activations" \
      --paths fast,fast-bf16-activations 2>&1 | quiet 30
    ;;
  record)
    card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    if [[ "$card" != *H200* && "${ANY_CARD:-0}" != 1 ]]; then echo "not an H200 ($card): the targets are an H200's"; exit 3; fi
    log "hyla bench train: every stage, paths ${PATHS:-fast,fast-fp32-activations}, on $card"
    timeout "$(left)" python3 -m hyla.cli bench train --no-losses --paths "${PATHS:-fast,fast-fp32-activations}" \
      --out "$OUT/record" 2>&1 | quiet 40
    ;;
  graphs)
    log "hyla bench train: alignment, the default against CUDA graphs, on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    # perf_hints: why inductor skips CUDA graphs, if it does (the whole log comes back in graphs-log.txt)
    TORCH_LOGS=perf_hints timeout "$(left)" python3 -m hyla.cli bench train --cases align:128x512 --no-losses \
      --paths fast,fast-cuda-graphs --out "$OUT/graphs" 2>&1 | tee "$OUT/graphs-log.txt" | quiet 30
    log "GPU tests: the replays and the loss curve under CUDA graphs"
    gpu_tests tests/convert/test_align_cuda_graphs_gpu.py
    gpu_tests tests/train/test_fast_path_gpu.py -k "follows_the_eager and align"
    card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    if [[ "$card" == *H200* ]]; then
      log "hyla bench train: every stage, the default beside float32 activations and CUDA graphs, on $card"
      timeout "$(left)" python3 -m hyla.cli bench train --no-losses --out "$OUT/record" \
        --paths fast,fast-fp32-activations,fast-cuda-graphs 2>&1 | quiet 40
    fi
    ;;
  code)
    log "hyla bench train: distillation, the default path, keeping inductor's generated code"
    export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-code
    timeout "$(left)" python3 -m hyla.cli bench train "${distill[@]}" --paths fast --out "$OUT/code" 2>&1 | quiet 20
    (cd /tmp/inductor-code && find . -name "*.py" -size -4M | tar -cJf "$OUT/code.tar.xz" -T -)
    ls -la "$OUT/code.tar.xz"
    ;;
  tests-train)
    log "GPU tests: the fast path's loss curves"
    gpu_tests tests/train/test_fast_path_gpu.py -k fused_projections
    gpu_tests tests/train/test_fast_path_gpu.py -k follows_the_eager
    ;;
  tests)
    # the evaluation settings against float32 first (inference runs RMSNorm and RoPE through the fused ops since
    # 2026-12-06); the KL kernel's loss curve passed on 2026-12-06 (`tests-train` has the fast path's)
    log "GPU tests"
    gpu_tests tests/inference/test_generate_gpu.py -k prefill_as_close
    gpu_tests tests/ops/test_linear_loss_gpu.py tests/inference/test_generate_gpu.py -k "not prefill_as_close"
    gpu_tests tests/inference/test_inference_gpu.py -k fused_chunk_attention
    ;;
  eme)
    log "hyla bench generate: inference modes at 64K"
    timeout "$(left)" python3 -m hyla.cli bench generate --lengths 64K --num-prompts 4 --batch-sizes 1 --paths engine \
      --rnn-mixer lightning,gla,gdn --variants direct,swla,swla+log --decode-step fused-projections \
      --out "$OUT/generate" 2>&1 | quiet 30
    ;;
  prefill)
    log "bench/rms_norm.py: the reference against torch's fused kernel and the Triton rows kernel, bf16, 64K tokens"
    timeout "$(left)" python3 bench/rms_norm.py 2>&1 | quiet 6
    gpu_tests tests/ops/test_rms_norm_gpu.py
    log "bench/rope.py: the reference against hyla's Triton kernel, bf16, 64K tokens"
    timeout "$(left)" python3 bench/rope.py 2>&1 | quiet 6
    gpu_tests tests/ops/test_rope_gpu.py
    for backend in flash cudnn-padded; do
      log "hyla bench profile: one 64K prefill of the converted shape, prefill uncompiled, $backend"
      timeout "$(left)" python3 -m hyla.cli bench profile --system converted-135m --phase prefill --context 0 \
        --chunk 65536 --no-compile-prefill --attention-backend $backend --steps 3 --out "$OUT/prefill-$backend" 2>&1 | \
        quiet 24
    done
    ;;
  *) echo "error: unknown part $part (train, autotune, fused, activations, record, graphs, code, tests, tests-train, eme, prefill)"
     exit 2 ;;
esac
log done
