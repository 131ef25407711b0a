#!/usr/bin/env bash
# The next GPU call (docs/perf.md, "Twenty-fourth session", call 4): the session's final state
# checked the way users check it, DeepGEMM's crash narrowed down, the combine profiled; about
# 300 s on an H100 / H200 with the kernel cache carried. Each step has a time cap.
#  1. `xtask parity --backend cuda` (every op against the CPU on fresh inputs) and the block's
#     CUDA tests (graphs, goldens against transformers, the decode fusions) with the new combine
#     and Auto's choices;
#  2. DeepGEMM (built in the background): its own fp8 test with its JIT's debug output, then
#     tools/peers/fp8_blockwise_gemm.py with the same output (the twenty-fourth session's call 3
#     saw a segmentation fault at the first fp8_gemm_nt call);
#  3. ncu's full sections of the combine at h128 b32 and h128 b1 (what still limits it).
# Needs, carried: $BIN (default .dev/bin: tools/device/stage.sh), $BIN2 (default .dev/bin2: the
# mla-block test binaries cuda_graph, cuda_graph_fp8, decode_graphs, golden, golden_fp8,
# decode_fusions, built with `cargo test --release -p mla-block --no-run`), the kernel cache
# (.dev/kcache.tar.xz) and .peer/deepgemm.tar.xz.
# Usage (in the repository root, on the GPU machine): bash tools/device/pending_first_call.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
BIN2=${BIN2:-.dev/bin2}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$S" || true
source tools/device/lib.sh  # step
bash tools/peers/build_deepgemm.sh .peer/deepgemm.tar.xz /tmp/deepgemm > "$OUT/deepgemm_build.log" 2>&1 &
BUILD=$!
trap '(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT

# 1. The final state as users check it.
step parity 240 "$BIN/xtask" parity --backend cuda
grep -E "^\| |worst|FAIL|fail|seed" "$OUT/parity.log" | tail -40 | cut -c1-160 | tee -a "$S"
export MLA_TEST_DEVICE=cuda
for t in cuda_graph cuda_graph_fp8 decode_graphs decode_fusions golden golden_fp8; do
  step "block_$t" 150 "$BIN2/$t" --test-threads 4
done
unset MLA_TEST_DEVICE

# 2. DeepGEMM.
wait "$BUILD"
tail -3 "$OUT/deepgemm_build.log" | tee -a "$S"
DG=/tmp/deepgemm/deepgemm
export DG_JIT_DEBUG=1 DG_JIT_PRINT_COMPILER_COMMAND=1
(cd "$DG" && PYTHONPATH=$DG timeout 150 python3 -X faulthandler tests/test_fp8_fp4.py) > "$OUT/dg_test.log" 2>&1
echo "== dg_test: rc $?" | tee -a "$S"
head -40 "$OUT/dg_test.log" | cut -c1-220 | tee -a "$S"
tail -25 "$OUT/dg_test.log" | cut -c1-220 | tee -a "$S"
PYTHONPATH=$DG step dg_peer 120 python3 -X faulthandler tools/peers/fp8_blockwise_gemm.py --m 4096 --json "$OUT/fp8_blockwise_gemm.json"
tail -30 "$OUT/dg_peer.log" | cut -c1-220 | tee -a "$S"
unset DG_JIT_DEBUG DG_JIT_PRINT_COMPILER_COMMAND

# 3. The combine under ncu's full set.
for shape in h128,b32,kv16,bs64,sq1 h128,b1,kv16,bs64,sq1; do
  tag=${shape%%,kv16*}
  tag=${tag//,/_}
  step "ncu_full_$tag" 120 ncu --clock-control none --set full --import-source no --kernel-name regex:mla_decode_combine \
    --launch-count 1 "$BIN/xtask" bench decode --only "$shape" --iters 1 --no-parity
  grep -E "Duration|DRAM Throughput|L2 Hit|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issue Slot|No Eligible|Active Warps Per Scheduler|Eligible Warps" \
    "$OUT/ncu_full_$tag.log" | head -30 | tee -a "$S"
done
