//! AVX-512 VNNI, AVX-VNNI and AVX2 kernels over Q6_K weights interleaved sixteen rows deep
//! ([`crate::interleave_q6_k`]): sixteen rows × `T` tokens per pass, each 32-bit lane a row.
//!
//! Per sub-block of 16 columns, four `vpdpbusd` (the six-bit codes unsigned, built from a nibble
//! and a crumb tile; each activation dword broadcast) give the sixteen rows' `Σ code·q`; taking
//! off `32 · Σq` leaves the exact `Σ (code − 32)·q`, times the rows' scales. The float step then
//! runs on sixteen rows at once, as the scalar kernel ([`crate::kernels::scalar::q6_k_dot`])
//! runs it on one: `acc += sumi · (d · d_act)`, block after block. Every row's result is the
//! scalar one bit for bit, whatever the number of tokens beside it.

use std::arch::x86_64::*;

use super::interleaved_q4_k::{Avx2Dots, AvxVnniDots, ByteDots};
use super::interleaved_q8_0::{prefetch_part, rows16_out, Rows16};
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
            let x = xq.add(64 * T * b);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(base.cast()));
            let mut isum = [_mm512_setzero_si512(); T];
            for s in 0..16 {
                if T == 1 {
                    // Decode streams the weights once: the block two ahead, a sixteenth at a
                    // time.
                    prefetch_part(base, BLOCK_BYTES, 2, s, 16);
                }
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

/// [`q6_k_rows16_vnni512`] on AVX2 (any x86 variant without VNNI): the sixteen rows as two
/// halves of eight, one 256-bit register each. `vpmaddubsw` multiplies the six-bit codes by
/// the signed activations in pairs; two of a sub-block's four products are summed in 16 bits
/// (at most 2 · 2 · 63 · 128 = 32 256) and widened by `vpmaddwd` with the rows' scales (each
/// row's scale in both halves of its lane). The codes' offset of 32 comes off once per block,
/// as `32 · Σ scale · Σq` of the sixteen sub-blocks, two per `vpmaddwd`. Tokens go four at a
/// time, one half of the rows at a time. The integer sums are exact and the float step is
/// [`q6_k_rows16_vnni512`]'s, lane by lane: the bits are the scalar kernel's. (One token takes the halves in turn too: both in one pass
/// leave too few registers, and decode measured 2.7× slower so.)
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the shapes are those of [`q6_k_rows16_vnni512`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6_k_rows16_avx2<const T: usize>(
    block: &[u8],
    xq: &[i32],
    bsum: &[i32],
    d: &[f32],
) -> [Rows16; T] {
    // SAFETY: this function's features are the AVX2 pass's.
    unsafe { q6_k_rows16_halves::<Avx2Dots, T>(block, xq, bsum, d) }
}

/// The body of [`q6_k_rows16_avx2`] and [`q6_k_rows16_avxvnni`], their sums made as `D` makes
/// them: each block's halves, four tokens a pass.
///
/// # Safety
/// As for the kernel that inlines it.
#[inline(always)]
pub(crate) unsafe fn q6_k_rows16_halves<D: ByteDots, const T: usize>(
    block: &[u8],
    xq: &[i32],
    bsum: &[i32],
    d: &[f32],
) -> [Rows16; T] {
    let blocks = d.len() / T;
    assert!(block.len() == blocks * BLOCK_BYTES && d.len() == blocks * T);
    assert!(xq.len() == 64 * d.len() && bsum.len() == 16 * d.len());
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..blocks {
        // SAFETY: the asserts above bound every read of block `b`: its bytes, its 64·T
        // dwords, 16·T sums and T scales.
        unsafe {
            let base = block.as_ptr().add(b * BLOCK_BYTES);
            let act = (
                xq.as_ptr().add(64 * T * b),
                bsum.as_ptr().add(16 * T * b),
                d.as_ptr().add(T * b),
            );
            for h in 0..2 {
                for t0 in (0..T).step_by(4) {
                    let acc = &mut acc[t0..(t0 + 4).min(T)];
                    match acc.len() {
                        4 => q6_k_pass::<D, 4, T>(base, h, act, t0, acc),
                        3 => q6_k_pass::<D, 3, T>(base, h, act, t0, acc),
                        2 => q6_k_pass::<D, 2, T>(base, h, act, t0, acc),
                        _ => q6_k_pass::<D, 1, T>(base, h, act, t0, acc),
                    }
                }
            }
        }
    }
    super::interleaved_q4_k::rows16_out_avx2(acc)
}

/// [`q6_k_pass_avxvnni`] where `D` sums in 32 bits, else [`q6_k_pass_avx2`].
///
/// # Safety
/// As for the pass it runs.
#[inline(always)]
unsafe fn q6_k_pass<D: ByteDots, const U: usize, const T: usize>(
    base: *const u8,
    h: usize,
    act: (*const i32, *const i32, *const f32),
    t0: usize,
    acc: &mut [[__m256; 2]],
) {
    // SAFETY: the caller's.
    unsafe {
        if D::WIDE {
            q6_k_pass_avxvnni::<D, U, T>(base, h, act, t0, acc)
        } else {
            q6_k_pass_avx2::<U, T>(base, h, act, t0, acc)
        }
    }
}

/// Half `h` (rows 8h..8h + 8) of one interleaved block at `base` times tokens `t0..t0 + U` of
/// `T`, whose block's dwords, sums and scales start at `act`: adds the block's float step into
/// `acc[u][h]`.
///
/// # Safety
/// As for [`q6_k_rows16_avx2`].
#[inline(always)]
unsafe fn q6_k_pass_avx2<const U: usize, const T: usize>(
    base: *const u8,
    h: usize,
    (x, bsum, d): (*const i32, *const i32, *const f32),
    t0: usize,
    acc: &mut [[__m256; 2]],
) {
    let mut isum = [_mm256_setzero_si256(); U];
    // SAFETY: the caller bounds the block's bytes and tokens t0..t0 + U of its activations.
    unsafe {
        // Eight signed bytes (a half's rows) as eight lanes of two i16, `a` low and `b` high.
        let pairs = |a: *const u8, b: *const u8| {
            let (a, b) = (_mm_loadl_epi64(a.cast()), _mm_loadl_epi64(b.cast()));
            _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b))
        };
        for s in 0..16 {
            if T == 1 && h == 0 {
                // Decode streams the weights once: the block two ahead, a sixteenth at a time.
                prefetch_part(base, BLOCK_BYTES, 2, s, 16);
            }
            let sc = {
                let at = base.add(SCALES + ROWS * s + 8 * h);
                pairs(at, at)
            };
            let g = 4 * s;
            let at = |offset: usize| base.add(offset + 32 * h).cast();
            let crumbs = _mm256_loadu_si256(at(CRUMBS + 64 * s));
            // Products of columns 16s + 4j .. 16s + 4j + 4, two j at a time (even, then odd:
            // the crumbs' shifts differ) summed in 16 bits, then widened with the scales.
            for pair in [[0, 2], [1, 3]] {
                let mut sum = [_mm256_setzero_si256(); U];
                for j in pair {
                    let code = q6_k_codes(base, h, s, j, crumbs);
                    for (u, sum) in sum.iter_mut().enumerate() {
                        let xj = _mm256_set1_epi32(*x.add((g + j) * T + t0 + u));
                        *sum = _mm256_add_epi16(*sum, _mm256_maddubs_epi16(code, xj));
                    }
                }
                for (isum, sum) in isum.iter_mut().zip(sum) {
                    *isum = _mm256_add_epi32(*isum, _mm256_madd_epi16(sum, sc));
                }
            }
        }
        q6_k_block_step::<U, T>(base, h, (bsum, d), t0, isum, acc);
    }
}

