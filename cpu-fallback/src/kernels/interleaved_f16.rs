//! AVX-512 and AVX2 kernels over F16 weights interleaved sixteen rows deep
//! ([`crate::interleave_f16`]): sixteen rows × `T` tokens per pass, each 32-bit lane a row (one
//! 512-bit register for the sixteen, or two 256-bit ones).
//!
//! Per column, the sixteen rows' halves are converted once and meet each token's (f16-rounded)
//! activation in one FMA. A product of two f16 values is exact in f32, so the fused
//! `acc + w·x` rounds as the scalar kernel's product-then-sum ([`crate::kernels::scalar::f16_dot`]
//! sums in column order from −0): every row equals it bit for bit, whatever the number of
//! tokens beside it.

use std::arch::x86_64::*;

use crate::interleave::ROWS;

/// `out[t][l] = row l · token t` for the sixteen rows of `block` (their interleaved copy) and
/// `T` tokens whose activations, rounded through f16, are packed column by column: `x[k·T + t]`
/// is token `t`'s column `k` (one pointer for every token).
///
/// # Safety
/// The CPU must support AVX-512 F; `block` holds 32 bytes for each of the `x.len() / T`
/// columns.
#[target_feature(enable = "avx512f")]
pub unsafe fn f16_rows16_avx512<const T: usize>(block: &[u8], x: &[f32]) -> [[f32; ROWS]; T] {
    let cols = x.len() / T;
    assert!(block.len() == 2 * ROWS * cols && x.len() == cols * T);
    let mut acc = [_mm512_set1_ps(-0.0); T];
    for k in 0..cols {
        // SAFETY: the assert above bounds the column's 32 bytes and its T activations.
        unsafe {
            let w = _mm512_cvtph_ps(_mm256_loadu_si256(block.as_ptr().add(2 * ROWS * k).cast()));
            let xk = x.as_ptr().add(T * k);
            for (t, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(w, _mm512_set1_ps(*xk.add(t)), *a);
            }
        }
    }
    let mut out = [[0.0f32; ROWS]; T];
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: `o` holds sixteen floats.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), a) };
    }
    out
}

/// [`f16_rows16_avx512`] for one token and four blocks of sixteen rows (decode): one FMA chain
/// per block, so that four run side by side instead of one waiting on its own latency.
///
/// # Safety
/// As for [`f16_rows16_avx512`], for every block.
#[target_feature(enable = "avx512f")]
pub unsafe fn f16_blocks4_avx512(blocks: [&[u8]; 4], x: &[f32]) -> [[f32; ROWS]; 4] {
    let cols = x.len();
    assert!(blocks.iter().all(|b| b.len() == 2 * ROWS * cols));
    let mut acc = [_mm512_set1_ps(-0.0); 4];
    for (k, &v) in x.iter().enumerate() {
        let v = _mm512_set1_ps(v);
        for (a, block) in acc.iter_mut().zip(blocks) {
            // SAFETY: the assert above bounds the column's 32 bytes.
            unsafe {
                let w =
                    _mm512_cvtph_ps(_mm256_loadu_si256(block.as_ptr().add(2 * ROWS * k).cast()));
                *a = _mm512_fmadd_ps(w, v, *a);
            }
        }
    }
    let mut out = [[0.0f32; ROWS]; 4];
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: `o` holds sixteen floats.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), a) };
    }
    out
}

/// Columns per stretch of [`f16_rows16_avx2`]: 2 KiB of the block, which stays in L1 while
/// every group of four tokens passes over it.
const AVX2_STRETCH: usize = 64;

