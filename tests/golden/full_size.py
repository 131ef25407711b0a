#!/usr/bin/env python3
"""The MLA block at DeepSeek-V3's full attention size against transformers (not in CI: 374 MB of
weights and torch + transformers; see README.md, "Full DeepSeek-V3 size").

    python3 tests/golden/full_size.py --out /tmp/v3full [--dtype bfloat16|float32]
        [--vt-mla target/release/vt-mla] [--seed 3001] [--threads 2]

Builds one case with generate.py's functions (config_json, make_arrays, load_hf_config,
hf_forward, seed_block_forward): DeepSeek-V3's attention config (hidden 7168, 128 heads,
q_lora 1536, kv_lora 512, nope 128, rope 64, v 128, YaRN factor 40 over 4096 positions,
mscale 1 / 1, no `rope_interleave`), random weights N(0, 1/fan_in) stored in the case's dtype,
S = 2 sequences of T = 16 tokens starting at positions 100 and 5000. `expected` is transformers'
eager `DeepseekV3Attention` in float32 on those values; `ref64` the seed block in float64.
Then runs `vt-mla run --backend cpu` under each schedule below and prints the relative Frobenius
error against both; exits 1 if one is over its tolerance (f32 1e-4, bf16 2e-2, an fp8_ds_mla
cache 6e-2: tests golden.rs and golden_fp8.rs).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate as g  # noqa: E402

SCHEDULES = [
    ["--schedule", "prefill:16"],
    ["--schedule", "prefill:8,decode:8"],
    ["--schedule", "prefill:5,decode:3,prefill:4,decode:4"],
    ["--schedule", "prefill:5,decode:3,prefill:4,decode:4", "--block-size", "1"],
    ["--schedule", "prefill:5,decode:3,prefill:4,decode:4", "--block-size", "16"],
    ["--schedule", "prefill:1,decode:15", "--block-size", "1"],
    ["--schedule", "prefill:8,decode:8", "--kv-cache-dtype", "fp8_ds_mla"],
    ["--schedule", "prefill:1,decode:15", "--block-size", "1", "--kv-cache-dtype", "fp8_ds_mla"],
]


def case(dtype: str, seed: int) -> dict:
    """DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3), its attention part."""
    return dict(
        name="deepseek_v3_full", seed=seed, dtype=dtype,
        hidden=7168, heads=128, q_lora=1536, kv_lora=512, nope=128, rope_dim=64, v=128,
        S=2, T=16, starts=[100, 5000],
        rope_theta=10000.0,
        rope=dict(factor=40, original_max_position_embeddings=4096, beta_fast=32, beta_slow=1,
                  mscale=1.0, mscale_all_dim=1.0),
        max_position_embeddings=163840,
        rope_form="legacy", rope_type_key="type", rope_interleave="absent",
    )


def read_out(path: str) -> np.ndarray:
    from safetensors.torch import load_file
    return load_file(path)["out"].double().numpy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="scratch folder for the case (about 380 MB in bf16)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--vt-mla", default="target/release/vt-mla")
    ap.add_argument("--seed", type=int, default=3001)
    ap.add_argument("--threads", type=int, default=2, help="torch's CPU threads")
    args = ap.parse_args()

    import torch
    import transformers
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")
    c = case(args.dtype, args.seed)
    cfg = g.config_json(c)
    weights, hidden, positions = g.make_arrays(c)
    tdt = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    stored = {g.PREFIX + k: torch.from_numpy(v).to(tdt).contiguous() for k, v in weights.items()}
    del weights
    # transformers and the float64 block both run on exactly the stored values.
    w_f32 = {k[len(g.PREFIX):]: v.float().numpy() for k, v in stored.items()}
    h_stored = torch.from_numpy(hidden).to(tdt).contiguous()
    h_f32 = h_stored.float().numpy()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as fh:
        import json
        json.dump(cfg, fh, indent=2)
        fh.write("\n")
    t0 = time.time()
    expected, *_ = g.hf_forward(g.load_hf_config(args.out, c), w_f32, h_f32, positions)
    print(f"transformers forward: {time.time() - t0:.1f} s")
    ref64 = g.seed_block_forward(cfg, w_f32, h_f32, positions, np.float64)
    rel = lambda x, r: float(np.linalg.norm(x - r) / np.linalg.norm(r))  # noqa: E731
    print(f"transformers (f32) vs the float64 block: {rel(expected.astype(np.float64), ref64):.3e}")
    g.save(os.path.join(args.out, "weights.safetensors"), stored)
    del stored, w_f32
    g.save(os.path.join(args.out, "input.safetensors"),
           {"hidden_states": h_stored, "positions": torch.from_numpy(positions).contiguous()})

    bound = {"bfloat16": 2e-2, "float32": 1e-4}[args.dtype]
    failed = 0
    print(f"{'vt-mla run --backend cpu':<84} {'time':>6}  {'vs transformers':>15}  {'vs float64':>10}")
    for extra in SCHEDULES:
        out = os.path.join(args.out, "out.safetensors")
        cmd = [args.vt_mla, "run", "--config", os.path.join(args.out, "config.json"),
               "--weights", os.path.join(args.out, "weights.safetensors"),
               "--input", os.path.join(args.out, "input.safetensors"),
               "--output", out, "--backend", "cpu", *extra]
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        dt = time.time() - t0
        if r.returncode != 0:
            print(f"{' '.join(extra):<84} FAILED\n{r.stderr}")
            failed += 1
            continue
        o = read_out(out)
        e, e64 = rel(o, expected.astype(np.float64)), rel(o, ref64)
        tol = 6e-2 if "fp8_ds_mla" in extra else bound
        ok = e <= tol
        failed += not ok
        print(f"{' '.join(extra):<84} {dt:5.1f}s  {e:15.3e}  {e64:10.3e}  {'ok' if ok else f'OVER {tol:g}'}")
        os.remove(out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
