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

# The lab builds the device scripts run (pending_first_call.sh, f8r_labs.sh, timeline.sh,
# schedule_labs.sh), as "HEADER NAME=VALUE..." lines: warm_kernels.sh compiles each ahead.
LAB_BUILDS="wgmma_3wg_sm90.cuh F8R_VT=1
wgmma_3wg_sm90.cuh F8R_OWNV=1
wgmma_3wg_sm90.cuh F8R_VT=1 F8R_LAB=3
wgmma_3wg_sm90.cuh F8R_AHEAD=1
wgmma_3wg_sm90.cuh W3_CP_DEFER=1
schedule.cuh MLA_TIMELINE=1
schedule.cuh MLA_SPLIT_COST=0
schedule.cuh MLA_SPLIT_COST=2
schedule.cuh MLA_SPLIT_COST=4"
