//! Ternary rows: bitnet.cpp's I2_S against per-row int8 activations, and ggml's TQ2_0 and
//! TQ1_0 against Q8_K blocks. Integer sums are exact and the float steps are the scalar
//! path's, so every result is bit-identical to it.

use std::arch::aarch64::*;

use hesper_engine::formats::{I2S_GROUP, TQ1_0_BLOCK_BYTES, TQ2_0_BLOCK_BYTES};

use super::{f16x4_to_f32, load_f16, totals4, Dot};
use crate::quant::Q8KBlock;

/// I2_S groups summed in a [`Dot::Acc`] before it is widened: a group is eight
/// [`Dot::mac`]s of ternary codes, and the narrowest accumulator holds 32.
const GROUPS_PER_WIDEN: usize = 4;

/// The four 2-bit planes of 16 code bytes, LSB first: plane `s` holds bits `2s..2s + 2`.
#[inline(always)]
unsafe fn crumbs(b: uint8x16_t) -> [int8x16_t; 4] {
    let mask = vdupq_n_u8(3);
    [
        vreinterpretq_s8_u8(vandq_u8(b, mask)),
        vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8::<2>(b), mask)),
        vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8::<4>(b), mask)),
        vreinterpretq_s8_u8(vshrq_n_u8::<6>(b)),
    ]
}

/// `acc[h]` plus Σ code·q over half `h` of one I2_S group: the 32 code bytes at `codes`
/// (MSB-first: bits 7-6 pair with `q[0..32]`, bits 1-0 with `q[96..128]`) and the 128
/// activations at `q`. Two accumulators, so two chains of multiply-accumulates interleave.
///
/// # Safety
/// 32 bytes must be readable at `codes` and 128 at `q`; the CPU must run `D`.
#[inline(always)]
unsafe fn i2s_group<D: Dot>(mut acc: [D::Acc; 2], codes: *const u8, q: *const i8) -> [D::Acc; 2] {
    // SAFETY: half h reads codes[16h..16h + 16] and q[32s + 16h..][..16] for s < 4.
    unsafe {
        for (h, a) in acc.iter_mut().enumerate() {
            let planes = crumbs(vld1q_u8(codes.add(16 * h)));
            for (slice, plane) in planes.iter().rev().enumerate() {
                *a = D::mac(*a, *plane, vld1q_s8(q.add(32 * slice + 16 * h)));
            }
        }
    }
    acc
}

/// Σ code·q over one I2_S row (see [`crate::kernels::scalar::i2s_code_dot`]).
///
/// # Safety
/// The CPU must run `D`.
#[inline(always)]
pub(super) unsafe fn i2s_code_dot<D: Dot>(row: &[u8], q: &[i8]) -> i32 {
    assert!(row.len() * 4 == q.len() && q.len().is_multiple_of(I2S_GROUP));
    let groups = q.len() / I2S_GROUP;
    let mut acc32 = vdupq_n_s32(0);
    for g0 in (0..groups).step_by(GROUPS_PER_WIDEN) {
        let mut acc = [D::zero(); 2];
        for g in g0..(g0 + GROUPS_PER_WIDEN).min(groups) {
            // SAFETY: group g is bytes [32g, 32g + 32) of row and [128g, 128g + 128) of q.
            acc = unsafe {
                i2s_group::<D>(acc, row.as_ptr().add(32 * g), q.as_ptr().add(I2S_GROUP * g))
            };
        }
        acc32 = D::accumulate(D::accumulate(acc32, acc[0]), acc[1]);
    }
    vaddvq_s32(acc32)
}

/// [`i2s_code_dot`] of four consecutive rows (`rows` holds all four) against one token
/// (decode): eight interleaved chains, one horizontal reduction for the four rows.
///
/// # Safety
/// The CPU must run `D`.
#[inline(always)]
pub(super) unsafe fn i2s_code_dot_rows4<D: Dot>(rows: &[u8], q: &[i8]) -> [i32; 4] {
    assert!(rows.len() == q.len() && q.len().is_multiple_of(I2S_GROUP));
    let row_bytes = rows.len() / 4;
    let groups = q.len() / I2S_GROUP;
    let mut acc32 = [vdupq_n_s32(0); 4];
    for g0 in (0..groups).step_by(GROUPS_PER_WIDEN) {
        let mut acc = [[D::zero(); 2]; 4];
        for g in g0..(g0 + GROUPS_PER_WIDEN).min(groups) {
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: group g of row k is bytes [k·row_bytes + 32g, +32) of rows, and
                // [128g, 128g + 128) of q.
                *a = unsafe {
                    i2s_group::<D>(
                        *a,
                        rows.as_ptr().add(k * row_bytes + 32 * g),
                        q.as_ptr().add(I2S_GROUP * g),
                    )
                };
            }
        }
        for (a32, a) in acc32.iter_mut().zip(acc) {
            *a32 = D::accumulate(D::accumulate(*a32, a[0]), a[1]);
        }
    }
    lanes_i32(totals4(acc32))
}

