//! Q8_0 and Q6_K rows against their block-quantized activations.

use std::arch::aarch64::*;

use hesper_engine::formats::q6_k::{Q6_K_BLOCK_BYTES, Q6_K_D, Q6_K_QH, Q6_K_SCALES};
use hesper_engine::formats::Q8_0_BLOCK_BYTES;

use super::{load_f16, totals4, Dot};
use crate::quant::{Q8KBlock, Q8_0Block};

/// Q8_0 row · Q8_0 activations: exact integer block sums, f32 accumulation in four
/// four-lane accumulators (summation order differs from the scalar path, as on AVX2).
///
/// # Safety
/// The CPU must run `D`.
#[inline(always)]
pub(super) unsafe fn q8_0_dot<D: Dot>(row: &[u8], act: &[Q8_0Block]) -> f32 {
    assert!(row.len() == act.len() * Q8_0_BLOCK_BYTES);
    // Four accumulators, one per block of a group of four: a single one would chain every
    // block's multiply-add on the previous one's latency.
    let mut acc = [vdupq_n_f32(0.0); 4];
    let groups = row
        .chunks_exact(4 * Q8_0_BLOCK_BYTES)
        .zip(act.chunks_exact(4));
    let done = groups.len() * 4;
    for (blks, acts) in groups {
        for (k, lane) in acc.iter_mut().enumerate() {
            let blk = &blks[k * Q8_0_BLOCK_BYTES..(k + 1) * Q8_0_BLOCK_BYTES];
            // SAFETY: `blk` is a whole block; the caller's contract gives `D`.
            *lane = unsafe { q8_0_block_fma::<D>(blk, &acts[k], *lane) };
        }
    }
    let tail = row[done * Q8_0_BLOCK_BYTES..]
        .chunks_exact(Q8_0_BLOCK_BYTES)
        .zip(&act[done..]);
    for (blk, a) in tail {
        // SAFETY: as above.
        acc[0] = unsafe { q8_0_block_fma::<D>(blk, a, acc[0]) };
    }
    vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ))
}

/// `acc + d_w·d_a · (w · q)` lane-wise for one Q8_0 block pair.
///
/// # Safety
/// `blk` is a whole Q8_0 block; the CPU must run `D`.
#[inline(always)]
unsafe fn q8_0_block_fma<D: Dot>(blk: &[u8], a: &Q8_0Block, acc: float32x4_t) -> float32x4_t {
    debug_assert!(blk.len() == Q8_0_BLOCK_BYTES);
    // SAFETY: a block is 2 scale bytes + 32 weights; `a.qs` holds 32 activations.
    unsafe {
        let w = blk.as_ptr().add(2).cast::<i8>();
        let x = a.qs.as_ptr();
        // Activations never hold −128 (|q| ≤ 127), within `Dot::mac_wide`'s bound.
        let sum = D::mac_wide(vdupq_n_s32(0), vld1q_s8(w), vld1q_s8(x));
        let sum = D::mac_wide(sum, vld1q_s8(w.add(16)), vld1q_s8(x.add(16)));
        let d = load_f16(blk.as_ptr()) * a.d;
        vfmaq_n_f32(acc, vcvtq_f32_s32(sum), d)
    }
}

/// Q6_K row · Q8_K activations; bit-identical to [`crate::kernels::scalar::q6_k_dot`] (the
/// integer block sums are exact and the float accumulation is the same).
///
/// # Safety
/// The CPU must run `D`.
#[inline(always)]
pub(super) unsafe fn q6_k_dot<D: Dot>(row: &[u8], act: &[Q8KBlock]) -> f32 {
    assert!(row.len() == act.len() * Q6_K_BLOCK_BYTES);
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(Q6_K_BLOCK_BYTES).zip(act) {
        // SAFETY: `blk` is a whole block; `a` holds 256 activations and 16 partial sums.
        let sumi = unsafe { q6_k_block_sum::<D>(blk.as_ptr(), a) };
        // SAFETY: the block scale is the two bytes at Q6_K_D.
        let d = unsafe { load_f16(blk.as_ptr().add(Q6_K_D)) };
        acc += sumi as f32 * (d * a.d);
    }
    acc
}