/// [`q6_k_rows16_avx2`] with AVX-VNNI's 256-bit `vpdpbusd` (Intel Alder Lake and later
/// clients): each code vector meets a token's activations in one instruction, summed in 32 bits
/// per sub-block, then times the rows' scales (`vpmulld`); the integer sums, and so the bits,
/// are [`q6_k_rows16_avx2`]'s.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-VNNI; the shapes are those of
/// [`q6_k_rows16_vnni512`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn q6_k_rows16_avxvnni<const T: usize>(
    block: &[u8],
    xq: &[i32],
    bsum: &[i32],
    d: &[f32],
) -> [Rows16; T] {
    // SAFETY: this function's features are the AVX-VNNI pass's.
    unsafe { q6_k_rows16_halves::<AvxVnniDots, T>(block, xq, bsum, d) }
}

/// [`q6_k_pass_avx2`] with `vpdpbusd` (`D`'s).
///
/// # Safety
/// As for [`q6_k_rows16_avxvnni`].
#[inline(always)]
unsafe fn q6_k_pass_avxvnni<D: ByteDots, const U: usize, const T: usize>(
    base: *const u8,
    h: usize,
    (x, bsum, d): (*const i32, *const i32, *const f32),
    t0: usize,
    acc: &mut [[__m256; 2]],
) {
    let mut isum = [_mm256_setzero_si256(); U];
    // SAFETY: the caller bounds the block's bytes and tokens t0..t0 + U of its activations.
    unsafe {
        for s in 0..16 {
            if T == 1 && h == 0 {
                // Decode streams the weights once: the block two ahead, a sixteenth at a time.
                prefetch_part(base, BLOCK_BYTES, 2, s, 16);
            }
            // The half's eight rows' scales of sub-block `s`, one a lane.
            let sc =
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(base.add(SCALES + ROWS * s + 8 * h).cast()));
            let at = |offset: usize| base.add(offset + 32 * h).cast();
            let crumbs = _mm256_loadu_si256(at(CRUMBS + 64 * s));
            let mut sum = [_mm256_setzero_si256(); U];
            for j in 0..4 {
                let code = q6_k_codes(base, h, s, j, crumbs);
                for (u, sum) in sum.iter_mut().enumerate() {
                    let xj = _mm256_set1_epi32(*x.add((4 * s + j) * T + t0 + u));
                    *sum = D::add(*sum, code, xj);
                }
            }
            for (isum, sum) in isum.iter_mut().zip(sum) {
                *isum = _mm256_add_epi32(*isum, _mm256_mullo_epi32(sum, sc));
            }
        }
        q6_k_block_step::<U, T>(base, h, (bsum, d), t0, isum, acc);
    }
}

