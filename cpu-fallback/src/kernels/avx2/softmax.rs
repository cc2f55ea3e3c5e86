//! The attention's softmax eight scores at a time, with a vector `exp` (the scalar path calls
//! the C library's `expf` once per score, which was a third of prefill attention).

use std::arch::x86_64::*;

/// `e^x` in every lane, within 2 ULP of the exact value for x ≥ −87.3 and 0 below (the
/// softmax's inputs are ≤ 0): `x = n·ln 2 + r` with |r| ≤ ln 2 / 2, a degree-7 Taylor
/// polynomial for `e^r` (truncation below 6e-9 relative), then `2^n` put in the exponent.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp8(x: __m256) -> __m256 {
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    // ln 2 split in two so that n·ln2_hi is exact (Cody–Waite).
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm256_set1_ps(1.0 / 5040.0);
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let n = _mm256_max_ps(n, _mm256_set1_ps(-126.0));
    let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    let e = _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
    let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.3));
    _mm256_andnot_ps(tiny, e)
}

/// AVX2/FMA version of [`crate::kernels::scalar::softmax`]: the same steps (max of the scaled
/// scores, `exp(s·scale − max)`, their sum in f64, one multiply by its inverse) with [`exp8`]
/// and the sum in four f64 lanes.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn softmax(scores: &mut [f32], scale: f32) {
    let max = scores
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v * scale));
    let (sv, mv) = (_mm256_set1_ps(scale), _mm256_set1_ps(max));
    let mut sum = [_mm256_setzero_pd(); 2];
    let mut chunks = scores.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: `c` holds eight floats.
        unsafe {
            let x = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), sv), mv);
            let e = exp8(x);
            _mm256_storeu_ps(c.as_mut_ptr(), e);
            sum[0] = _mm256_add_pd(sum[0], _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
            sum[1] = _mm256_add_pd(sum[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(e)));
        }
    }
    let mut lanes = [0.0f64; 4];
    // SAFETY: `lanes` holds four doubles.
    unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), _mm256_add_pd(sum[0], sum[1])) };
    let mut total: f64 = lanes.iter().sum();
    for sc in chunks.into_remainder() {
        *sc = (*sc * scale - max).exp();
        total += f64::from(*sc);
    }
    let inv = (1.0 / total) as f32;
    for sc in scores.iter_mut() {
        *sc *= inv;
    }
}
