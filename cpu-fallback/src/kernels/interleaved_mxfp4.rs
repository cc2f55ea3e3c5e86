//! AVX2 kernel over MXFP4 weights interleaved sixteen rows deep
//! ([`crate::interleave_mxfp4`]): sixteen rows × `T` tokens per pass, each 32-bit lane a row,
//! as two halves of eight rows (one 256-bit register each).
//!
//! Per block of 32 columns, the nibbles are looked up as doubled E2M1 values (`vpshufb` from
//! a 16-entry table) and `vpmaddubsw` multiplies their magnitudes by the activations given
//! their signs, in pairs; a block's pairs are summed in 16 bits (at most 8 · 2 · 12 · 127 =
//! 24 384) and widened by `vpmaddwd`. The float step then runs on the rows' lanes as the scalar
//! kernel ([`crate::kernels::scalar::mxfp4_dot`]) runs it on one: `acc += sumi · (2^(e − 128)
//! · d_a)`, block after block. Every row's result is the scalar one bit for bit, whatever the
//! number of tokens beside it.

use std::arch::x86_64::*;

use hesper_engine::formats::MXFP4_VALUES;

use super::interleaved_q8_0::{halves_and_tokens, Rows16};
use crate::interleave_mxfp4::{BLOCK_BYTES, SCALE_BYTES};

/// `out[t][l] = row l · token t` for the sixteen rows of `block` (their interleaved copy) and
/// `T` tokens packed as [`crate::formats::q8_0::Packed`] holds them: `xq[(8b + g)·T + t]` is
/// dword `g` of token `t`'s block `b`, `d[b·T + t]` its scale.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `block` holds `d.len() / T` interleaved blocks and `xq`
/// eight dwords for each of the `d.len()` scales.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn mxfp4_rows16_avx2<const T: usize>(
    block: &[u8],
    xq: &[i32],
    d: &[f32],
) -> [Rows16; T] {
    let blocks = d.len() / T;
    assert!(block.len() == blocks * BLOCK_BYTES && d.len() == blocks * T);
    assert!(xq.len() == 8 * d.len());
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..blocks {
        // SAFETY: the asserts above bound every read of block `b`: its 272 bytes, its 8·T
        // dwords and T scales.
        unsafe {
            let base = block.as_ptr().add(b * BLOCK_BYTES);
            if T == 1 {
                for line in (0..BLOCK_BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(8 * BLOCK_BYTES + line).cast());
                }
            }
            let act = (xq.as_ptr().add(8 * T * b), d.as_ptr().add(T * b));
            halves_and_tokens!(pass, base, act, acc);
        }
    }
    super::interleaved_q4_k::rows16_out_avx2(acc)
}

/// `2^(e − 128)` of eight exponent bytes at `p` (ggml's `GGML_E8M0_TO_FP32_HALF` lane by
/// lane: the bits `(e − 1) << 23`, and for `e` 0 and 1 the subnormals `0x200000 << e`).
///
/// # Safety
/// Eight bytes must be readable at `p`; the CPU must support AVX2.
#[inline(always)]
unsafe fn scales8(p: *const u8) -> __m256 {
    // SAFETY: the caller's contract.
    let e = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(p.cast()) });
    let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
    let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small))
}

/// The halves `hs` of one interleaved block at `base` times tokens `t0..t0 + U` of `T`, whose
/// block's dwords and scales start at `act`: adds the block's float step into `acc[u][h]`.
///
/// # Safety
/// As for [`mxfp4_rows16_avx2`].
#[inline(always)]
unsafe fn pass<const H: usize, const U: usize, const T: usize>(
    base: *const u8,
    hs: [usize; H],
    (x, d): (*const i32, *const f32),
    t0: usize,
    acc: &mut [[__m256; 2]],
) {
    let low4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut sum = [[_mm256_setzero_si256(); U]; H];
    // SAFETY: the caller bounds the block's bytes and tokens t0..t0 + U of its activations;
    // the table is 16 bytes.
    unsafe {
        let table = _mm_loadu_si128(MXFP4_VALUES.as_ptr().cast());
        let table = _mm256_set_m128i(table, table);
        for k in 0..4 {
            let x0: [__m256i; U] =
                std::array::from_fn(|u| _mm256_set1_epi32(*x.add(k * T + t0 + u)));
            let x1: [__m256i; U] =
                std::array::from_fn(|u| _mm256_set1_epi32(*x.add((4 + k) * T + t0 + u)));
            for (i, &h) in hs.iter().enumerate() {
                let tile = _mm256_loadu_si256(base.add(SCALE_BYTES + 64 * k + 32 * h).cast());
                let w0 = _mm256_shuffle_epi8(table, _mm256_and_si256(tile, low4));
                let w1 = _mm256_shuffle_epi8(
                    table,
                    _mm256_and_si256(_mm256_srli_epi16::<4>(tile), low4),
                );
                let (a0, a1) = (_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(w1, w1));
                for u in 0..U {
                    let p = _mm256_add_epi16(
                        _mm256_maddubs_epi16(a0, _mm256_sign_epi8(x0[u], w0)),
                        _mm256_maddubs_epi16(a1, _mm256_sign_epi8(x1[u], w1)),
                    );
                    sum[i][u] = _mm256_add_epi16(sum[i][u], p);
                }
            }
        }
        for (i, &h) in hs.iter().enumerate() {
            let dw = scales8(base.add(8 * h));
            for u in 0..U {
                let s = _mm256_madd_epi16(sum[i][u], ones);
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*d.add(t0 + u)));
                acc[u][h] = _mm256_add_ps(acc[u][h], _mm256_mul_ps(_mm256_cvtepi32_ps(s), scale));
            }
        }
    }
}
