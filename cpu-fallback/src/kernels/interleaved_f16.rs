//! AVX-512 kernel over F16 weights interleaved sixteen rows deep ([`crate::interleave_f16`]):
//! sixteen rows × `T` tokens per pass, each 32-bit lane a row.
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
