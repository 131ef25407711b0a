#!/usr/bin/env python3
"""Generate golden test cases for the DeepSeek MLA attention block.

Ground truth is Hugging Face transformers' `DeepseekV3Attention` (eager attention),
run on CPU in float32 over a full causal mask per sequence.

Usage:
    python3 tests/golden/generate.py --out tests/golden            # (re)write every case
    python3 tests/golden/generate.py --out tests/golden --check    # also cross-check vs the seed formulas
    python3 tests/golden/generate.py --check-only                  # cross-check, write nothing
    python3 tests/golden/generate.py --out tests/golden --case v2lite_yarn_f32

Needs: torch, transformers (>= 5, for the `rope_parameters` config form), safetensors, numpy.

All random values come from numpy's PCG64 (`np.random.default_rng(seed)`), so config.json,
weights.safetensors and input.safetensors are bit-identical whatever the torch/transformers
version; only expected.safetensors depends on them (float32 rounding noise).

The `--check` mode re-implements, in float64 numpy, the formulas of the C++ seed
(shared/seeds/000_*.txt: YarnGetMscale, BuildDeepseekRopeCosSinCache, MlaAttentionScale, and
the block itself with GPT-J in-place / neox rotation) and prints the max differences against
what transformers computes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import OrderedDict

import numpy as np

PREFIX = "model.layers.0.self_attn."

# ----------------------------------------------------------------------------------------------
# The cases.
#   rope: None (no scaling) or dict of YaRN params.
#   rope_form: "legacy" -> top-level rope_theta + rope_scaling (released checkpoints);
#              "parameters" -> rope_parameters {rope_type, rope_theta, ...} (transformers 5).
#   rope_type_key: key used inside legacy rope_scaling ("type" as in the released V2/V3
#              checkpoints, or "rope_type").
#   rope_interleave: "absent" | True | False (absent means interleaved in transformers).
#   starts: first position of each sequence (positions[s, t] = starts[s] + t).
# ----------------------------------------------------------------------------------------------
CASES = [
    dict(
        name="qlora_yarn_interleave_f32",
        seed=1001,
        dtype="float32",
        hidden=64, heads=4, q_lora=48, kv_lora=32, nope=24, rope_dim=8, v=16,
        S=2, T=24, starts=[100, 300],
        rope_theta=10000.0,
        rope=dict(factor=8.0, original_max_position_embeddings=64, beta_fast=32, beta_slow=1,
                  mscale=1.0, mscale_all_dim=1.0),
        max_position_embeddings=512,
        rope_form="legacy", rope_type_key="type",
        rope_interleave="absent",
        covers="q_lora branch; YaRN (DeepSeek-V3 style mscale=mscale_all_dim=1.0, so rotation mscale "
               "is 1 and the softmax scale carries mscale^2); rope_interleave absent -> interleaved "
               "(GPT-J pairs); positions far past original_max_position_embeddings; nope != v.",
    ),
    dict(
        name="qlora_yarn_neox_bf16",
        seed=1002,
        dtype="bfloat16",
        hidden=96, heads=6, q_lora=48, kv_lora=48, nope=16, rope_dim=16, v=24,
        S=2, T=32, starts=[100, 300],
        rope_theta=10000.0,
        rope=dict(factor=8.0, original_max_position_embeddings=64, beta_fast=32, beta_slow=1,
                  mscale=0.707, mscale_all_dim=0.707),
        max_position_embeddings=512,
        rope_form="legacy", rope_type_key="type",
        rope_interleave=False,
        covers="q_lora branch; YaRN with DeepSeek-V2 style mscale=mscale_all_dim=0.707; "
               "rope_interleave false -> neox half-split rotation; bf16 weights/inputs "
               "(expected computed in f32 from the bf16 values); v > nope.",
    ),
    dict(
        name="v2lite_yarn_f32",
        seed=1003,
        dtype="float32",
        hidden=96, heads=8, q_lora=None, kv_lora=48, nope=24, rope_dim=16, v=24,
        S=2, T=40, starts=[0, 500],
        rope_theta=10000.0,
        rope=dict(factor=16.0, original_max_position_embeddings=64, beta_fast=32, beta_slow=1,
                  mscale=0.707, mscale_all_dim=0.707),
        max_position_embeddings=1024,
        rope_form="parameters", rope_type_key="rope_type",
        rope_interleave=True,
        covers="q_lora_rank null -> q_proj branch (V2-Lite); YaRN given in the transformers-5 "
               "rope_parameters form (rope_theta inside it, no top-level rope_theta/rope_scaling); "
               "rope_interleave explicitly true; sequence 0 at positions 0..T-1, sequence 1 at 500..",
    ),
    dict(
        name="v2lite_noyarn_bf16",
        seed=1004,
        dtype="bfloat16",
        hidden=64, heads=4, q_lora=None, kv_lora=32, nope=16, rope_dim=8, v=16,
        S=2, T=28, starts=[0, 700],
        rope_theta=10000.0,
        rope=None,
        max_position_embeddings=2048,
        rope_form="legacy", rope_type_key="type",
        rope_interleave="absent",
        covers="q_proj branch; no rope scaling (rope_scaling null: plain RoPE, scale = "
               "qk_head_dim^-0.5, cos/sin unscaled); rope_interleave absent -> interleaved; bf16.",
    ),
    dict(
        name="qlora_yarn_mscale_f32",
        seed=1005,
        dtype="float32",
        hidden=96, heads=6, q_lora=48, kv_lora=64, nope=32, rope_dim=16, v=32,
        S=2, T=32, starts=[1000, 2000],
        rope_theta=50000.0,
        rope=dict(factor=40.0, original_max_position_embeddings=64, beta_fast=32, beta_slow=1,
                  mscale=0.707, mscale_all_dim=1.0),
        max_position_embeddings=2560,
        rope_form="legacy", rope_type_key="rope_type",
        rope_interleave=False,
        covers="q_lora branch; YaRN factor 40 with mscale (0.707) != mscale_all_dim (1.0), so the "
               "cos/sin cache carries a non-1 rotation mscale AND the softmax scale carries "
               "mscale_all_dim^2; rope_theta 50000; legacy rope_scaling keyed by `rope_type`; "
               "neox rotation; long positions (1000.., 2000..).",
    ),
    # DeepSeek-V2/V3's latent and rope widths (kv_lora_rank 512, qk_rope_head_dim 64): the
    # rows an fp8_ds_mla KV cache holds (512 e4m3 latents + 64 bf16 rope values), small
    # elsewhere. The goldens are transformers' outputs as ever (no fp8 anywhere here); the
    # Rust tests run the block on them with an fp8 cache too.
    dict(
        name="latent512_yarn_bf16",
        seed=1006,
        dtype="bfloat16",
        hidden=64, heads=4, q_lora=48, kv_lora=512, nope=16, rope_dim=64, v=16,
        S=2, T=32, starts=[100, 300],
        rope_theta=10000.0,
        rope=dict(factor=40.0, original_max_position_embeddings=64, beta_fast=32, beta_slow=1,
                  mscale=1.0, mscale_all_dim=1.0),
        max_position_embeddings=2560,
        rope_form="legacy", rope_type_key="type",
        rope_interleave="absent",
        covers="DeepSeek-V3's cache row widths (kv_lora_rank 512, rope 64: what an fp8_ds_mla "
               "cache holds); q_lora branch; V3-style YaRN (factor 40, mscale = mscale_all_dim = "
               "1.0); rope_interleave absent -> interleaved; bf16.",
    ),
    dict(
        name="latent512_qproj_f32",
        seed=1007,
        dtype="float32",
        hidden=64, heads=4, q_lora=None, kv_lora=512, nope=24, rope_dim=64, v=16,
        S=2, T=40, starts=[0, 500],
        rope_theta=10000.0,
        rope=dict(factor=16.0, original_max_position_embeddings=64, beta_fast=32, beta_slow=1,
                  mscale=0.707, mscale_all_dim=0.707),
        max_position_embeddings=1024,
        rope_form="parameters", rope_type_key="rope_type",
        rope_interleave=True,
        covers="DeepSeek-V2-Lite's cache row widths (kv_lora_rank 512, rope 64: what an "
               "fp8_ds_mla cache holds); q_proj branch; V2-style YaRN (mscale 0.707/0.707) in the "
               "rope_parameters form; rope_interleave true; nope != v; f32.",
    ),
    # DeepSeek-V3.2 (issue 19): transformers' DeepseekV32Attention, whose lightning indexer
    # picks index_topk of the causally visible tokens per query; T > index_topk, so the
    # selection matters for most queries. The hidden states are drawn token by token and a
    # token is redrawn until its query's k-th and (k+1)-th indexer scores are at least
    # `min_gap` (relative to the query's largest |score|) apart, so the selection is the
    # same in any precision the block computes in (`v32_gaps`, printed).
    dict(
        name="v32_sparse_f32",
        seed=1101,
        dtype="float32",
        hidden=64, heads=4, q_lora=48, kv_lora=32, nope=16, rope_dim=8, v=16,
        S=2, T=40, starts=[0, 300],
        rope_theta=10000.0,
        rope=dict(factor=40.0, original_max_position_embeddings=64, beta_fast=32, beta_slow=1,
                  mscale=1.0, mscale_all_dim=1.0),
        max_position_embeddings=2560,
        rope_form="legacy", rope_type_key="type",
        rope_interleave="absent",
        v32=dict(index_n_heads=4, index_head_dim=16, index_topk=12, min_gap=0.03),
        covers="DeepSeek-V3.2 sparse attention: index_topk 12 of up to 40 visible tokens; indexer "
               "with 4 heads of 16 (neox rope on its first 8 dims, LayerNorm k_norm with bias); "
               "V3.2's rope (YaRN factor 40, mscale 1/1, interleaved main rope); f32.",
    ),
    dict(
        name="v32_sparse_mscale_bf16",
        seed=1102,
        dtype="bfloat16",
        hidden=64, heads=4, q_lora=32, kv_lora=48, nope=16, rope_dim=16, v=24,
        S=2, T=36, starts=[100, 700],
        rope_theta=10000.0,
        rope=dict(factor=16.0, original_max_position_embeddings=64, beta_fast=32, beta_slow=1,
                  mscale=0.707, mscale_all_dim=1.0),
        max_position_embeddings=1024,
        rope_form="parameters", rope_type_key="rope_type",
        rope_interleave="absent",
        v32=dict(index_n_heads=6, index_head_dim=24, index_topk=8, min_gap=0.05),
        covers="DeepSeek-V3.2 sparse attention in bf16: index_topk 8 of up to 36 visible tokens; "
               "indexer 6 heads of 24 (rope on its first 16 dims); mscale 0.707 != mscale_all_dim 1.0, "
               "so the rotation mscale scales the indexer's rope dims too; rope_parameters form; v > nope.",
    ),
]


# ----------------------------------------------------------------------------------------------
# config.json
# ----------------------------------------------------------------------------------------------
def config_json(c: dict) -> dict:
    cfg = OrderedDict()
    v32 = c.get("v32")
    cfg["architectures"] = ["DeepseekV32ForCausalLM" if v32 else "DeepseekV3ForCausalLM"]
    cfg["model_type"] = "deepseek_v32" if v32 else "deepseek_v3"
    cfg["vocab_size"] = 1024
    cfg["hidden_size"] = c["hidden"]
    cfg["intermediate_size"] = 2 * c["hidden"]
    cfg["moe_intermediate_size"] = c["hidden"]
    cfg["num_hidden_layers"] = 1
    cfg["first_k_dense_replace"] = 1
    cfg["num_attention_heads"] = c["heads"]
    cfg["num_key_value_heads"] = c["heads"]
    cfg["q_lora_rank"] = c["q_lora"]
    cfg["kv_lora_rank"] = c["kv_lora"]
    cfg["qk_nope_head_dim"] = c["nope"]
    cfg["qk_rope_head_dim"] = c["rope_dim"]
    cfg["v_head_dim"] = c["v"]
    cfg["hidden_act"] = "silu"
    # transformers' DeepseekV3RMSNorm for q_a_layernorm / kv_a_layernorm is built WITHOUT
    # passing config.rms_norm_eps (it uses its default 1e-6); keep 1e-6 so there is no ambiguity.
    cfg["rms_norm_eps"] = 1e-6
    cfg["max_position_embeddings"] = c["max_position_embeddings"]
    if c["rope_form"] == "legacy":
        cfg["rope_theta"] = c["rope_theta"]
        if c["rope"] is None:
            cfg["rope_scaling"] = None
        else:
            rs = OrderedDict()
            rs[c["rope_type_key"]] = "yarn"
            for k in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                      "mscale", "mscale_all_dim"):
                rs[k] = c["rope"][k]
            cfg["rope_scaling"] = rs
    else:
        rp = OrderedDict()
        if c["rope"] is None:
            rp["rope_type"] = "default"
            rp["rope_theta"] = c["rope_theta"]
        else:
            rp["rope_type"] = "yarn"
            rp["rope_theta"] = c["rope_theta"]
            for k in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                      "mscale", "mscale_all_dim"):
                rp[k] = c["rope"][k]
        cfg["rope_parameters"] = rp
    if c["rope_interleave"] != "absent":
        cfg["rope_interleave"] = bool(c["rope_interleave"])
    if v32:
        for k in ("index_n_heads", "index_head_dim", "index_topk"):
            cfg[k] = v32[k]
    cfg["attention_bias"] = False
    cfg["attention_dropout"] = 0.0
    cfg["tie_word_embeddings"] = False
    cfg["torch_dtype"] = c["dtype"]
    return cfg


def expected_interleave(c: dict) -> bool:
    return True if c["rope_interleave"] == "absent" else bool(c["rope_interleave"])


# ----------------------------------------------------------------------------------------------
# Random weights and inputs (numpy only, so they do not depend on torch's RNG).
# ----------------------------------------------------------------------------------------------
def make_arrays(c: dict):
    rng = np.random.default_rng(c["seed"])
    H, N, L, P, R, V = c["hidden"], c["heads"], c["kv_lora"], c["nope"], c["rope_dim"], c["v"]
    Dqk = P + R

    def lin(out_f, in_f, gain=1.0):
        # std = gain / sqrt(fan_in): activations stay O(1) (0.07..0.18 for these sizes).
        return (rng.standard_normal((out_f, in_f)) * (gain / math.sqrt(in_f))).astype(np.float32)

    def norm_w(n):
        return rng.uniform(0.6, 1.4, size=(n,)).astype(np.float32)

    w = OrderedDict()
    if c["q_lora"] is not None:
        w["q_a_proj.weight"] = lin(c["q_lora"], H)
        w["q_a_layernorm.weight"] = norm_w(c["q_lora"])
        w["q_b_proj.weight"] = lin(N * Dqk, c["q_lora"])
    else:
        w["q_proj.weight"] = lin(N * Dqk, H)
    w["kv_a_proj_with_mqa.weight"] = lin(L + R, H)
    w["kv_a_layernorm.weight"] = norm_w(L)
    w["kv_b_proj.weight"] = lin(N * (P + V), L)
    w["o_proj.weight"] = lin(H, N * V)
    v32 = c.get("v32")
    if v32:
        Hi, Di = v32["index_n_heads"], v32["index_head_dim"]
        w["indexer.wq_b.weight"] = lin(Hi * Di, c["q_lora"])
        w["indexer.wk.weight"] = lin(Di, H)
        w["indexer.k_norm.weight"] = norm_w(Di)
        w["indexer.k_norm.bias"] = rng.uniform(-0.3, 0.3, size=(Di,)).astype(np.float32)
        w["indexer.weights_proj.weight"] = lin(Hi, H)

    S, T = c["S"], c["T"]
    hidden = rng.standard_normal((S, T, H)).astype(np.float32)
    positions = np.stack([np.arange(T, dtype=np.int64) + st for st in c["starts"]])
    assert positions.shape == (S, T)
    return w, hidden, positions


# ----------------------------------------------------------------------------------------------
# transformers reference
# ----------------------------------------------------------------------------------------------
def load_hf_config(case_dir: str, c: dict):
    from transformers import DeepseekV3Config

    config = DeepseekV3Config.from_pretrained(case_dir)
    config._attn_implementation = "eager"
    # Make sure transformers read the config.json the way we mean it.
    assert bool(config.rope_interleave) == expected_interleave(c), (config.rope_interleave, c["name"])
    assert config.q_lora_rank == c["q_lora"]
    rp = config.rope_parameters
    if c["rope"] is None:
        assert rp.get("rope_type", "default") == "default", rp
    else:
        assert rp["rope_type"] == "yarn", rp
        for k, v in c["rope"].items():
            assert rp[k] == v, (k, rp)
    assert float(rp["rope_theta"]) == c["rope_theta"], rp
    return config


def hf_forward(config, weights_f32: dict, hidden_f32: np.ndarray, positions: np.ndarray):
    """Run DeepseekV3Attention in float32 on CPU. Returns (out, attn_module, rotary_module)."""
    import torch
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    torch.manual_seed(0)
    attn = m.DeepseekV3Attention(config, layer_idx=0).float().eval()
    rotary = m.DeepseekV3RotaryEmbedding(config)
    sd = {k: torch.from_numpy(v.copy()) for k, v in weights_f32.items()}
    attn.load_state_dict(sd, strict=True)  # raises on any missing/unexpected name or shape

    x = torch.from_numpy(hidden_f32.copy())
    pos = torch.from_numpy(positions.copy())
    S, T, _ = x.shape
    # Additive causal mask over each sequence (token t sees tokens 0..t of its own sequence).
    mask = torch.zeros(S, 1, T, T, dtype=torch.float32)
    upper = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    mask = mask.masked_fill(upper, torch.finfo(torch.float32).min)
    with torch.no_grad():
        cos, sin = rotary(x, pos)
        out = attn(hidden_states=x, position_embeddings=(cos, sin), attention_mask=mask)[0]
    return out.numpy(), attn, rotary, cos.numpy(), sin.numpy()


# ----------------------------------------------------------------------------------------------
# The seed's formulas (float64 numpy). Defaults are vLLM's DeepseekScalingRotaryEmbedding ones:
# mscale=1, mscale_all_dim=0, beta_fast=32, beta_slow=1, attn_factor=1, extrapolation_factor=1.
# ----------------------------------------------------------------------------------------------
def seed_yarn_get_mscale(scale, mscale):
    if scale <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def seed_yarn_find_correction_dim(num_rotations, dim, base, max_pos):
    return (dim * math.log(max_pos / (num_rotations * 2.0 * math.pi))) / (2.0 * math.log(base))


def seed_rope_params(cfg_json: dict):
    """Read YaRN parameters from a config.json dict the way the Rust port is meant to."""
    rs = cfg_json.get("rope_parameters") or cfg_json.get("rope_scaling") or {}
    base = float(rs.get("rope_theta", cfg_json.get("rope_theta", 10000.0)))
    rtype = rs.get("rope_type", rs.get("type", "default"))
    p = dict(base=base, yarn=(rtype in ("yarn", "deepseek_yarn")), factor=float(rs.get("factor", 1.0)),
             orig=int(rs.get("original_max_position_embeddings", cfg_json["max_position_embeddings"])),
             beta_fast=float(rs.get("beta_fast", 32)), beta_slow=float(rs.get("beta_slow", 1)),
             mscale=float(rs.get("mscale", 1.0)), mscale_all_dim=float(rs.get("mscale_all_dim", 0.0)),
             attn_factor=1.0, extrapolation_factor=1.0)
    return p


def seed_inv_freq_and_mscale(p: dict, rot: int):
    """BuildDeepseekRopeCosSinCache's inv_freq and rotation mscale, float64."""
    half = rot // 2
    yarn = p["yarn"] and p["factor"] > 1.0
    low = high = 0.0
    if yarn:
        low = math.floor(seed_yarn_find_correction_dim(p["beta_fast"], rot, p["base"], p["orig"]))
        high = math.ceil(seed_yarn_find_correction_dim(p["beta_slow"], rot, p["base"], p["orig"]))
        low = max(low, 0.0)
        high = min(high, float(rot - 1))
        if low == high:
            high += 0.001
    inv = np.zeros(half, dtype=np.float64)
    for i in range(half):
        pos_freq = p["base"] ** ((2.0 * i) / rot)
        extrap = 1.0 / pos_freq
        if not yarn:
            inv[i] = extrap
            continue
        interp = 1.0 / (p["factor"] * pos_freq)
        linear = (i - low) / (high - low)
        ramp = min(1.0, max(0.0, linear))
        mask = (1.0 - ramp) * p["extrapolation_factor"]
        inv[i] = interp * (1.0 - mask) + extrap * mask
    rot_mscale = (seed_yarn_get_mscale(p["factor"], p["mscale"]) /
                  seed_yarn_get_mscale(p["factor"], p["mscale_all_dim"]) * p["attn_factor"]) if yarn else 1.0
    return inv, rot_mscale, (low, high)


