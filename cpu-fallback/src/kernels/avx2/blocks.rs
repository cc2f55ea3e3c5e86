//! Q8_0 and Q6_K rows against their block-quantized activations.

use std::arch::x86_64::*;

use hesper_engine::formats::q6_k::{Q6_K_BLOCK_BYTES, Q6_K_D, Q6_K_QH, Q6_K_SCALES};
use hesper_engine::formats::Q8_0_BLOCK_BYTES;

use super::{hsum_f32, hsum_i32, prefetch_ahead};
use crate::quant::{Q8KBlock, Q8_0Block};

/// AVX2 version of [`crate::kernels::scalar::q8_0_dot`]: exact integer block sums, f32 accumulation
/// in eight lanes (summation order differs from the scalar path).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `row` holds `act.len()` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0_dot(row: &[u8], act: &[Q8_0Block]) -> f32 {
    debug_assert!(row.len() == act.len() * Q8_0_BLOCK_BYTES);
    // Four accumulators, one per block of a group of four: a single one would chain every
    // block's FMA on the previous one's latency (the head's 80 blocks a row, 128 256 rows).
    let mut acc = [_mm256_setzero_ps(); 4];
    let groups = row
        .chunks_exact(4 * Q8_0_BLOCK_BYTES)
        .zip(act.chunks_exact(4));
    let done = groups.len() * 4;
    for (blks, acts) in groups {
        // SAFETY: a prefetch hint never faults.
        unsafe {
            prefetch_ahead(blks.as_ptr());
            prefetch_ahead(blks.as_ptr().wrapping_add(64));
            prefetch_ahead(blks.as_ptr().wrapping_add(128));
        }
        for (k, lane) in acc.iter_mut().enumerate() {
            let blk = &blks[k * Q8_0_BLOCK_BYTES..(k + 1) * Q8_0_BLOCK_BYTES];
            // SAFETY: the CPU has AVX2/FMA/F16C (this function's contract).
            *lane = unsafe { q8_0_block_fma(blk, &acts[k], *lane) };
        }
    }
    let tail = row[done * Q8_0_BLOCK_BYTES..]
        .chunks_exact(Q8_0_BLOCK_BYTES)
        .zip(&act[done..]);
    for (blk, a) in tail {
        // SAFETY: as above.
        acc[0] = unsafe { q8_0_block_fma(blk, a, acc[0]) };
    }
    hsum_f32(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ))
}

/// `acc + d_w·d_a · (w · q)` lane-wise for one Q8_0 block pair.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_block_fma(blk: &[u8], a: &Q8_0Block, acc: __m256) -> __m256 {
    let ones = _mm256_set1_epi16(1);
    // SAFETY: a block is 2 scale bytes + 32 weights; `a.qs` holds 32 activations.
    unsafe {
        let w = _mm256_loadu_si256(blk.as_ptr().add(2).cast());
        let x = _mm256_loadu_si256(a.qs.as_ptr().cast());
        // |w| · (x · sign w): maddubs needs one unsigned operand. Activations never hold
        // −128 (|q| ≤ 127), so a pair sum stays below i16::MAX.
        let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        let p32 = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
            u16::from_le_bytes([blk[0], blk[1]]),
        ))));
        _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d), p32, acc)
    }
}

/// Byte-shuffle controls that spread the int8 scales of quadrant `4h + k` of a Q6_K block
/// (sub-blocks `8h + 2k` and `8h + 2k + 1`) over eight lanes each.
const Q6_K_SCALE_SPREAD: [[i8; 16]; 8] = {
    let mut ctrl = [[0i8; 16]; 8];
    let mut quadrant = 0;
    while quadrant < 8 {
        let mut i = 0;
        while i < 16 {
            ctrl[quadrant][i] = (2 * quadrant + i / 8) as i8;
            i += 1;
        }
        quadrant += 1;
    }
    ctrl
};

/// AVX2 version of [`crate::kernels::scalar::q6_k_dot`]; bit-identical result (the integer block sums
/// are exact and the float accumulation is the same).
///
/// # Safety
/// The CPU must support AVX2 and F16C; `row` holds `act.len()` Q6_K blocks.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn q6_k_dot(row: &[u8], act: &[Q8KBlock]) -> f32 {
    // SAFETY: this function's contract.
    unsafe { q6_k_dot_tokens::<1>(row, [act])[0] }
}

