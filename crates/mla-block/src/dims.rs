//! The block's dimensions and their validation.

use vt_core::{Error, Result};

use crate::rope::{mla_attention_scale, YarnRopeParams};

const OP: &str = "MlaBlockDims";

/// The largest width a dimension of the block may have: `hidden_size`, `q_lora_rank`,
/// `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`, `index_head_dim`
/// and `index_topk`. 2^20 is 146x DeepSeek-V3's widest (hidden 7168; kv_lora_rank 512,
/// q_lora_rank 1536, heads of 128 + 64, top 2048 in V3.2), so no real model is near it, and
/// a product of three such widths (2^60) still fits i64: the size checks below then compare
/// exact values. A larger value is a typo or a hostile file, refused naming the field.
pub const MAX_DIM: i64 = 1 << 20;

/// The most heads (`num_attention_heads`, `index_n_heads`): 2^16, 512x DeepSeek-V3's 128
/// (and 1024x V3.2's 64 indexer heads).
pub const MAX_HEADS: i64 = 1 << 16;

/// The most elements of one weight matrix the dims may imply (`q_b_proj`, `kv_b_proj`,
/// `o_proj`, the fused A-projection, the indexer's): 2^32 (16 GiB in f32), 36x DeepSeek-V3's
/// largest attention weight (`o_proj`, 7168 x 16384 = 2^26.8).
pub const MAX_WEIGHT_ELEMENTS: i64 = 1 << 32;

/// The most elements of one token's row in the widths the block allocates per token (the
/// query `num_heads * (nope + rope)`, the absorbed query `num_heads * (kv_lora_rank + rope)`,
/// `kv_b_proj`'s output, the attention output, the indexer query `index_n_heads *
/// index_head_dim`, ...): 2^24, 227x DeepSeek-V3's widest (the absorbed query, 128 x 576).
pub const MAX_TOKEN_ROW_ELEMENTS: i64 = 1 << 24;

/// The dimensions of one MLA attention block (Hugging Face config names in brackets).
///
/// Build with [`MlaBlockDims::new`], which sets `scale` through [`mla_attention_scale`]
/// so the YaRN `mscale^2` correction cannot be forgotten; [`MlaBlockDims::validate`]
/// rejects a default-constructed `scale` of 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlaBlockDims {
    /// H (config `hidden_size`).
    pub hidden_size: i64,
    /// N (config `num_attention_heads`).
    pub num_heads: i64,
    /// Q (config `q_lora_rank`); 0 means the q_proj branch (config value `null`, V2-Lite).
    pub q_lora_rank: i64,
    /// L (config `kv_lora_rank`): the width of the compressed latent that the cache stores.
    pub kv_lora_rank: i64,
    /// P (config `qk_nope_head_dim`): the part of a q/k head without rotary embedding.
    pub qk_nope_head_dim: i64,
    /// R (config `qk_rope_head_dim`): the rotary part of a q/k head (and of a cache row).
    pub qk_rope_head_dim: i64,
    /// V (config `v_head_dim`).
    pub v_head_dim: i64,
    /// Config `rms_norm_eps` of `q_a_layernorm` and `kv_a_layernorm`.
    pub rms_norm_eps: f32,
    /// Softmax scale; set by [`MlaBlockDims::new`] (`qk_head_dim^-0.5`, times `mscale^2`
    /// under YaRN).
    pub scale: f32,
    /// DeepSeek-V3.2's lightning indexer (config `index_n_heads`, `index_head_dim`,
    /// `index_topk`): `Some` makes the block sparse ([`MlaBlockDims::with_indexer`]).
    pub indexer: Option<IndexerDims>,
}

/// The lightning indexer of a DeepSeek-V3.2 layer (transformers' `DeepseekV32Indexer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexerDims {
    /// Hi (config `index_n_heads`, 64 in V3.2).
    pub n_heads: i64,
    /// Di (config `index_head_dim`, 128): the width of an indexer query head and of a key,
    /// whose first `qk_rope_head_dim` dims are rotated (neox).
    pub head_dim: i64,
    /// k (config `index_topk`, 2048): the tokens each query attends to.
    pub topk: i64,
}

