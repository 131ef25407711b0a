"""The torch peer of `vt-mla bench-prefill`: one random MLA layer's prefill forward (DeepSeek-V3's
sizes by default: hidden 7168, 128 heads, q_lora 1536, kv_lora 512, qk_nope 128, qk_rope 64, v 128),
T new tokens of one sequence, optionally after --context C cached tokens, in plain torch:
- GEMMs: torch.matmul(x, W.t()) in bf16 (cuBLAS); bf16 reduced-precision reductions off, as vt's
  cuBLAS calls (--reduced-precision-reduction turns them on);
- RMSNorm (f32 math) and GPT-J (interleaved) RoPE from an f32 cos/sin cache in plain torch ops;
- the paged cache write as index_copy_ of [kv_c_normed | k_pe] rows, the context gather as
  index_select;
- attention: SDPA (qk 192, v 128) with the cuDNN backend (--sdpa picks another), causal over the
  new tokens; with context, per chunk of --chunk-tokens rows a non-causal attention with its lse
  (aten._scaled_dot_product_cudnn_attention with compute_log_sumexp, else the efficient backend's
  op, else plain math) and an lse merge in torch ops, as vt's block does.
The op names are vt's (vt-mla's op_timer): q_a_proj, kv_a_proj, rms_norm, q_b_proj, kv_norm_rope,
rope, cache_write, kv_b_proj, concat_k, attention, [gather_ctx, kv_b_proj (ctx), concat_k (ctx),
attention (ctx), merge], o_proj.
Timing, as vt-mla bench-prefill does: --iters forwards back to back between two synchronizations,
host-timed, the median of --rounds rounds; per op, each op of a forward rerun --op-iters times
between synchronizations, median over --rounds forwards, summed by name.
Prints a table and, with --json FILE, {"peer": ..., "rows": [{"T", "context", "ms", "min_ms",
"ops": {name: ms}}]} for `vt-mla bench-prefill --peer FILE`.
Usage: prefill_step.py [--tokens 1024,4096,8192] [--context C] [--chunk-tokens W] [--dims v3|small]
                       [--device cuda] [--json FILE] [--iters 5] [--rounds 5] [--op-iters 10]"""
import argparse, json, math, statistics, sys, time
import torch

DIMS = {
    "v3": dict(H=7168, N=128, Q=1536, L=512, P=128, R=64, V=128),
    "small": dict(H=128, N=16, Q=48, L=64, P=32, R=16, V=32),
}
BACKENDS = ("cudnn", "flash", "efficient", "math")


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def rms(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


def rope(x, cos, sin):
    """GPT-J pairs (x[2i], x[2i+1]) rotated by frequency i; cos/sin broadcast to x[..., R/2]."""
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2).to(x.dtype)