/// Σ code·q of one I2_S row against four token rows (prefill): each group's codes are
/// unpacked once and used for all four tokens.
///
/// # Safety
/// The CPU must run `D`.
#[inline(always)]
pub(super) unsafe fn i2s_code_dot_x4<D: Dot>(row: &[u8], q: [&[i8]; 4]) -> [i32; 4] {
    assert!(q
        .iter()
        .all(|q| q.len() == row.len() * 4 && q.len().is_multiple_of(I2S_GROUP)));
    let groups = row.len() / 32;
    let mut acc32 = [vdupq_n_s32(0); 4];
    for g0 in (0..groups).step_by(GROUPS_PER_WIDEN) {
        let mut acc = [[D::zero(); 2]; 4];
        for g in g0..(g0 + GROUPS_PER_WIDEN).min(groups) {
            // SAFETY: group g is bytes [32g, 32g + 32) of row and [128g, 128g + 128) of
            // every q.
            unsafe {
                for h in 0..2 {
                    let planes = crumbs(vld1q_u8(row.as_ptr().add(32 * g + 16 * h)));
                    for (a, qt) in acc.iter_mut().zip(q) {
                        let base = qt.as_ptr().add(I2S_GROUP * g + 16 * h);
                        for (slice, plane) in planes.iter().rev().enumerate() {
                            a[h] = D::mac(a[h], *plane, vld1q_s8(base.add(32 * slice)));
                        }
                    }
                }
            }
        }
        for (a32, a) in acc32.iter_mut().zip(acc) {
            *a32 = D::accumulate(D::accumulate(*a32, a[0]), a[1]);
        }
    }
    lanes_i32(totals4(acc32))
}

/// The four lanes of `v`.
#[inline(always)]
unsafe fn lanes_i32(v: int32x4_t) -> [i32; 4] {
    let mut out = [0i32; 4];
    // SAFETY: `out` holds exactly four i32.
    unsafe { vst1q_s32(out.as_mut_ptr(), v) };
    out
}

/// The four lanes of `v`.
#[inline(always)]
unsafe fn lanes_f32(v: float32x4_t) -> [f32; 4] {
    let mut out = [0.0f32; 4];
    // SAFETY: `out` holds exactly four f32.
    unsafe { vst1q_f32(out.as_mut_ptr(), v) };
    out
}

/// The 256 codes (0..=2, weight + 1) of one ggml ternary block as sixteen 16-byte vectors,
/// vector `i` pairing with activations `16i..16i + 16`; `BYTES` names the layout.
///
/// # Safety
/// A whole block must be readable at `blk`; the CPU must run `D`.
#[inline(always)]
unsafe fn block_codes<D: Dot, const BYTES: usize>(blk: *const u8) -> [int8x16_t; 16] {
    // SAFETY: the caller guarantees a whole block.
    unsafe {
        if BYTES == TQ1_0_BLOCK_BYTES {
            tq1_0_codes::<D>(blk)
        } else {
            tq2_0_codes::<D>(blk)
        }
    }
}

/// TQ2_0: two 32-byte halves of LSB-first 2-bit codes; byte `m` of half `h`, bits
/// `2s..2s + 2` pair with activation `128h + 32s + m`.
///
/// # Safety
/// 64 bytes must be readable at `blk`.
#[inline(always)]
unsafe fn tq2_0_codes<D: Dot>(blk: *const u8) -> [int8x16_t; 16] {
    let mut out = [vdupq_n_s8(0); 16];
    for v in 0..4 {
        // Vector v is bytes 16v.. of the block: half v / 2, activations 16·(v % 2) on.
        // SAFETY: v < 4, inside the 64 code bytes.
        let planes = crumbs(unsafe { vld1q_u8(blk.add(16 * v)) });
        for (s, plane) in planes.into_iter().enumerate() {
            out[8 * (v / 2) + 2 * s + v % 2] = D::opaque(plane);
        }
    }
    out
}

