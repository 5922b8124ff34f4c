#!/usr/bin/env bash
# Carry compiled GPU kernels from one device session to the next (the same machine image): Triton's cache, which
# holds fla's compiled kernels and, with fla's default FLA_CACHE_RESULTS=1, its autotuning choices, and torch
# inductor's cache (the compiled decode blocks). A fresh machine otherwise compiles and autotunes everything again:
# the first GLA training step took 286 s on one (docs/results/family-lh.md).
#
#   bash bench/gpu_cache.sh restore   # on the GPU machine, before the work: unpack .gpu-inputs/cache/gpu-cache.part*
#                                     # (carry ".gpu-inputs/cache") if present; a missing cache is not an error
#   bash bench/gpu_cache.sh save      # on the GPU machine, as the session's last call: $OUT/gpu-cache.partNN,
#                                     # at most 15 MiB each and 7 parts (what one call can bring back)
# Here, after `save`: rm -rf .gpu-inputs/cache && mkdir -p .gpu-inputs/cache &&
#   cp FILES_AT/gpu-cache.part* .gpu-inputs/cache/
# Stale entries cost nothing: both caches are keyed by source, compiler version and device.
set -uo pipefail
triton=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
inductor=${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_$(id -un)}
parts=.gpu-inputs/cache
case ${1:-} in
restore)
  if ls $parts/gpu-cache.part* >/dev/null 2>&1; then
    cat $parts/gpu-cache.part* | tar -xzf - -C / \
      && echo "gpu cache restored: $(du -sh "$triton" 2>/dev/null | cut -f1) Triton," \
        "$(du -sh "$inductor" 2>/dev/null | cut -f1) inductor"
  else
    echo "no gpu cache carried ($parts); kernels compile on first use"
  fi
  ;;
save)
  : "${OUT:?save writes to \$OUT}"
  paths=()
  for dir in "$triton" "$inductor"; do [ -d "$dir" ] && paths+=("${dir#/}"); done
  [ ${#paths[@]} -gt 0 ] || { echo "nothing to save: no $triton or $inductor"; exit 0; }
  tar -czf - -C / "${paths[@]}" | split -b 15m -d -a 2 - "$OUT/gpu-cache.part"
  count=$(ls "$OUT"/gpu-cache.part* | wc -l)
  if [ "$count" -gt 7 ]; then
    rm -f "$OUT"/gpu-cache.part*
    echo "gpu cache too large to bring back ($count parts of 15 MiB); saving Triton's alone"
    tar -czf - -C / "${triton#/}" | split -b 15m -d -a 2 - "$OUT/gpu-cache.part"
    count=$(ls "$OUT"/gpu-cache.part* | wc -l)
    [ "$count" -le 7 ] || { rm -f "$OUT"/gpu-cache.part*; echo "Triton's cache alone is too large too"; exit 1; }
  fi
  du -ch "$OUT"/gpu-cache.part* | tail -n 1
  ;;
*) echo "usage: bash bench/gpu_cache.sh restore|save" >&2; exit 2 ;;
esac
