//! F32 and F16 rows against f32 activations, and the attention's dot products and weighted
//! sums over the f32 KV cache. Fused multiply-adds in four-lane accumulators: equal to the
//! scalar path up to summation order and FMA rounding, as the AVX2 versions are.
//!
//! These need nothing beyond NEON, which every AArch64 target has, so both variants run them
//! and they are safe functions: each asserts the shapes it reads, then runs an `unsafe` body.

use std::arch::aarch64::*;

use super::f16x8_to_f32;

/// Four f32 lanes of the (little-endian, any alignment) bytes at `p`.
///
/// # Safety
/// 16 bytes must be readable at `p`.
#[inline(always)]
unsafe fn load_f32x4(p: *const u8) -> float32x4_t {
    // SAFETY: the caller guarantees 16 readable bytes; a byte load needs no alignment.
    unsafe { vreinterpretq_f32_u8(vld1q_u8(p)) }
}

/// Σ w[i]·x[i] for the `x.len()` little-endian floats at `w`, in four four-lane accumulators.
///
/// # Safety
/// `4 · x.len()` bytes must be readable at `w`.
#[inline(always)]
unsafe fn dot_at(w: *const u8, x: &[f32]) -> f32 {
    let n = x.len();
    let xp = x.as_ptr();
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    // SAFETY: every load reads floats inside [0, n) of both.
    unsafe {
        while i + 16 <= n {
            for (j, a) in acc.iter_mut().enumerate() {
                let k = i + 4 * j;
                *a = vfmaq_f32(*a, load_f32x4(w.add(4 * k)), vld1q_f32(xp.add(k)));
            }
            i += 16;
        }
        while i + 4 <= n {
            acc[0] = vfmaq_f32(acc[0], load_f32x4(w.add(4 * i)), vld1q_f32(xp.add(i)));
            i += 4;
        }
        let v = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
        let tail: f32 = (i..n)
            .map(|k| f32::from_le_bytes(w.add(4 * k).cast::<[u8; 4]>().read()) * x[k])
            .sum();
        vaddvq_f32(v) + tail
    }
}

/// NEON version of [`crate::kernels::scalar::f32_dot`].
pub fn f32_dot(row: &[u8], x: &[f32]) -> f32 {
    assert_eq!(row.len(), 4 * x.len());
    // SAFETY: the row holds x.len() floats.
    unsafe { dot_at(row.as_ptr(), x) }
}

/// NEON version of [`crate::kernels::scalar::scores`]: four keys per pass share each load of
/// the query and one horizontal reduction.
pub fn scores(q: &[f32], k: &[f32], stride: usize, out: &mut [f32]) {
    assert!(out.is_empty() || k.len() >= (out.len() - 1) * stride + q.len());
    // SAFETY: the assert bounds every key.
    unsafe { scores_unchecked(q, k, stride, out) }
}

/// [`scores`] without the bounds check.
///
/// # Safety
/// `k` holds `(out.len() − 1)·stride + q.len()` floats.
#[inline(always)]
unsafe fn scores_unchecked(q: &[f32], k: &[f32], stride: usize, out: &mut [f32]) {
    let hd = q.len();
    let vec_end = hd / 4 * 4;
    let mut j = 0;
    while j + 4 <= out.len() {
        let mut acc = [vdupq_n_f32(0.0); 4];
        for i in (0..vec_end).step_by(4) {
            // SAFETY: key j + r covers [(j + r)·stride, (j + r)·stride + hd) of k (the
            // caller's contract) and i + 4 <= hd.
            unsafe {
                let qv = vld1q_f32(q.as_ptr().add(i));
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = vfmaq_f32(*a, qv, vld1q_f32(k.as_ptr().add((j + r) * stride + i)));
                }
            }
        }
        let sums = vpaddq_f32(vpaddq_f32(acc[0], acc[1]), vpaddq_f32(acc[2], acc[3]));
        let mut lanes = [0.0f32; 4];
        // SAFETY: `lanes` holds exactly four floats.
        unsafe { vst1q_f32(lanes.as_mut_ptr(), sums) };
        for (r, s) in lanes.into_iter().enumerate() {
            let key = &k[(j + r) * stride..][..hd];
            let tail: f32 = (vec_end..hd).map(|i| q[i] * key[i]).sum();
            out[j + r] = s + tail;
        }
        j += 4;
    }
    for (jj, o) in out.iter_mut().enumerate().skip(j) {
        let key = &k[jj * stride..][..hd];
        // SAFETY: `key` holds hd floats, reinterpreted as their bytes.
        *o = unsafe { dot_at(key.as_ptr().cast(), q) };
    }
}