/// The ternary digit ggml reads from every byte `q`, `(3·q) >> 8`, and the byte that holds
/// the next digit, `3·q` (mod 256): the high and low halves of one widening multiply.
#[inline(always)]
unsafe fn trit_and_next(q: uint8x16_t) -> (int8x16_t, uint8x16_t) {
    let lo = vreinterpretq_u8_u16(vmull_u8(vget_low_u8(q), vdup_n_u8(3)));
    let hi = vreinterpretq_u8_u16(vmull_high_u8(q, vdupq_n_u8(3)));
    (vreinterpretq_s8_u8(vuzp2q_u8(lo, hi)), vuzp1q_u8(lo, hi))
}

/// `3ⁿ` (mod 256) for the bytes of lane `n` of `qh` repeated in four u32 lanes.
const QH_POWERS: [u8; 16] = [1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27];

/// TQ1_0: byte `m` of `qs[0..32]` times 3ⁿ holds element `32n + m`, byte `m` of `qs[32..48]`
/// times 3ⁿ element `160 + 16n + m`, byte `j` of `qh` times 3ⁿ element `240 + 4n + j`.
///
/// # Safety
/// 52 bytes (qs, qh) must be readable at `blk`.
#[inline(always)]
unsafe fn tq1_0_codes<D: Dot>(blk: *const u8) -> [int8x16_t; 16] {
    let mut out = [vdupq_n_s8(0); 16];
    // SAFETY: qs is bytes 0..48 and qh 48..52 of the block.
    unsafe {
        // qs[0..16] and qs[16..32]: five digits each, elements 32n.. and 32n + 16..
        for half in 0..2 {
            let mut q = vld1q_u8(blk.add(16 * half));
            for n in 0..5 {
                let (trit, next) = trit_and_next(q);
                out[2 * n + half] = D::opaque(trit);
                q = next;
            }
        }
        // qs[32..48]: five digits, elements 160 + 16n..
        let mut q = vld1q_u8(blk.add(32));
        for slot in out.iter_mut().skip(10).take(5) {
            let (trit, next) = trit_and_next(q);
            *slot = D::opaque(trit);
            q = next;
        }
        // qh: four digits of four bytes, elements 240 + 4n + j, all in one vector.
        let qh = vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes(
            blk.add(48).cast::<[u8; 4]>().read(),
        )));
        let powers = vld1q_u8(QH_POWERS.as_ptr());
        out[15] = D::opaque(trit_and_next(vmulq_u8(qh, powers)).0);
    }
    out
}

/// Σ code·q of one block's codes against the 256 activations at `q`, in four chains.
///
/// # Safety
/// 256 activations must be readable at `q`; the CPU must run `D`.
#[inline(always)]
unsafe fn codes_dot<D: Dot>(codes: &[int8x16_t; 16], q: *const i8) -> D::Acc {
    let mut acc = [D::zero(); 4];
    for (i, c) in codes.iter().enumerate() {
        // SAFETY: i < 16, so the load stays inside the 256 activations. Sixteen products of
        // codes 0..=2 per block are within `Dot::mac`'s bound.
        acc[i % 4] = D::mac(acc[i % 4], *c, unsafe { vld1q_s8(q.add(16 * i)) });
    }
    D::add(D::add(acc[0], acc[1]), D::add(acc[2], acc[3]))
}

/// TQ2_0 or TQ1_0 row (`BYTES` is the block size) · Q8_K activations: per block the exact
/// Σ(code − 1)·q, then the scalar path's `acc += sumi · (d_act · d_weight)`, so the result is
/// bit-identical to it.
///
/// # Safety
/// The CPU must run `D`; `BYTES` is `TQ2_0_BLOCK_BYTES` or `TQ1_0_BLOCK_BYTES`.
#[inline(always)]
pub(super) unsafe fn ternary_dot<D: Dot, const BYTES: usize>(row: &[u8], act: &[Q8KBlock]) -> f32 {
    const { assert!(BYTES == TQ1_0_BLOCK_BYTES || BYTES == TQ2_0_BLOCK_BYTES) };
    assert!(row.len() == act.len() * BYTES);
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(BYTES).zip(act) {
        // SAFETY: `blk` is a whole block; `a.qs` holds 256 activations.
        unsafe {
            let codes_q = D::total(codes_dot::<D>(
                &block_codes::<D, BYTES>(blk.as_ptr()),
                a.qs.as_ptr(),
            ));
            let d = a.d * load_f16(blk.as_ptr().add(BYTES - 2));
            acc += (codes_q - a.sum) as f32 * d;
        }
    }
    acc
}

