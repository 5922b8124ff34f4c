#!/usr/bin/env bash
# RULER NIAH of a finished run's export under other logit-scaling constants a than the one it was exported with, at
# full samples (the scaling stage's own NIAH cells hold 4 samples): meant as `experiment.sh wait`'s AFTER, e.g.
#   AFTER='bash scripts/gpu-session/sweep_a.sh' A_VALUES="2000 1000 3000" TASKS=SK2 LENGTHS=16K,32K,64K
# The export's own a is skipped (the plan's evaluations have it). Each a writes /root/keep/extra/TASKS-aA, and the
# whole folder is packed into $OUT/extra.tar.xz after each one, so a call that ends early still brings back the
# finished ones (one file: the device call brings back at most 8, and `collect` writes 7).
# Each a costs its NIAH plus, unless the h200 profile's warm-niah-* compiled the engine for that a, ~100 s of
# compilation: give it a call of its own (`wait` with AFTER once the run has ended early in a call). Sitting J ran
# it as the AFTER of a call in which the run ended 8 minutes in: the call's limit cut it before its first a.
set -uo pipefail
keep=/root/keep
model=${MODEL:-$keep/run/main/06-export}
tasks=${TASKS:-SK2}
lengths=${LENGTHS:-16K,32K,64K}
export PYTHONPATH=$keep/site:$keep/repo/src
[ -f "$model/config.json" ] || { echo "error: no export at $model"; exit 2; }
chosen=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1])).get('attention_logit_scaling_a'))" \
  "$model/config.json")
echo "export's a: $chosen"
mkdir -p $keep/extra
for a in ${A_VALUES:-2000 1000 3000}; do
  if python3 -c "import sys; sys.exit(0 if sys.argv[1] != 'None' and float(sys.argv[1]) == float(sys.argv[2]) else 1)" \
       "$chosen" "$a"; then
    echo "a = $a is the export's own: skipped"
    continue
  fi
  start=$SECONDS
  python3 -m hyla.cli eval niah --model "$model" --out "$keep/extra/${tasks//,/-}-a$a" --tasks "$tasks" \
    --lengths "$lengths" --num-samples "${SAMPLES:-25}" --samples-cache $keep/run/niah-samples \
    --logit-scaling-a "$a" --batch-size "${BATCH:-4}" 2>&1 | grep -v '^\s*$' | tail -n 6
  echo "a = $a: $((SECONDS - start)) s"
  tar -cJf "$OUT/extra.tar.xz" -C $keep extra
done
