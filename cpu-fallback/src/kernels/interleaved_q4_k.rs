//! AVX-512 VNNI, AVX-VNNI and AVX2 kernels over Q4_K and Q5_K weights interleaved sixteen rows deep
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

use super::interleaved_q8_0::{prefetch_part, rows16_out, Rows16};
use crate::interleave::ROWS;
use crate::interleave_q4_k::{block_bytes, DMIN, HIGH, MINS, SCALES, TILES};

/// How the 256-bit K-quant passes add a sub-block's byte products (unsigned codes times signed
/// activations, four to a 32-bit lane): in 16 bits with `vpmaddubsw`, widened later by
/// `vpmaddwd` with the rows' scales ([`Avx2Dots`]), or in 32 bits with `vpdpbusd`, then times
/// the scales ([`AvxVnniDots`]; the tests run the same body with the instruction's EVEX form).
pub(crate) trait ByteDots {
    /// Whether the sums are 32-bit (`vpdpbusd`).
    const WIDE: bool;
    /// `acc` plus the products of `codes` and `x`, lane by lane.
    ///
    /// # Safety
    /// The CPU supports the instruction.
    unsafe fn add(acc: __m256i, codes: __m256i, x: __m256i) -> __m256i;
}

/// AVX2's 16-bit sums.
pub(crate) struct Avx2Dots;

impl ByteDots for Avx2Dots {
    const WIDE: bool = false;
    #[inline(always)]
    unsafe fn add(acc: __m256i, codes: __m256i, x: __m256i) -> __m256i {
        _mm256_add_epi16(acc, _mm256_maddubs_epi16(codes, x))
    }
}

/// AVX-VNNI's 256-bit VEX `vpdpbusd`.
pub(crate) struct AvxVnniDots;

impl ByteDots for AvxVnniDots {
    const WIDE: bool = true;
    #[inline(always)]
    unsafe fn add(acc: __m256i, codes: __m256i, x: __m256i) -> __m256i {
        // SAFETY: the caller's CPU has AVX-VNNI.
        unsafe { _mm256_dpbusd_avx_epi32(acc, codes, x) }
    }
}

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
            let x = xq.add(64 * T * b);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(base.cast()));
            let dmw = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(DMIN).cast()));
            let mut isum = [_mm512_setzero_si512(); T];
            let mut msum = [_mm512_setzero_si512(); T];
            for s in 0..8 {
                if T == 1 {
                    // Decode streams the weights once: the block two ahead, an eighth at a time.
                    prefetch_part(base, block_size, 2, s, 8);
                }
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

/// [`k_rows16_vnni512`] on AVX2 (any x86 variant without VNNI): the sixteen rows as two halves
/// of eight, one 256-bit register each. Without `vpdpbusd`, `vpmaddubsw` multiplies the
/// unsigned codes by the signed activations in pairs; a sub-block's pairs are summed in 16 bits
/// (low and high nibbles apart: at most 4 · 2 · 31 · 128 = 31 744, so exact for Q5_K's five-bit
/// codes too), then widened by `vpmaddwd`. Tokens go four at a time, one half of the rows at a
/// time (the block's tiles read again from L1); one or two tokens take both halves in one pass.
/// The integer sums are exact and the float step is [`k_rows16_vnni512`]'s, lane by lane: the
/// bits are the scalar kernel's.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the shapes are those of [`k_rows16_vnni512`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn k_rows16_avx2<const FIVE: bool, const T: usize>(
    block: &[u8],
    xq: &[i32],
    bsum: &[i32],
    d: &[f32],
) -> [Rows16; T] {
    // SAFETY: this function's features are the AVX2 passes'.
    unsafe { k_rows16_halves::<Avx2Dots, FIVE, T>(block, xq, bsum, d) }
}

/// [`k_rows16_avx2`] with AVX-VNNI's 256-bit `vpdpbusd` (Intel Alder Lake and later clients):
/// each code vector meets a token's activations in one instruction, a sub-block's sums kept in
/// 32 bits and multiplied by the rows' scales (`vpmulld`); the integer sums, and so the bits,
/// are [`k_rows16_avx2`]'s.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-VNNI; the shapes are those of
/// [`k_rows16_vnni512`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn k_rows16_avxvnni<const FIVE: bool, const T: usize>(
    block: &[u8],
    xq: &[i32],
    bsum: &[i32],
    d: &[f32],
) -> [Rows16; T] {
    // SAFETY: this function's features are the AVX-VNNI passes'.
    unsafe { k_rows16_halves::<AvxVnniDots, FIVE, T>(block, xq, bsum, d) }
}

