//! Scalar row dot products: the exact semantics every other kernel is tested against.
//!
//! Integer parts (ternary × int8) are exact; float accumulation runs block by block in the
//! order ggml's generic kernels use.

use half::{bf16, f16};
use hesper_engine::formats::q4_k::{k_d_dmin, k_scales_mins, q4_k_code, Q4_K_BLOCK_BYTES};
use hesper_engine::formats::q5_k::{q5_k_code, Q5_K_BLOCK_BYTES};
use hesper_engine::formats::q6_k::{
    q6_k_code, q6_k_d, q6_k_scale_index, Q6_K_BLOCK_BYTES, Q6_K_SCALES,
};
use hesper_engine::formats::{
    i2s_code, mxfp4_code, mxfp4_scale, q4_0_code, tq1_0_code, tq2_0_code, MXFP4_BLOCK_BYTES,
    MXFP4_VALUES, Q4_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES, TQ1_0_BLOCK_BYTES, TQ2_0_BLOCK_BYTES,
};

use crate::quant::{Q8KBlock, Q8_0Block, QK_K};

/// Σ code·q over one I2_S row (codes 0, 1, 2; subtract Σq for the ternary sum).
pub fn i2s_code_dot(row: &[u8], q: &[i8]) -> i32 {
    q.iter()
        .enumerate()
        .map(|(k, &qv)| i32::from(i2s_code(row, k)) * i32::from(qv))
        .sum()
}

/// One TQ2_0 row · Q8_K activations: per block the exact integer Σ(c−1)·q, then
/// `acc += sumi · (d_act · d_weight)` in f32.
pub fn tq2_0_dot(row: &[u8], act: &[Q8KBlock]) -> f32 {
    ternary_blocks_dot(row, act, TQ2_0_BLOCK_BYTES, tq2_0_code)
}

/// One TQ1_0 row · Q8_K activations (same accumulation as [`tq2_0_dot`]).
pub fn tq1_0_dot(row: &[u8], act: &[Q8KBlock]) -> f32 {
    ternary_blocks_dot(row, act, TQ1_0_BLOCK_BYTES, tq1_0_code)
}

/// Shared body of the TQ dots: blocks of `block_bytes` whose last two bytes are the f16
/// scale, element `e`'s code given by `code(block, e)`.
fn ternary_blocks_dot(
    row: &[u8],
    act: &[Q8KBlock],
    block_bytes: usize,
    code: fn(&[u8], usize) -> u8,
) -> f32 {
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(block_bytes).zip(act) {
        let sumi: i32 = (0..QK_K)
            .map(|e| (i32::from(code(blk, e)) - 1) * i32::from(a.qs[e]))
            .sum();
        let d = a.d * f16::from_le_bytes([blk[block_bytes - 2], blk[block_bytes - 1]]).to_f32();
        acc += sumi as f32 * d;
    }
    acc
}

/// One Q8_0 row · Q8_0 activations.
pub fn q8_0_dot(row: &[u8], act: &[Q8_0Block]) -> f32 {
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(Q8_0_BLOCK_BYTES).zip(act) {
        let sumi: i32 = blk[2..]
            .iter()
            .zip(&a.qs)
            .map(|(&w, &q)| i32::from(w as i8) * i32::from(q))
            .sum();
        acc += sumi as f32 * (f16::from_le_bytes([blk[0], blk[1]]).to_f32() * a.d);
    }
    acc
}

/// One Q4_0 row · Q8_0 activations: per block the exact integer Σ(code − 8)·q, then
/// `acc += sumi · (d_weight · d_act)` in f32, block after block.
pub fn q4_0_dot(row: &[u8], act: &[Q8_0Block]) -> f32 {
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(Q4_0_BLOCK_BYTES).zip(act) {
        let sumi: i32 = (0..32)
            .map(|e| (i32::from(q4_0_code(blk, e)) - 8) * i32::from(a.qs[e]))
            .sum();
        acc += sumi as f32 * (f16::from_le_bytes([blk[0], blk[1]]).to_f32() * a.d);
    }
    acc
}

/// One MXFP4 row · Q8_0 activations: per block the exact integer Σ value·q over the doubled
/// E2M1 values, then `acc += sumi · (scale · d_act)` in f32, block after block (ggml's
/// `ggml_vec_dot_mxfp4_q8_0`).
pub fn mxfp4_dot(row: &[u8], act: &[Q8_0Block]) -> f32 {
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(MXFP4_BLOCK_BYTES).zip(act) {
        let sumi: i32 = (0..32)
            .map(|e| i32::from(MXFP4_VALUES[usize::from(mxfp4_code(blk, e))]) * i32::from(a.qs[e]))
            .sum();
        acc += sumi as f32 * (mxfp4_scale(blk[0]) * a.d);
    }
    acc
}

/// One Q4_K row · Q8_K activations (see [`k_quant_dot`]).
pub fn q4_k_dot(row: &[u8], act: &[Q8KBlock]) -> f32 {
    k_quant_dot(row, act, Q4_K_BLOCK_BYTES, q4_k_code)
}

/// One Q5_K row · Q8_K activations (see [`k_quant_dot`]).
pub fn q5_k_dot(row: &[u8], act: &[Q8KBlock]) -> f32 {
    k_quant_dot(row, act, Q5_K_BLOCK_BYTES, q5_k_code)
}

