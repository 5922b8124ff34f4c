# Sourced by the GPU scripts whose work outlives one 10-minute device call (bench/gpu_train.sh,
# bench/gpu_data_parallel.sh): `collect RESULT...` waits up to $wait_s seconds for $keep/done, then copies
# tests.txt, bench.log and the RESULT files that exist to $OUT and prints the tail of the test and bench logs.
collect() {
  local start=$SECONDS
  while [ $((SECONDS - start)) -lt "$wait_s" ] && [ ! -f "$keep/done" ]; do
    sleep 10
    if [ $(( (SECONDS - start) % 60 )) -lt 10 ]; then tail -n 2 "$keep/bench.log" 2>/dev/null; fi
  done
  [ -f "$keep/done" ] && echo "finished: $(cat "$keep/done")" || echo "still running after ${wait_s}s"
  cp "$keep/tests.txt" "$keep/bench.log" "$OUT/" 2>/dev/null
  cp "$@" "$OUT/" 2>/dev/null
  tail -n 30 "$keep/tests.txt" 2>/dev/null | grep -E "passed|failed|error" | tail -n 3
  tail -n 60 "$keep/bench.log" 2>/dev/null
}