/// [`f16_rows16_avx512`] with AVX2's sixteen registers: the sixteen rows in two eight-lane
/// halves, six tokens at a time where `T` is a multiple of six (twelve accumulators, two weight
/// halves, one broadcast: twelve FMA chains, for cores whose weight conversions share the FMA
/// pipes), else four (eight accumulators). More tokens pass over the block in
/// stretches of [`AVX2_STRETCH`] columns, each group in turn, their accumulators kept between
/// stretches; every row still sums in column order, so the bits are [`f16_rows16_avx512`]'s
/// and the scalar kernel's.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `block` holds 32 bytes for each of the
/// `x.len() / T` columns.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_rows16_avx2<const T: usize>(block: &[u8], x: &[f32]) -> [[f32; ROWS]; T] {
    let cols = x.len() / T;
    assert!(block.len() == 2 * ROWS * cols && x.len() == cols * T);
    let mut acc = [[_mm256_set1_ps(-0.0); 2]; T];
    for k0 in (0..cols).step_by(AVX2_STRETCH) {
        let columns = k0..(k0 + AVX2_STRETCH).min(cols);
        let pass = if T.is_multiple_of(6) { 6 } else { 4 };
        for t0 in (0..T).step_by(pass) {
            let acc = &mut acc[t0..(t0 + pass).min(T)];
            // SAFETY: the assert above bounds every column's 32 bytes and T activations;
            // tokens t0.. are within T.
            unsafe {
                match acc.len() {
                    6 => stretch_avx2::<6, T>(block, x, t0, columns.clone(), acc),
                    4 => stretch_avx2::<4, T>(block, x, t0, columns.clone(), acc),
                    3 => stretch_avx2::<3, T>(block, x, t0, columns.clone(), acc),
                    2 => stretch_avx2::<2, T>(block, x, t0, columns.clone(), acc),
                    _ => stretch_avx2::<1, T>(block, x, t0, columns.clone(), acc),
                }
            }
        }
    }
    super::interleaved_q4_k::rows16_out_avx2(acc)
}

/// Adds `columns` of the block times tokens `t0..t0 + U` (of `T` packed per column) into
/// `acc` (`U` pairs of eight-lane halves), in column order, held in registers meanwhile.
///
/// # Safety
/// As for [`f16_rows16_avx2`]; `columns` within its columns, `t0 + U <= T`, `acc.len() == U`.
#[inline(always)]
unsafe fn stretch_avx2<const U: usize, const T: usize>(
    block: &[u8],
    x: &[f32],
    t0: usize,
    columns: std::ops::Range<usize>,
    acc: &mut [[__m256; 2]],
) {
    let mut a: [[__m256; 2]; U] = std::array::from_fn(|u| acc[u]);
    for k in columns {
        // SAFETY: the caller bounds the column's 32 bytes and tokens t0..t0 + U of it.
        unsafe {
            let w = block.as_ptr().add(2 * ROWS * k);
            let lo = _mm256_cvtph_ps(_mm_loadu_si128(w.cast()));
            let hi = _mm256_cvtph_ps(_mm_loadu_si128(w.add(16).cast()));
            let xk = x.as_ptr().add(T * k + t0);
            for (u, [a_lo, a_hi]) in a.iter_mut().enumerate() {
                let v = _mm256_broadcast_ss(&*xk.add(u));
                *a_lo = _mm256_fmadd_ps(lo, v, *a_lo);
                *a_hi = _mm256_fmadd_ps(hi, v, *a_hi);
            }
        }
    }
    acc.copy_from_slice(&a);
}

/// [`f16_rows16_avx2`] for one token and four blocks of sixteen rows (decode): eight FMA
/// chains (two per block) side by side, the same bits as four calls.
///
/// # Safety
/// As for [`f16_rows16_avx2`], for every block.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_blocks4_avx2(blocks: [&[u8]; 4], x: &[f32]) -> [[f32; ROWS]; 4] {
    let cols = x.len();
    assert!(blocks.iter().all(|b| b.len() == 2 * ROWS * cols));
    let mut acc = [[_mm256_set1_ps(-0.0); 2]; 4];
    for (k, v) in x.iter().enumerate() {
        let v = _mm256_broadcast_ss(v);
        for ([lo, hi], block) in acc.iter_mut().zip(blocks) {
            // SAFETY: the assert above bounds the column's 32 bytes.
            unsafe {
                let w = block.as_ptr().add(2 * ROWS * k);
                *lo = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(w.cast())), v, *lo);
                *hi = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(w.add(16).cast())), v, *hi);
            }
        }
    }
    super::interleaved_q4_k::rows16_out_avx2(acc)
}
