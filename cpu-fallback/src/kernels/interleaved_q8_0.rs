//! AVX-512 VNNI kernel over Q8_0 weights interleaved sixteen rows deep
//! ([`crate::interleave_q8_0`]): sixteen rows × `T` tokens per pass, each 32-bit lane a row.
//!
//! Per block of 32 columns, eight `vpdpbusd` (offset weights unsigned, each activation dword
//! broadcast) give the sixteen rows' sums of `(w + 128)·q`; subtracting `128·Σq` leaves the
//! exact `Σ w·q`. The float step then runs on sixteen rows at once, as the scalar kernel
//! ([`crate::kernels::scalar::q8_0_dot`]) runs it on one: `acc += sumi · (d_w · d_a)`, a
//! product and a sum rounded in that order, block after block. Every row's result is the
//! scalar one bit for bit, whatever the number of tokens beside it.

use std::arch::x86_64::*;

use crate::interleave::ROWS;
use crate::interleave_q8_0::{BLOCK_BYTES, SCALE_BYTES};

/// Row sums of one token in a pass: sixteen rows' results.
pub type Rows16 = [f32; ROWS];

/// `out[t][l] = row l · token t` for the sixteen rows of `block` (their interleaved copy) and
/// `T` tokens packed as [`crate::formats::q8_0::Packed`] holds them: `xq[(8b + g)·T + t]` is
/// dword `g` of token `t`'s block `b`, `d[b·T + t]` its scale, `bias[b·T + t]` its `128 · Σq`.
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL and VNNI; `block` holds `d.len() / T` interleaved
/// blocks, `xq` eight dwords and `bias` one sum for each of the `d.len()` scales.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q8_0_rows16_vnni512<const T: usize>(
    block: &[u8],
    xq: &[i32],
    d: &[f32],
    bias: &[i32],
) -> [Rows16; T] {
    let blocks = d.len() / T;
    assert!(block.len() == blocks * BLOCK_BYTES && d.len() == blocks * T);
    assert!(xq.len() == 8 * d.len() && bias.len() == d.len());
    let (xq, d, bias) = (xq.as_ptr(), d.as_ptr(), bias.as_ptr());
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..blocks {
        // SAFETY: the asserts above bound every read: the block's 544 bytes, its 8·T dwords,
        // T scales and T sums.
        unsafe {
            let base = block.as_ptr().add(b * BLOCK_BYTES);
            let x = xq.add(8 * T * b);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(base.cast()));
            let tile = |g: usize| _mm512_loadu_si512(base.add(SCALE_BYTES + 64 * g).cast());
            // Two chains per token (even and odd dwords) where registers allow, so that one
            // token alone does not wait on eight dependent `vpdpbusd`.
            let mut even = [_mm512_setzero_si512(); T];
            let mut odd = [_mm512_setzero_si512(); T];
            for g in (0..8).step_by(2) {
                let (w0, w1) = (tile(g), tile(g + 1));
                for t in 0..T {
                    let x0 = _mm512_set1_epi32(*x.add(g * T + t));
                    let x1 = _mm512_set1_epi32(*x.add((g + 1) * T + t));
                    if T <= 4 {
                        even[t] = _mm512_dpbusd_epi32(even[t], w0, x0);
                        odd[t] = _mm512_dpbusd_epi32(odd[t], w1, x1);
                    } else {
                        even[t] = _mm512_dpbusd_epi32(even[t], w0, x0);
                        even[t] = _mm512_dpbusd_epi32(even[t], w1, x1);
                    }
                }
            }
            for t in 0..T {
                let sum = _mm512_sub_epi32(
                    _mm512_add_epi32(even[t], odd[t]),
                    _mm512_set1_epi32(*bias.add(T * b + t)),
                );
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*d.add(T * b + t)));
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_cvtepi32_ps(sum), scale));
            }
        }
    }
    rows16_out(acc)
}

/// Asks for the `bytes` of the interleaved block `ahead` blocks of `bytes` after `base`: decode
/// streams the weights once, and the hardware prefetcher alone leaves the kernels waiting (a
/// hint, never faults past the end).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn prefetch_block(base: *const u8, bytes: usize, ahead: usize) {
    for line in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(ahead * bytes + line).cast());
    }
}

/// The sixteen lanes of each of `T` accumulators: the rows' results of an interleaved kernel.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn rows16_out<const T: usize>(acc: [__m512; T]) -> [Rows16; T] {
    let mut out = [[0.0f32; ROWS]; T];
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: `o` holds sixteen floats.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), a) };
    }
    out
}
