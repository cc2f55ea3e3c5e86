//! AVX-512 VNNI and AVX2 kernels over Q4_0 weights interleaved sixteen rows deep
//! ([`crate::interleave_q4_0`]): sixteen rows × `T` tokens per pass, each 32-bit lane a row.
//!
//! Per block of 32 columns, eight `vpdpbusd` (the unsigned codes, each activation dword
//! broadcast) give the sixteen rows' sums of `code·q`; subtracting `8 · Σq` leaves the exact
//! `Σ (code − 8)·q`. The float step then runs on sixteen rows at once, as the scalar kernel
//! ([`crate::kernels::scalar::q4_0_dot`]) runs it on one: `acc += sumi · (d_w · d_a)`, block
//! after block. Every row's result is the scalar one bit for bit, whatever the number of tokens
//! beside it.

use std::arch::x86_64::*;

use super::interleaved_q8_0::{halves_and_tokens, prefetch_block, rows16_out, Rows16};
use crate::interleave_q4_0::{BLOCK_BYTES, SCALE_BYTES};

/// `out[t][l] = row l · token t` for the sixteen rows of `block` (their interleaved copy) and
/// `T` tokens packed as [`crate::formats::q8_0::Packed`] holds them: `xq[(8b + g)·T + t]` is
/// dword `g` of token `t`'s block `b`, `d[b·T + t]` its scale, `bias[b·T + t]` its `128 · Σq`
/// (of which the codes' offset of 8 takes a sixteenth).
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL and VNNI; `block` holds `d.len() / T` interleaved
/// blocks, `xq` eight dwords and `bias` one sum for each of the `d.len()` scales.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q4_0_rows16_vnni512<const T: usize>(
    block: &[u8],
    xq: &[i32],
    d: &[f32],
    bias: &[i32],
) -> [Rows16; T] {
    let blocks = d.len() / T;
    assert!(block.len() == blocks * BLOCK_BYTES && d.len() == blocks * T);
    assert!(xq.len() == 8 * d.len() && bias.len() == d.len());
    let (xq, d, bias) = (xq.as_ptr(), d.as_ptr(), bias.as_ptr());
    let low4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..blocks {
        // SAFETY: the asserts above bound every read: the block's 288 bytes, its 8·T dwords,
        // T scales and T sums.
        unsafe {
            let base = block.as_ptr().add(b * BLOCK_BYTES);
            if T == 1 {
                prefetch_block(base, BLOCK_BYTES, 8);
            }
            let x = xq.add(8 * T * b);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(base.cast()));
            // Two chains per token (low and high nibbles) so that one token alone does not
            // wait on eight dependent `vpdpbusd`.
            let mut lo = [_mm512_setzero_si512(); T];
            let mut hi = [_mm512_setzero_si512(); T];
            for k in 0..4 {
                let tile = _mm512_loadu_si512(base.add(SCALE_BYTES + 64 * k).cast());
                let (c0, c1) = (
                    _mm512_and_si512(tile, low4),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(tile), low4),
                );
                for t in 0..T {
                    let x0 = _mm512_set1_epi32(*x.add(k * T + t));
                    let x1 = _mm512_set1_epi32(*x.add((4 + k) * T + t));
                    lo[t] = _mm512_dpbusd_epi32(lo[t], c0, x0);
                    hi[t] = _mm512_dpbusd_epi32(hi[t], c1, x1);
                }
            }
            for t in 0..T {
                let sum = _mm512_sub_epi32(
                    _mm512_add_epi32(lo[t], hi[t]),
                    _mm512_set1_epi32(*bias.add(T * b + t) >> 4),
                );
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*d.add(T * b + t)));
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_cvtepi32_ps(sum), scale));
            }
        }
    }
    rows16_out(acc)
}

