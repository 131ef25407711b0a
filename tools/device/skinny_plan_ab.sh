#!/usr/bin/env bash
# One GPU call (twenty-fifth session): the skinny fp8 TMA form's one-CTA-an-SM plan (a_proj)
# against the plan before it ($OLD's xtask), twice interleaved, and o_proj's split counts swept
# (the data for extending the rule to more row blocks). Appends to $OUT/summary.txt.
# Needs, carried: $NEW (default .dev/bin_new: xtask, skinny_gemm), $OLD (default .dev/bin:
# xtask) and .dev/kcache.tar.xz (the kernels are the same in both).
# Usage (in the repository root, on the GPU machine): bash tools/device/skinny_plan_ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
NEW=${NEW:-.dev/bin_new}
OLD=${OLD:-.dev/bin}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$S" || true
source tools/device/lib.sh  # step
trap '(cd "$OUT" && tar czf logs_plan.tgz --remove-files ./*.log 2>/dev/null); kcache_report' EXIT
step skinny_tests 150 "$NEW/skinny_gemm" --test-threads 1
for r in 1 2; do
  for v in old new; do
    x=$OLD/xtask
    [ "$v" = new ] && x=$NEW/xtask
    step "plan_${v}_$r" 100 "$x" bench gemm --m 1,8,16,32 --only a_proj,q_b,o_proj --iters 20 --no-parity
    grep -E "^(a_proj|q_b|o_proj) " "$OUT/plan_${v}_$r.log" | cut -c1-100 | tee -a "$S"
  done
done
for s in 1 2 3 4 5 6 8; do
  step "oproj_s$s" 60 "$NEW/xtask" bench gemm --m 1,8 --only o_proj --iters 20 --no-parity --splits "$s"
  grep -E "^o_proj " "$OUT/oproj_s$s.log" | cut -c1-100 | sed "s/^/splits $s: /" | tee -a "$S"
done
