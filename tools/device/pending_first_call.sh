#!/usr/bin/env bash
# The next GPU call (docs/perf.md, "Twenty-fourth session", call 3); about 400 s on an H100 /
# H200 with the kernel cache carried. Each step has a time cap (a hang shows as a timeout and
# the later steps still run). FlashMLA, then DeepGEMM, build in the background while the GPU
# runs the tests and the labs.
#  1. the sparse suite three times and the fp8 decode suite twice, each run on fresh inputs
#     (the lse bound of common::fp8_lse_bound, new in this session), and the decode suite under
#     the MLA_KV_EVICT=2 lab build;
#  2. MLA_KV_EVICT (the cache's TMA boxes tagged L2 evict-first, so the combine's partials stay
#     in L2): main, =1, =2, main again on the shapes where the combine matters and on the large
#     ones, then the combine's time without ncu's cache flush;
#  3. the decode table against FlashMLA, for main and both lab builds;
#  4. the V3 decode step with DeepSeek's fp8 weights (`--weights-dtype fp8`) against torch +
#     FlashMLA (issue 18);
#  5. DeepGEMM's fp8 GEMM (issue 17's peer; its script crashed in the twenty-third session):
#     the peer under Python's faulthandler, then `xtask bench gemm --peer`.
# Needs, carried: $BIN (default .dev/bin: tools/device/stage.sh), its kernel cache
# (.dev/kcache.tar.xz), .peer/flashmla.tar.xz and .peer/deepgemm.tar.xz.
# Usage (in the repository root, on the GPU machine): bash tools/device/pending_first_call.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
LAB=${LAB:-/tmp/pending_lab}
FLASHMLA_DIR=${FLASHMLA_DIR:-.peer/flashmla}
mkdir -p "$OUT"
# FlashMLA's tree carried packed (.peer/flashmla.tar.xz, 1.2 MB against 30): unpacked here.
if [ ! -f "$FLASHMLA_DIR/setup.py" ] && [ -f .peer/flashmla.tar.xz ]; then
  FLASHMLA_DIR=/tmp/flashmla/flashmla
  mkdir -p /tmp/flashmla && tar -C /tmp/flashmla -xJf .peer/flashmla.tar.xz
fi
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$S" || true
source tools/device/lib.sh  # step, san, lab_overlay
lab_overlay "$LAB/e1" schedule.cuh MLA_KV_EVICT=1
lab_overlay "$LAB/e2" schedule.cuh MLA_KV_EVICT=2
mkdir -p "$LAB/main"  # an empty overlay: the built-in kernels
(
  bash tools/peers/build_flashmla.sh "$FLASHMLA_DIR" > "$OUT/flashmla_build.log" 2>&1
  bash tools/peers/build_deepgemm.sh .peer/deepgemm.tar.xz /tmp/deepgemm > "$OUT/deepgemm_build.log" 2>&1
) &
BUILD=$!
# Every log in one archive at the end (the 8-file limit on what comes back), whatever happens.
trap '(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT

# 1. Correctness on fresh inputs.
for i in 1 2 3; do step "sparse_$i" 60 "$BIN/sparse_mla" --test-threads 1; done
for i in 1 2; do step "fp8_$i" 60 "$BIN/mla_decode_fp8" --test-threads 1; done
VT_CUDA_KERNELS_DIR=$LAB/e2 step decode_e2 90 "$BIN/mla_decode_attention" --test-threads 1

# 2. MLA_KV_EVICT against main, interleaved.
AB=(--only b32,kv16,bs64,sq1 --only b1,kv16 --only h64,b128,s4096,kv16 --only h128,b128,s4096,kv16
  --only h64,b128,s4096,kv8 --only h128,b128,s4096,kv8 --iters 20 --no-parity)
for r in main e1 e2 main2; do
  dir=$LAB/${r%2}
  VT_CUDA_KERNELS_DIR=$dir step "ab_$r" 90 "$BIN/xtask" bench decode "${AB[@]}"
  echo "== ab_$r" | tee -a "$S"
  grep -E "^h[0-9]" "$OUT/ab_$r.log" | cut -c1-80 | tee -a "$S"
done
# The combine's own time with the partials where the main kernel left them (no cache flush).
for r in main e1; do
  VT_CUDA_KERNELS_DIR=$LAB/$r step "ncu_$r" 90 ncu --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,lts__t_sector_hit_rate.pct --csv \
    "$BIN/xtask" bench decode --only h64,b32,kv16,bs64,sq1 --only h128,b32,kv16,bs64,sq1 --iters 3 --no-parity
  grep -E 'mla_decode_combine' "$OUT/ncu_$r.log" | tail -8 | awk -F'","' '{print $5, $9, $13, $15}' | tee -a "$S"
done

# 3. The decode table against FlashMLA (main and both labs).
while kill -0 "$BUILD" 2>/dev/null && [ ! -e "$OUT/deepgemm_build.log" ]; do sleep 2; done  # FlashMLA's step done
tail -2 "$OUT/flashmla_build.log" | tee -a "$S"
PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  step peer 60 python3 tools/peers/flashmla_decode.py --json "$OUT/flashmla.json"
for r in main e1 e2; do
  VT_CUDA_KERNELS_DIR=$LAB/$r step "bench_$r" 90 "$BIN/xtask" bench decode --peer "$OUT/flashmla.json" --no-parity
  echo "== bench_$r" | tee -a "$S"
  grep -E "^h[0-9]" "$OUT/bench_$r.log" | cut -c1-32,33-60,100-150 | tee -a "$S"
done

# 4. The V3 decode step with fp8 weights against torch + FlashMLA (same call).
PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  step step_peer 120 python3 tools/peers/block_step.py --json "$OUT/block_step.json"
grep -E "^B=" "$OUT/step_peer.log" | tee -a "$S"
for bc in "1 8192" "32 4096" "128 4096"; do
  set -- $bc
  step "step8_b$1" 90 "$BIN/vt-mla" bench --graph --backend cuda --tp 1 --batch "$1" --context "$2" --iters 20 \
    --profile 3 --steps 5 --rounds 2 --warmup 2 --weights-dtype fp8 --peer "$OUT/block_step.json"
  grep -E "one step|floor|peer|^  [a-z]" "$OUT/step8_b$1.log" | cut -c1-160 | tee -a "$S"
done

# 5. DeepGEMM (issue 17's peer).
wait "$BUILD"
tail -3 "$OUT/deepgemm_build.log" | tee -a "$S"
export PYTHONPATH=/tmp/deepgemm/deepgemm${PYTHONPATH:+:$PYTHONPATH}
step gemm_peer 150 python3 -X faulthandler tools/peers/fp8_blockwise_gemm.py --m 1,128,4096 --json "$OUT/fp8_blockwise_gemm.json"
tail -30 "$OUT/gemm_peer.log" | cut -c1-200 | tee -a "$S"
PEER=()
[ -f "$OUT/fp8_blockwise_gemm.json" ] && PEER=(--peer "$OUT/fp8_blockwise_gemm.json")
step gemm 120 "$BIN/xtask" bench gemm --m 1,128,4096 ${PEER[@]+"${PEER[@]}"}
grep -vE "^\s*$" "$OUT/gemm.log" | tail -40 | cut -c1-200 | tee -a "$S"
cat "$S" > /dev/null