class Layer:
    def __init__(self, d, dtype, dev, rows, seed):
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.d, self.dtype, self.dev = d, dtype, dev
        H, N, Q, L, P, R, V = (d[k] for k in "HNQLPRV")

        def w(n, k):  # uniform with variance 1/fan_in, like vt's RandomLayerSpec
            a = math.sqrt(3.0 / k)
            return ((torch.rand(n, k, generator=g) * 2 - 1) * a).to(dtype).to(dev)

        def norm(n):
            return (1 + 0.1 * (torch.rand(n, generator=g) * 2 - 1)).to(dev)  # f32, used in f32 math

        self.w_qa, self.w_kva = w(Q, H), w(L + R, H)
        self.w_qb, self.w_kvb, self.w_o = w(N * (P + R), Q), w(N * (P + V), L), w(H, N * V)
        self.qn, self.kvn = norm(Q), norm(L)
        inv = 1.0 / (10000 ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
        ang = torch.arange(rows, dtype=torch.float64)[:, None] * inv[None]
        self.cos_sin = torch.cat((ang.cos(), ang.sin()), -1).float().to(dev)  # [rows, R]
        self.scale = (P + R) ** -0.5


def attend(q, k, v, causal, scale, need_lse, backend):
    """q [N, Tq, Dqk], k [N, Tk, Dqk], v [N, Tk, Dv] (views) -> out [N, Tq, Dv] (and lse [N, Tq], f32)."""
    from torch.nn.attention import sdpa_kernel, SDPBackend

    be = dict(cudnn=SDPBackend.CUDNN_ATTENTION, flash=SDPBackend.FLASH_ATTENTION,
              efficient=SDPBackend.EFFICIENT_ATTENTION, math=SDPBackend.MATH)[backend]
    q4, k4, v4 = q[None], k[None], v[None]
    if not need_lse:
        with sdpa_kernel([be]):
            try:
                return torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, scale=scale)[0], None
            except RuntimeError as e:  # a backend refusing the strided views: the copies count as attention
                if not WARNED:
                    print(f"SDPA {backend} refused the [T, N, D] views ({str(e)[:100]}); passing contiguous copies", file=sys.stderr)
                    WARNED.append(1)
                q4, k4, v4 = (x.contiguous() for x in (q4, k4, v4))
                return torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, scale=scale)[0], None
    return ATTN_LSE[0](q4, k4, v4, causal, scale)


def _lse_cudnn(q, k, v, causal, scale):
    r = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
    return r[0][0], r[1][0].reshape(q.shape[1], q.shape[2]).float()


def _lse_efficient(q, k, v, causal, scale):
    r = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)
    return r[0][0], r[1][0][:, : q.shape[2]].float()


def _lse_math(q, k, v, causal, scale):
    s = torch.matmul(q[0].float(), k[0].float().transpose(-1, -2)) * scale
    if causal:
        tq, tk = s.shape[-2:]
        s = s.masked_fill(torch.ones(tq, tk, dtype=torch.bool, device=s.device).tril(tk - tq).logical_not(), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.matmul(torch.exp(s - lse[..., None]), v[0].float()).to(q.dtype), lse


ATTN_LSE = [None, None]  # (function, name), chosen once by pick_lse
WARNED = []


def pick_lse(dev, dtype):
    """The first attention-with-lse op that runs here and agrees with plain math on a small case."""
    cands = [("cudnn", _lse_cudnn), ("efficient", _lse_efficient)] if dev.type == "cuda" else []
    g = torch.Generator(device="cpu").manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, dd, generator=g).to(dtype).to(dev) for n, dd in ((64, 192), (128, 192), (128, 128)))
    ref_o, ref_l = _lse_math(q, k, v, False, 0.07)
    for name, f in cands:
        try:
            o, l = f(q, k, v, False, 0.07)
            if (o.float() - ref_o.float()).abs().max() < 3e-2 and (l - ref_l).abs().max() < 1e-2:
                ATTN_LSE[:] = [f, name]
                return name
            print(f"attention with lse: {name} disagrees with math, not used", file=sys.stderr)
        except Exception as e:  # noqa: BLE001 (private ops differ across torch versions)
            print(f"attention with lse: {name} unavailable: {str(e)[:120]}", file=sys.stderr)
    ATTN_LSE[:] = [_lse_math, "math"]
    return "math"


def merge(o1, l1, o2, l2):
    """Two partial results [N, T, V] with lse [N, T] -> merged (out in o1's dtype, lse f32)."""
    m = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)
    s = w1 + w2
    o = (o1.float() * (w1 / s)[..., None] + o2.float() * (w2 / s)[..., None]).to(o1.dtype)
    return o, m + torch.log(s)