impl MlaBlockDims {
    /// Dims with `scale` derived from the rope parameters, validated.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        hidden_size: i64,
        num_heads: i64,
        q_lora_rank: i64,
        kv_lora_rank: i64,
        qk_nope_head_dim: i64,
        qk_rope_head_dim: i64,
        v_head_dim: i64,
        rms_norm_eps: f32,
        rope: &YarnRopeParams,
    ) -> Result<MlaBlockDims> {
        let mut d = MlaBlockDims {
            hidden_size,
            num_heads,
            q_lora_rank,
            kv_lora_rank,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
            rms_norm_eps,
            scale: 0.0,
            indexer: None,
        };
        d.validate_sizes()?;
        d.scale = mla_attention_scale(&d, rope);
        d.validate()?;
        Ok(d)
    }

    /// P + R: the q/k head width of the materialized (prefill) form (saturating; dims
    /// that pass [`MlaBlockDims::validate`] never saturate).
    pub const fn qk_head_dim(&self) -> i64 {
        self.qk_nope_head_dim.saturating_add(self.qk_rope_head_dim)
    }

    /// L + R: the width of one latent row `[kv_c_normed | k_pe]` and of the absorbed query
    /// (saturating, as [`MlaBlockDims::qk_head_dim`]).
    pub const fn latent_row_dim(&self) -> i64 {
        self.kv_lora_rank.saturating_add(self.qk_rope_head_dim)
    }

    /// The elements of one token's row in the block's paged cache: the latent row L + R, and
    /// for a DeepSeek-V3.2 block its indexer key beside it (L + R + Di: the
    /// [`crate::PagedKvCache`] row the sparse block splits into its latent and key views).
    pub const fn cache_row_dim(&self) -> i64 {
        match self.indexer {
            Some(ix) => self.latent_row_dim().saturating_add(ix.head_dim),
            None => self.latent_row_dim(),
        }
    }

    /// These dims with DeepSeek-V3.2's indexer, validated: every indexer dim > 0, the
    /// indexer head at least the rope dim wide (its first R dims are rotated), and the
    /// q_lora branch (the indexer's query reads `q_a_layernorm`'s output).
    pub fn with_indexer(mut self, indexer: IndexerDims) -> Result<MlaBlockDims> {
        self.indexer = Some(indexer);
        self.validate()?;
        Ok(self)
    }

    /// Whether the block runs DeepSeek-V3.2's sparse attention.
    pub const fn is_sparse(&self) -> bool {
        self.indexer.is_some()
    }

    /// Every size derived from the dims fits: each weight's byte size in f32 (the widest
    /// compute dtype) and the per-token widths the block allocates, in checked i64
    /// arithmetic. The error names the dimension whose product overflows.
    fn validate_sizes(&self) -> Result<()> {
        self.validate_bounds()?;
        let (h, n, q) = (self.hidden_size, self.num_heads, self.q_lora_rank);
        let (l, p, r, v) = (self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim);
        let prod = |xs: &[i64]| xs.iter().try_fold(4i64, |acc, &x| acc.checked_mul(x.max(1)));
        let sum = |a: i64, b: i64| a.checked_add(b);
        // (what, blamed dim, product) for every weight shape and per-token width.
        let checks: [(&str, &'static str, Option<i64>); 8] = [
            ("qk_nope_head_dim + qk_rope_head_dim", "qk_nope_head_dim", sum(p, r)),
            ("kv_lora_rank + qk_rope_head_dim", "kv_lora_rank", sum(l, r)),
            ("qk_nope_head_dim + v_head_dim", "v_head_dim", sum(p, v)),
            (
                "q_b_proj / q_proj [num_heads * (qk_nope_head_dim + qk_rope_head_dim), max(q_lora_rank, hidden_size)]",
                "num_heads",
                sum(p, r).and_then(|dqk| prod(&[n, dqk, q.max(h)])),
            ),
            (
                "kv_b_proj [num_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]",
                "num_heads",
                sum(p, v).and_then(|pv| prod(&[n, pv, l])),
            ),
            ("o_proj [hidden_size, num_heads * v_head_dim]", "num_heads", prod(&[h, n, v])),
            (
                "fused q_a/kv_a projection [q_lora_rank + kv_lora_rank + qk_rope_head_dim, hidden_size]",
                "hidden_size",
                sum(l, r).and_then(|lr| sum(q, lr)).and_then(|rows| prod(&[rows, h])),
            ),
            (
                "absorbed query [num_heads, kv_lora_rank + qk_rope_head_dim] per token",
                "num_heads",
                sum(l, r).and_then(|lr| prod(&[n, lr])),
            ),
        ];
        for (what, arg, v) in checks {
            if v.is_none() {
                return Err(Error::invalid(
                    OP,
                    arg,
                    format!(
                        "the size of {what} overflows i64 (hidden_size {h}, num_heads {n}, q_lora_rank {q}, \
                         kv_lora_rank {l}, qk_nope_head_dim {p}, qk_rope_head_dim {r}, v_head_dim {v:?})",
                        v = self.v_head_dim
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every dim within its bound ([`MAX_DIM`], [`MAX_HEADS`]; lower bounds are
    /// [`MlaBlockDims::validate`]'s), then every weight and per-token width the dims imply
    /// within [`MAX_WEIGHT_ELEMENTS`] / [`MAX_TOKEN_ROW_ELEMENTS`]. The error names the
    /// dimension (as its config field, but for `num_heads`) and its value. Runs first, so a
    /// dimension past its bound is named before any product of it is computed.
    fn validate_bounds(&self) -> Result<()> {
        let heads = [("num_heads", self.num_heads)];
        let widths = [
            ("hidden_size", self.hidden_size),
            ("q_lora_rank", self.q_lora_rank),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("v_head_dim", self.v_head_dim),
        ];
        check_upper_bounds(&heads, &widths)?;
        // Every factor is now at most 2^20: the products below (at most three factors, one
        // a sum of at most three) are exact. Negative dims count as 0 here and are refused by
        // `validate`'s lower bounds.
        let [h, n, q, l, p, r, v] = [
            self.hidden_size,
            self.num_heads,
            self.q_lora_rank,
            self.kv_lora_rank,
            self.qk_nope_head_dim,
            self.qk_rope_head_dim,
            self.v_head_dim,
        ]
        .map(|x| x.max(0));
        let values = format!(
            "num_attention_heads {n}, hidden_size {h}, q_lora_rank {q}, kv_lora_rank {l}, \
             qk_nope_head_dim {p}, qk_rope_head_dim {r}, v_head_dim {v}"
        );
        let q_in = if q > 0 { q } else { h };
        let weights: [(&str, &'static str, i64); 4] = [
            (
                "q_b_proj / q_proj [num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim), \
                 q_lora_rank or hidden_size]",
                "num_heads",
                n * (p + r) * q_in,
            ),
            (
                "kv_b_proj [num_attention_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]",
                "num_heads",
                n * (p + v) * l,
            ),
            ("o_proj [hidden_size, num_attention_heads * v_head_dim]", "num_heads", h * n * v),
            (
                "the fused A-projection [q_lora_rank + kv_lora_rank + qk_rope_head_dim, hidden_size]",
                "hidden_size",
                (q + l + r) * h,
            ),
        ];
        let rows: [(&str, &'static str, i64); 3] = [
            (
                "the query num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim)",
                "num_heads",
                n * (p + r),
            ),
            (
                "the absorbed query num_attention_heads * (kv_lora_rank + qk_rope_head_dim)",
                "num_heads",
                n * (l + r),
            ),
            (
                "kv_b_proj's output num_attention_heads * (qk_nope_head_dim + v_head_dim)",
                "num_heads",
                n * (p + v),
            ),
        ];
        check_products(&weights, &rows, &values)
    }

    /// The indexer's dims within their bounds, and the sizes they imply.
    fn validate_indexer_bounds(&self, ix: &IndexerDims) -> Result<()> {
        check_upper_bounds(
            &[("index_n_heads", ix.n_heads)],
            &[("index_head_dim", ix.head_dim), ("index_topk", ix.topk)],
        )?;
        let [hi, di] = [ix.n_heads, ix.head_dim].map(|x| x.max(0));
        let (h, q) = (self.hidden_size.max(0), self.q_lora_rank.max(0));
        let values = format!("index_n_heads {hi}, index_head_dim {di}, q_lora_rank {q}, hidden_size {h}");
        let weights: [(&str, &'static str, i64); 2] = [
            ("indexer.wq_b [index_n_heads * index_head_dim, q_lora_rank]", "index_n_heads", hi * di * q),
            ("indexer.wk [index_head_dim, hidden_size]", "index_head_dim", di * h),
        ];
        let rows: [(&str, &'static str, i64); 1] =
            [("the indexer query index_n_heads * index_head_dim", "index_n_heads", hi * di)];
        check_products(&weights, &rows, &values)
    }

    fn validate_indexer(&self, ix: &IndexerDims) -> Result<()> {
        self.validate_indexer_bounds(ix)?;
        check_positive(
            OP,
            &[("index_n_heads", ix.n_heads), ("index_head_dim", ix.head_dim), ("index_topk", ix.topk)],
        )?;
        if ix.head_dim < self.qk_rope_head_dim {
            return Err(Error::invalid(
                OP,
                "index_head_dim",
                format!(
                    "{} is narrower than qk_rope_head_dim {} (the indexer rotates its first qk_rope_head_dim dims)",
                    ix.head_dim, self.qk_rope_head_dim
                ),
            ));
        }
        if !self.has_q_lora() {
            return Err(Error::invalid(
                OP,
                "q_lora_rank",
                "DeepSeek-V3.2's indexer reads q_a_layernorm's output: q_lora_rank must be set",
            ));
        }
        let sizes = [
            ix.n_heads
                .checked_mul(ix.head_dim)
                .and_then(|x| x.checked_mul(self.q_lora_rank.max(self.hidden_size))),
            self.latent_row_dim().checked_add(ix.head_dim),
            ix.topk.checked_mul(4),
        ];
        if sizes.iter().any(Option::is_none) {
            return Err(Error::invalid(
                OP,
                "index_n_heads",
                format!("the indexer's sizes overflow i64 ({ix:?})"),
            ));
        }
        Ok(())
    }

    /// Whether q goes through the low-rank q_a / q_b pair.
    pub const fn has_q_lora(&self) -> bool {
        self.q_lora_rank > 0
    }

    /// The seed's checks: every dim > 0 (q_lora_rank >= 0), an even rope dim,
    /// `v_head_dim <= qk_head_dim`, a positive finite eps, and a scale that was set; and
    /// every size derived from the dims (weight bytes, per-token widths) fits i64.
    pub fn validate(&self) -> Result<()> {
        self.validate_sizes()?;
        let dims = [
            ("hidden_size", self.hidden_size),
            ("num_heads", self.num_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("v_head_dim", self.v_head_dim),
        ];
        for (name, v) in dims {
            if v <= 0 {
                return Err(Error::invalid(OP, name, format!("every dimension must be > 0, got {v}")));
            }
        }
        if self.q_lora_rank < 0 {
            return Err(Error::invalid(
                OP,
                "q_lora_rank",
                format!("must be >= 0 (0 selects the q_proj branch), got {}", self.q_lora_rank),
            ));
        }
        if self.qk_rope_head_dim % 2 != 0 {
            return Err(Error::invalid(
                OP,
                "qk_rope_head_dim",
                format!("must be even (it is the rotary dim), got {}", self.qk_rope_head_dim),
            ));
        }
        if self.v_head_dim > self.qk_head_dim() {
            return Err(Error::invalid(
                OP,
                "v_head_dim",
                format!(
                    "{} exceeds qk_head_dim = qk_nope_head_dim + qk_rope_head_dim = {}",
                    self.v_head_dim,
                    self.qk_head_dim()
                ),
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(Error::invalid(
                OP,
                "rms_norm_eps",
                format!("must be finite and > 0, got {}", self.rms_norm_eps),
            ));
        }
        if let Some(ix) = self.indexer {
            self.validate_indexer(&ix)?;
        }
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(Error::invalid(
                OP,
                "scale",
                format!(
                    "is {}; set it with mla_attention_scale() (MlaBlockDims::new does), which \
                     carries the YaRN mscale^2 correction",
                    self.scale
                ),
            ));
        }
        Ok(())
    }
}

/// Refuses (naming `op`) the first of `sizes` that is not > 0, with its name and value.
pub(crate) fn check_positive(op: &'static str, sizes: &[(&'static str, i64)]) -> Result<()> {
    for &(name, v) in sizes {
        if v <= 0 {
            return Err(Error::invalid(op, name, format!("must be > 0, got {v}")));
        }
    }
    Ok(())
}

/// Refuses a head count past [`MAX_HEADS`] or a width past [`MAX_DIM`], naming it and its
/// value.
fn check_upper_bounds(heads: &[(&'static str, i64)], widths: &[(&'static str, i64)]) -> Result<()> {
    let limits = heads.iter().map(|&(n, v)| (n, v, MAX_HEADS, "2^16, 512x DeepSeek-V3's 128 heads"));
    let limits = limits.chain(
        widths.iter().map(|&(n, v)| (n, v, MAX_DIM, "2^20, 146x DeepSeek-V3's widest dim, hidden_size 7168")),
    );
    for (name, v, max, why) in limits {
        if v > max {
            return Err(Error::invalid(
                OP,
                name,
                format!(
                    "{v} is past its bound {max} ({why}): a dimension this large overflows the sizes the \
                     block derives from it or any device's memory"
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses a weight past [`MAX_WEIGHT_ELEMENTS`] or a per-token width past
/// [`MAX_TOKEN_ROW_ELEMENTS`] (`(what, blamed dim, elements)`), naming the blamed dim and
/// every value (`values`).
fn check_products(
    weights: &[(&str, &'static str, i64)],
    rows: &[(&str, &'static str, i64)],
    values: &str,
) -> Result<()> {
    let all = weights
        .iter()
        .map(|&(w, a, e)| (w, a, e, MAX_WEIGHT_ELEMENTS, "a weight"))
        .chain(rows.iter().map(|&(w, a, e)| (w, a, e, MAX_TOKEN_ROW_ELEMENTS, "one token's row")));
    for (what, arg, elements, max, kind) in all {
        if elements > max {
            return Err(Error::invalid(
                OP,
                arg,
                format!("{what} has {elements} elements, past the bound {max} for {kind} ({values})"),
            ));
        }
    }
    Ok(())
}
