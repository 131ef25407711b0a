#!/usr/bin/env bash
# Where a_proj's fixed cost goes (twenty-fifth session): the fp8 weight-only skinny kernel at
# a_proj's 2112 x 7168 runs 12 K splits of 5 chunks at M 1 and costs ~5.5 us beyond its
# streaming rate (docs/perf.md). This times it at forced split counts (the bench's `--splits`,
# its skinny columns only) and profiles the TMA-form launch at the planner's 12 and at 4 with
# ncu. Run after another script in the same call (it appends to $OUT/summary.txt).
# Needs, carried: $BIN (default .dev/bin) with xtask.
# Usage (in the repository root, on the GPU machine): bash tools/device/aproj_splits.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
mkdir -p "$OUT"
S=$OUT/summary.txt
source tools/device/lib.sh  # step
# This script's logs in their own archive (the 8-file limit on what comes back).
trap '(cd "$OUT" && tar czf logs_aproj.tgz --remove-files ./aproj_*.log ./ncu_*.log ./skinny_tests.log 2>/dev/null)' EXIT
# The skinny kernel's suite first, where its binary is carried.
if [ -x "$BIN/skinny_gemm" ]; then step skinny_tests 150 "$BIN/skinny_gemm" --test-threads 1; fi
for s in 1 2 3 4 6 8 12 16; do
  step "aproj_s$s" 60 "$BIN/xtask" bench gemm --m 1,8 --only a_proj --iters 20 --no-parity --splits "$s"
  grep -E "^a_proj " "$OUT/aproj_s$s.log" | cut -c1-100 | sed "s/^/splits $s: /" | tee -a "$S"
done
for s in 12 4; do
  step "ncu_aproj_s$s" 120 ncu --clock-control none --set full -k regex:w8tma --launch-skip 2 --launch-count 1 \
    "$BIN/xtask" bench gemm --m 1 --only a_proj --iters 3 --no-parity --splits "$s"
  grep -E "^\s+(Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Grid Size|Waves Per SM|Issue Slots Busy|No Eligible)" \
    "$OUT/ncu_aproj_s$s.log" | sed "s/^/ncu splits $s: /" | tee -a "$S"
done
