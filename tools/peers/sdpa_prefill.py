"""torch SDPA on the MLA prefill shape (qk 192, v 128, bf16): cuDNN (v as is) and flash (v padded to
192, as engines do for FlashAttention-2). The shapes of `cargo xtask bench prefill`:
- causal single sequences, T = 1024, 4096, 8192, 16384 at 128 and 16 heads;
- the varlen batch at 128 heads: 16 causal sequences, lengths spread over 256..8192 in a mixed
  order, timed as a loop of one SDPA call per sequence (SDPA has no varlen form); its row holds the
  batch's total time and `seqlens`, tq = tk = the total tokens;
- the single causal sequence of the same work as that batch ("varlen ref");
- chunked context: 4096 queries, non-causal, over 16384 and 65536 keys, at 128 and 16 heads (SDPA
  without lse: it returns none; ours computes it).
FLOPs count visible (query, key) pairs: 2 * pairs * heads * (192 + 128).
Copied from ../shared/tools/peers/sdpa_prefill.py and extended (varlen batch, its reference, 16-head
chunks); the row format is the same, plus "seqlens" on the varlen row.
Usage: sdpa_prefill.py [--json FILE]"""
import json, math, sys, torch, triton
from torch.nn.attention import sdpa_kernel, SDPBackend
DQK, DV = 192, 128

# Same formulas as xtask/src/bench_prefill.rs (varlen_lens, same_work_len).
_sorted = [256 + i * (8192 - 256) // 15 for i in range(16)]
VARLEN = [_sorted[(j * 7) % 16] for j in range(16)]
_pairs = sum(l * (l + 1) // 2 for l in VARLEN)
VARLEN_REF = int(math.floor(math.sqrt(2 * _pairs) / 64 + 0.5)) * 64

shapes = [(h, [t], [t], True) for h in (128, 16) for t in (1024, 4096, 8192, 16384)]
shapes += [(128, [VARLEN_REF], [VARLEN_REF], True), (128, VARLEN, VARLEN, True)]
shapes += [(h, [4096], [tk], False) for h in (128, 16) for tk in (16384, 65536)]

def pairs(lq, lk, causal):
    if not causal:
        return lq * lk
    return sum(min(max(lk - lq + i + 1, 0), lk) for i in range(lq))

rows = []
for heads, qlens, klens, causal in shapes:
    flops = 2 * sum(pairs(a, b, causal) for a, b in zip(qlens, klens)) * heads * (DQK + DV)
    qs = [torch.randn(1, heads, a, DQK, device="cuda", dtype=torch.bfloat16) for a in qlens]
    ks = [torch.randn(1, heads, b, DQK, device="cuda", dtype=torch.bfloat16) for b in klens]
    tq, tk = sum(qlens), sum(klens)
    for name, be, dv in (("cudnn", SDPBackend.CUDNN_ATTENTION, DV), ("flash", SDPBackend.FLASH_ATTENTION, DQK)):
        vs = [torch.randn(1, heads, b, dv, device="cuda", dtype=torch.bfloat16) for b in klens]
        try:
            with sdpa_kernel([be]):
                def f():
                    for q, k, v in zip(qs, ks, vs):
                        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                f(); ms = triton.testing.do_bench(f, return_mode="median")
        except Exception as e:
            print(f"{name} heads={heads} tq={tq} tk={tk}: unavailable: {str(e)[:100]}"); continue
        row = dict(backend=name, heads=heads, tq=tq, tk=tk, causal=causal, ms=ms, tflops=flops / ms / 1e9)
        if len(qlens) > 1:
            row["seqlens"] = qlens
        rows.append(row)
        tag = f" varlen x{len(qlens)}" if len(qlens) > 1 else ""
        print(f"SDPA {name:5s} heads={heads:3d} tq={tq:5d} tk={tk:5d} causal={int(causal)}{tag}: {ms:8.3f} ms {flops/ms/1e9:5.0f} TFLOP/s", flush=True)
        del vs
    del qs, ks
    torch.cuda.empty_cache()
if "--json" in sys.argv:
    json.dump({"peer": f"torch {torch.__version__} SDPA", "rows": rows}, open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1)
