//! Attention of four query heads that read one kv head (grouped-query attention, as 2B4T's
//! 20 query heads over 5 kv heads): each key and value row is loaded once for the four, where
//! one query at a time loads it four times. Every result is bit-identical to the one-query
//! kernels ([`super::scores`], [`super::weighted_sum`]): the same accumulator per (query, key)
//! or per output element, fed in the same order.

use std::arch::x86_64::*;

use super::float::{dot, hsum_f32_x4};

/// [`super::scores`] of four queries against the same keys: `out[g][j] = q[g] · k[j·stride..]`.
///
/// # Safety
/// The CPU must support AVX2 and FMA; all `q` are as long, all `out` as long, and `k` holds
/// `(out[0].len() − 1)·stride + q[0].len()` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn scores_x4(q: [&[f32]; 4], k: &[f32], stride: usize, mut out: [&mut [f32]; 4]) {
    let hd = q[0].len();
    let keys = out[0].len();
    debug_assert!(keys == 0 || k.len() >= (keys - 1) * stride + hd);
    let vec_end = hd / 8 * 8;
    // Keys in pairs up to the last whole four (as `scores` passes four at a time), then the
    // rest one by one with `dot`, as `scores` does.
    let paired = keys / 4 * 4;
    for j in (0..paired).step_by(2) {
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        for i in (0..vec_end).step_by(8) {
            // SAFETY: keys j, j + 1 cover [(j + r)·stride, (j + r)·stride + hd) of k, and
            // i + 8 <= hd for every query.
            unsafe {
                let kv = [
                    _mm256_loadu_ps(k.as_ptr().add(j * stride + i)),
                    _mm256_loadu_ps(k.as_ptr().add((j + 1) * stride + i)),
                ];
                for (a, qg) in acc.iter_mut().zip(q) {
                    let qv = _mm256_loadu_ps(qg.as_ptr().add(i));
                    a[0] = _mm256_fmadd_ps(qv, kv[0], a[0]);
                    a[1] = _mm256_fmadd_ps(qv, kv[1], a[1]);
                }
            }
        }
        // SAFETY: AVX2 is enabled here.
        let sums = unsafe {
            [
                hsum_f32_x4([acc[0][0], acc[0][1], acc[1][0], acc[1][1]]),
                hsum_f32_x4([acc[2][0], acc[2][1], acc[3][0], acc[3][1]]),
            ]
        };
        for (g, o) in out.iter_mut().enumerate() {
            for r in 0..2 {
                let key = &k[(j + r) * stride..][..hd];
                let tail: f32 = (vec_end..hd).map(|i| q[g][i] * key[i]).sum();
                o[j + r] = sums[g / 2][2 * (g % 2) + r] + tail;
            }
        }
    }
    for (g, o) in out.into_iter().enumerate() {
        for (j, s) in o.iter_mut().enumerate().skip(paired) {
            // SAFETY: key j covers [j·stride, j·stride + hd) of k.
            *s = unsafe { dot(q[g], &k[j * stride..][..hd]) };
        }
    }
}

/// [`super::weighted_sum`] of four probability rows over the same values:
/// `out[g] = Σ_j p[g][j] · v[j·stride..]`, sixteen output dims of the four at a time.
///
/// # Safety
/// The CPU must support AVX2 and FMA; all `p` are as long, all `out` as long, and `v` holds
/// `(p[0].len() − 1)·stride + out[0].len()` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn weighted_sum_x4(p: [&[f32]; 4], v: &[f32], stride: usize, mut out: [&mut [f32]; 4]) {
    let hd = out[0].len();
    let len = p[0].len();
    debug_assert!(len == 0 || v.len() >= (len - 1) * stride + hd);
    let vec_end = hd / 8 * 8;
    let mut d0 = 0;
    while d0 < vec_end {
        // Two registers per query while sixteen dims remain, then one.
        let width = ((vec_end - d0) / 8).min(2);
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        for j in 0..len {
            // SAFETY: value j covers [j·stride, j·stride + hd) of v; d0 + 8·width <= hd;
            // every p holds len > j probabilities.
            unsafe {
                let row = v.as_ptr().add(j * stride + d0);
                let x = [
                    _mm256_loadu_ps(row),
                    _mm256_loadu_ps(row.add(8 * (width - 1))),
                ];
                for (a, pg) in acc.iter_mut().zip(p) {
                    let pv = _mm256_set1_ps(*pg.get_unchecked(j));
                    for c in 0..width {
                        a[c] = _mm256_fmadd_ps(pv, x[c], a[c]);
                    }
                }
            }
        }
        for (a, o) in acc.iter().zip(out.iter_mut()) {
            for (c, a) in a.iter().enumerate().take(width) {
                // SAFETY: d0 + 8c + 8 <= hd = o.len().
                unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(d0 + 8 * c), *a) };
            }
        }
        d0 += 8 * width;
    }
    for (g, o) in out.into_iter().enumerate() {
        for (d, o) in o.iter_mut().enumerate().skip(vec_end) {
            *o = p[g]
                .iter()
                .enumerate()
                .fold(0.0, |acc, (j, &pj)| pj.mul_add(v[j * stride + d], acc));
        }
    }
}
