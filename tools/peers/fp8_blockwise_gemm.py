"""torch's block-scaled fp8 GEMM (torch._scaled_mm with DeepSeek's scales: 1 x 128 on the
activations, 128 x 128 on the weights; cuBLASLt's VEC128 / BLK128x128 modes on sm_90, CUDA 12.9+)
and torch's bf16 matmul on the linear GEMMs of a DeepSeek-V3 layer, the shapes of
`cargo xtask bench gemm` (a_proj 2112 x 7168, q_b 24576 x 1536, kv_b 32768 x 512 (prefill M only),
o_proj 7168 x 16384; N x K), at the M of --m (default 1,128,4096).

Operands as torch wants them: a [M, K] e4m3 row-major, its scales [M, K/128] stored [K/128, M]
(outer-dim-major); the weight [N, K] e4m3 passed as its transpose (column-major [K, N]), its
scales [N/128, K/128] row-major passed transposed. Timing: triton.testing.do_bench (median, L2
cleared before each call by zeroing 256 MB); --clean-flush: the same loop with the L2 cleared by
a read (l2flush.py), the protocol `xtask bench gemm` uses by default, which takes only a file
whose "l2_flush" matches its own. FLOPs = 2 M N K. A shape torch refuses is recorded with its error.

DeepGEMM (deepseek-ai/DeepGEMM's `fp8_gemm_nt`, the same operands and scales, the activations'
scales in the transposed TMA-aligned layout it wants, made once outside the timing) is timed too
when `deep_gemm` imports (tools/peers/build_deepgemm.sh builds it on the GPU machine; put its
directory on PYTHONPATH): `deepgemm_ms`, or `deepgemm_error` with why not.
Usage: fp8_blockwise_gemm.py [--m 1,128,4096] [--clean-flush] [--json FILE]"""
import json, sys, torch, triton
from l2flush import time_ms, word

CLEAN = "--clean-flush" in sys.argv


def bench(f):
    return time_ms(f, read=True) if CLEAN else triton.testing.do_bench(f, return_mode="median")


try:
    import deep_gemm
    from deep_gemm.utils import get_mn_major_tma_aligned_tensor
    DG_ERROR = None
except Exception as e:  # not built here, or a build that does not load
    deep_gemm = None
    DG_ERROR = f"deep_gemm does not import: {e}"[:300]

GEMMS = [("a_proj", 2112, 7168, True), ("q_b", 24576, 1536, True), ("kv_b", 32768, 512, False),
         ("o_proj", 7168, 16384, True)]
ms_arg = sys.argv[sys.argv.index("--m") + 1] if "--m" in sys.argv else "1,128,4096"
MS = [int(x) for x in ms_arg.split(",")]
f8 = torch.float8_e4m3fn


def cdiv(a, b):
    return (a + b - 1) // b


rows = []
for name, n, k, decode in GEMMS:
    w16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    w8 = torch.randn(n, k, device="cuda").clamp(-448, 448).to(f8)
    ws = torch.rand(cdiv(n, 128), cdiv(k, 128), device="cuda") * 2e-3 + 1e-3
    for m in MS:
        if m <= 128 and not decode:
            continue
        flops = 2 * m * n * k
        x16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        x8 = torch.randn(m, k, device="cuda").clamp(-448, 448).to(f8)
        xs = (torch.rand(cdiv(k, 128), m, device="cuda") * 2e-3 + 1e-3).t()  # [M, KB], stride (1, M)
        row = dict(gemm=name, m=m, n=n, k=k, flops=flops)
        bf = lambda: torch.matmul(x16, w16.t())
        bf(); row["bf16_ms"] = bench(bf)
        try:
            f = lambda: torch._scaled_mm(x8, w8.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16)
            out = f()
            # A check that the scales were applied as DeepSeek's blocks (first row, f32 reference).
            xd = x8[:1].float() * xs[:1].repeat_interleave(128, dim=1)[:, :k]
            wd = w8.float() * ws.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
            ref = xd @ wd.t()
            row["rel_err_row0"] = ((out[:1].float() - ref).norm() / ref.norm()).item()
            row["fp8_ms"] = bench(f)
            row["fp8_tflops"] = flops / row["fp8_ms"] / 1e9
        except Exception as e:  # torch/cuBLASLt without blockwise support for this shape
            row["error"] = str(e)[:300]
        if deep_gemm is None:
            row["deepgemm_error"] = DG_ERROR
        else:
            try:
                sfa = get_mn_major_tma_aligned_tensor(xs.contiguous())  # [M, KB] f32, as DeepGEMM wants it
                d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                g = lambda: deep_gemm.fp8_gemm_nt((x8, sfa), (w8, ws), d, disable_ue8m0_cast=True)
                g()  # the JIT compiles this shape's kernel here, outside the timing
                xd = x8[:1].float() * xs[:1].repeat_interleave(128, dim=1)[:, :k]
                wd = w8.float() * ws.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
                ref = xd @ wd.t()
                row["deepgemm_rel_err_row0"] = ((d[:1].float() - ref).norm() / ref.norm()).item()
                row["deepgemm_ms"] = bench(g)
            except Exception as e:
                row["deepgemm_error"] = str(e)[:300]
        rows.append(row)
        fp8 = f"{row['fp8_ms'] * 1e3:9.1f} us {row['fp8_tflops']:5.0f} TFLOP/s (err {row['rel_err_row0']:.1e})" \
            if "fp8_ms" in row else f"unavailable: {row['error'][:120]}"
        dg = f"{row['deepgemm_ms'] * 1e3:9.1f} us (err {row['deepgemm_rel_err_row0']:.1e})" \
            if "deepgemm_ms" in row else f"- ({row.get('deepgemm_error', '')[:80]})"
        print(f"{name:7s} M {m:5d}: bf16 {row['bf16_ms'] * 1e3:9.1f} us {flops / row['bf16_ms'] / 1e9:5.0f} TFLOP/s;"
              f" fp8 blockwise {fp8}; DeepGEMM {dg}", flush=True)
        del x16, x8, xs
    del w16, w8, ws
    torch.cuda.empty_cache()
if "--json" in sys.argv:
    dg_name = f", DeepGEMM {deep_gemm.__version__}" if deep_gemm is not None else ""
    json.dump({"peer": f"torch {torch.__version__} _scaled_mm blockwise (1x128, 128x128){dg_name}",
               "device": torch.cuda.get_device_name(), "l2_flush": word(CLEAN), "rows": rows},
              open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1)
