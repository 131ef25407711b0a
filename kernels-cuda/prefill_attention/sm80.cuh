// PrefillAttention, sm_80+ mma.sync kernel (FlashAttention-2 class): see
// crates/vt-cuda/src/prefill_attention/sm80.rs. Included by prefill_attention.cu after
// common.cuh and params.cuh.
#pragma once