/// The exact Σ_sub-blocks scale · Σ (code − 32)·q of one Q6_K block.
///
/// # Safety
/// A whole block (ql 0..128, qh 128..192, scales 192..208, d 208..210) must be readable at
/// `p`; the CPU must run `D`.
#[inline(always)]
unsafe fn q6_k_block_sum<D: Dot>(p: *const u8, a: &Q8KBlock) -> i32 {
    let low4 = vdupq_n_u8(0x0F);
    let high2 = vdupq_n_u8(0x30);
    let q = a.qs.as_ptr();
    // SAFETY: every load below is inside the block or the 256 activations.
    unsafe {
        let scales8 = vld1q_s8(p.add(Q6_K_SCALES).cast());
        let scales16 = [vmovl_s8(vget_low_s8(scales8)), vmovl_high_s8(scales8)];
        let mut sum = vdupq_n_s32(0);
        for (h, &half_scales) in scales16.iter().enumerate() {
            // Sub-block 8h + 2k + v: quadrant k, bytes 16v..16v + 16 of the half.
            let mut sub = [vdupq_n_s32(0); 8];
            for v in 0..2 {
                let ql0 = vld1q_u8(p.add(64 * h + 16 * v));
                let ql1 = vld1q_u8(p.add(64 * h + 32 + 16 * v));
                let qh = vld1q_u8(p.add(Q6_K_QH + 32 * h + 16 * v));
                // Quadrant k: low nibbles of ql0, ql1, then high nibbles; qh bits 2k, 2k+1
                // moved to bits 4-5.
                let codes = [
                    vorrq_u8(vandq_u8(ql0, low4), vandq_u8(vshlq_n_u8::<4>(qh), high2)),
                    vorrq_u8(vandq_u8(ql1, low4), vandq_u8(vshlq_n_u8::<2>(qh), high2)),
                    vorrq_u8(vshrq_n_u8::<4>(ql0), vandq_u8(qh, high2)),
                    vorrq_u8(vshrq_n_u8::<4>(ql1), vandq_u8(vshrq_n_u8::<2>(qh), high2)),
                ];
                for (k, c) in codes.into_iter().enumerate() {
                    let x = vld1q_s8(q.add(128 * h + 32 * k + 16 * v));
                    // Codes 0..=63 × int8: one call is within `Dot::mac`'s bound.
                    let s = D::mac(D::zero(), vreinterpretq_s8_u8(c), x);
                    sub[2 * k + v] = D::accumulate(vdupq_n_s32(0), s);
                }
            }
            // [Σ sub-block 8h + 4i + j for j < 4], times the scales of those sub-blocks.
            let scales = [
                vmovl_s16(vget_low_s16(half_scales)),
                vmovl_high_s16(half_scales),
            ];
            for (i, sc) in scales.into_iter().enumerate() {
                let s = totals4([sub[4 * i], sub[4 * i + 1], sub[4 * i + 2], sub[4 * i + 3]]);
                sum = vmlaq_s32(sum, s, sc);
            }
        }
        // Σ (code − 32)·q·scale = Σ code·q·scale − 32 · Σ_sub-blocks scale · Σq.
        let bsums = [
            vld1q_s16(a.bsums.as_ptr()),
            vld1q_s16(a.bsums.as_ptr().add(8)),
        ];
        let mut offset = vmull_s16(vget_low_s16(scales16[0]), vget_low_s16(bsums[0]));
        offset = vmlal_high_s16(offset, scales16[0], bsums[0]);
        offset = vmlal_s16(offset, vget_low_s16(scales16[1]), vget_low_s16(bsums[1]));
        offset = vmlal_high_s16(offset, scales16[1], bsums[1]);
        vaddvq_s32(vsubq_s32(sum, vshlq_n_s32::<5>(offset)))
    }
}