/// Shared body of the Q4_K and Q5_K dots (blocks of `block_bytes`, element `e`'s code given by
/// `code(block, e)`): per block the exact integers `sumi = Σ_s scale_s · Σ code·q` and
/// `summ = Σ_s min_s · Σ q` over the eight sub-blocks, then
/// `acc += (d·d_act)·sumi − (dmin·d_act)·summ` in f32, block after block.
pub fn k_quant_dot(
    row: &[u8],
    act: &[Q8KBlock],
    block_bytes: usize,
    code: fn(&[u8], usize) -> u8,
) -> f32 {
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(block_bytes).zip(act) {
        let (scales, mins) = k_scales_mins(blk);
        let sumi: i32 = (0..8)
            .map(|s| {
                let sub: i32 = (32 * s..32 * s + 32)
                    .map(|e| i32::from(code(blk, e)) * i32::from(a.qs[e]))
                    .sum();
                i32::from(scales[s]) * sub
            })
            .sum();
        let summ = k_mins_sum(&mins, a);
        let (d, dmin) = k_d_dmin(blk);
        acc += (d * a.d) * sumi as f32 - (dmin * a.d) * summ as f32;
    }
    acc
}

/// `Σ_s min_s · Σ q` over the eight 32-value sub-blocks of a K-quant block: what the block's
/// minimums take off its dot product (before `dmin · d_act`), from the activations' partial sums.
#[inline]
pub fn k_mins_sum(mins: &[u8; 8], a: &Q8KBlock) -> i32 {
    mins.iter()
        .enumerate()
        .map(|(s, &m)| i32::from(m) * (i32::from(a.bsums[2 * s]) + i32::from(a.bsums[2 * s + 1])))
        .sum()
}

/// One Q6_K row · Q8_K activations: per block the exact integer
/// Σ_sub-blocks scale · Σ (code − 32)·q, then `acc += sumi · (d_weight · d_act)` in f32.
pub fn q6_k_dot(row: &[u8], act: &[Q8KBlock]) -> f32 {
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(Q6_K_BLOCK_BYTES).zip(act) {
        let sumi: i32 = (0..16)
            .map(|sb| {
                let sc = i32::from(blk[Q6_K_SCALES + q6_k_scale_index(16 * sb)] as i8);
                let s: i32 = (16 * sb..16 * sb + 16)
                    .map(|e| (i32::from(q6_k_code(blk, e)) - 32) * i32::from(a.qs[e]))
                    .sum();
                sc * s
            })
            .sum();
        acc += sumi as f32 * (q6_k_d(blk) * a.d);
    }
    acc
}

/// One F32 row (little-endian bytes) · x.
pub fn f32_dot(row: &[u8], x: &[f32]) -> f32 {
    row.chunks_exact(4)
        .zip(x)
        .map(|(b, &v)| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * v)
        .sum()
}

/// Σ aᵢ·bᵢ with eight independent partial sums (vectorises without fast-math).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `out[j] = q · k[j·stride ..][..q.len()]` for every `j < out.len()` (attention scores of one
/// query against cached keys `stride` floats apart).
pub fn scores(q: &[f32], k: &[f32], stride: usize, out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot(q, &k[j * stride..][..q.len()]);
    }
}

/// RMSNorm of one row: Σx² in f64 (of f32 squares), `scale = 1/sqrt(mean + eps)` in f32,
/// `y = (x·scale)·w`.
pub fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((y, &v), &g) in y.iter_mut().zip(x).zip(w) {
        *y = (v * scale) * g;
    }
}

/// Scaled attention scores to probabilities in place: `exp(s·scale − max)` over their sum
/// (accumulated in f64).
pub fn softmax(scores: &mut [f32], scale: f32) {
    let max = scores
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v * scale));
    let mut sum = 0.0f64;
    for sc in scores.iter_mut() {
        *sc = (*sc * scale - max).exp();
        sum += f64::from(*sc);
    }
    let inv = (1.0 / sum) as f32;
    for sc in scores.iter_mut() {
        *sc *= inv;
    }
}

/// `out = Σ_j p[j] · v[j·stride ..][..out.len()]` (attention's weighted sum of cached values).
pub fn weighted_sum(p: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
    out.fill(0.0);
    let hd = out.len();
    for (j, &pj) in p.iter().enumerate() {
        for (a, &b) in out.iter_mut().zip(&v[j * stride..][..hd]) {
            *a += pj * b;
        }
    }
}

/// One F16 row · x (x already rounded through f16 by the caller).
pub fn f16_dot(row: &[u8], x: &[f32]) -> f32 {
    row.chunks_exact(2)
        .zip(x)
        .map(|(b, &v)| f16::from_le_bytes([b[0], b[1]]).to_f32() * v)
        .sum()
}

/// One BF16 row · x (x already rounded through bf16 by the caller).
pub fn bf16_dot(row: &[u8], x: &[f32]) -> f32 {
    row.chunks_exact(2)
        .zip(x)
        .map(|(b, &v)| bf16::from_le_bytes([b[0], b[1]]).to_f32() * v)
        .sum()
}