/// The six-bit codes of columns `16s + 4j .. 16s + 4j + 4` of half `h` of the block at `base`
/// (a byte each, the half's rows in its lanes): a nibble of tile `2s + j / 2`, and crumb `j` of
/// `crumbs` (the sub-block's crumb tile) moved to bits 4-5.
///
/// # Safety
/// The block's bytes are readable (the caller bounds them).
#[inline(always)]
unsafe fn q6_k_codes(base: *const u8, h: usize, s: usize, j: usize, crumbs: __m256i) -> __m256i {
    // SAFETY: the caller bounds the block's bytes.
    let n = unsafe { _mm256_loadu_si256(base.add(NIBBLES + 64 * (2 * s + j / 2) + 32 * h).cast()) };
    let n = if j.is_multiple_of(2) {
        n
    } else {
        _mm256_srli_epi16::<4>(n)
    };
    let high = match j {
        0 => _mm256_slli_epi16::<4>(crumbs),
        1 => _mm256_slli_epi16::<2>(crumbs),
        2 => crumbs,
        _ => _mm256_srli_epi16::<2>(crumbs),
    };
    let low4 = _mm256_set1_epi8(0x0F);
    let high2 = _mm256_set1_epi8(0x30);
    _mm256_or_si256(_mm256_and_si256(n, low4), _mm256_and_si256(high, high2))
}

/// Half `h` of the block at `base` done for tokens `t0..t0 + U`: the codes' offset of 32 taken
/// off each token's `Σ scale·Σ code·q` (`isum`, as `32 · Σ scale · Σq` of the sixteen
/// sub-blocks, two per `vpmaddwd`), then the float step into `acc[u][h]`.
///
/// # Safety
/// As for [`q6_k_pass_avx2`].
#[inline(always)]
unsafe fn q6_k_block_step<const U: usize, const T: usize>(
    base: *const u8,
    h: usize,
    (bsum, d): (*const i32, *const f32),
    t0: usize,
    isum: [__m256i; U],
    acc: &mut [[__m256; 2]],
) {
    // SAFETY: the caller bounds the block's bytes and tokens t0..t0 + U of its activations.
    unsafe {
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(base.add(16 * h).cast()));
        // Sub-blocks 2p and 2p + 1: the rows' scales beside each other.
        let scales: [__m256i; 8] = std::array::from_fn(|p| {
            let at = |s: usize| base.add(SCALES + ROWS * s + 8 * h);
            let (a, b) = (
                _mm_loadl_epi64(at(2 * p).cast()),
                _mm_loadl_epi64(at(2 * p + 1).cast()),
            );
            _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b))
        });
        for u in 0..U {
            let mut offset = _mm256_setzero_si256();
            for (p, &sc) in scales.iter().enumerate() {
                let q = |s: usize| *bsum.add(s * T + t0 + u);
                let q = _mm256_set1_epi32((q(2 * p) & 0xFFFF) | (q(2 * p + 1) << 16));
                offset = _mm256_add_epi32(offset, _mm256_madd_epi16(sc, q));
            }
            let sumi = _mm256_sub_epi32(isum[u], _mm256_slli_epi32::<5>(offset));
            let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*d.add(t0 + u)));
            acc[u][h] = _mm256_add_ps(acc[u][h], _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), scale));
        }
    }
}