/// NEON version of [`crate::kernels::scalar::weighted_sum`]: 64 output dims at a time stay in
/// sixteen registers for the whole pass over the values, then 4 at a time.
pub fn weighted_sum(p: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
    assert!(p.is_empty() || v.len() >= (p.len() - 1) * stride + out.len());
    let hd = out.len();
    let mut d0 = 0;
    while d0 + 64 <= hd {
        // SAFETY: the assert bounds every value; d0 + 64 <= hd.
        unsafe { weighted_sum_cols::<16>(p, v, stride, &mut out[d0..d0 + 64], d0) };
        d0 += 64;
    }
    while d0 + 4 <= hd {
        // SAFETY: as above; d0 + 4 <= hd.
        unsafe { weighted_sum_cols::<1>(p, v, stride, &mut out[d0..d0 + 4], d0) };
        d0 += 4;
    }
    for (d, o) in out.iter_mut().enumerate().skip(d0) {
        *o = p
            .iter()
            .enumerate()
            .fold(0.0, |acc, (j, &pj)| pj.mul_add(v[j * stride + d], acc));
    }
}

/// `out = Σ_j p[j] · v[j·stride + d0 ..][..4·W]`, the `W` four-lane accumulators held in
/// registers for the whole pass (a constant `W`, so they are never spilled).
///
/// # Safety
/// `out.len() == 4·W` and `v` holds `(p.len() − 1)·stride + d0 + 4·W` floats.
#[inline(always)]
unsafe fn weighted_sum_cols<const W: usize>(
    p: &[f32],
    v: &[f32],
    stride: usize,
    out: &mut [f32],
    d0: usize,
) {
    debug_assert!(out.len() == 4 * W);
    let mut acc = [vdupq_n_f32(0.0); W];
    for (j, &pj) in p.iter().enumerate() {
        let row = v.as_ptr().add(j * stride + d0);
        for (c, a) in acc.iter_mut().enumerate() {
            // SAFETY: value j's dims d0 + 4c .. d0 + 4c + 4 are inside v (the contract).
            *a = vfmaq_n_f32(*a, unsafe { vld1q_f32(row.add(4 * c)) }, pj);
        }
    }
    for (c, a) in acc.into_iter().enumerate() {
        // SAFETY: 4c + 4 <= 4·W = out.len().
        unsafe { vst1q_f32(out.as_mut_ptr().add(4 * c), a) };
    }
}

/// NEON version of [`crate::kernels::scalar::f16_dot`]: the halves widened exactly with
/// `FCVTL`/`FCVTL2`.
pub fn f16_dot(row: &[u8], x: &[f32]) -> f32 {
    assert_eq!(row.len(), 2 * x.len());
    // SAFETY: the row holds x.len() halves.
    let (head, done) = unsafe { f16_dot_head(row.as_ptr(), x) };
    head + crate::kernels::scalar::f16_dot(&row[2 * done..], &x[done..])
}

/// Σ w[i]·x[i] over the first `x.len() / 8 · 8` halves at `w`, and how many that is.
///
/// # Safety
/// `2 · x.len()` bytes must be readable at `w`.
#[inline(always)]
unsafe fn f16_dot_head(w: *const u8, x: &[f32]) -> (f32, usize) {
    let n = x.len();
    let xp = x.as_ptr();
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    // SAFETY: every load reads 8 halves / 8 floats inside [0, n).
    unsafe {
        while i + 16 <= n {
            for h in 0..2 {
                let k = i + 8 * h;
                let [lo, hi] = f16x8_to_f32(vreinterpretq_u16_u8(vld1q_u8(w.add(2 * k))));
                acc[2 * h] = vfmaq_f32(acc[2 * h], lo, vld1q_f32(xp.add(k)));
                acc[2 * h + 1] = vfmaq_f32(acc[2 * h + 1], hi, vld1q_f32(xp.add(k + 4)));
            }
            i += 16;
        }
        while i + 8 <= n {
            let [lo, hi] = f16x8_to_f32(vreinterpretq_u16_u8(vld1q_u8(w.add(2 * i))));
            acc[0] = vfmaq_f32(acc[0], lo, vld1q_f32(xp.add(i)));
            acc[1] = vfmaq_f32(acc[1], hi, vld1q_f32(xp.add(i + 4)));
            i += 8;
        }
    }
    let v = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
    (vaddvq_f32(v), i)
}
