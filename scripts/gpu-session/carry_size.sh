#!/usr/bin/env bash
# What each device call of scripts/gpu-session/experiment.sh sends, and the lm-eval call of gpu-tests.sh, against the
# 64 MiB a call may carry: the repository's tracked files (sent with every call) plus that call's carried inputs. Run
# it before a GPU session; a call over the limit is refused before it starts; it fails when one of them would be.
#   bash scripts/gpu-session/carry_size.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
limit=$((64 * 1024 * 1024))
tracked=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
untracked=$(git ls-files -z --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1 || echo 0)
check() {  # $1: call name, rest: carried paths; fails when the call would be over the limit
  local name=$1; shift
  local carried
  carried=$(du -cb "$@" | tail -1 | cut -f1)
  local total=$((tracked + untracked + carried))
  awk -v n="$name" -v t="$total" -v r="$((tracked + untracked))" -v c="$carried" -v l="$limit" 'BEGIN {
    printf "%-7s %6.2f MiB (repository %5.2f + carried %5.2f) of 64: %s\n", n, t / 1048576, r / 1048576,
      c / 1048576, (t <= l ? "ok" : "OVER") }'
  [ "$total" -le "$limit" ]
}
# The calls of experiment.sh's header, in order; a plan with a corpus job also carries .gpu-inputs/a in part1.
check part1 .gpu-teacher/p0 .whl || exit 1
check part1+a .gpu-teacher/p0 .gpu-inputs/a .whl || echo "part1 is over with .gpu-inputs/a: send it in a stash call of its own"
check stash-p1 .gpu-teacher/p1 || exit 1
check stash-p2 .gpu-teacher/p2 || exit 1
check stash-p3 .gpu-teacher/p3 || exit 1
# the recipe plans' offline English (two parts) beside the training text and RULER's data
# (each in a call of its own since the repository reached 36 MiB: c1 and b together came within 0.9 MiB of the limit)
if [ -d .gpu-inputs/c1 ]; then check stash-c1 .gpu-inputs/c1 || exit 1; fi
if [ -d .gpu-inputs/c2 ]; then check stash-c2 .gpu-inputs/c2 || exit 1; fi
check stash-b .gpu-inputs/b || exit 1
# an earlier sitting's compiled kernels (bench/gpu_cache.sh place): a `stash` call per group
for group in .gpu-inputs/cache/g*; do [ -d "$group" ] && { check "stash-${group##*/}" "$group" || exit 1; }; done
check start .gpu-teacher/p4 || exit 1
# gpu-tests.sh with lm-eval-harness (its header)
if [ -d .gpu-inputs/lmeval ]; then check lm-eval .whl .gpu-inputs/lmeval || exit 1; fi
# hyla bench loss with Liger Kernel (docs/results/train-speed.md)
if [ -d .gpu-inputs/bench ]; then check bench-loss .whl .gpu-inputs/bench || exit 1; fi
