//! F32 and F16 rows against f32 activations, and the attention's dot products and weighted
//! sums over the f32 KV cache.

use std::arch::x86_64::*;

use super::{hsum_f32, prefetch_ahead};

/// AVX2/FMA version of [`crate::kernels::scalar::f32_dot`].
///
/// # Safety
/// The CPU must support AVX2 and FMA; `row.len() == 4 * x.len()`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn f32_dot(row: &[u8], x: &[f32]) -> f32 {
    debug_assert!(row.len() == 4 * x.len());
    // SAFETY: the row holds x.len() floats (loads are unaligned, so any byte address works).
    unsafe { dot_at(row.as_ptr().cast(), x) }
}

/// AVX2/FMA version of [`crate::kernels::scalar::dot`].
///
/// # Safety
/// The CPU must support AVX2 and FMA; `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert!(a.len() == b.len());
    // SAFETY: `a` holds b.len() floats.
    unsafe { dot_at(a.as_ptr(), b) }
}

/// Σ w[i]·x[i] for the `x.len()` floats at `w`, in four eight-lane accumulators.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `x.len()` floats are readable at `w`.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_at(w: *const f32, x: &[f32]) -> f32 {
    let n = x.len();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every load reads inside [0, n) of both; loadu has no alignment needs.
    unsafe {
        while i + 32 <= n {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(
                    _mm256_loadu_ps(w.add(i + 8 * j)),
                    _mm256_loadu_ps(x.as_ptr().add(i + 8 * j)),
                    *a,
                );
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(w.add(i)),
                _mm256_loadu_ps(x.as_ptr().add(i)),
                acc[0],
            );
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let tail: f32 = (i..n).map(|k| w.add(k).read_unaligned() * x[k]).sum();
        hsum_f32(v) + tail
    }
}

/// AVX2/FMA version of [`crate::kernels::scalar::scores`]: four keys per pass share each load of the
/// query and one horizontal reduction (summation order differs from the scalar path).
///
/// # Safety
/// The CPU must support AVX2 and FMA; `k` holds `(out.len() − 1)·stride + q.len()` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn scores(q: &[f32], k: &[f32], stride: usize, out: &mut [f32]) {
    let hd = q.len();
    debug_assert!(out.is_empty() || k.len() >= (out.len() - 1) * stride + hd);
    let vec_end = hd / 8 * 8;
    let mut j = 0;
    while j + 4 <= out.len() {
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in (0..vec_end).step_by(8) {
            // SAFETY: key j + r covers [(j + r)·stride, (j + r)·stride + hd) of k, i + 8 <= hd.
            unsafe {
                let qv = _mm256_loadu_ps(q.as_ptr().add(i));
                for (r, a) in acc.iter_mut().enumerate() {
                    let kv = _mm256_loadu_ps(k.as_ptr().add((j + r) * stride + i));
                    *a = _mm256_fmadd_ps(qv, kv, *a);
                }
            }
        }
        let sums = hsum_f32_x4(acc);
        for (r, s) in sums.into_iter().enumerate() {
            let key = &k[(j + r) * stride..][..hd];
            let tail: f32 = (vec_end..hd).map(|i| q[i] * key[i]).sum();
            out[j + r] = s + tail;
        }
        j += 4;
    }
    for (jj, o) in out.iter_mut().enumerate().skip(j) {
        // SAFETY: as above for one key.
        *o = unsafe { dot(q, &k[jj * stride..][..hd]) };
    }
}

/// The horizontal sums of four vectors of eight f32 lanes.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn hsum_f32_x4(v: [__m256; 4]) -> [f32; 4] {
    // Pairwise sums within each 128-bit half: lanes end as [Σv0, Σv1, Σv2, Σv3] per half.
    let s = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
    let mut out = [0.0f32; 4];
    // SAFETY: `out` holds exactly four floats; storeu has no alignment needs.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), s) };
    out
}

/// AVX2/FMA version of [`crate::kernels::scalar::weighted_sum`]: 64 output dims at a time stay in eight
/// registers for the whole pass over the values (one FMA rounding per term instead of two).
///
/// # Safety
/// The CPU must support AVX2 and FMA; `v` holds `(p.len() − 1)·stride + out.len()` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn weighted_sum(p: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
    let hd = out.len();
    debug_assert!(p.is_empty() || v.len() >= (p.len() - 1) * stride + hd);
    let mut d0 = 0;
    while d0 < hd / 8 * 8 {
        let width = ((hd / 8 * 8 - d0) / 8).min(8);
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, &pj) in p.iter().enumerate() {
            let pv = _mm256_set1_ps(pj);
            for (c, a) in acc.iter_mut().enumerate().take(width) {
                // SAFETY: value j covers [j·stride, j·stride + hd) of v; d0 + 8c + 8 <= hd.
                let x = unsafe { _mm256_loadu_ps(v.as_ptr().add(j * stride + d0 + 8 * c)) };
                *a = _mm256_fmadd_ps(pv, x, *a);
            }
        }
        for (c, a) in acc.iter().enumerate().take(width) {
            // SAFETY: d0 + 8c + 8 <= hd = out.len().
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(d0 + 8 * c), *a) };
        }
        d0 += 8 * width;
    }
    for (d, o) in out.iter_mut().enumerate().skip(d0) {
        *o = p
            .iter()
            .enumerate()
            .fold(0.0, |acc, (j, &pj)| pj.mul_add(v[j * stride + d], acc));
    }
}

