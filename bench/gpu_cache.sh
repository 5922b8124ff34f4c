#!/usr/bin/env bash
# Carry compiled GPU kernels from one device session to the next (the same machine image): Triton's cache, which
# holds fla's compiled kernels and, with fla's default FLA_CACHE_RESULTS=1, its autotuning choices, and torch
# inductor's cache (the compiled blocks). A fresh machine otherwise compiles and autotunes everything again: the
# first GLA training step took 286 s on one (docs/results/family-lh.md).
#
# The cache is split in parts of 15 MiB with a checksum list (gpu-cache.sha256). A cache larger than one call
# carries (64 MiB, the repository included) travels in groups, one call each; the parts gather on the machine
# (~/.gpu-cache-parts) and are unpacked once all of them are there.
#
#   bash bench/gpu_cache.sh save              # on the GPU machine: the parts and gpu-cache.sha256 into $SAVE_TO
#                                             # (default /root/keep/gpu-cache); parts 0-3 come back in this call
#   bash bench/gpu_cache.sh out FIRST LAST    # on the GPU machine, after save: parts FIRST..LAST into $OUT (the
#                                             # rest of a cache over 60 MiB, in the next call)
#   bash bench/gpu_cache.sh place DIR...      # here: the parts from the calls' folders into .gpu-inputs/cache/gN,
#                                             # groups that each fit one call; prints the carry of each group
#   bash bench/gpu_cache.sh restore           # on the GPU machine: the carried parts (.gpu-inputs/cache and its
#                                             # groups) gathered; unpacked once complete; a missing cache is not
#                                             # an error
# Stale entries cost nothing: both caches are keyed by source, compiler version and device.
set -uo pipefail
triton=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
inductor=${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_$(id -un)}
carried=.gpu-inputs/cache
gathered=$HOME/.gpu-cache-parts
part_mib=15
case ${1:-} in
restore)
  mkdir -p "$gathered"
  found=$(find "$carried" -name 'gpu-cache.part*' -o -name gpu-cache.sha256 2>/dev/null)
  [ -n "$found" ] && cp $found "$gathered"/
  if [ -f "$gathered/done" ]; then
    echo "gpu cache already restored on this machine"
  elif [ ! -f "$gathered/gpu-cache.sha256" ]; then
    echo "no gpu cache carried ($carried); kernels compile on first use"
  else
    total=$(wc -l < "$gathered/gpu-cache.sha256")
    here=$(cd "$gathered" && ls gpu-cache.part* 2>/dev/null | wc -l)
    if [ "$here" -lt "$total" ]; then
      echo "gpu cache: $here of $total parts on this machine; the rest come in later calls"
    elif (cd "$gathered" && sha256sum --quiet -c gpu-cache.sha256); then
      cat "$gathered"/gpu-cache.part* | tar -xzf - -C / && touch "$gathered/done" \
        && echo "gpu cache restored: $(du -sh "$triton" 2>/dev/null | cut -f1) Triton," \
          "$(du -sh "$inductor" 2>/dev/null | cut -f1) inductor"
    else
      echo "gpu cache: a part does not match gpu-cache.sha256; kernels compile on first use"
    fi
  fi
  ;;
save)
  : "${OUT:?save writes to \$OUT}"
  to=${SAVE_TO:-/root/keep/gpu-cache}
  mkdir -p "$to" && rm -f "$to"/gpu-cache.part* "$to"/gpu-cache.sha256
  paths=()
  for dir in "$triton" "$inductor"; do [ -d "$dir" ] && paths+=("${dir#/}"); done
  [ ${#paths[@]} -gt 0 ] || { echo "nothing to save: no $triton or $inductor"; exit 0; }
  tar -czf - -C / "${paths[@]}" | split -b ${part_mib}m -d -a 2 - "$to/gpu-cache.part"
  (cd "$to" && sha256sum gpu-cache.part* > gpu-cache.sha256)
  count=$(wc -l < "$to/gpu-cache.sha256")
  echo "gpu cache: $count parts, $(du -ch "$to"/gpu-cache.part* | tail -n 1 | cut -f1) ($to)"
  # at most 4 parts (60 MiB) come back in one call
  bash "$0" out 0 3 >/dev/null
  [ "$count" -gt 4 ] && echo "parts 4 to $((count - 1)) stay on the machine: \`bash bench/gpu_cache.sh out 4 7\` next"
  ls "$OUT"
  ;;
out)
  : "${OUT:?out writes to \$OUT}"
  from=${SAVE_TO:-/root/keep/gpu-cache}
  for n in $(seq "${2:?first part}" "${3:?last part}"); do
    part=$(printf "%s/gpu-cache.part%02d" "$from" "$n")
    [ -f "$part" ] && cp "$part" "$OUT/"
  done
  cp "$from/gpu-cache.sha256" "$OUT/" && ls "$OUT"
  ;;
place)
  shift
  [ $# -gt 0 ] || { echo "usage: bash bench/gpu_cache.sh place DIR... (the calls' files_at folders)" >&2; exit 2; }
  rm -rf "$carried" && mkdir -p "$carried"
  manifest=$(find "$@" -name gpu-cache.sha256 | head -n 1)
  [ -n "$manifest" ] || { echo "error: no gpu-cache.sha256 in $*" >&2; exit 2; }
  group=1
  index=0
  while read -r _ name; do
    part=$(find "$@" -name "$name" | head -n 1)
    [ -n "$part" ] || { echo "error: $name (in $manifest) is in none of $*" >&2; rm -rf "$carried"; exit 2; }
    # 3 parts (45 MiB) and the repository fit one call's 64 MiB
    [ $index -gt 0 ] && [ $((index % 3)) -eq 0 ] && group=$((group + 1))
    mkdir -p "$carried/g$group" && cp "$part" "$carried/g$group/" && cp "$manifest" "$carried/g$group/"
    (cd "$carried/g$group" && grep " $name\$" gpu-cache.sha256 | sha256sum --quiet -c -) \
      || { echo "error: $part does not match $manifest" >&2; rm -rf "$carried"; exit 2; }
    index=$((index + 1))
  done < "$manifest"
  for dir in "$carried"/g*; do
    echo "carry [\"$dir\"]  bash scripts/gpu-session/experiment.sh stash   # $(ls "$dir" | grep -c part) parts"
  done
  ;;
*) echo "usage: bash bench/gpu_cache.sh save|out FIRST LAST|place DIR...|restore" >&2; exit 2 ;;
esac
