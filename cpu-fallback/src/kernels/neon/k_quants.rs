//! Q4_0, Q4_K and Q5_K rows against their block-quantized activations: the exact integer sums
//! of each block in vector lanes, then the scalar path's float accumulation, so every result
//! equals [`crate::kernels::scalar`]'s bit for bit.

use std::arch::aarch64::*;

use hesper_engine::formats::q4_k::{k_d_dmin, k_scales_mins, Q4_K_BLOCK_BYTES, Q4_K_QS};
use hesper_engine::formats::q5_k::{Q5_K_BLOCK_BYTES, Q5_K_QH, Q5_K_QS};
use hesper_engine::formats::{mxfp4_scale, MXFP4_BLOCK_BYTES, MXFP4_VALUES, Q4_0_BLOCK_BYTES};

use super::{load_f16, totals4, Dot};
use crate::kernels::scalar::k_mins_sum;
use crate::quant::{Q8KBlock, Q8_0Block};

/// Q4_0 row · Q8_0 activations, bit-identical to [`crate::kernels::scalar::q4_0_dot`].
///
/// # Safety
/// The CPU must run `D`.
#[inline(always)]
pub(super) unsafe fn q4_0_dot<D: Dot>(row: &[u8], act: &[Q8_0Block]) -> f32 {
    assert!(row.len() == act.len() * Q4_0_BLOCK_BYTES);
    let low4 = vdupq_n_u8(0x0F);
    let eight = vdupq_n_s8(8);
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(Q4_0_BLOCK_BYTES).zip(act) {
        // SAFETY: a block is 2 scale bytes + 16 nibble bytes; `a.qs` holds 32 activations.
        unsafe {
            let b = vld1q_u8(blk.as_ptr().add(2));
            let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, low4)), eight);
            let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(b)), eight);
            let x = a.qs.as_ptr();
            // |code − 8| ≤ 8: within `Dot::mac_wide`'s bound.
            let sum = D::mac_wide(vdupq_n_s32(0), lo, vld1q_s8(x));
            let sum = D::mac_wide(sum, hi, vld1q_s8(x.add(16)));
            acc += vaddvq_s32(sum) as f32 * (load_f16(blk.as_ptr()) * a.d);
        }
    }
    acc
}

/// MXFP4 row · Q8_0 activations, bit-identical to [`crate::kernels::scalar::mxfp4_dot`].
///
/// # Safety
/// The CPU must run `D`.
#[inline(always)]
pub(super) unsafe fn mxfp4_dot<D: Dot>(row: &[u8], act: &[Q8_0Block]) -> f32 {
    assert!(row.len() == act.len() * MXFP4_BLOCK_BYTES);
    let low4 = vdupq_n_u8(0x0F);
    // SAFETY: the table is 16 bytes.
    let table = unsafe { vld1q_s8(MXFP4_VALUES.as_ptr()) };
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(MXFP4_BLOCK_BYTES).zip(act) {
        // SAFETY: a block is 1 exponent byte + 16 nibble bytes; `a.qs` holds 32 activations.
        unsafe {
            let b = vld1q_u8(blk.as_ptr().add(1));
            let lo = vqtbl1q_s8(table, vandq_u8(b, low4));
            let hi = vqtbl1q_s8(table, vshrq_n_u8::<4>(b));
            let x = a.qs.as_ptr();
            // |value| ≤ 12: within `Dot::mac_wide`'s bound.
            let sum = D::mac_wide(vdupq_n_s32(0), lo, vld1q_s8(x));
            let sum = D::mac_wide(sum, hi, vld1q_s8(x.add(16)));
            acc += vaddvq_s32(sum) as f32 * (mxfp4_scale(blk[0]) * a.d);
        }
    }
    acc
}

/// Q4_K row · Q8_K activations, bit-identical to [`crate::kernels::scalar::q4_k_dot`].
///
/// # Safety
/// The CPU must run `D`.
#[inline(always)]
pub(super) unsafe fn q4_k_dot<D: Dot>(row: &[u8], act: &[Q8KBlock]) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { k_dot::<D, false>(row, act, Q4_K_BLOCK_BYTES, Q4_K_QS) }
}

