#!/usr/bin/env bash
# On the development machine, before a device call: runs the device scripts with PREFLIGHT=1
# (tools/device/lib.sh) against the staged binaries, where every GPU step fails or skips at
# once, and lists what would waste the call: a command line a program rejects, a test filter
# that matches nothing (PREFLIGHT FAIL lines). Peer builds are skipped (no .peer given).
# Usage (in the repository root, after tools/device/stage.sh): bash tools/device/preflight.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
P=${P:-/tmp/vt-preflight}
rm -rf "$P"
run() {  # run NAME SCRIPT [ENV...]
  local name=$1 script=$2
  shift 2
  mkdir -p "$P/$name"
  env PREFLIGHT=1 OUT="$P/$name" KCACHE=none LAB="$P/$name/lab" "$@" timeout 600 bash "$script" > "$P/$name/stdout.log" 2>&1
}
run pending tools/device/pending_first_call.sh
run timeline tools/device/timeline.sh
run schedule tools/device/schedule_labs.sh
run new_tests tools/device/new_kernels_first_run.sh PART=tests
run new_bench tools/device/new_kernels_first_run.sh PART=bench
for part in tests bench sanitize step; do
  run "gather_$part" tools/device/gather_first_run.sh PART=$part
done
fails=$(cat "$P"/*/summary.txt 2>/dev/null | grep -c "^PREFLIGHT FAIL")
grep -h "^PREFLIGHT FAIL" "$P"/*/summary.txt
echo "preflight: $fails problem(s); logs in $P"
[ "$fails" -eq 0 ]
