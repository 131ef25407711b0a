# Sourced by the device scripts (through lib.sh) and by warm_kernels.sh on the development
# machine, so both write the same lab texts (the disk cache is keyed by the text compiled).
#
# lab_overlay DIR HEADER NAME=VALUE...: a VT_CUDA_KERNELS_DIR overlay in DIR holding
# kernels-cuda/mla_decode_attention/HEADER with `#define NAME VALUE` lines on top.
lab_overlay() {
  local d=$1/mla_decode_attention h=$2
  shift 2
  mkdir -p "$d"
  { for def in "$@"; do echo "#define ${def%%=*} ${def#*=}"; done; cat "kernels-cuda/mla_decode_attention/$h"; } > "$d/$h"
}

# The lab builds warm_kernels.sh compiles ahead, as "HEADER NAME=VALUE..." lines: timeline.sh's.
# The fp8 loader's labs became the kernels' own code in the twenty-eighth and twenty-ninth
# sessions, and the three-warpgroup kernel's per-column-block FULL barriers (W3_SPLIT_FULL) and
# its CTA pairs (W3_MCAST, now Kernel::Wgmma3Pair) in the thirtieth; W3_OWNQ (twenty-ninth),
# W3_Q_AHEAD (thirtieth), the combine's 8-byte stores (MLA_COMBINE_VST, thirty-first), W3_QEARLY
# and W3_LAYOUT (thirty-second) and W3_QNEXT (thirty-third) were measured and removed. Add a line
# here for a new lab so its call does not compile it on the device. The other lab scripts'
# builds (schedule_labs.sh, f8r_labs.sh) compile on the device. F8R_VT and W3_CP_DEFER became
# the defaults in the twenty-fourth session; their =0 builds are the old forms. F8R_SOLO and
# F8R_ONEBAR were measured and removed in the thirty-eighth session, W3_L2AHEAD in the
# thirty-ninth, MLA_KV_EVICT_FIRST (the KV loads' evict-first L2 policy), MLA_PART16 (16-bit
# partials) and W3_PG_LAB in the fortieth, whose W3_LOOKUP=2 became the kernels' only form.
LAB_BUILDS="schedule.cuh MLA_TIMELINE=1"