def seed_cos_sin_cache(p: dict, rot: int, rows: int):
    """[rows, rot] = cat(cos*mscale, sin*mscale), float64 (the seed casts to f32 at the end)."""
    inv, ms, _ = seed_inv_freq_and_mscale(p, rot)
    t = np.arange(rows, dtype=np.float64)[:, None]
    ang = t * inv[None, :]
    return np.concatenate([np.cos(ang) * ms, np.sin(ang) * ms], axis=1)


def seed_attention_scale(p: dict, qk_head_dim: int):
    base = qk_head_dim ** -0.5
    if not p["yarn"] or p["factor"] <= 1.0:
        return base
    m = seed_yarn_get_mscale(p["factor"], p["mscale_all_dim"])
    return base * m * m


def _rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope_inplace(x, cos, sin, neox):
    """x [..., R]; cos/sin [..., R/2] broadcastable. GPT-J: pairs (2i, 2i+1) rotated in place.
    neox: pairs (i, i + R/2)."""
    out = np.empty_like(x)
    h = x.shape[-1] // 2
    if neox:
        x1, x2 = x[..., :h], x[..., h:]
        out[..., :h] = x1 * cos - x2 * sin
        out[..., h:] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x2 * cos + x1 * sin
    return out


def _round_bf16(a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = a.view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def seed_block_forward(cfg_json, w, hidden, positions, dtype=np.float64, bf16_steps=False,
                       drop_rot_mscale=False, drop_softmax_mscale=False):
    """The MLA block with the seed's semantics (materialized-MHA prefill form, full causal).
    bf16_steps=True rounds every op output to bf16 (a crude model of a bf16 device pipeline
    with f32 accumulation) to estimate a realistic bf16 tolerance."""
    rnd = _round_bf16 if bf16_steps else (lambda a: a)
    f = lambda a: np.asarray(a, dtype=dtype)
    H, N = cfg_json["hidden_size"], cfg_json["num_attention_heads"]
    L, P, R, V = (cfg_json["kv_lora_rank"], cfg_json["qk_nope_head_dim"],
                  cfg_json["qk_rope_head_dim"], cfg_json["v_head_dim"])
    Dqk = P + R
    eps = cfg_json["rms_norm_eps"]
    neox = not cfg_json.get("rope_interleave", True)
    p = seed_rope_params(cfg_json)
    cache = seed_cos_sin_cache(p, R, int(positions.max()) + 1)
    if drop_rot_mscale:
        cache = cache / seed_inv_freq_and_mscale(p, R)[1]
    if bf16_steps:
        cache = cache.astype(np.float32)  # seed stores the cache in f32
    scale = seed_attention_scale(p, Dqk) if not drop_softmax_mscale else Dqk ** -0.5
    W = {k: f(v) for k, v in w.items()}
    x = f(hidden)
    S, T, _ = x.shape
    if cfg_json["q_lora_rank"] is not None:
        qc = rnd(x @ W["q_a_proj.weight"].T)
        qc = rnd(_rmsnorm(qc, W["q_a_layernorm.weight"], eps))
        q = rnd(qc @ W["q_b_proj.weight"].T)
    else:
        q = rnd(x @ W["q_proj.weight"].T)
    q = q.reshape(S, T, N, Dqk)
    kv = x @ W["kv_a_proj_with_mqa.weight"].T
    kv = rnd(kv)
    kv_c = rnd(_rmsnorm(kv[..., :L], W["kv_a_layernorm.weight"], eps))  # latent only
    k_pe = kv[..., L:]                                                   # not normed
    cs = cache[positions]  # [S,T,R]
    cos, sin = f(cs[..., : R // 2]), f(cs[..., R // 2:])
    q_pe = rnd(_rope_inplace(q[..., P:], cos[:, :, None, :], sin[:, :, None, :], neox))
    k_pe = rnd(_rope_inplace(k_pe, cos, sin, neox))
    kvb = rnd(kv_c @ W["kv_b_proj.weight"].T).reshape(S, T, N, P + V)
    k_nope, v = kvb[..., :P], kvb[..., P:]
    qf = np.concatenate([q[..., :P], q_pe], axis=-1)
    kf = np.concatenate([k_nope, np.broadcast_to(k_pe[:, :, None, :], (S, T, N, R))], axis=-1)
    sc = np.einsum("sqnd,sknd->snqk", qf, kf) * scale
    causal = np.triu(np.ones((T, T), dtype=bool), 1)
    sc = np.where(causal[None, None], -np.inf, sc)
    sc = sc - sc.max(-1, keepdims=True)
    pr = np.exp(sc)
    pr = pr / pr.sum(-1, keepdims=True)
    o = rnd(np.einsum("snqk,sknd->sqnd", pr, v)).reshape(S, T, N * V)
    return rnd(o @ W["o_proj.weight"].T)


# ----------------------------------------------------------------------------------------------
# DeepSeek-V3.2: the indexer and the sparse block in float64 numpy (transformers' semantics:
# DeepseekV32Indexer + DeepseekV32Attention with the top-k mask), for the gap check and as an
# independent cross-check of transformers' output.
# ----------------------------------------------------------------------------------------------
def _layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def v32_index_scores(cfg_json, W, x, positions, rows=None):
    """Indexer scores [len(rows), T] of one sequence x [T, H] (float64), -inf where not causally
    visible: sum_h w[t,h] * relu(q[t,h] . k[j] * Di^-0.5), w = weights_proj(x) * Hi^-0.5, q =
    wq_b(q_a_layernorm(q_a_proj(x))) and k = k_norm(wk(x)) with the neox rope on their first R
    dims (the cos/sin of the main attention, rotation mscale included)."""
    T = x.shape[0]
    rows = np.arange(T) if rows is None else np.asarray(rows)
    Hi, Di, R = cfg_json["index_n_heads"], cfg_json["index_head_dim"], cfg_json["qk_rope_head_dim"]
    p = seed_rope_params(cfg_json)
    cache = seed_cos_sin_cache(p, R, int(positions.max()) + 1)
    cs = cache[positions]
    cos, sin = cs[..., : R // 2], cs[..., R // 2:]
    qc = _rmsnorm(x[rows] @ W["q_a_proj.weight"].T, W["q_a_layernorm.weight"], 1e-6)
    q = (qc @ W["indexer.wq_b.weight"].T).reshape(len(rows), Hi, Di)
    q[..., :R] = _rope_inplace(q[..., :R], cos[rows][:, None, :], sin[rows][:, None, :], neox=True)
    k = _layernorm(x @ W["indexer.wk.weight"].T, W["indexer.k_norm.weight"], W["indexer.k_norm.bias"], 1e-6)
    k[..., :R] = _rope_inplace(k[..., :R], cos, sin, neox=True)
    w = (x[rows] @ W["indexer.weights_proj.weight"].T) * Hi ** -0.5
    sc = np.maximum(np.einsum("thd,jd->thj", q, k) * Di ** -0.5, 0.0)
    sc = np.einsum("th,thj->tj", w, sc)
    visible = np.arange(T)[None, :] <= rows[:, None]
    return np.where(visible, sc, -np.inf)


def v32_gap(scores_row, topk):
    """(k-th - (k+1)-th score) / max |visible score| of one query; inf when it sees <= topk."""
    v = np.sort(scores_row[np.isfinite(scores_row)])[::-1]
    if len(v) <= topk:
        return math.inf
    return float((v[topk - 1] - v[topk]) / max(np.abs(v).max(), 1e-30))


def v32_draw_hidden(c, cfg_json, W, hidden, positions):
    """Redraws hidden[s, t] (token by token: query t's scores depend on tokens 0..t only) until
    every query's gap is >= min_gap. W are the stored (rounded) weights as float64, `hidden` is
    modified in place; bf16 cases judge the bf16-rounded values. Returns the gaps [S, T]."""
    v32 = c["v32"]
    rng = np.random.default_rng(c["seed"] + 7919)
    bf16 = c["dtype"] == "bfloat16"
    rnd = (lambda a: _round_bf16(a).astype(np.float64)) if bf16 else (lambda a: a.astype(np.float64))
    S, T, H = hidden.shape
    gaps = np.full((S, T), math.inf)
    for s in range(S):
        for t in range(T):
            for attempt in range(1000):
                x = rnd(hidden[s, : t + 1])
                row = v32_index_scores(cfg_json, W, x, positions[s, : t + 1], rows=[t])[0]
                g = v32_gap(row, v32["index_topk"])
                if g >= v32["min_gap"]:
                    gaps[s, t] = g
                    break
                hidden[s, t] = rng.standard_normal(H).astype(np.float32)
            else:
                sys.exit(f"{c['name']}: no hidden state for token {t} of sequence {s} gives a gap >= {v32['min_gap']}")
    return gaps


def v32_block_forward(cfg_json, W, hidden, positions):
    """The V3.2 block in float64: the V3 MLA block with each query attending only to its top-k
    indexer tokens (all visible ones when fewer). Returns (out [S,T,H], selected [S][T] sets)."""
    H, N = cfg_json["hidden_size"], cfg_json["num_attention_heads"]
    L, P, R, V = (cfg_json["kv_lora_rank"], cfg_json["qk_nope_head_dim"],
                  cfg_json["qk_rope_head_dim"], cfg_json["v_head_dim"])
    topk = cfg_json["index_topk"]
    p = seed_rope_params(cfg_json)
    cache = seed_cos_sin_cache(p, R, int(positions.max()) + 1)
    scale = seed_attention_scale(p, P + R)
    S, T, _ = hidden.shape
    out = np.zeros((S, T, H))
    selected = []
    for s in range(S):
        x = hidden[s].astype(np.float64)
        cs = cache[positions[s]]
        cos, sin = cs[..., : R // 2], cs[..., R // 2:]
        qc = _rmsnorm(x @ W["q_a_proj.weight"].T, W["q_a_layernorm.weight"], 1e-6)
        q = (qc @ W["q_b_proj.weight"].T).reshape(T, N, P + R)
        q[..., P:] = _rope_inplace(q[..., P:], cos[:, None, :], sin[:, None, :], neox=False)
        kv = x @ W["kv_a_proj_with_mqa.weight"].T
        kv_c = _rmsnorm(kv[:, :L], W["kv_a_layernorm.weight"], 1e-6)
        k_pe = _rope_inplace(kv[:, L:], cos, sin, neox=False)
        kvb = (kv_c @ W["kv_b_proj.weight"].T).reshape(T, N, P + V)
        kf = np.concatenate([kvb[..., :P], np.broadcast_to(k_pe[:, None, :], (T, N, R))], -1)
        sc = np.einsum("qnd,knd->nqk", q, kf) * scale
        idx = v32_index_scores(cfg_json, W, x, positions[s])
        sel = []
        keep = np.zeros((T, T), dtype=bool)
        for t in range(T):
            order = np.argsort(-idx[t, : t + 1], kind="stable")[:topk]
            keep[t, order] = True
            sel.append(set(int(j) for j in order))
        selected.append(sel)
        sc = np.where(keep[None], sc, -np.inf)
        sc = sc - sc.max(-1, keepdims=True)
        pr = np.exp(sc)
        pr = pr / pr.sum(-1, keepdims=True)
        o = np.einsum("nqk,knd->qnd", pr, kvb[..., P:]).reshape(T, N * V)
        out[s] = o @ W["o_proj.weight"].T
    return out, selected


def v32_hf_forward(config, weights_f32, hidden_f32, positions):
    """DeepseekV32Attention (eager) in float32 on CPU over a full causal mask per sequence.
    Returns (out, the indexer's top-k index sets [S][T], attn)."""
    import torch
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as m

    torch.manual_seed(0)
    attn = m.DeepseekV32Attention(config, layer_idx=0).float().eval()
    rotary = m.DeepseekV32RotaryEmbedding(config)
    sd = {k: torch.from_numpy(v.copy()) for k, v in weights_f32.items()}
    attn.load_state_dict(sd, strict=True)
    x = torch.from_numpy(hidden_f32.copy())
    pos = torch.from_numpy(positions.copy())
    S, T, _ = x.shape
    mask = torch.zeros(S, 1, T, T, dtype=torch.float32)
    upper = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    mask = mask.masked_fill(upper, torch.finfo(torch.float32).min)
    with torch.no_grad():
        cos, sin = rotary(x, pos)
        out = attn(hidden_states=x, position_embeddings=(cos, sin), attention_mask=mask, position_ids=pos)[0]
        q_resid = attn.q_a_layernorm(attn.q_a_proj(x))
        idx = attn.indexer(x, q_resid, (cos, sin), mask[:, 0], pos).numpy()
    sets = [[set(int(j) for j in idx[s, t] if j <= t) for t in range(T)] for s in range(S)]
    return out.numpy(), sets, attn


# ----------------------------------------------------------------------------------------------
# Cross-checks
# ----------------------------------------------------------------------------------------------
def check_case(c, cfg_json, config, attn, rotary, cos_hf, sin_hf, weights_f32, hidden_f32,
               positions, out_hf):
    R = c["rope_dim"]
    half = R // 2
    p = seed_rope_params(cfg_json)
    inv_seed, ms_seed, (low, high) = seed_inv_freq_and_mscale(p, R)
    inv_hf = rotary.inv_freq.double().numpy()
    res = OrderedDict()
    res["yarn_correction_range(low,high)"] = (low, high)
    res["inv_freq max rel diff"] = float(np.max(np.abs(inv_hf - inv_seed) / inv_seed))
    res["rotation mscale (hf attention_scaling, seed)"] = (float(rotary.attention_scaling), ms_seed)
    res["rotation mscale abs diff"] = abs(float(rotary.attention_scaling) - ms_seed)
    sc_seed = seed_attention_scale(p, c["nope"] + R)
    res["softmax scale (hf, seed)"] = (float(attn.scaling), sc_seed)
    res["softmax scale rel diff"] = abs(float(attn.scaling) - sc_seed) / sc_seed
    cache = seed_cos_sin_cache(p, R, int(positions.max()) + 1)
    cs = cache[positions]
    # transformers' cos/sin are cat(freqs, freqs): both halves equal the seed's half-width cache.
    res["cos/sin max abs diff vs seed (f64 cache)"] = float(max(
        np.abs(cos_hf[..., :half] - cs[..., :half]).max(), np.abs(cos_hf[..., half:] - cs[..., :half]).max(),
        np.abs(sin_hf[..., :half] - cs[..., half:]).max(), np.abs(sin_hf[..., half:] - cs[..., half:]).max()))
    ref64 = seed_block_forward(cfg_json, weights_f32, hidden_f32, positions, np.float64)
    res["max|out|"] = float(np.abs(ref64).max())
    res["out: hf(f32) vs seed block (f64) max abs diff"] = float(np.abs(out_hf - ref64).max())
    # Same numpy block, but rotating with the WRONG style: proves the goldens pin the style.
    other = dict(cfg_json)
    other["rope_interleave"] = not bool(cfg_json.get("rope_interleave", True))
    wrong = seed_block_forward(other, weights_f32, hidden_f32, positions, np.float64)
    res["out: wrong rotation style, max abs diff (must be large)"] = float(np.abs(out_hf - wrong).max())
    if c["rope"] is not None:
        for label, kw in (("rotation mscale", dict(drop_rot_mscale=True)),
                          ("softmax mscale^2", dict(drop_softmax_mscale=True))):
            alt = seed_block_forward(cfg_json, weights_f32, hidden_f32, positions, np.float64, **kw)
            res[f"out: without {label}, max abs diff (0 when that term is 1)"] = float(np.abs(out_hf - alt).max())
    if c["dtype"] == "bfloat16":
        emu = seed_block_forward(cfg_json, weights_f32, hidden_f32, positions, np.float32, bf16_steps=True)
        res["out: bf16-rounded-per-op seed pipeline vs expected, max abs diff"] = float(np.abs(out_hf - emu).max())
    return res


def check_interleave_layout():
    """transformers' apply_rotary_pos_emb_interleave == GPT-J in-place rotation followed by the
    de-interleave permutation [0,2,4,...,1,3,5,...] (applied to q and k alike)."""
    import torch
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    rng = np.random.default_rng(7)
    R = 8
    q = rng.standard_normal((1, 2, 3, R)).astype(np.float32)
    k = rng.standard_normal((1, 1, 3, R)).astype(np.float32)
    ang = rng.uniform(0, 6, size=(1, 3, R // 2)).astype(np.float32)
    emb = np.concatenate([ang, ang], -1)
    cos, sin = np.cos(emb), np.sin(emb)
    qh, kh = m.apply_rotary_pos_emb_interleave(torch.from_numpy(q), torch.from_numpy(k),
                                               torch.from_numpy(cos), torch.from_numpy(sin))
    perm = list(range(0, R, 2)) + list(range(1, R, 2))
    qg = _rope_inplace(q, np.cos(ang)[:, None], np.sin(ang)[:, None], neox=False)[..., perm]
    kg = _rope_inplace(k, np.cos(ang)[:, None], np.sin(ang)[:, None], neox=False)[..., perm]
    d_layout = max(np.abs(qh.numpy() - qg).max(), np.abs(kh.numpy() - kg).max())
    # dot products are permutation invariant -> identical attention scores to in-place GPT-J
    qg2 = _rope_inplace(q, np.cos(ang)[:, None], np.sin(ang)[:, None], neox=False)
    kg2 = _rope_inplace(k, np.cos(ang)[:, None], np.sin(ang)[:, None], neox=False)
    d_dot = np.abs(np.einsum("bhtd,bgsd->bhts", qh.numpy(), kh.numpy())
                   - np.einsum("bhtd,bgsd->bhts", qg2, kg2)).max()
    return float(d_layout), float(d_dot)


def check_mscale_edge_cases():
    """How transformers vs the seed (with vLLM defaults) read mscale/mscale_all_dim when one is
    missing or zero. Not used by the goldens; printed for the Rust port."""
    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    rows = []
    variants = [
        ("mscale=1.0, mscale_all_dim=1.0", dict(mscale=1.0, mscale_all_dim=1.0)),
        ("mscale=0.707, mscale_all_dim=0.707", dict(mscale=0.707, mscale_all_dim=0.707)),
        ("mscale=0.707, mscale_all_dim=1.0", dict(mscale=0.707, mscale_all_dim=1.0)),
        ("mscale absent, mscale_all_dim=1.0", dict(mscale_all_dim=1.0)),
        ("mscale=1.0, mscale_all_dim absent", dict(mscale=1.0)),
        ("mscale=0.707, mscale_all_dim absent", dict(mscale=0.707)),
        ("both absent", dict()),
    ]
    for label, extra in variants:
        rp = dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=64,
                  beta_fast=32, beta_slow=1, **extra)
        cfg = DeepseekV3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None,
                               kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                               max_position_embeddings=2560, rope_parameters=dict(rp))
        _, att = ROPE_INIT_FUNCTIONS["yarn"](cfg)
        hf_scale = m.DeepseekV3Attention(cfg, layer_idx=0).scaling / 24 ** -0.5
        p = seed_rope_params(dict(rope_parameters=rp, max_position_embeddings=2560))
        _, ms, _ = seed_inv_freq_and_mscale(p, 8)
        sd = seed_attention_scale(p, 24) / 24 ** -0.5
        rows.append((label, float(att), ms, float(hf_scale), sd))
    return rows


# ----------------------------------------------------------------------------------------------
def save(path, tensors):
    from safetensors.torch import save_file
    save_file(tensors, path, metadata={"format": "pt"})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)),
                    help="directory that receives one folder per case (default: this script's folder)")
    ap.add_argument("--check", action="store_true", help="cross-check against the seed formulas")
    ap.add_argument("--check-only", action="store_true", help="cross-check only, write nothing")
    ap.add_argument("--case", action="append", help="only this case (repeatable)")
    args = ap.parse_args()

    import tempfile

    import torch
    import transformers

    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")

    cases = [c for c in CASES if not args.case or c["name"] in args.case]
    if args.case and len(cases) != len(args.case):
        sys.exit(f"unknown case in {args.case}")
    do_check = args.check or args.check_only
    failures = []
    summary = []
    for c in cases:
        assert c["v"] <= c["nope"] + c["rope_dim"] and c["rope_dim"] % 2 == 0
        cfg_json = config_json(c)
        weights, hidden, positions = make_arrays(c)
        bf16 = c["dtype"] == "bfloat16"
        tdt = torch.bfloat16 if bf16 else torch.float32
        # Stored tensors in the case dtype; the reference runs in f32 on exactly those values.
        w_store = {PREFIX + k: torch.from_numpy(v).to(tdt).contiguous() for k, v in weights.items()}
        w_f32 = {k: w_store[PREFIX + k].float().numpy() for k in weights}
        v32 = c.get("v32")
        if v32:
            w64 = {k: v.astype(np.float64) for k, v in w_f32.items()}
            gaps = v32_draw_hidden(c, cfg_json, w64, hidden, positions)
        h_store = torch.from_numpy(hidden).to(tdt).contiguous()
        h_f32 = h_store.float().numpy()

        case_dir = os.path.join(args.out, c["name"]) if not args.check_only else tempfile.mkdtemp()
        os.makedirs(case_dir, exist_ok=True)
        with open(os.path.join(case_dir, "config.json"), "w") as fh:
            json.dump(cfg_json, fh, indent=2)
            fh.write("\n")
        if v32:
            from transformers import DeepseekV32Config

            config = DeepseekV32Config.from_pretrained(case_dir)
            config._attn_implementation = "eager"
            assert (config.index_n_heads, config.index_head_dim, config.index_topk) == \
                (v32["index_n_heads"], v32["index_head_dim"], v32["index_topk"]), config
            assert config.q_lora_rank == c["q_lora"] and config.head_dim == c["rope_dim"], config
            out, hf_sets, attn = v32_hf_forward(config, w_f32, h_f32, positions)
            # The selection transformers makes is the one the float64 model makes, and the
            # float64 block equals transformers' output up to f32 noise.
            ref64, np_sets = v32_block_forward(cfg_json, w64, h_f32.astype(np.float64), positions)
            sets_equal = hf_sets == np_sets
            d64 = float(np.abs(out - ref64).max())
            # Dense attention over every visible token, to show that the selection matters.
            dense_cfg = dict(cfg_json, index_topk=c["T"])
            dense64, _ = v32_block_forward(dense_cfg, w64, h_f32.astype(np.float64), positions)
            selecting = int(sum(1 for s_ in range(c["S"]) for t in range(c["T"]) if t + 1 > v32["index_topk"]))
            print(f"   v32: indexer selection transformers == float64 model: {sets_equal}; "
                  f"out max abs diff hf(f32) vs float64 block {d64:.3g}; "
                  f"min gap (k-th - (k+1)-th) / max|score| over the {selecting} selecting queries "
                  f"{np.min(gaps):.4f} (bound {v32['min_gap']}); dense attention instead of sparse "
                  f"changes out by max abs {np.abs(out - dense64).max():.3g}")
            if not sets_equal or d64 > 1e-3 * max(1.0, float(np.abs(ref64).max())):
                failures.append(c["name"])
        else:
            config = load_hf_config(case_dir, c)
            out, attn, rotary, cos_hf, sin_hf = hf_forward(config, w_f32, h_f32, positions)
        assert np.isfinite(out).all()
        if not args.check_only:
            save(os.path.join(case_dir, "weights.safetensors"), w_store)
            save(os.path.join(case_dir, "input.safetensors"),
                 {"hidden_states": h_store, "positions": torch.from_numpy(positions).contiguous()})
            save(os.path.join(case_dir, "expected.safetensors"),
                 {"out": torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))})
        print(f"\n== {c['name']}: dtype={c['dtype']} H={c['hidden']} N={c['heads']} q_lora={c['q_lora']} "
              f"L={c['kv_lora']} P={c['nope']} R={c['rope_dim']} V={c['v']} S={c['S']} T={c['T']} "
              f"starts={c['starts']} interleave={expected_interleave(c)} max|out|={np.abs(out).max():.4f}")
        entry = dict(name=c["name"], dtype=c["dtype"], S=c["S"], T=c["T"], starts=c["starts"],
                     rope_interleave=expected_interleave(c), covers=c["covers"])
        if v32:
            entry["index_topk"] = v32["index_topk"]
            entry["min_index_gap"] = round(float(np.min(gaps)), 4)
        summary.append(entry)
        if do_check and not v32:
            res = check_case(c, cfg_json, config, attn, rotary, cos_hf, sin_hf, w_f32, h_f32, positions, out)
            for k, v in res.items():
                print(f"   {k}: {v}")
            if res["inv_freq max rel diff"] > 1e-6 or res["rotation mscale abs diff"] > 1e-12 \
                    or res["softmax scale rel diff"] > 1e-12 \
                    or res["out: hf(f32) vs seed block (f64) max abs diff"] > 1e-3 * max(1.0, res["max|out|"]):
                failures.append(c["name"])

    if not args.check_only:
        # With --case, keep the other cases' entries (in CASES order), so regenerating one
        # case does not drop the rest from cases.json.
        path = os.path.join(args.out, "cases.json")
        if args.case and os.path.isfile(path):
            with open(path) as fh:
                old = {e["name"]: e for e in json.load(fh)["cases"]}
            new = {e["name"]: e for e in summary}
            summary = [new.get(c["name"], old.get(c["name"])) for c in CASES]
            summary = [e for e in summary if e is not None]
        with open(path, "w") as fh:
            json.dump(dict(generated_with=dict(torch=torch.__version__, transformers=transformers.__version__),
                           cases=summary), fh, indent=2)
            fh.write("\n")

    if failures and not do_check:
        sys.exit(f"V3.2 consistency check FAILED for: {failures}")
    if do_check:
        d_layout, d_dot = check_interleave_layout()
        print("\n== interleaved rotation layout (transformers apply_rotary_pos_emb_interleave)")
        print(f"   vs GPT-J in-place then de-interleave permutation [0,2,..,1,3,..]: max abs diff {d_layout:.3g}")
        print(f"   q.k dot products vs plain GPT-J in-place rotation: max abs diff {d_dot:.3g}")
        print("\n== mscale edge cases (factor 40): hf rotation mscale | seed rotation mscale | "
              "hf softmax mscale^2 | seed softmax mscale^2")
        for label, a, b, s1, s2 in check_mscale_edge_cases():
            flag = "" if abs(a - b) < 1e-12 and abs(s1 - s2) < 1e-12 else "   <-- DIFFERS"
            print(f"   {label:38s} {a:.6f} | {b:.6f} | {s1:.6f} | {s2:.6f}{flag}")
        if failures:
            print(f"\nCROSS-CHECK FAILED for: {failures}")
            sys.exit(1)
        print("\ncross-check OK")


if __name__ == "__main__":
    main()