/// [`q4_0_rows16_vnni512`] on AVX2 (any x86 variant without VNNI): the sixteen rows as two
/// halves of eight, one 256-bit register each; `vpmaddubsw` multiplies the unsigned codes by
/// the signed activations in pairs, a block's pairs summed in 16 bits (at most
/// 8 · 2 · 15 · 127 = 30 480) and widened by `vpmaddwd`. Tokens go four at a time, one half of
/// the rows at a time; one or two tokens take both halves in one pass. The integer sums are
/// exact and the float step is [`q4_0_rows16_vnni512`]'s, lane by lane: the bits are the
/// scalar kernel's.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the shapes are those of [`q4_0_rows16_vnni512`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_0_rows16_avx2<const T: usize>(
    block: &[u8],
    xq: &[i32],
    d: &[f32],
    bias: &[i32],
) -> [Rows16; T] {
    let blocks = d.len() / T;
    assert!(block.len() == blocks * BLOCK_BYTES && d.len() == blocks * T);
    assert!(xq.len() == 8 * d.len() && bias.len() == d.len());
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..blocks {
        // SAFETY: the asserts above bound every read of block `b`: its 288 bytes, its 8·T
        // dwords, T scales and T sums.
        unsafe {
            let base = block.as_ptr().add(b * BLOCK_BYTES);
            if T == 1 {
                for line in (0..BLOCK_BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(8 * BLOCK_BYTES + line).cast());
                }
            }
            let act = (
                xq.as_ptr().add(8 * T * b),
                d.as_ptr().add(T * b),
                bias.as_ptr().add(T * b),
            );
            halves_and_tokens!(q4_0_pass_avx2, base, act, acc);
        }
    }
    super::interleaved_q4_k::rows16_out_avx2(acc)
}

/// The halves `hs` of one interleaved block at `base` times tokens `t0..t0 + U` of `T`, whose
/// block's dwords, scales and sums start at `act`: adds the block's float step into
/// `acc[u][h]`.
///
/// # Safety
/// As for [`q4_0_rows16_avx2`].
#[inline(always)]
unsafe fn q4_0_pass_avx2<const H: usize, const U: usize, const T: usize>(
    base: *const u8,
    hs: [usize; H],
    (x, d, bias): (*const i32, *const f32, *const i32),
    t0: usize,
    acc: &mut [[__m256; 2]],
) {
    let low4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut sum = [[_mm256_setzero_si256(); U]; H];
    // SAFETY: the caller bounds the block's bytes and tokens t0..t0 + U of its activations.
    unsafe {
        for k in 0..4 {
            let x0: [__m256i; U] =
                std::array::from_fn(|u| _mm256_set1_epi32(*x.add(k * T + t0 + u)));
            let x1: [__m256i; U] =
                std::array::from_fn(|u| _mm256_set1_epi32(*x.add((4 + k) * T + t0 + u)));
            for (i, &h) in hs.iter().enumerate() {
                let tile = _mm256_loadu_si256(base.add(SCALE_BYTES + 64 * k + 32 * h).cast());
                let c0 = _mm256_and_si256(tile, low4);
                let c1 = _mm256_and_si256(_mm256_srli_epi16::<4>(tile), low4);
                for u in 0..U {
                    let p = _mm256_add_epi16(
                        _mm256_maddubs_epi16(c0, x0[u]),
                        _mm256_maddubs_epi16(c1, x1[u]),
                    );
                    sum[i][u] = _mm256_add_epi16(sum[i][u], p);
                }
            }
        }
        for (i, &h) in hs.iter().enumerate() {
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(base.add(16 * h).cast()));
            for u in 0..U {
                let t = t0 + u;
                let s = _mm256_sub_epi32(
                    _mm256_madd_epi16(sum[i][u], ones),
                    _mm256_set1_epi32(*bias.add(t) >> 4),
                );
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*d.add(t)));
                acc[u][h] = _mm256_add_ps(acc[u][h], _mm256_mul_ps(_mm256_cvtepi32_ps(s), scale));
            }
        }
    }
}
