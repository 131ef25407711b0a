"""torch SDPA (cuDNN backend) at the head dims of `crates/vt-cuda/tests/prefill_dims_speed.rs`:
(qk, v) = (192, 128), (128, 128), (64, 64), 128 heads, bf16, causal T = 4096 and 8192, and
4096 queries over 16384 keys non-causal. FLOPs = 2 x visible pairs x heads x (qk + v);
triton.testing.do_bench median. Prints a table; run in the same device call as the test."""
import torch, triton
from torch.nn.attention import sdpa_kernel, SDPBackend

def pairs(lq, lk, causal):
    return sum(min(max(lk - lq + i + 1, 0), lk) for i in range(lq)) if causal else lq * lk

print("torch", torch.__version__, "SDPA cuDNN, 128 heads, bf16, TFLOP/s")
print("| qk | v | causal T=4096 | causal T=8192 | chunk 4096 over 16384 |")
print("|---|---|---|---|---|")
for d, dv in ((192, 128), (128, 128), (64, 64)):
    cells = []
    for lq, lk, causal in ((4096, 4096, True), (8192, 8192, True), (4096, 16384, False)):
        q = torch.randn(1, 128, lq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 128, lk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, 128, lk, dv, device="cuda", dtype=torch.bfloat16)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            ms = triton.testing.do_bench(f, warmup=50, rep=200, return_mode="median")
        cells.append(2 * pairs(lq, lk, causal) * 128 * (d + dv) / (ms * 1e-3) / 1e12)
    print(f"| {d} | {dv} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