/// Q5_K row · Q8_K activations, bit-identical to [`crate::kernels::scalar::q5_k_dot`].
///
/// # Safety
/// The CPU must run `D`.
#[inline(always)]
pub(super) unsafe fn q5_k_dot<D: Dot>(row: &[u8], act: &[Q8KBlock]) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { k_dot::<D, true>(row, act, Q5_K_BLOCK_BYTES, Q5_K_QS) }
}

/// The body of the Q4_K (`FIVE` false) and Q5_K dots: blocks of `block_bytes` whose nibbles
/// start at `qs` (and, for Q5_K, whose fifth bits are at `Q5_K_QH`).
///
/// # Safety
/// The CPU must run `D`.
#[inline(always)]
unsafe fn k_dot<D: Dot, const FIVE: bool>(
    row: &[u8],
    act: &[Q8KBlock],
    block_bytes: usize,
    qs: usize,
) -> f32 {
    assert!(row.len() == act.len() * block_bytes);
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(block_bytes).zip(act) {
        let p = blk.as_ptr();
        let (scales, mins) = k_scales_mins(blk);
        // SAFETY: a whole block and its 256 activations.
        let sumi = unsafe { k_block_sum::<D, FIVE>(p.add(qs), p.add(Q5_K_QH), &scales, a) };
        let summ = k_mins_sum(&mins, a);
        let (d, dmin) = k_d_dmin(blk);
        acc += (d * a.d) * sumi as f32 - (dmin * a.d) * summ as f32;
    }
    acc
}

/// The exact `Σ_s scale_s · Σ code·q` of one Q4_K or Q5_K block.
///
/// # Safety
/// 128 nibble bytes must be readable at `qs` and, with `FIVE`, 32 bytes of fifth bits at `qh`;
/// the CPU must run `D`.
#[inline(always)]
unsafe fn k_block_sum<D: Dot, const FIVE: bool>(
    qs: *const u8,
    qh: *const u8,
    scales: &[u8; 8],
    a: &Q8KBlock,
) -> i32 {
    let low4 = vdupq_n_u8(0x0F);
    let one = vdupq_n_u8(1);
    let q = a.qs.as_ptr();
    // SAFETY: the caller's contract; the activations hold 256 values.
    unsafe {
        let mut high = [vdupq_n_u8(0); 2];
        if FIVE {
            high = [vld1q_u8(qh), vld1q_u8(qh.add(16))];
        }
        let mut sub = [vdupq_n_s32(0); 8];
        for j in 0..4 {
            for (v, h) in high.iter_mut().enumerate() {
                let b = vld1q_u8(qs.add(32 * j + 16 * v));
                let mut lo = vandq_u8(b, low4);
                let mut hi = vshrq_n_u8::<4>(b);
                if FIVE {
                    // Bits 2j and 2j + 1 of each qh byte (shifted down to bits 0 and 1) → bit 4.
                    lo = vorrq_u8(lo, vshlq_n_u8::<4>(vandq_u8(*h, one)));
                    hi = vorrq_u8(hi, vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<1>(*h), one)));
                    *h = vshrq_n_u8::<2>(*h);
                }
                // Codes 0..=31 × int8: one call is within `Dot::mac`'s bound.
                let x0 = vld1q_s8(q.add(64 * j + 16 * v));
                let x1 = vld1q_s8(q.add(64 * j + 32 + 16 * v));
                let s0 = D::mac(D::zero(), vreinterpretq_s8_u8(lo), x0);
                let s1 = D::mac(D::zero(), vreinterpretq_s8_u8(hi), x1);
                sub[2 * j] = D::accumulate(sub[2 * j], s0);
                sub[2 * j + 1] = D::accumulate(sub[2 * j + 1], s1);
            }
        }
        let sc: [i32; 8] = scales.map(i32::from);
        let s = vmulq_s32(
            totals4([sub[0], sub[1], sub[2], sub[3]]),
            vld1q_s32(sc.as_ptr()),
        );
        let s = vmlaq_s32(
            s,
            totals4([sub[4], sub[5], sub[6], sub[7]]),
            vld1q_s32(sc.as_ptr().add(4)),
        );
        vaddvq_s32(s)
    }
}
