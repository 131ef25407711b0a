"""FlashMLA 9241ae3's sparse MLA kernels (DeepSeek-V3.2) on the shapes of `cargo xtask bench sparse`.

- decode: flash_mla_with_kvcache(..., is_fp8_kvcache=True, indices=...) over the 656-byte
  fp8 cache (V32_FP8Sparse layout, block size 64, scales 1.0): b sequences of s_kv tokens
  (blocks scattered by a random permutation), s_q = 2 query tokens each, h_q heads, topk
  distinct random positions of its sequence per query token, given as cache slots
  (block * 64 + row). FlashMLA's V3.2 rows (h_q 128, b 2/64/74/128, s_kv 32768, topk 2048),
  the same at h_q 64, and the peak rows (b 148, topk 16384). Every sequence has s_kv tokens
  (FlashMLA's own test draws varlen lengths); the vt bench does the same.
- prefill: flash_mla_sparse_fwd(q [s_q, h_q, 576], kv [s_kv, 1, 576] bf16, indices
  [s_q, 1, topk]): s_q 4096, h_q 128, topk 2048 distinct random tokens, s_kv 8192 ... 131072.
- Counting (FlashMLA's tests/lib.py): flops = 2 T h_q topk (576 + 512), T = b s_q;
  decode bytes = 2 T h_q (576 + 512) + unique slots * 656; prefill bytes = valid indices
  * 576 * 2 + 2 T h_q (576 + 512).
- Timing: triton.testing.do_bench (median, L2 cleared before each run), as flashmla_decode.py.

Usage (PYTHONPATH holding a FlashMLA build, tools/peers/build_flashmla.sh):
    flashmla_sparse.py [--json FILE] [--only decode|prefill]

JSON written with --json (what `cargo xtask bench sparse --peer FILE` reads):
    {"peer": "FlashMLA 9241ae3 sparse",
     "rows": [{"kind": "decode" | "prefill", "h_q": int, "b": int (1 for prefill),
               "s_q": int, "s_kv": int, "topk": int,
               "us": float (median microseconds), "tflops": float, "gbps": float}]}
"""
import json, sys, torch, triton
from flash_mla import flash_mla_with_kvcache, get_mla_metadata, flash_mla_sparse_fwd

torch.manual_seed(0)
D, DV, BS, ROW = 576, 512, 64, 656
only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None


def distinct(rows, n, k):
    """k distinct random positions of 0..n per row, [rows, k] int64, on the GPU."""
    out = []
    for r0 in range(0, rows, 256):
        r = min(256, rows - r0)
        out.append(torch.rand(r, n, device="cuda").argsort(dim=1)[:, :k])
    return torch.cat(out)


def fp8_cache(rows):
    """rows 656-byte V32_FP8Sparse rows: e4m3 latent of randn / 10, four f32 scales 1.0, bf16 rope."""
    buf = torch.empty(rows, ROW, dtype=torch.uint8, device="cuda")
    for r0 in range(0, rows, 1 << 20):
        r1 = min(rows, r0 + (1 << 20))
        n = r1 - r0
        buf[r0:r1, :512] = (torch.randn(n, 512, device="cuda") / 10).to(torch.float8_e4m3fn).view(torch.uint8)
        buf[r0:r1, 512:528] = torch.ones(n, 4, dtype=torch.float32, device="cuda").view(torch.uint8)
        buf[r0:r1, 528:] = (torch.randn(n, 64, device="cuda") / 10).to(torch.bfloat16).view(torch.uint8)
    return buf


decode = [(h, b, 2, 32768, 2048) for h in (128, 64) for b in (2, 64, 74, 128)]
decode += [(h, 148, 2, 32768, 16384) for h in (64, 128)]
prefill = [(128, 1, 4096, s_kv, 2048) for s_kv in (8192, 32768, 65536, 98304, 131072)]
rows = []


def report(kind, h_q, b, s_q, s_kv, topk, ms, byts):
    t = b * s_q
    flops = 2 * t * h_q * topk * (D + DV)
    rows.append(dict(kind=kind, h_q=h_q, b=b, s_q=s_q, s_kv=s_kv, topk=topk, us=ms * 1e3,
                     tflops=flops / ms / 1e9, gbps=byts / ms / 1e6))
    print(f"FlashMLA sparse {kind} h_q={h_q:3d} b={b:3d} s_q={s_q} s_kv={s_kv:6d} topk={topk:5d}: "
          f"{ms*1e3:8.1f} us {flops/ms/1e9:5.0f} TFLOP/s {byts/ms/1e6:6.0f} GB/s", flush=True)


if only in (None, "decode"):
    cache_rows = max(b * s_kv for _, b, _, s_kv, _ in decode)
    cache = fp8_cache(cache_rows)
    for h_q, b, s_q, s_kv, topk in decode:
        per_seq = s_kv // BS
        table = torch.randperm(b * per_seq, device="cuda").view(b, per_seq)
        pos = distinct(b * s_q, s_kv, topk).view(b, s_q, topk)
        seq = torch.arange(b, device="cuda").view(b, 1, 1)
        idx = (table[seq, pos // BS] * BS + pos % BS).to(torch.int32)
        q = torch.randn(b, s_q, h_q, D, dtype=torch.bfloat16, device="cuda") / 10
        kc = cache[: b * s_kv].view(torch.float8_e4m3fn).view(b * per_seq, BS, 1, ROW)
        md, _ = get_mla_metadata()
        f = lambda: flash_mla_with_kvcache(q, kc, None, None, DV, md, None, D ** -0.5, False, True, idx)
        f()
        ms = triton.testing.do_bench(f, return_mode="median")
        t = b * s_q
        byts = 2 * t * h_q * (D + DV) + idx.unique().numel() * ROW
        report("decode", h_q, b, s_q, s_kv, topk, ms, byts)
    del cache

if only in (None, "prefill"):
    for h_q, b, s_q, s_kv, topk in prefill:
        q = torch.randn(s_q, h_q, D, dtype=torch.bfloat16, device="cuda") / 10
        kv = torch.randn(s_kv, 1, D, dtype=torch.bfloat16, device="cuda") / 10
        idx = distinct(s_q, s_kv, topk).to(torch.int32).view(s_q, 1, topk)
        f = lambda: flash_mla_sparse_fwd(q, kv, idx, D ** -0.5, DV)
        f()
        ms = triton.testing.do_bench(f, return_mode="median")
        byts = s_q * topk * D * 2 + 2 * s_q * h_q * (D + DV)
        report("prefill", h_q, b, s_q, s_kv, topk, ms, byts)

if "--json" in sys.argv:
    json.dump({"peer": "FlashMLA 9241ae3 sparse", "rows": rows},
              open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1)
