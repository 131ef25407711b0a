# Sourced by the device scripts (tools/device/*.sh), after OUT is set.
# step NAME CAP_SECONDS COMMAND...: runs COMMAND under a time cap into $OUT/NAME.log (a hang shows
# as rc 124 and the later steps still run), appends its exit status and the lines that matter
# (test results, failures, sanitizer summaries, the decode kernels' errors) to
# $OUT/summary.txt, and returns the exit status.
step() {
  local name=$1 cap=$2
  shift 2
  local t0=$SECONDS
  timeout "$cap" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
  grep -E "test result|FAILED|panicked|ERROR SUMMARY|RACECHECK SUMMARY|hazard|out rel error .*wgmma_fp8r|wgmma_3wg" "$OUT/$name.log" \
    | tail -12 | tee -a "$OUT/summary.txt"
  return $rc
}
