// PrefillAttention, sm_90a wgmma kernel: being written.
#pragma once