/// Four rows' (or tokens') `acc += (sums − offsets) · d`, one per lane: the scalar path's
/// float steps (no fused multiply-add), so each lane is bit-identical to it.
#[inline(always)]
unsafe fn ternary_step4(
    acc: float32x4_t,
    sums: int32x4_t,
    offsets: int32x4_t,
    d: float32x4_t,
) -> float32x4_t {
    vaddq_f32(acc, vmulq_f32(vcvtq_f32_s32(vsubq_s32(sums, offsets)), d))
}

/// [`ternary_dot`] of four consecutive rows (`rows` holds all four) against one token
/// (decode): one horizontal reduction and one float step for the four rows.
///
/// # Safety
/// As for [`ternary_dot`].
#[inline(always)]
pub(super) unsafe fn ternary_dot_rows4<D: Dot, const BYTES: usize>(
    rows: &[u8],
    act: &[Q8KBlock],
) -> [f32; 4] {
    const { assert!(BYTES == TQ1_0_BLOCK_BYTES || BYTES == TQ2_0_BLOCK_BYTES) };
    assert!(rows.len() == 4 * act.len() * BYTES);
    let row_bytes = rows.len() / 4;
    let p = rows.as_ptr();
    let mut acc = vdupq_n_f32(0.0);
    for (b, a) in act.iter().enumerate() {
        // SAFETY: block b of row k is the BYTES bytes at k·row_bytes + b·BYTES; `a.qs` holds
        // 256 activations.
        unsafe {
            let mut sums = [vdupq_n_s32(0); 4];
            let mut scales = [0u16; 4];
            for k in 0..4 {
                let blk = p.add(k * row_bytes + b * BYTES);
                let codes = block_codes::<D, BYTES>(blk);
                sums[k] = D::accumulate(sums[k], codes_dot::<D>(&codes, a.qs.as_ptr()));
                scales[k] = u16::from_le_bytes(blk.add(BYTES - 2).cast::<[u8; 2]>().read());
            }
            let d = vmulq_f32(vdupq_n_f32(a.d), f16x4_to_f32(vld1_u16(scales.as_ptr())));
            acc = ternary_step4(acc, totals4(sums), vdupq_n_s32(a.sum), d);
        }
    }
    lanes_f32(acc)
}

/// [`ternary_dot`] of one row against four token rows (prefill): each block's codes are
/// unpacked once for all four tokens.
///
/// # Safety
/// As for [`ternary_dot`].
#[inline(always)]
pub(super) unsafe fn ternary_dot_x4<D: Dot, const BYTES: usize>(
    row: &[u8],
    act: [&[Q8KBlock]; 4],
) -> [f32; 4] {
    const { assert!(BYTES == TQ1_0_BLOCK_BYTES || BYTES == TQ2_0_BLOCK_BYTES) };
    assert!(act.iter().all(|a| row.len() == a.len() * BYTES));
    let mut acc = vdupq_n_f32(0.0);
    for (b, blk) in row.chunks_exact(BYTES).enumerate() {
        let a: [&Q8KBlock; 4] = std::array::from_fn(|t| &act[t][b]);
        // SAFETY: `blk` is a whole block; every `a[t].qs` holds 256 activations.
        unsafe {
            let codes = block_codes::<D, BYTES>(blk.as_ptr());
            let mut sums = [vdupq_n_s32(0); 4];
            for (sum, a) in sums.iter_mut().zip(a) {
                *sum = D::accumulate(*sum, codes_dot::<D>(&codes, a.qs.as_ptr()));
            }
            let offsets = vld1q_s32([a[0].sum, a[1].sum, a[2].sum, a[3].sum].as_ptr());
            let d = vmulq_f32(
                vld1q_f32([a[0].d, a[1].d, a[2].d, a[3].d].as_ptr()),
                vdupq_n_f32(load_f16(blk.as_ptr().add(BYTES - 2))),
            );
            acc = ternary_step4(acc, totals4(sums), offsets, d);
        }
    }
    lanes_f32(acc)
}
