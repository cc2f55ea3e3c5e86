//! ggml's Q4_K and Q5_K encoders (`quantize_row_q4_K_ref`, `quantize_row_q5_K_ref`: what
//! llama-quantize writes without an importance matrix), step for step in f32 so that the bytes
//! are the same: per 32-value sub-block a scale and a minimum fitted by `make_qkx2_quants`
//! (weighted least squares over a few candidate scales), both quantized to 6 bits against the
//! block's f16 `d` and `dmin`, then every level recomputed from the stored scales.

use half::f16;

use super::nearest_int;
use super::q4_k::{k_pack_scales_mins, QK_K};

/// One block of K-quant levels (`0..=nmax`) with its packed scales and minimums, `d`, `dmin`.
pub(super) struct KBlock {
    pub levels: [u8; QK_K],
    pub scales: [u8; 12],
    pub d: f16,
    pub dmin: f16,
}

/// How a K-quant fits its sub-blocks: levels, and `make_qkx2_quants`' search.
pub(super) struct Fit {
    /// The largest level (15 for Q4_K, 31 for Q5_K).
    pub nmax: i32,
    /// The search's first offset.
    pub rmin: f32,
    /// Its step.
    pub rdelta: f32,
    /// Its steps after the first.
    pub nstep: i32,
}

/// Q4_K's fit.
pub(super) const Q4_K_FIT: Fit = Fit {
    nmax: 15,
    rmin: -1.0,
    rdelta: 0.1,
    nstep: 20,
};

/// Q5_K's fit.
pub(super) const Q5_K_FIT: Fit = Fit {
    nmax: 31,
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
};

/// The levels, scales and minimums of 256 values, as ggml's reference quantizer makes them.
pub(super) fn k_block(x: &[f32], fit: &Fit) -> KBlock {
    let mut levels = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * (j + 1)];
        let sum_x2 = xs.iter().fold(0.0f32, |s, &v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| av_x + xs[l].abs());
        let (scale, min) = make_qkx2_quants(fit, xs, &weights, &mut levels[32 * j..32 * (j + 1)]);
        (scales[j], mins[j]) = (scale, min);
        // `if (v > max) max = v`, as ggml compares (a NaN never replaces).
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let six_bits = |v: f32| (nearest_int(v) as u8).min(63);
    let ls = scales.map(|s| six_bits(inv_scale * s));
    let lm = mins.map(|m| six_bits(inv_min * m));
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    for j in 0..8 {
        let step = d.to_f32() * f32::from(ls[j]);
        if step == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(lm[j]);
        for i in 32 * j..32 * (j + 1) {
            levels[i] = nearest_int((x[i] + dm) / step).clamp(0, fit.nmax) as u8;
        }
    }
    KBlock {
        levels,
        scales: k_pack_scales_mins(&ls, &lm),
        d,
        dmin,
    }
}

/// ggml's `make_qkx2_quants` (no MAD): the scale and minimum (returned negated, as ggml's
/// `the_min`) of 32 values with `weights`, their levels in `l`.
fn make_qkx2_quants(fit: &Fit, x: &[f32], weights: &[f32], l: &mut [u8]) -> (f32, f32) {
    let n = x.len();
    let nmax = fit.nmax;
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    let mut aux = [0u8; 32];
    for is in 0..=fit.nstep {
        iscale = (fit.rmin + fit.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = q as u8;
            let (w, q) = (weights[i], q as f32);
            sum_l += w * q;
            sum_l2 += w * q * q;
            sum_xl += w * q * x[i];
        }
        let big_d = sum_w * sum_l2 - sum_l * sum_l;
        if big_d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / big_d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / big_d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(aux[i]) + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}
