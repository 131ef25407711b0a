#!/usr/bin/env bash
# Main's full tables with their peers in one call (issues 13, 16, 17, 18, 19; ~330 s on an H200
# with FlashMLA built in the call): PARTS of "gemm decode step sparse" (default all):
#  - gemm: `xtask bench gemm --m 1,32,128,4096` beside torch's blockwise fp8
#    (tools/peers/fp8_blockwise_gemm.py);
#  - decode: `xtask bench decode` beside FlashMLA (tools/peers/flashmla_decode.py);
#  - step: `vt-mla bench --graph` (bf16 and fp8 weights, B 1 / 32 / 128) beside torch +
#    FlashMLA's step (tools/peers/block_step.py);
#  - sparse: `xtask bench sparse` beside FlashMLA's sparse kernels (tools/peers/flashmla_sparse.py).
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
PP="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}"
if part gemm; then
  step gemm_peer 90 python3 tools/peers/fp8_blockwise_gemm.py --m 1,32,128,4096 --json "$OUT/fp8_blockwise_gemm.json"
  G=(); [ -s "$OUT/fp8_blockwise_gemm.json" ] && G=(--peer "$OUT/fp8_blockwise_gemm.json")
  step gemm 120 "$BIN/xtask" bench gemm --m 1,32,128,4096 --iters 20 ${G[@]+"${G[@]}"} --json "$OUT/gemm.json"
  grep -E "^\||^[a-z_]+ .*M|floor|ratio" "$OUT/gemm.log" | cut -c1-220 | head -60 | tee -a "$S"
fi
flashmla_built 2
if part decode; then
  PYTHONPATH="$PP" step peer 60 python3 tools/peers/flashmla_decode.py --json "$OUT/flashmla.json"
  P=(); [ -s "$OUT/flashmla.json" ] && P=(--peer "$OUT/flashmla.json")
  step bench 150 "$BIN/xtask" bench decode ${P[@]+"${P[@]}"} --json "$OUT/decode.json"
  grep -E "^h[0-9]|^targets|^  (ok|MISS)|ceiling|copy" "$OUT/bench.log" | cut -c1-220 | tee -a "$S"
fi
if part step; then
  PYTHONPATH="$PP" step step_peer 120 python3 tools/peers/block_step.py --json "$OUT/block_step.json"
  grep -E "^B=|b=|graph" "$OUT/step_peer.log" | head -8 | tee -a "$S"
  for w in bf16 fp8; do
    for bc in "1 8192" "32 4096" "128 4096"; do
      set -- $bc
      wd=(); [ "$w" = fp8 ] && wd=(--weights-dtype fp8)
      step "step_${w}_b$1" 90 "$BIN/vt-mla" bench --graph --backend cuda --tp 1 --batch "$1" --context "$2" --iters 20 \
        --profile 3 --steps 5 --rounds 2 --warmup 2 ${wd[@]+"${wd[@]}"} --peer "$OUT/block_step.json"
      grep -E "one step|^peer|floor" "$OUT/step_${w}_b$1.log" | cut -c1-200 | tee -a "$S"
    done
  done
fi
if part sparse; then
  PYTHONPATH="$PP" step sparse_peer 120 python3 tools/peers/flashmla_sparse.py --json "$OUT/flashmla_sparse.json"
  SP=(); [ -s "$OUT/flashmla_sparse.json" ] && SP=(--peer "$OUT/flashmla_sparse.json")
  step sparse 150 "$BIN/xtask" bench sparse ${SP[@]+"${SP[@]}"} --json "$OUT/sparse.json"
  grep -E "^(decode|prefill|indexer|step)|ratio|share" "$OUT/sparse.log" | cut -c1-200 | head -40 | tee -a "$S"
fi
