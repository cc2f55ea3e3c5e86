//! Element-wise kernels: the residual add, a scale, the gated activations of the FFN and the
//! weighted sum of a mixture's experts.

use hesper_dsl::kernel;

/// `x[i] += y[i]` (the residual add, in place).
#[kernel(workgroup = 256)]
pub fn add_assign(x: &mut [f32], y: &[f32], #[uniform] n: u32) {
    let i = gid();
    if i < n {
        x[i] = x[i] + y[i];
    }
}

/// `x[i] *= s` (Gemma's embedding scale).
#[kernel(workgroup = 256)]
pub fn scale_assign(x: &mut [f32], #[uniform] s: f32, #[uniform] n: u32) {
    let i = gid();
    if i < n {
        x[i] = x[i] * s;
    }
}

/// `x[i] = cap · tanh(x[i] / cap)` (Gemma 2's soft-capped logits).
#[kernel(workgroup = 256)]
pub fn softcap_assign(x: &mut [f32], #[uniform] cap: f32, #[uniform] n: u32) {
    let i = gid();
    if i < n {
        x[i] = cap * (x[i] / cap).tanh();
    }
}

/// `x[i] += b[i % width]` over `n` values: a bias of `width` added to every row.
#[kernel(workgroup = 256)]
pub fn add_bias(x: &mut [f32], b: &[f32], #[uniform] width: u32, #[uniform] n: u32) {
    let i = gid();
    if i < n {
        x[i] = x[i] + b[i % width];
    }
}

/// [`add_bias`] of the queries, keys and values in one launch: `n` rows of `q` (`q_width`
/// wide) plus `bq`, of `k` and `v` (`kv_width` wide) plus `bk` and `bv`. Thread `i` adds one
/// value: the queries' first, then the keys', then the values'.
#[kernel(workgroup = 256)]
pub fn add_qkv_bias(
    q: &mut [f32],
    k: &mut [f32],
    v: &mut [f32],
    bq: &[f32],
    bk: &[f32],
    bv: &[f32],
    #[uniform] q_width: u32,
    #[uniform] kv_width: u32,
    #[uniform] n: u32,
) {
    let i = gid();
    let nq = n * q_width;
    let nkv = n * kv_width;
    if i < nq {
        q[i] = q[i] + bq[i % q_width];
    } else if i < nq + nkv {
        let j = i - nq;
        k[j] = k[j] + bk[j % kv_width];
    } else if i < nq + 2u32 * nkv {
        let j = i - nq - nkv;
        v[j] = v[j] + bv[j % kv_width];
    }
}

/// `out = silu(gate) · up` (llama.cpp mainline's BitNet FFN).
#[kernel(workgroup = 256)]
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32], #[uniform] n: u32) {
    let i = gid();
    if i < n {
        let g = gate[i];
        out[i] = g / (1.0 + (-g).exp()) * up[i];
    }
}

/// `out = relu(gate)² · up` (BitNet b1.58 2B4T's FFN).
#[kernel(workgroup = 256)]
pub fn relu2_mul(gate: &[f32], up: &[f32], out: &mut [f32], #[uniform] n: u32) {
    let i = gid();
    if i < n {
        let r = gate[i].max(0.0);
        out[i] = r * r * up[i];
    }
}

/// `out = gelu(gate) · up` with GELU's tanh approximation, as
/// `hesper_engine::config::Activation::GeluTanh` defines it (Gemma's FFN).
#[kernel(workgroup = 256)]
pub fn gelu_mul(gate: &[f32], up: &[f32], out: &mut [f32], #[uniform] n: u32) {
    let i = gid();
    if i < n {
        let g = gate[i];
        let u = 0.7978846 * g * (1.0 + 0.044715 * g * g);
        out[i] = g / (1.0 + (-2.0 * u).exp()) * up[i];
    }
}

/// `out = min(g, 7) · σ(1.702 · min(g, 7)) · (clamp(u, −7, 7) + 1)`, as
/// `hesper_engine::config::Activation::SwigluClamped` defines it (gpt-oss's experts).
#[kernel(workgroup = 256)]
pub fn swiglu_clamped_mul(gate: &[f32], up: &[f32], out: &mut [f32], #[uniform] n: u32) {
    let i = gid();
    if i < n {
        let g = gate[i].min(7.0);
        let u = up[i].max(-7.0).min(7.0);
        out[i] = g / (1.0 + (-1.702 * g).exp()) * (u + 1.0);
    }
}

/// `out[t][c] = Σ_r w[t·n_used + r] · ys[t·n_used + r][c]` over the `n` values of `out` (rows
/// of `width`): each row's expert outputs weighted and added in the order they were chosen (a
/// mixture of experts' output, as the CPU backend adds them up); where `biased` is 1, each
/// output plus the bias of its expert first (`ys[k][c] + bias[ids[k]·width + c]`, as an
/// `add_bias` of the expert's down bias before); where `add` is 1, added to `out` instead (the
/// residual stream: `out + Σ`, as an `add_assign` of the sum after it). Where `pos_at` is not 0,
/// pair `k`'s output is row `ids[pos_at + k]` of `ys` instead (the slot `crate::moe_group`
/// gave it).
#[kernel(workgroup = 256)]
pub fn moe_combine(
    ys: &[f32],
    w: &[f32],
    ids: &[u32],
    bias: &[f32],
    out: &mut [f32],
    #[uniform] width: u32,
    #[uniform] n_used: u32,
    #[uniform] biased: u32,
    #[uniform] add: u32,
    #[uniform] pos_at: u32,
    #[uniform] n: u32,
) {
    let i = gid();
    if i < n {
        let t = i / width;
        let c = i % width;
        let mut acc: f32 = 0.0;
        for r in 0u32..n_used {
            let k = t * n_used + r;
            let mut row = k;
            if pos_at > 0u32 {
                row = ids[pos_at + k];
            }
            let mut y = ys[row * width + c];
            if biased == 1u32 {
                y = y + bias[ids[k] * width + c];
            }
            acc = acc + y * w[k];
        }
        if add == 1u32 {
            out[i] = out[i] + acc;
        } else {
            out[i] = acc;
        }
    }
}

/// Interleaves the rows of two `rows × row_words` matrices (row `i` of `a` becomes row `2i`, of
/// `b` row `2i + 1`): how a gate/up pair is joined on the GPU for one fused pass
/// ([`crate::GLU_RELU2`]). Thread `gid` writes output words `gid, gid + stride, …`, so a
/// grid of at most 65 535 workgroups (`stride` its threads) covers any pair: the FFN of a
/// Llama-3.2-1B-shaped F16 file is 2²⁴ words, one past a one-word-a-thread grid's reach.
#[kernel(workgroup = 256)]
pub fn interleave_rows(
    a: &[u32],
    b: &[u32],
    out: &mut [u32],
    #[uniform] row_words: u32,
    #[uniform] rows: u32,
    #[uniform] stride: u32,
) {
    for i in (gid()..(2u32 * rows * row_words)).step_by(stride) {
        let row = i / row_words;
        let src = (row / 2u32) * row_words + i % row_words;
        if row % 2u32 == 0u32 {
            out[i] = a[src];
        } else {
            out[i] = b[src];
        }
    }
}
