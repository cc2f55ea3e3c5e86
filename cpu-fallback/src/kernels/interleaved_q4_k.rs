//! AVX-512 VNNI kernel over Q4_K and Q5_K weights interleaved sixteen rows deep
//! ([`crate::interleave_q4_k`]): sixteen rows × `T` tokens per pass, each 32-bit lane a row.
//!
//! Per sub-block of 32 columns, eight `vpdpbusd` (the codes unsigned, each activation dword
//! broadcast) give the sixteen rows' exact `Σ code·q`, times the rows' scales; the minimums
//! times the activations' sub-block sums give `Σ min·Σq`. The float step then runs on sixteen
//! rows at once, as the scalar kernels ([`crate::kernels::scalar::q4_k_dot`], `q5_k_dot`) run
//! it on one:
//! `acc += (d·d_act)·sumi − (dmin·d_act)·summ`, block after block. Every row's result is the
//! scalar one bit for bit, whatever the number of tokens beside it.

use std::arch::x86_64::*;

use super::interleaved_q8_0::{prefetch_block, rows16_out, Rows16};
use crate::interleave::ROWS;
use crate::interleave_q4_k::{block_bytes, DMIN, HIGH, MINS, SCALES, TILES};

/// `out[t][l] = row l · token t` for the sixteen rows of `block` (their interleaved copy, of
/// Q5_K with `FIVE`) and
/// `T` tokens packed as [`crate::formats::q4_k::Packed`] holds them: `xq[(64b + g)·T + t]` is
/// activation dword `g` of token `t`'s block `b`, `bsum[(16b + i)·T + t]` its `Σq` of values
/// `16i..16i + 16`, `d[b·T + t]` its scale.
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL and VNNI; `block` holds `d.len() / T` interleaved
/// blocks, `xq` 64 dwords and `bsum` sixteen sums for each of the `d.len()` scales.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub unsafe fn k_rows16_vnni512<const FIVE: bool, const T: usize>(
    block: &[u8],
    xq: &[i32],
    bsum: &[i32],
    d: &[f32],
) -> [Rows16; T] {
    let block_size = block_bytes(FIVE);
    let blocks = d.len() / T;
    assert!(block.len() == blocks * block_size && d.len() == blocks * T);
    assert!(xq.len() == 64 * d.len() && bsum.len() == 16 * d.len());
    let (xq, bsum, d) = (xq.as_ptr(), bsum.as_ptr(), d.as_ptr());
    let low4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..blocks {
        // SAFETY: the asserts above bound every read: the block's bytes, its 64·T dwords,
        // 16·T sums and T scales.
        unsafe {
            let base = block.as_ptr().add(b * block_size);
            if T == 1 {
                prefetch_block(base, block_size, 2);
            }
            let x = xq.add(64 * T * b);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(base.cast()));
            let dmw = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(DMIN).cast()));
            let mut isum = [_mm512_setzero_si512(); T];
            let mut msum = [_mm512_setzero_si512(); T];
            for s in 0..8 {
                let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(base.add(SCALES + ROWS * s).cast()));
                let mn = _mm512_cvtepu8_epi32(_mm_loadu_si128(base.add(MINS + ROWS * s).cast()));
                // Two chains per token (low and high nibbles) so that one token alone does not
                // wait on eight dependent `vpdpbusd`.
                let mut lo = [_mm512_setzero_si512(); T];
                let mut hi = [_mm512_setzero_si512(); T];
                // Q5_K: the fifth bits of the sub-block, bit j of each byte for columns
                // 4j..4j + 4 (shifted down one column group at a time).
                let mut fifth = if FIVE {
                    _mm512_loadu_si512(base.add(HIGH + 64 * s).cast())
                } else {
                    _mm512_setzero_si512()
                };
                for k in 0..4 {
                    let tile = _mm512_loadu_si512(base.add(TILES + 64 * (4 * s + k)).cast());
                    let (mut c0, mut c1) = (
                        _mm512_and_si512(tile, low4),
                        _mm512_and_si512(_mm512_srli_epi16::<4>(tile), low4),
                    );
                    if FIVE {
                        let one = _mm512_set1_epi8(1);
                        c0 = _mm512_or_si512(
                            c0,
                            _mm512_slli_epi16::<4>(_mm512_and_si512(fifth, one)),
                        );
                        fifth = _mm512_srli_epi16::<1>(fifth);
                        c1 = _mm512_or_si512(
                            c1,
                            _mm512_slli_epi16::<4>(_mm512_and_si512(fifth, one)),
                        );
                        fifth = _mm512_srli_epi16::<1>(fifth);
                    }
                    let g = 8 * s + 2 * k;
                    for t in 0..T {
                        let x0 = _mm512_set1_epi32(*x.add(g * T + t));
                        let x1 = _mm512_set1_epi32(*x.add((g + 1) * T + t));
                        lo[t] = _mm512_dpbusd_epi32(lo[t], c0, x0);
                        hi[t] = _mm512_dpbusd_epi32(hi[t], c1, x1);
                    }
                }
                for t in 0..T {
                    let sub = _mm512_add_epi32(lo[t], hi[t]);
                    isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(sub, sc));
                    let pair = (16 * b + 2 * s) * T + t;
                    let q = _mm512_set1_epi32(*bsum.add(pair) + *bsum.add(pair + T));
                    msum[t] = _mm512_add_epi32(msum[t], _mm512_mullo_epi32(mn, q));
                }
            }
            for t in 0..T {
                let ad = _mm512_set1_ps(*d.add(T * b + t));
                let sumi = _mm512_mul_ps(_mm512_mul_ps(dw, ad), _mm512_cvtepi32_ps(isum[t]));
                let summ = _mm512_mul_ps(_mm512_mul_ps(dmw, ad), _mm512_cvtepi32_ps(msum[t]));
                acc[t] = _mm512_add_ps(acc[t], _mm512_sub_ps(sumi, summ));
            }
        }
    }
    rows16_out(acc)
}