/// The body of [`k_rows16_avx2`] and [`k_rows16_avxvnni`], their sums made as `D` makes them.
///
/// # Safety
/// As for the kernel that inlines it.
#[inline(always)]
pub(crate) unsafe fn k_rows16_halves<D: ByteDots, const FIVE: bool, const T: usize>(
    block: &[u8],
    xq: &[i32],
    bsum: &[i32],
    d: &[f32],
) -> [Rows16; T] {
    let block_size = block_bytes(FIVE);
    let blocks = d.len() / T;
    assert!(block.len() == blocks * block_size && d.len() == blocks * T);
    assert!(xq.len() == 64 * d.len() && bsum.len() == 16 * d.len());
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..blocks {
        // SAFETY: the asserts above bound every read of block `b`: its bytes, its 64·T
        // dwords, 16·T sums and T scales.
        unsafe {
            let base = block.as_ptr().add(b * block_size);
            let act = KAct {
                xq: xq.as_ptr().add(64 * T * b),
                bsum: bsum.as_ptr().add(16 * T * b),
                d: d.as_ptr().add(T * b),
            };
            match T {
                1 if !FIVE => k_pass::<D, FIVE, 2, 1, T>(base, [0, 1], &act, 0, &mut acc),
                2 if !FIVE => k_pass::<D, FIVE, 2, 2, T>(base, [0, 1], &act, 0, &mut acc),
                _ => {
                    for h in 0..2 {
                        for t0 in (0..T).step_by(4) {
                            let acc = &mut acc[t0..(t0 + 4).min(T)];
                            match acc.len() {
                                4 => k_pass::<D, FIVE, 1, 4, T>(base, [h], &act, t0, acc),
                                3 => k_pass::<D, FIVE, 1, 3, T>(base, [h], &act, t0, acc),
                                2 => k_pass::<D, FIVE, 1, 2, T>(base, [h], &act, t0, acc),
                                _ => k_pass::<D, FIVE, 1, 1, T>(base, [h], &act, t0, acc),
                            }
                        }
                    }
                }
            }
        }
    }
    rows16_out_avx2(acc)
}

/// One block's activations of `T` tokens, packed as [`crate::formats::q4_k::Packed`] holds
/// them: 64 dwords, sixteen sums and one scale per token, token-minor.
struct KAct {
    xq: *const i32,
    bsum: *const i32,
    d: *const f32,
}