/// Eight f16 values at `p` widened to f32.
#[target_feature(enable = "avx2,f16c")]
unsafe fn load_f16x8(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 16 readable bytes at `p`.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
}

/// AVX2/FMA/F16C version of [`crate::kernels::scalar::f16_dot`]: one eight-lane accumulator
/// over the row's runs of eight, in order, then [`hsum_f32`] and the scalar rest. Every F16
/// kernel ([`f16_tile`]) sums each row and token in exactly this order, so a token's result
/// does not depend on which kernel, batch or thread computed it.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `row.len() == 2 * x.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_dot(row: &[u8], x: &[f32]) -> f32 {
    // SAFETY: forwarded from the caller.
    let [[sum]] = unsafe { f16_tile::<1, 1>(row, [x]) };
    sum
}

/// [`f16_dot`] of `R` consecutive rows (`rows` holds them all) against `T` token rows, as
/// `[row][token]`: a tile of `R·T` accumulators in registers, so each run of halves is
/// converted once for all `T` tokens and each token's floats are loaded once for all `R` rows.
/// Each row and token is summed exactly as [`f16_dot`] sums it.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `rows.len() == 2 * R * x[t].len()` for every `t`.
#[inline(always)]
pub unsafe fn f16_tile<const R: usize, const T: usize>(
    rows: &[u8],
    x: [&[f32]; T],
) -> [[f32; T]; R] {
    let n = x[0].len();
    debug_assert!(x.iter().all(|x| rows.len() == 2 * R * x.len()));
    let w: [*const u8; R] = std::array::from_fn(|r| rows.as_ptr().wrapping_add(2 * n * r));
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut i = 0;
    // SAFETY: every load reads 8 halves / 8 floats inside [0, n) of each row and of each x.
    unsafe {
        while i + 8 <= n {
            if i % 32 == 0 {
                for w in w {
                    prefetch_ahead(w.wrapping_add(2 * i));
                }
            }
            let xv: [__m256; T] = std::array::from_fn(|t| _mm256_loadu_ps(x[t].as_ptr().add(i)));
            for (acc, w) in acc.iter_mut().zip(w) {
                let wv = load_f16x8(w.add(2 * i));
                for (acc, xv) in acc.iter_mut().zip(xv) {
                    *acc = _mm256_fmadd_ps(wv, xv, *acc);
                }
            }
            i += 8;
        }
    }
    std::array::from_fn(|r| {
        let tail = &rows[r * 2 * n + 2 * i..(r + 1) * 2 * n];
        std::array::from_fn(|t| {
            // SAFETY: this function's contract (AVX2).
            let sum = unsafe { hsum_f32(acc[r][t]) };
            sum + crate::kernels::scalar::f16_dot(tail, &x[t][i..])
        })
    })
}

/// The F16 tiles compiled for one register file: AVX2's sixteen registers, or AVX-512's
/// thirty-two (the same eight-lane arithmetic, so the same sums).
macro_rules! f16_tiles {
    ($features:literal, $what:literal, $($name:ident: $r:literal x $t:literal),*) => {$(
        #[doc = concat!("[`f16_tile`] of ", $r, " rows × ", $t, " tokens, ", $what, ".")]
        ///
        /// # Safety
        /// As for [`f16_tile`], on a CPU with these features.
        #[target_feature(enable = $features)]
        pub unsafe fn $name(rows: &[u8], x: [&[f32]; $t]) -> [[f32; $t]; $r] {
            // SAFETY: forwarded from the caller.
            unsafe { f16_tile::<$r, $t>(rows, x) }
        }
    )*};
}

f16_tiles!("avx2,fma,f16c", "with AVX2's registers",
    f16_dot_x4: 1 x 4, f16_dot_rows4: 4 x 1, f16_dot_rows2_x4: 2 x 4);
f16_tiles!("avx2,fma,f16c,avx512f,avx512vl", "with AVX-512's thirty-two registers",
    f16_dot_rows4_x4_avx512: 4 x 4);

/// AVX2 version of [`crate::kernels::scalar::rms_norm_row`]: the same f32 squares and f32
/// scaling, the f64 sum of squares in eight lanes instead of one (so it may round differently
/// in its last bits).
///
/// # Safety
/// The CPU must support AVX2; `w` and `y` are as long as `x`.
#[target_feature(enable = "avx2")]
pub unsafe fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let d = x.len();
    debug_assert!(w.len() == d && y.len() == d);
    let vec_end = d / 8 * 8;
    let mut acc = [_mm256_setzero_pd(); 2];
    for i in (0..vec_end).step_by(8) {
        // SAFETY: i + 8 <= d.
        unsafe {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            let sq = _mm256_mul_ps(v, v);
            acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
            acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(sq)));
        }
    }
    let mut lanes = [0.0f64; 4];
    // SAFETY: `lanes` holds four doubles.
    unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), _mm256_add_pd(acc[0], acc[1])) };
    let sum: f64 =
        lanes.iter().sum::<f64>() + x[vec_end..].iter().map(|&v| f64::from(v * v)).sum::<f64>();
    let mean = (sum / d as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    let sv = _mm256_set1_ps(scale);
    for i in (0..vec_end).step_by(8) {
        // SAFETY: i + 8 <= d for x, w and y.
        unsafe {
            let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), sv);
            let out = _mm256_mul_ps(v, _mm256_loadu_ps(w.as_ptr().add(i)));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), out);
        }
    }
    for i in vec_end..d {
        y[i] = (x[i] * scale) * w[i];
    }
}
