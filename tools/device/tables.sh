#!/usr/bin/env bash
# Main's full tables with their peers in one call (issues 13, 16, 17, 18, 19; ~330 s on an H200
# with FlashMLA built in the call): PARTS of "gemm decode step sparse" (default all):
#  - gemm: `xtask bench gemm --m 1,32,128,4096` beside torch's blockwise fp8
#    (tools/peers/fp8_blockwise_gemm.py);
#  - decode: `xtask bench decode` beside FlashMLA (tools/peers/flashmla_decode.py), and
#  - step: `vt-mla bench --graph` (bf16 and fp8 weights, B 1 / 32 / 128) beside torch +
#    FlashMLA's step (tools/peers/block_step.py): pending_first_call.sh's parts "table steps";
#  - sparse: `xtask bench sparse` beside FlashMLA's sparse kernels (tools/peers/flashmla_sparse.py);
#  - clean (not in the default): the decode table again with the L2 cleared by a read instead of
#    do_bench's write, for both (`flashmla_decode.py --clean-flush`, `bench decode --clean-flush`):
#    what the write-back of the flush's dirty lines adds to each side's time.
# The issues' tables are an H200's: guard the call, e.g.
#   if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash tools/device/tables.sh; fi
# Needs, carried: $BIN (default .dev/bin: xtask, vt-mla; tools/device/stage.sh), .dev/kcache.tar.xz,
# .peer/flashmla.tar.xz. Usage (in the repository root, on the GPU machine): DEADLINE=330 bash tools/device/tables.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee -a "$S" || true
source tools/device/lib.sh
trap '(cd "$OUT" && tar czf logs53.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT
PARTS=${PARTS:-"decode step gemm sparse"}
part() { [[ " $PARTS " == *" $1 "* ]]; }
[ -n "${PREFLIGHT:-}" ] || flashmla_build
if part gemm; then
  step gemm_peer 90 python3 tools/peers/fp8_blockwise_gemm.py --m 1,32,128,4096 --clean-flush --json "$OUT/fp8_blockwise_gemm.json"
  G=(); [ -s "$OUT/fp8_blockwise_gemm.json" ] && G=(--peer "$OUT/fp8_blockwise_gemm.json")
  step gemm 120 "$BIN/xtask" bench gemm --m 1,32,128,4096 --iters 20 ${G[@]+"${G[@]}"} --json "$OUT/gemm.json"
  grep -E "^\||^[a-z_]+ .*M|floor|ratio" "$OUT/gemm.log" | cut -c1-220 | head -60 | tee -a "$S"
fi
flashmla_built 2
# The decode table and the V3 step with their peers: pending_first_call.sh's parts 2 and 3 (its
# own summary appended to this one), FlashMLA already built above.
PFC=()
part decode && PFC+=(table)
part step && PFC+=(steps)
if [ ${#PFC[@]} -gt 0 ]; then
  OUT=$OUT/main PARTS="${PFC[*]}" DEADLINE=$(( ${DEADLINE:-100000} - SECONDS )) \
    bash tools/device/pending_first_call.sh > "$OUT/pending_first_call.txt" 2>&1
  cat "$OUT/main/summary.txt" >> "$S"
fi
if part clean; then
  PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" step clean_peer 90 python3 tools/peers/flashmla_decode.py --clean-flush --json "$OUT/flashmla_clean.json"
  grep -E "protocol check" "$OUT/clean_peer.log" | tee -a "$S"
  CP=(); [ -s "$OUT/flashmla_clean.json" ] && CP=(--peer "$OUT/flashmla_clean.json")
  step decode_clean 150 "$BIN/xtask" bench decode --clean-flush --no-parity --iters 20 ${CP[@]+"${CP[@]}"} --json "$OUT/decode_clean.json"
  grep -E "^\| |^targets|^L2 flush" "$OUT/decode_clean.log" | cut -c1-120 | tee -a "$S"
fi
if part sparse; then
  PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" step sparse_peer 120 python3 tools/peers/flashmla_sparse.py --json "$OUT/flashmla_sparse.json"
  SP=(); [ -s "$OUT/flashmla_sparse.json" ] && SP=(--peer "$OUT/flashmla_sparse.json")
  step sparse 150 "$BIN/xtask" bench sparse ${SP[@]+"${SP[@]}"} --json "$OUT/sparse.json"
  grep -E "^(decode|prefill|indexer|step)|ratio|share" "$OUT/sparse.log" | cut -c1-200 | head -40 | tee -a "$S"
fi