/// The halves `hs` (rows `8h..8h + 8` each) of one interleaved block at `base` times tokens
/// `t0..t0 + U` of `T`: adds the block's float step into `acc[u][h]`. A sub-block's 16-bit sums
/// are widened by `vpmaddwd` with the rows' scales (each row's scale in both halves of its
/// lane: `scale · Σ`, exact in 32 bits), or where `D` sums in 32 bits multiplied by the
/// scales; the minimums meet the activations' sums two sub-blocks per
/// `vpmaddwd` once the block is done.
///
/// # Safety
/// As for the kernel that inlines it; `base` is the block's start and `act` its activations.
#[inline(always)]
unsafe fn k_pass<D: ByteDots, const FIVE: bool, const H: usize, const U: usize, const T: usize>(
    base: *const u8,
    hs: [usize; H],
    act: &KAct,
    t0: usize,
    acc: &mut [[__m256; 2]],
) {
    let low4 = _mm256_set1_epi8(0x0F);
    let bit4 = _mm256_set1_epi8(0x10);
    let mut isum = [[_mm256_setzero_si256(); U]; H];
    // SAFETY: the caller bounds the block's bytes and the activations of tokens t0..t0 + U.
    unsafe {
        // Eight bytes (one per row of a half) as eight lanes of two i16 each, `a` in the low
        // and `b` in the high one.
        let pairs = |a: *const u8, b: *const u8| {
            let (a, b) = (_mm_loadl_epi64(a.cast()), _mm_loadl_epi64(b.cast()));
            _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a, b))
        };
        for s in 0..8 {
            if T == 1 && hs[0] == 0 {
                // Decode streams the weights once: the block two ahead, an eighth at a time.
                prefetch_part(base, block_bytes(FIVE), 2, s, 8);
            }
            let at = |offset: usize, h: usize| base.add(offset + ROWS * s + 8 * h);
            // The rows' scales: twice in each 32-bit lane for `vpmaddwd`, or once (32-bit sums).
            let sc = hs.map(|h| {
                if D::WIDE {
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(at(SCALES, h).cast()))
                } else {
                    pairs(at(SCALES, h), at(SCALES, h))
                }
            });
            let mut lo = [[_mm256_setzero_si256(); U]; H];
            let mut hi = [[_mm256_setzero_si256(); U]; H];
            let fifth = hs.map(|h| {
                if FIVE {
                    _mm256_loadu_si256(base.add(HIGH + 64 * s + 32 * h).cast())
                } else {
                    _mm256_setzero_si256()
                }
            });
            for k in 0..4 {
                let g = 8 * s + 2 * k;
                let x0: [__m256i; U] =
                    std::array::from_fn(|u| _mm256_set1_epi32(*act.xq.add(g * T + t0 + u)));
                let x1: [__m256i; U] =
                    std::array::from_fn(|u| _mm256_set1_epi32(*act.xq.add((g + 1) * T + t0 + u)));
                for (i, &h) in hs.iter().enumerate() {
                    let tile =
                        _mm256_loadu_si256(base.add(TILES + 64 * (4 * s + k) + 32 * h).cast());
                    let (mut c0, mut c1) = (
                        _mm256_and_si256(tile, low4),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(tile), low4),
                    );
                    if FIVE {
                        // Bits 2k and 2k + 1 of each byte moved to bit 4 (a shift within
                        // 16-bit lanes never carries a neighbour's bit into bit 4 here).
                        let [b0, b1] = fifth_bits(fifth[i], k);
                        c0 = _mm256_or_si256(c0, _mm256_and_si256(b0, bit4));
                        c1 = _mm256_or_si256(c1, _mm256_and_si256(b1, bit4));
                    }
                    for u in 0..U {
                        lo[i][u] = D::add(lo[i][u], c0, x0[u]);
                        hi[i][u] = D::add(hi[i][u], c1, x1[u]);
                    }
                }
            }
            for i in 0..H {
                for u in 0..U {
                    let sub = if D::WIDE {
                        _mm256_mullo_epi32(_mm256_add_epi32(lo[i][u], hi[i][u]), sc[i])
                    } else {
                        _mm256_add_epi32(
                            _mm256_madd_epi16(lo[i][u], sc[i]),
                            _mm256_madd_epi16(hi[i][u], sc[i]),
                        )
                    };
                    isum[i][u] = _mm256_add_epi32(isum[i][u], sub);
                }
            }
        }
        for (i, &h) in hs.iter().enumerate() {
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(base.add(16 * h).cast()));
            let dmw = _mm256_cvtph_ps(_mm_loadu_si128(base.add(DMIN + 16 * h).cast()));
            let mins: [__m256i; 4] = std::array::from_fn(|p| {
                let at = |s: usize| base.add(MINS + ROWS * s + 8 * h);
                pairs(at(2 * p), at(2 * p + 1))
            });
            for u in 0..U {
                // Sub-blocks 2p and 2p + 1: the activations' sums of their 32 values each.
                let mut msum = _mm256_setzero_si256();
                for (p, &m) in mins.iter().enumerate() {
                    let q = |s: usize| {
                        let at = 2 * s * T + t0 + u;
                        *act.bsum.add(at) + *act.bsum.add(at + T)
                    };
                    let (q0, q1) = (q(2 * p), q(2 * p + 1));
                    let q = _mm256_set1_epi32((q0 & 0xFFFF) | (q1 << 16));
                    msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m, q));
                }
                let ad = _mm256_set1_ps(*act.d.add(t0 + u));
                let sumi = _mm256_mul_ps(_mm256_mul_ps(dw, ad), _mm256_cvtepi32_ps(isum[i][u]));
                let summ = _mm256_mul_ps(_mm256_mul_ps(dmw, ad), _mm256_cvtepi32_ps(msum));
                acc[u][h] = _mm256_add_ps(acc[u][h], _mm256_sub_ps(sumi, summ));
            }
        }
    }
}

/// The fifth bits of tile `k`'s low and high nibbles (bits `2k` and `2k + 1` of each byte of
/// `fifth`) shifted to bit 4, other bits left as they fall (the caller keeps bit 4 alone).
#[inline(always)]
unsafe fn fifth_bits(fifth: __m256i, k: usize) -> [__m256i; 2] {
    match k {
        0 => [_mm256_slli_epi16::<4>(fifth), _mm256_slli_epi16::<3>(fifth)],
        1 => [_mm256_slli_epi16::<2>(fifth), _mm256_slli_epi16::<1>(fifth)],
        2 => [fifth, _mm256_srli_epi16::<1>(fifth)],
        _ => [_mm256_srli_epi16::<2>(fifth), _mm256_srli_epi16::<3>(fifth)],
    }
}

/// The sixteen lanes of each of `T` pairs of eight-lane accumulators: the rows' results of
/// an interleaved AVX2 kernel.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn rows16_out_avx2<const T: usize>(acc: [[__m256; 2]; T]) -> [Rows16; T] {
    let mut out = [[0.0f32; ROWS]; T];
    for (o, [lo, hi]) in out.iter_mut().zip(acc) {
        // SAFETY: `o` holds sixteen floats.
        unsafe {
            _mm256_storeu_ps(o.as_mut_ptr(), lo);
            _mm256_storeu_ps(o.as_mut_ptr().add(8), hi);
        }
    }
    out
}
