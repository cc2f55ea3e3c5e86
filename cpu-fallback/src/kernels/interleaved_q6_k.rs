//! AVX-512 VNNI kernel over Q6_K weights interleaved sixteen rows deep
//! ([`crate::interleave_q6_k`]): sixteen rows × `T` tokens per pass, each 32-bit lane a row.
//!
//! Per sub-block of 16 columns, four `vpdpbusd` (the six-bit codes unsigned, built from a nibble
//! and a crumb tile; each activation dword broadcast) give the sixteen rows' `Σ code·q`; taking
//! off `32 · Σq` leaves the exact `Σ (code − 32)·q`, times the rows' scales. The float step then
//! runs on sixteen rows at once, as the scalar kernel ([`crate::kernels::scalar::q6_k_dot`])
//! runs it on one: `acc += sumi · (d · d_act)`, block after block. Every row's result is the
//! scalar one bit for bit, whatever the number of tokens beside it.

use std::arch::x86_64::*;

use super::interleaved_q8_0::{prefetch_block, rows16_out, Rows16};
use crate::interleave::ROWS;
use crate::interleave_q6_k::{BLOCK_BYTES, CRUMBS, NIBBLES, SCALES};

/// `out[t][l] = row l · token t` for the sixteen rows of `block` (their interleaved copy) and
/// `T` tokens packed as [`crate::formats::q4_k::Packed`] holds them (see
/// [`crate::kernels::interleaved_q4_k::q4_k_rows16_vnni512`]).
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL and VNNI; `block` holds `d.len() / T` interleaved
/// blocks, `xq` 64 dwords and `bsum` sixteen sums for each of the `d.len()` scales.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub unsafe fn q6_k_rows16_vnni512<const T: usize>(
    block: &[u8],
    xq: &[i32],
    bsum: &[i32],
    d: &[f32],
) -> [Rows16; T] {
    let blocks = d.len() / T;
    assert!(block.len() == blocks * BLOCK_BYTES && d.len() == blocks * T);
    assert!(xq.len() == 64 * d.len() && bsum.len() == 16 * d.len());
    let (xq, bsum, d) = (xq.as_ptr(), bsum.as_ptr(), d.as_ptr());
    let low4 = _mm512_set1_epi8(0x0F);
    let high2 = _mm512_set1_epi8(0x30);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..blocks {
        // SAFETY: the asserts above bound every read: the block's bytes, its 64·T dwords,
        // 16·T sums and T scales.
        unsafe {
            let base = block.as_ptr().add(b * BLOCK_BYTES);
            if T == 1 {
                prefetch_block(base, BLOCK_BYTES, 2);
            }
            let x = xq.add(64 * T * b);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(base.cast()));
            let mut isum = [_mm512_setzero_si512(); T];
            for s in 0..16 {
                let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(base.add(SCALES + ROWS * s).cast()));
                let crumbs = _mm512_loadu_si512(base.add(CRUMBS + 64 * s).cast());
                let n0 = _mm512_loadu_si512(base.add(NIBBLES + 64 * (2 * s)).cast());
                let n1 = _mm512_loadu_si512(base.add(NIBBLES + 64 * (2 * s + 1)).cast());
                // Columns 16s + 4j .. 16s + 4j + 4: a nibble, and crumb j moved to bits 4-5.
                let high = [
                    _mm512_and_si512(_mm512_slli_epi16::<4>(crumbs), high2),
                    _mm512_and_si512(_mm512_slli_epi16::<2>(crumbs), high2),
                    _mm512_and_si512(crumbs, high2),
                    _mm512_and_si512(_mm512_srli_epi16::<2>(crumbs), high2),
                ];
                let codes = [
                    _mm512_or_si512(_mm512_and_si512(n0, low4), high[0]),
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(n0), low4), high[1]),
                    _mm512_or_si512(_mm512_and_si512(n1, low4), high[2]),
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(n1), low4), high[3]),
                ];
                let g = 4 * s;
                for (t, isum) in isum.iter_mut().enumerate() {
                    // Two chains so that one token alone does not wait on four dependent
                    // `vpdpbusd`.
                    let xg = [0, 1, 2, 3].map(|j| *x.add((g + j) * T + t));
                    let zero = _mm512_setzero_si512();
                    let even = _mm512_dpbusd_epi32(zero, codes[0], _mm512_set1_epi32(xg[0]));
                    let odd = _mm512_dpbusd_epi32(zero, codes[1], _mm512_set1_epi32(xg[1]));
                    let even = _mm512_dpbusd_epi32(even, codes[2], _mm512_set1_epi32(xg[2]));
                    let odd = _mm512_dpbusd_epi32(odd, codes[3], _mm512_set1_epi32(xg[3]));
                    let offset = _mm512_set1_epi32(32 * *bsum.add((16 * b + s) * T + t));
                    let sub = _mm512_sub_epi32(_mm512_add_epi32(even, odd), offset);
                    *isum = _mm512_add_epi32(*isum, _mm512_mullo_epi32(sub, sc));
                }
            }
            for t in 0..T {
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*d.add(T * b + t)));
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_cvtepi32_ps(isum[t]), scale));
            }
        }
    }
    rows16_out(acc)
}