/// [`q6_k_dot`] of one row against four tokens (prefill), each block unpacked once; each
/// result bit-identical to [`q6_k_dot`]'s.
///
/// # Safety
/// The CPU must support AVX2 and F16C; `row` holds as many Q6_K blocks as each token.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn q6_k_dot_x4(row: &[u8], act: [&[Q8KBlock]; 4]) -> [f32; 4] {
    // SAFETY: this function's contract.
    unsafe { q6_k_dot_tokens::<4>(row, act) }
}

/// One Q6_K row against `T` tokens: each block's codes and scales unpacked once.
///
/// # Safety
/// The CPU must support AVX2 and F16C; `row` holds as many Q6_K blocks as each token.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn q6_k_dot_tokens<const T: usize>(row: &[u8], act: [&[Q8KBlock]; T]) -> [f32; T] {
    assert!(act.iter().all(|a| row.len() == a.len() * Q6_K_BLOCK_BYTES));
    let low4 = _mm256_set1_epi8(0x0F);
    let high2 = _mm256_set1_epi8(0x30);
    let mut acc = [0.0f32; T];
    for (b, blk) in row.chunks_exact(Q6_K_BLOCK_BYTES).enumerate() {
        // SAFETY: a block is 210 bytes (ql 0..128, qh 128..192, scales 192..208, d 208..210)
        // and each token's block holds 256 activations and 16 partial sums.
        unsafe {
            let p = blk.as_ptr();
            for line in (0..Q6_K_BLOCK_BYTES).step_by(64) {
                prefetch_ahead(p.wrapping_add(line));
            }
            let scales = _mm_loadu_si128(p.add(Q6_K_SCALES).cast());
            // Quadrant 4h + k: its 32 codes and its two sub-blocks' scales over the lanes.
            let mut codes = [_mm256_setzero_si256(); 8];
            let mut spread = [_mm256_setzero_si256(); 8];
            for h in 0..2 {
                let ql0 = _mm256_loadu_si256(p.add(64 * h).cast());
                let ql1 = _mm256_loadu_si256(p.add(64 * h + 32).cast());
                let qh = _mm256_loadu_si256(p.add(Q6_K_QH + 32 * h).cast());
                // Quadrant k: low nibbles of ql0, ql1, then high nibbles; qh bits 2k, 2k+1
                // moved to bits 4-5.
                codes[4 * h] = _mm256_or_si256(
                    _mm256_and_si256(ql0, low4),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(qh), high2),
                );
                codes[4 * h + 1] = _mm256_or_si256(
                    _mm256_and_si256(ql1, low4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(qh), high2),
                );
                codes[4 * h + 2] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4),
                    _mm256_and_si256(qh, high2),
                );
                codes[4 * h + 3] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), high2),
                );
            }
            for (quadrant, sc) in spread.iter_mut().enumerate() {
                let ctrl = _mm_loadu_si128(Q6_K_SCALE_SPREAD[quadrant].as_ptr().cast());
                *sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, ctrl));
            }
            let scales16 = _mm256_cvtepi8_epi16(scales);
            let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
                u16::from_le_bytes([blk[Q6_K_D], blk[Q6_K_D + 1]]),
            ))));
            for (acc, a) in acc.iter_mut().zip(act.map(|a| &a[b])) {
                let q = a.qs.as_ptr();
                let mut sum = _mm256_setzero_si256();
                for (quadrant, (&c, &sc)) in codes.iter().zip(&spread).enumerate() {
                    let x = _mm256_loadu_si256(q.add(32 * quadrant).cast());
                    // codes 0..63 × |q| ≤ 127: pair sums ≤ 16 002, inside i16.
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(c, x), sc));
                }
                // Σ (code − 32)·q·scale = Σ code·q·scale − 32 · Σ_sub-blocks scale · Σq.
                let bsums = _mm256_loadu_si256(a.bsums.as_ptr().cast());
                let offset = _mm256_madd_epi16(scales16, bsums);
                let sumi = hsum_i32(_mm256_sub_epi32(sum, _mm256_slli_epi32::<5>(offset)));
                *acc += sumi as f32 * (d * a.d);
            }
        }
    }
    acc
}