def steps(lay, t, c, chunk, backend):
    """The forward as (name, fn) steps over a shared state (each rerunnable on its own)."""
    d = lay.d
    H, N, Q, L, P, R, V = (d[k] for k in "HNQLPRV")
    dev, dt = lay.dev, lay.dtype
    s = {}
    g = torch.Generator(device="cpu").manual_seed(7)
    s["x"] = ((torch.rand(t, H, generator=g) * 2 - 1) * math.sqrt(3)).to(dt).to(dev)
    s["pos"] = torch.arange(c, c + t, device=dev)
    s["cache"] = ((torch.rand(c + t, L + R, generator=g) * 2 - 1)).to(dt).to(dev)  # context rows "cached"
    chunks = [(a, min(a + chunk, c)) for a in range(0, c, chunk)]

    def cos_sin():
        cs = lay.cos_sin.index_select(0, s["pos"])
        return cs[:, : R // 2], cs[:, R // 2:]

    def q_a():
        s["q_c"] = torch.matmul(s["x"], lay.w_qa.t())

    def kv_a():
        s["kv"] = torch.matmul(s["x"], lay.w_kva.t())

    def q_norm():
        s["q_c"] = rms(s["q_c"], lay.qn)

    def q_b():
        s["q"] = torch.matmul(s["q_c"], lay.w_qb.t()).view(t, N, P + R)

    def kv_norm_rope():
        cos, sin = cos_sin()
        s["kv_c"] = rms(s["kv"][:, :L], lay.kvn)
        s["k_pe"] = rope(s["kv"][:, L:], cos, sin)

    def rope_q():
        cos, sin = cos_sin()
        qp = s["q"][..., P:]
        qp.copy_(rope(qp, cos[:, None], sin[:, None]))

    def cache_write():
        s["cache"].index_copy_(0, s["pos"], torch.cat((s["kv_c"], s["k_pe"]), -1))

    def kv_b():
        s["kv_nope"] = torch.matmul(s["kv_c"], lay.w_kvb.t()).view(t, N, P + V)

    def concat_k():
        s["k"] = torch.cat((s["kv_nope"][..., :P], s["k_pe"][:, None, :].expand(t, N, R)), -1)

    def attention():
        q, k, v = s["q"].transpose(0, 1), s["k"].transpose(0, 1), s["kv_nope"][..., P:].transpose(0, 1)
        o, lse = attend(q, k, v, True, lay.scale, c > 0, backend)
        s["attn_new"], s["lse_new"] = o, lse  # [N, T, V]

    out = [("q_a_proj", q_a), ("kv_a_proj", kv_a), ("rms_norm", q_norm), ("q_b_proj", q_b),
           ("kv_norm_rope", kv_norm_rope), ("rope", rope_q), ("cache_write", cache_write),
           ("kv_b_proj", kv_b), ("concat_k", concat_k), ("attention", attention)]
    for i, (a, b) in enumerate(chunks):
        idx = torch.arange(a, b, device=dev)

        def gather(idx=idx):
            s["ctx"] = s["cache"].index_select(0, idx)

        def kv_b_ctx(n=b - a):
            s["ctx_nope"] = torch.matmul(s["ctx"][:, :L], lay.w_kvb.t()).view(n, N, P + V)

        def concat_ctx(n=b - a):
            s["ctx_k"] = torch.cat((s["ctx_nope"][..., :P], s["ctx"][:, None, L:].expand(n, N, R)), -1)

        def attn_ctx(i=i):
            q, k, v = s["q"].transpose(0, 1), s["ctx_k"].transpose(0, 1), s["ctx_nope"][..., P:].transpose(0, 1)
            o, lse = attend(q, k, v, False, lay.scale, True, backend)
            if i == 0:
                s["acc"], s["acc_lse"] = o, lse
            else:
                s["chunk"], s["chunk_lse"] = o, lse

        out += [("gather_ctx", gather), ("kv_b_proj (ctx)", kv_b_ctx), ("concat_k (ctx)", concat_ctx),
                ("attention (ctx)", attn_ctx)]
        if i > 0:
            def merge_acc():
                s["acc"], s["acc_lse"] = merge(s["acc"], s["acc_lse"], s["chunk"], s["chunk_lse"])

            out.append(("merge", merge_acc))
    if chunks:
        def merge_final():
            s["attn_new"], _ = merge(s["acc"], s["acc_lse"], s["attn_new"], s["lse_new"])

        out.append(("merge", merge_final))

    def o_proj():
        s["out"] = torch.matmul(s["attn_new"].transpose(0, 1).reshape(t, N * V), lay.w_o.t())

    out.append(("o_proj", o_proj))
    return out, s


def run_row(lay, t, c, chunk, a):
    st, s = steps(lay, t, c, chunk, a.sdpa)
    dev = lay.dev

    def forward():
        for _, f in st:
            f()

    with torch.no_grad():
        for _ in range(max(1, a.warmup)):
            forward()
        sync(dev)
        if not torch.isfinite(s["out"][[0, -1]].float()).all():
            raise RuntimeError("the output is not finite")
        rounds = []
        for _ in range(a.rounds):
            sync(dev)
            t0 = time.perf_counter()
            for _ in range(a.iters):
                forward()
            sync(dev)
            rounds.append((time.perf_counter() - t0) * 1e3 / a.iters)
        per = []  # per forward: each step's ms
        for _ in range(a.rounds):
            times = []
            for _, f in st:
                f()
                sync(dev)
                t0 = time.perf_counter()
                for _ in range(a.op_iters):
                    f()
                sync(dev)
                times.append((time.perf_counter() - t0) * 1e3 / a.op_iters)
            per.append(times)
    ops = {}
    for j, (name, _) in enumerate(st):
        ops[name] = ops.get(name, 0.0) + statistics.median(p[j] for p in per)
    return dict(T=t, context=c, ms=statistics.median(rounds), min_ms=min(rounds), ops=ops)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="1024,4096,8192")
    ap.add_argument("--context", type=int, default=0)
    ap.add_argument("--chunk-tokens", type=int, default=None)
    ap.add_argument("--dims", choices=sorted(DIMS), default="v3")
    ap.add_argument("--dtype", choices=("bf16", "f16", "f32"), default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sdpa", choices=BACKENDS, default="cudnn", help="SDPA backend of the causal attention")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--op-iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reduced-precision-reduction", action="store_true",
                    help="let cuBLAS reduce bf16 GEMMs in bf16 (torch's default; vt's cuBLAS calls disallow it)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = torch.device(a.device)
    dtype = dict(bf16=torch.bfloat16, f16=torch.float16, f32=torch.float32)[a.dtype]
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = a.reduced_precision_reduction
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = a.reduced_precision_reduction
    torch.backends.cuda.matmul.allow_tf32 = False
    tokens = [int(x) for x in a.tokens.split(",") if x]
    c = a.context
    chunk = a.chunk_tokens or max(1, min(c, 65536))
    lay = Layer(DIMS[a.dims], dtype, dev, c + max(tokens), a.seed)
    lse_impl = pick_lse(dev, dtype) if c > 0 else None
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev)
    peer = f"torch {torch.__version__} (torch.matmul/cuBLAS, SDPA {a.sdpa}" + (f", context attention with lse: {lse_impl}" if lse_impl else "") + ")"
    print(f"{peer} on {name}: {a.dims} layer {a.dtype}, context {c}" + (f" in chunks of {chunk}" if c else ""), flush=True)
    rows = []
    for t in tokens:
        try:
            r = run_row(lay, t, c, chunk, a)
        except Exception as e:  # noqa: BLE001 (report the row, keep going)
            print(f"T={t} context={c}: unavailable: {str(e)[:200]}", flush=True)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            continue
        rows.append(r)
        tot = sum(r["ops"].values())
        print(f"T={t:6d} context={c}: {r['ms']:9.4f} ms (min {r['min_ms']:.4f}; ops sum {tot:.4f})", flush=True)
        for k, v in r["ops"].items():
            print(f"    {k:18s} {v:9.4f} ms  {100 * v / tot:5.1f}%")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"peer": peer, "device": name, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
