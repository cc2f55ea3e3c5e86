//! AVX2 + FMA + F16C kernels for x86_64. Each function is `unsafe` because the caller must
//! have checked the CPU features (see [`super::Isa::detect`]).
//!
//! * `ternary` — I2_S, TQ2_0 and TQ1_0 rows against int8 and Q8_K activations;
//! * `blocks` — Q8_0 and Q6_K rows;
//! * `k_quants` — Q4_0, Q4_K and Q5_K rows;
//! * `float` — F32 and F16 rows, and the attention's dot products and weighted sums.

mod blocks;
mod float;
mod grouped;
mod k_quants;
mod softmax;
mod ternary;

pub use blocks::{q6_k_dot, q6_k_dot_x4, q8_0_dot};
pub use float::{
    f16_dot, f16_dot_rows2_x4, f16_dot_rows4, f16_dot_rows4_x4_avx512, f16_dot_x4, f32_dot,
    rms_norm_row, scores, weighted_sum,
};
pub use grouped::{scores_x4, weighted_sum_x4};
pub use k_quants::{
    mxfp4_dot, q4_0_dot, q4_0_dot_rows4, q4_0_dot_x4, q4_k_dot, q4_k_dot_rows4, q4_k_dot_x4,
    q5_k_dot, q5_k_dot_rows4, q5_k_dot_x4,
};
pub use softmax::softmax;
pub use ternary::{
    i2s_code_dot, i2s_code_dot_rows4, i2s_code_dot_x4_avx2, i2s_code_dot_x4_avxvnni,
    i2s_code_dot_x4_vnni, ternary_dot, ternary_dot_rows4_avx2, ternary_dot_rows4_avxvnni,
    ternary_dot_rows4_vnni, ternary_dot_x4_avx2, ternary_dot_x4_avxvnni, ternary_dot_x4_vnni,
    tq1_0_as_tq2_0_block,
};

use std::arch::x86_64::*;

/// How far ahead of the weights being multiplied the streaming kernels ask for more: the
/// kernels are nearly as busy computing as the memory is streaming, and the hardware
/// prefetcher alone leaves them waiting. Swept on the 2B4T shape (BENCHMARKS.md): 2–8 KiB
/// ahead is 10–15 % faster than none.
const PREFETCH_AHEAD: usize = 2048;

/// How far ahead [`i2s_code_dot_rows4`] asks for more of its four-row stream: four
/// interleaved streams leave the hardware prefetcher further behind than one. Swept with
/// `benches/cpu_kernels` (BENCHMARKS.md): 2 KiB 25, 6–8 KiB 27–28, 16 KiB 27–29 GB/s.
const ROWS4_PREFETCH_AHEAD: usize = 8192;

/// Asks for the cache line at `p` (a hint: never faults, even past the end of the weights).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn prefetch(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T0>(p.cast());
}

/// Asks for the cache line `PREFETCH_AHEAD` bytes after `p`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn prefetch_ahead(p: *const u8) {
    prefetch(p.wrapping_add(PREFETCH_AHEAD));
}

/// Horizontal sum of eight i32 lanes.
#[target_feature(enable = "avx2")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Horizontal sum of eight f32 lanes.
#[target_feature(enable = "avx2")]
unsafe fn hsum_f32(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The totals of four vectors of eight i32 lanes, as one vector `[Σv0, Σv1, Σv2, Σv3]`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn totals4(v: [__m256i; 4]) -> __m128i {
    // Pairwise sums within each 128-bit half: lanes end as [Σv0, Σv1, Σv2, Σv3] per half.
    let s = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s))
}

/// The totals of four vectors of eight i32 lanes.
#[target_feature(enable = "avx2")]
unsafe fn hsum_i32_x4(v: [__m256i; 4]) -> [i32; 4] {
    let mut out = [0i32; 4];
    // SAFETY: `out` holds exactly 16 bytes; storeu has no alignment needs.
    unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), totals4(v)) };
    out
}
