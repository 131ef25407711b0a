#!/usr/bin/env bash
# The A/B that made `VT_MLA_3WG_PAIR` the default (docs/perf.md, "Thirty-first session"): the
# decode suite, the block's CUDA tests with the flag on (CUDA graphs, goldens, fusions, both
# caches) and the V3 layer step in graph replay at B 32 / 128 (128 heads: Auto takes the pair
# there) with the flag on and off, bf16 weights, and on with fp8 weights.
# Needs, carried: $BIN (default .dev/bin) with mla_decode_attention and vt-mla, $BIN2 (default
# .dev/bin2) with the block's test binaries (tools/device/stage.sh), .dev/kcache.tar.xz;
# MANIFEST (the staging checkout's crates/mla-block) for the goldens.
# Usage (in the repository root, on the GPU machine):
#   MANIFEST=/work/main/crates/mla-block bash tools/device/three_wg_pair_step.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
BIN2=${BIN2:-.dev/bin2}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$S" || true
source tools/device/lib.sh  # step, link_manifest, kcache_report
trap '(cd "$OUT" && tar czf logs_pair_step.tgz --remove-files ./*.log 2>/dev/null); kcache_report' EXIT
VT_MLA_3WG_PAIR=1 step decode_tests 90 "$BIN/mla_decode_attention" --test-threads 1
link_manifest
for t in cuda_graph golden decode_fusions cuda_graph_fp8 golden_fp8; do
  VT_MLA_3WG_PAIR=1 MLA_TEST_DEVICE=cuda step "block_$t" 90 "$BIN2/$t" --test-threads 1
done
for v in "bf16 1" "bf16 0" "fp8 1"; do
  set -- $v
  wd=()
  [ "$1" = fp8 ] && wd=(--weights-dtype fp8)
  for b in 32 128; do
    VT_MLA_3WG_PAIR=$2 step "step_$1_pair$2_b$b" 60 "$BIN/vt-mla" bench --graph --backend cuda --tp 1 \
      --batch "$b" --context 4096 --iters 20 --profile 3 --steps 5 --rounds 2 --warmup 2 ${wd[@]+"${wd[@]}"}
    grep -E "one step|decode_attention" "$OUT/step_$1_pair$2_b$b.log" | cut -c1-120 | sed "s/^/$1 pair=$2 b$b: /" \
      | tee -a "$S"
  done
done
