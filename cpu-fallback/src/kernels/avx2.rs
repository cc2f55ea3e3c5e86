//! AVX2 + FMA + F16C kernels for x86_64. Each function is `unsafe` because the caller must
//! have checked the CPU features (see [`super::Isa::detect`]).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use hesper_engine::q6_k::{Q6_K_BLOCK_BYTES, Q6_K_D, Q6_K_QH, Q6_K_SCALES};
use hesper_engine::weights::{I2S_GROUP, Q8_0_BLOCK_BYTES, TQ2_0_BLOCK_BYTES};

use crate::quant::{Q8KBlock, Q8_0Block};

/// How far ahead of the weights being multiplied the streaming kernels ask for more: the
/// kernels are nearly as busy computing as the memory is streaming, and the hardware
/// prefetcher alone leaves them waiting. Swept on the 2B4T shape (BENCHMARKS.md): 2–8 KiB
/// ahead is 10–15 % faster than none.
const PREFETCH_AHEAD: usize = 2048;

/// How far ahead [`i2s_code_dot_rows4`] asks for more of its four-row stream: four
/// interleaved streams leave the hardware prefetcher further behind than one. Swept with
/// `benches/cpu_kernels` (BENCHMARKS.md): 2 KiB 25, 6–8 KiB 27–28, 16 KiB 27–29 GB/s.
const ROWS4_PREFETCH_AHEAD: usize = 8192;

/// Asks for the cache line at `p` (a hint: never faults, even past the end of the weights).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn prefetch(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T0>(p.cast());
}

/// Asks for the cache line `PREFETCH_AHEAD` bytes after `p`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn prefetch_ahead(p: *const u8) {
    prefetch(p.wrapping_add(PREFETCH_AHEAD));
}

/// Horizontal sum of eight i32 lanes.
#[target_feature(enable = "avx2")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Horizontal sum of eight f32 lanes.
#[target_feature(enable = "avx2")]
unsafe fn hsum_f32(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Σ over 32 code bytes × four 32-byte activation slices (shifts 6, 4, 2, 0 when
/// `msb_first`, else 0, 2, 4, 6), as sixteen i16 partial sums, each at most 4·512 = 2048 in
/// magnitude (so up to 8 of them can be added before widening).
#[target_feature(enable = "avx2")]
unsafe fn crumbs_dot(codes: *const u8, q: *const i8, msb_first: bool) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at `codes` and 128 at `q`.
    unsafe {
        let mask = _mm256_set1_epi8(3);
        let b = _mm256_loadu_si256(codes.cast());
        let planes = [
            _mm256_and_si256(b, mask),
            _mm256_and_si256(_mm256_srli_epi16::<2>(b), mask),
            _mm256_and_si256(_mm256_srli_epi16::<4>(b), mask),
            _mm256_and_si256(_mm256_srli_epi16::<6>(b), mask),
        ];
        let mut sum16 = _mm256_setzero_si256();
        for (slice, plane) in (0..4).zip(if msb_first {
            [3, 2, 1, 0]
        } else {
            [0, 1, 2, 3]
        }) {
            let qv = _mm256_loadu_si256(q.add(32 * slice).cast());
            // codes are 0..=2 and |q| <= 128, so each i16 pair sum is at most 512 and the
            // sum of four stays far below i16::MAX.
            sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(planes[plane], qv));
        }
        sum16
    }
}

/// Widens sixteen i16 partial sums to eight i32 ones.
#[target_feature(enable = "avx2")]
unsafe fn widen(sum16: __m256i) -> __m256i {
    _mm256_madd_epi16(sum16, _mm256_set1_epi16(1))
}

/// AVX2 version of [`super::scalar::i2s_code_dot`].
///
/// # Safety
/// The CPU must support AVX2; `row.len() * 4 == q.len()` and `q.len() % 128 == 0`.
#[target_feature(enable = "avx2")]
pub unsafe fn i2s_code_dot(row: &[u8], q: &[i8]) -> i32 {
    debug_assert!(row.len() * 4 == q.len() && q.len() % I2S_GROUP == 0);
    let mut acc = _mm256_setzero_si256();
    let groups = q.len() / I2S_GROUP;
    // Eight groups' i16 sums stay within ±16384, so widen once per eight groups.
    for g0 in (0..groups).step_by(8) {
        let mut sum16 = _mm256_setzero_si256();
        for g in g0..(g0 + 8).min(groups) {
            if g % 2 == 0 {
                prefetch_ahead(row.as_ptr().wrapping_add(32 * g));
            }
            // SAFETY: group g covers bytes [32g, 32g+32) of row and [128g, 128g+128) of q.
            sum16 = _mm256_add_epi16(sum16, unsafe {
                crumbs_dot(
                    row.as_ptr().add(32 * g),
                    q.as_ptr().add(I2S_GROUP * g),
                    true,
                )
            });
        }
        acc = _mm256_add_epi32(acc, widen(sum16));
    }
    hsum_i32(acc)
}

/// [`i2s_code_dot`] of four consecutive rows (`rows` holds all four) against one token
/// (decode): four independent chains keep the core busy while loads wait on memory, and one
/// horizontal reduction serves all four. Bit-identical to four single dots.
///
/// # Safety
/// The CPU must support AVX2; `rows.len() == q.len()` (four rows of `q.len() / 4` code bytes)
/// and `q.len() % 128 == 0`.
#[target_feature(enable = "avx2")]
pub unsafe fn i2s_code_dot_rows4(rows: &[u8], q: &[i8]) -> [i32; 4] {
    debug_assert!(rows.len() == q.len() && q.len() % I2S_GROUP == 0);
    let row_bytes = rows.len() / 4;
    let mut acc = [_mm256_setzero_si256(); 4];
    let groups = q.len() / I2S_GROUP;
    for g0 in (0..groups).step_by(8) {
        let mut sum16 = [_mm256_setzero_si256(); 4];
        for g in g0..(g0 + 8).min(groups) {
            // The four rows are read as one stream of 128 bytes per group: ask for the two
            // lines `ROWS4_PREFETCH_AHEAD` ahead of that stream (the next rows near the end).
            let ahead = rows.as_ptr().wrapping_add(ROWS4_PREFETCH_AHEAD + 128 * g);
            prefetch(ahead);
            prefetch(ahead.wrapping_add(64));
            for (k, s) in sum16.iter_mut().enumerate() {
                // SAFETY: group g covers bytes [32g, 32g+32) of row k and [128g, 128g+128)
                // of q.
                *s = _mm256_add_epi16(*s, unsafe {
                    crumbs_dot(
                        rows.as_ptr().add(k * row_bytes + 32 * g),
                        q.as_ptr().add(I2S_GROUP * g),
                        true,
                    )
                });
            }
        }
        for (a, s) in acc.iter_mut().zip(sum16) {
            *a = _mm256_add_epi32(*a, widen(s));
        }
    }
    hsum_i32_x4(acc)
}

/// The horizontal sums of four vectors of eight i32 lanes.
#[target_feature(enable = "avx2")]
unsafe fn hsum_i32_x4(v: [__m256i; 4]) -> [i32; 4] {
    // Pairwise sums within each 128-bit half: lanes end as [Σv0, Σv1, Σv2, Σv3] per half.
    let s = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    let mut out = [0i32; 4];
    // SAFETY: `out` holds exactly 16 bytes; storeu has no alignment needs.
    unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), s) };
    out
}

/// Σ code·q of one I2_S row against four token rows at once: each group's codes are unpacked
/// once and reused for all four tokens (prefill).
///
/// # Safety
/// The CPU must support AVX2; every `q` has `row.len() * 4` values, a multiple of 128.
#[target_feature(enable = "avx2")]
pub unsafe fn i2s_code_dot_x4(row: &[u8], q: [&[i8]; 4]) -> [i32; 4] {
    debug_assert!(q
        .iter()
        .all(|q| q.len() == row.len() * 4 && q.len() % I2S_GROUP == 0));
    let mask = _mm256_set1_epi8(3);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_si256(); 4];
    for g in 0..row.len() / 32 {
        // SAFETY: group g covers bytes [32g, 32g+32) of row and [128g, 128g+128) of each q.
        unsafe {
            let b = _mm256_loadu_si256(row.as_ptr().add(32 * g).cast());
            // MSB-first: activation slice 0 pairs with bits 7-6, slice 3 with bits 1-0.
            let planes = [
                _mm256_and_si256(_mm256_srli_epi16::<6>(b), mask),
                _mm256_and_si256(_mm256_srli_epi16::<4>(b), mask),
                _mm256_and_si256(_mm256_srli_epi16::<2>(b), mask),
                _mm256_and_si256(b, mask),
            ];
            for (a, qt) in acc.iter_mut().zip(q) {
                let base = qt.as_ptr().add(I2S_GROUP * g);
                let mut sum16 = _mm256_maddubs_epi16(planes[0], _mm256_loadu_si256(base.cast()));
                for (slice, plane) in planes.iter().enumerate().skip(1) {
                    sum16 = _mm256_add_epi16(
                        sum16,
                        _mm256_maddubs_epi16(
                            *plane,
                            _mm256_loadu_si256(base.add(32 * slice).cast()),
                        ),
                    );
                }
                *a = _mm256_add_epi32(*a, _mm256_madd_epi16(sum16, ones));
            }
        }
    }
    acc.map(|a| hsum_i32(a))
}

/// Σ code·q of one 256-element TQ2_0 block (LSB-first crumbs) against 256 activations.
#[target_feature(enable = "avx2")]
unsafe fn tq2_0_block_codes_q(codes: *const u8, q: *const i8) -> i32 {
    // SAFETY: the caller guarantees 64 code bytes and 256 activations.
    unsafe {
        let h0 = crumbs_dot(codes, q, false);
        let h1 = crumbs_dot(codes.add(32), q.add(128), false);
        hsum_i32(widen(_mm256_add_epi16(h0, h1)))
    }
}

/// The f16 scale stored at the end of a TQ2_0 block.
#[target_feature(enable = "f16c")]
unsafe fn tq2_0_scale(blk: &[u8]) -> f32 {
    let bits = i32::from(u16::from_le_bytes([blk[64], blk[65]]));
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
}

/// AVX2 version of [`super::scalar::tq2_0_dot`]; bit-identical result.
///
/// # Safety
/// The CPU must support AVX2 and F16C; `row` holds `act.len()` TQ2_0 blocks.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn tq2_0_dot(row: &[u8], act: &[Q8KBlock]) -> f32 {
    debug_assert!(row.len() == act.len() * TQ2_0_BLOCK_BYTES);
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(TQ2_0_BLOCK_BYTES).zip(act) {
        // SAFETY: the block holds 64 code bytes; `a` holds 256 activations.
        let codes_q = unsafe { tq2_0_block_codes_q(blk.as_ptr(), a.qs.as_ptr()) };
        acc += (codes_q - a.sum) as f32 * (a.d * tq2_0_scale(blk));
    }
    acc
}

/// [`tq2_0_dot`] of one row against four token rows (prefill): each block's codes are
/// unpacked once for all four, and the four tokens' float steps run one per lane, each the
/// scalar path's own. Bit-identical to four single dots.
///
/// # Safety
/// As for [`tq2_0_dot`], for each of the four activation rows.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn tq2_0_dot_x4(row: &[u8], act: [&[Q8KBlock]; 4]) -> [f32; 4] {
    let mask = _mm256_set1_epi8(3);
    let mut acc = _mm_setzero_ps();
    for (b, blk) in row.chunks_exact(TQ2_0_BLOCK_BYTES).enumerate() {
        let a: [&Q8KBlock; 4] = std::array::from_fn(|t| &act[t][b]);
        let mut sum16 = [_mm256_setzero_si256(); 4];
        for half in 0..2 {
            // SAFETY: the block holds 64 code bytes; every `a` holds 256 activations.
            unsafe {
                let codes = _mm256_loadu_si256(blk.as_ptr().add(32 * half).cast());
                // LSB-first: activation slice s pairs with bits 2s, 2s+1.
                let planes = [
                    _mm256_and_si256(codes, mask),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(codes), mask),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(codes), mask),
                    _mm256_and_si256(_mm256_srli_epi16::<6>(codes), mask),
                ];
                for (sum, a) in sum16.iter_mut().zip(a) {
                    let q = a.qs.as_ptr().add(128 * half);
                    for (slice, plane) in planes.iter().enumerate() {
                        let qv = _mm256_loadu_si256(q.add(32 * slice).cast());
                        *sum = _mm256_add_epi16(*sum, _mm256_maddubs_epi16(*plane, qv));
                    }
                }
            }
        }
        let codes_q = _mm_loadu_si128(hsum_i32_x4(sum16.map(|s| widen(s))).as_ptr().cast());
        let sumi = _mm_sub_epi32(
            codes_q,
            _mm_setr_epi32(a[0].sum, a[1].sum, a[2].sum, a[3].sum),
        );
        let d = _mm_mul_ps(
            _mm_setr_ps(a[0].d, a[1].d, a[2].d, a[3].d),
            _mm_set1_ps(tq2_0_scale(blk)),
        );
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(sumi), d));
    }
    let mut out = [0.0f32; 4];
    // SAFETY: `out` holds exactly four floats.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
    out
}

/// [`tq2_0_dot`] of four consecutive rows (`rows` holds all four) against one token
/// (decode). Per row and block the integer sum is exact and the float steps are the scalar
/// path's own, one row per lane, so every result is bit-identical to [`tq2_0_dot`].
///
/// # Safety
/// The CPU must support AVX2 and F16C; `rows` holds four rows of `act.len()` TQ2_0 blocks.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn tq2_0_dot_rows4(rows: &[u8], act: &[Q8KBlock]) -> [f32; 4] {
    debug_assert!(rows.len() == 4 * act.len() * TQ2_0_BLOCK_BYTES);
    let row_bytes = rows.len() / 4;
    let p = rows.as_ptr();
    let mut acc = _mm_setzero_ps();
    for (b, a) in act.iter().enumerate() {
        let at = b * TQ2_0_BLOCK_BYTES;
        // The four rows are read as one stream of 264 bytes per block.
        let ahead = p.wrapping_add(ROWS4_PREFETCH_AHEAD + 4 * at);
        for line in 0..5 {
            prefetch(ahead.wrapping_add(64 * line));
        }
        let mut sums = [_mm256_setzero_si256(); 4];
        let mut scales = [0u16; 4];
        for (k, (sum, scale)) in sums.iter_mut().zip(&mut scales).enumerate() {
            // SAFETY: block b of row k is the 66 bytes at k·row_bytes + 66b; `a` holds 256
            // activations.
            unsafe {
                let blk = p.add(k * row_bytes + at);
                let h0 = crumbs_dot(blk, a.qs.as_ptr(), false);
                let h1 = crumbs_dot(blk.add(32), a.qs.as_ptr().add(128), false);
                *sum = widen(_mm256_add_epi16(h0, h1));
                *scale = u16::from_le_bytes([*blk.add(64), *blk.add(65)]);
            }
        }
        let codes_q = _mm_loadu_si128(hsum_i32_x4(sums).as_ptr().cast());
        let sumi = _mm_sub_epi32(codes_q, _mm_set1_epi32(a.sum));
        let dw = _mm_cvtph_ps(_mm_loadu_si64(scales.as_ptr().cast()));
        let d = _mm_mul_ps(_mm_set1_ps(a.d), dw);
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(sumi), d));
    }
    let mut out = [0.0f32; 4];
    // SAFETY: `out` holds exactly four floats.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
    out
}

/// AVX2 version of [`super::scalar::q8_0_dot`]: exact integer block sums, f32 accumulation
/// in eight lanes (summation order differs from the scalar path).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `row` holds `act.len()` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0_dot(row: &[u8], act: &[Q8_0Block]) -> f32 {
    debug_assert!(row.len() == act.len() * Q8_0_BLOCK_BYTES);
    // Four accumulators, one per block of a group of four: a single one would chain every
    // block's FMA on the previous one's latency (the head's 80 blocks a row, 128 256 rows).
    let mut acc = [_mm256_setzero_ps(); 4];
    let groups = row
        .chunks_exact(4 * Q8_0_BLOCK_BYTES)
        .zip(act.chunks_exact(4));
    let done = groups.len() * 4;
    for (blks, acts) in groups {
        // SAFETY: a prefetch hint never faults.
        unsafe {
            prefetch_ahead(blks.as_ptr());
            prefetch_ahead(blks.as_ptr().wrapping_add(64));
            prefetch_ahead(blks.as_ptr().wrapping_add(128));
        }
        for (k, lane) in acc.iter_mut().enumerate() {
            let blk = &blks[k * Q8_0_BLOCK_BYTES..(k + 1) * Q8_0_BLOCK_BYTES];
            // SAFETY: the CPU has AVX2/FMA/F16C (this function's contract).
            *lane = unsafe { q8_0_block_fma(blk, &acts[k], *lane) };
        }
    }
    let tail = row[done * Q8_0_BLOCK_BYTES..]
        .chunks_exact(Q8_0_BLOCK_BYTES)
        .zip(&act[done..]);
    for (blk, a) in tail {
        // SAFETY: as above.
        acc[0] = unsafe { q8_0_block_fma(blk, a, acc[0]) };
    }
    hsum_f32(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ))
}

/// `acc + d_w·d_a · (w · q)` lane-wise for one Q8_0 block pair.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_block_fma(blk: &[u8], a: &Q8_0Block, acc: __m256) -> __m256 {
    let ones = _mm256_set1_epi16(1);
    // SAFETY: a block is 2 scale bytes + 32 weights; `a.qs` holds 32 activations.
    unsafe {
        let w = _mm256_loadu_si256(blk.as_ptr().add(2).cast());
        let x = _mm256_loadu_si256(a.qs.as_ptr().cast());
        // |w| · (x · sign w): maddubs needs one unsigned operand. Activations never hold
        // −128 (|q| ≤ 127), so a pair sum stays below i16::MAX.
        let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        let p32 = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
            u16::from_le_bytes([blk[0], blk[1]]),
        ))));
        _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d), p32, acc)
    }
}

/// Byte-shuffle controls that spread the int8 scales of quadrant `4h + k` of a Q6_K block
/// (sub-blocks `8h + 2k` and `8h + 2k + 1`) over eight lanes each.
const Q6_K_SCALE_SPREAD: [[i8; 16]; 8] = {
    let mut ctrl = [[0i8; 16]; 8];
    let mut quadrant = 0;
    while quadrant < 8 {
        let mut i = 0;
        while i < 16 {
            ctrl[quadrant][i] = (2 * quadrant + i / 8) as i8;
            i += 1;
        }
        quadrant += 1;
    }
    ctrl
};

/// AVX2 version of [`super::scalar::q6_k_dot`]; bit-identical result (the integer block sums
/// are exact and the float accumulation is the same).
///
/// # Safety
/// The CPU must support AVX2 and F16C; `row` holds `act.len()` Q6_K blocks.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn q6_k_dot(row: &[u8], act: &[Q8KBlock]) -> f32 {
    debug_assert!(row.len() == act.len() * Q6_K_BLOCK_BYTES);
    let low4 = _mm256_set1_epi8(0x0F);
    let high2 = _mm256_set1_epi8(0x30);
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(Q6_K_BLOCK_BYTES).zip(act) {
        // SAFETY: a block is 210 bytes (ql 0..128, qh 128..192, scales 192..208, d 208..210)
        // and `a` holds 256 activations and 16 partial sums.
        unsafe {
            let p = blk.as_ptr();
            for line in (0..Q6_K_BLOCK_BYTES).step_by(64) {
                prefetch_ahead(p.wrapping_add(line));
            }
            let q = a.qs.as_ptr();
            let scales = _mm_loadu_si128(p.add(Q6_K_SCALES).cast());
            let mut sum = _mm256_setzero_si256();
            for h in 0..2 {
                let ql0 = _mm256_loadu_si256(p.add(64 * h).cast());
                let ql1 = _mm256_loadu_si256(p.add(64 * h + 32).cast());
                let qh = _mm256_loadu_si256(p.add(Q6_K_QH + 32 * h).cast());
                // Quadrant k: low nibbles of ql0, ql1, then high nibbles; qh bits 2k, 2k+1
                // moved to bits 4-5.
                let codes = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, low4),
                        _mm256_and_si256(_mm256_slli_epi16::<4>(qh), high2),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, low4),
                        _mm256_and_si256(_mm256_slli_epi16::<2>(qh), high2),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4),
                        _mm256_and_si256(qh, high2),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(qh), high2),
                    ),
                ];
                for (k, c) in codes.into_iter().enumerate() {
                    let x = _mm256_loadu_si256(q.add(128 * h + 32 * k).cast());
                    // codes 0..63 × |q| ≤ 127: pair sums ≤ 16 002, inside i16.
                    let p16 = _mm256_maddubs_epi16(c, x);
                    let ctrl = _mm_loadu_si128(Q6_K_SCALE_SPREAD[4 * h + k].as_ptr().cast());
                    let sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, ctrl));
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p16, sc));
                }
            }
            // Σ (code − 32)·q·scale = Σ code·q·scale − 32 · Σ_sub-blocks scale · Σq.
            let bsums = _mm256_loadu_si256(a.bsums.as_ptr().cast());
            let offset = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales), bsums);
            let sumi = hsum_i32(_mm256_sub_epi32(sum, _mm256_slli_epi32::<5>(offset)));
            let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
                u16::from_le_bytes([blk[Q6_K_D], blk[Q6_K_D + 1]]),
            ))));
            acc += sumi as f32 * (d * a.d);
        }
    }
    acc
}

/// AVX2/FMA version of [`super::scalar::f32_dot`].
///
/// # Safety
/// The CPU must support AVX2 and FMA; `row.len() == 4 * x.len()`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn f32_dot(row: &[u8], x: &[f32]) -> f32 {
    debug_assert!(row.len() == 4 * x.len());
    // SAFETY: the row holds x.len() floats (loads are unaligned, so any byte address works).
    unsafe { dot_at(row.as_ptr().cast(), x) }
}

/// AVX2/FMA version of [`super::scalar::dot`].
///
/// # Safety
/// The CPU must support AVX2 and FMA; `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert!(a.len() == b.len());
    // SAFETY: `a` holds b.len() floats.
    unsafe { dot_at(a.as_ptr(), b) }
}

/// Σ w[i]·x[i] for the `x.len()` floats at `w`, in four eight-lane accumulators.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `x.len()` floats are readable at `w`.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_at(w: *const f32, x: &[f32]) -> f32 {
    let n = x.len();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every load reads inside [0, n) of both; loadu has no alignment needs.
    unsafe {
        while i + 32 <= n {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(
                    _mm256_loadu_ps(w.add(i + 8 * j)),
                    _mm256_loadu_ps(x.as_ptr().add(i + 8 * j)),
                    *a,
                );
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(w.add(i)),
                _mm256_loadu_ps(x.as_ptr().add(i)),
                acc[0],
            );
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let tail: f32 = (i..n).map(|k| w.add(k).read_unaligned() * x[k]).sum();
        hsum_f32(v) + tail
    }
}

/// AVX2/FMA version of [`super::scalar::scores`]: four keys per pass share each load of the
/// query and one horizontal reduction (summation order differs from the scalar path).
///
/// # Safety
/// The CPU must support AVX2 and FMA; `k` holds `(out.len() − 1)·stride + q.len()` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn scores(q: &[f32], k: &[f32], stride: usize, out: &mut [f32]) {
    let hd = q.len();
    debug_assert!(out.is_empty() || k.len() >= (out.len() - 1) * stride + hd);
    let vec_end = hd / 8 * 8;
    let mut j = 0;
    while j + 4 <= out.len() {
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in (0..vec_end).step_by(8) {
            // SAFETY: key j + r covers [(j + r)·stride, (j + r)·stride + hd) of k, i + 8 <= hd.
            unsafe {
                let qv = _mm256_loadu_ps(q.as_ptr().add(i));
                for (r, a) in acc.iter_mut().enumerate() {
                    let kv = _mm256_loadu_ps(k.as_ptr().add((j + r) * stride + i));
                    *a = _mm256_fmadd_ps(qv, kv, *a);
                }
            }
        }
        let sums = hsum_f32_x4(acc);
        for (r, s) in sums.into_iter().enumerate() {
            let key = &k[(j + r) * stride..][..hd];
            let tail: f32 = (vec_end..hd).map(|i| q[i] * key[i]).sum();
            out[j + r] = s + tail;
        }
        j += 4;
    }
    for (jj, o) in out.iter_mut().enumerate().skip(j) {
        // SAFETY: as above for one key.
        *o = unsafe { dot(q, &k[jj * stride..][..hd]) };
    }
}

/// The horizontal sums of four vectors of eight f32 lanes.
#[target_feature(enable = "avx2")]
unsafe fn hsum_f32_x4(v: [__m256; 4]) -> [f32; 4] {
    // Pairwise sums within each 128-bit half: lanes end as [Σv0, Σv1, Σv2, Σv3] per half.
    let s = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
    let mut out = [0.0f32; 4];
    // SAFETY: `out` holds exactly four floats; storeu has no alignment needs.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), s) };
    out
}

/// AVX2/FMA version of [`super::scalar::weighted_sum`]: 64 output dims at a time stay in eight
/// registers for the whole pass over the values (one FMA rounding per term instead of two).
///
/// # Safety
/// The CPU must support AVX2 and FMA; `v` holds `(p.len() − 1)·stride + out.len()` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn weighted_sum(p: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
    let hd = out.len();
    debug_assert!(p.is_empty() || v.len() >= (p.len() - 1) * stride + hd);
    let mut d0 = 0;
    while d0 < hd / 8 * 8 {
        let width = ((hd / 8 * 8 - d0) / 8).min(8);
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, &pj) in p.iter().enumerate() {
            let pv = _mm256_set1_ps(pj);
            for (c, a) in acc.iter_mut().enumerate().take(width) {
                // SAFETY: value j covers [j·stride, j·stride + hd) of v; d0 + 8c + 8 <= hd.
                let x = unsafe { _mm256_loadu_ps(v.as_ptr().add(j * stride + d0 + 8 * c)) };
                *a = _mm256_fmadd_ps(pv, x, *a);
            }
        }
        for (c, a) in acc.iter().enumerate().take(width) {
            // SAFETY: d0 + 8c + 8 <= hd = out.len().
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(d0 + 8 * c), *a) };
        }
        d0 += 8 * width;
    }
    for (d, o) in out.iter_mut().enumerate().skip(d0) {
        *o = p
            .iter()
            .enumerate()
            .fold(0.0, |acc, (j, &pj)| pj.mul_add(v[j * stride + d], acc));
    }
}

/// Eight f16 values at `p` widened to f32.
#[target_feature(enable = "avx2,f16c")]
unsafe fn load_f16x8(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 16 readable bytes at `p`.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
}

/// AVX2/FMA/F16C version of [`super::scalar::f16_dot`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `row.len() == 2 * x.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_dot(row: &[u8], x: &[f32]) -> f32 {
    debug_assert!(row.len() == 2 * x.len());
    let n = x.len();
    let w = row.as_ptr();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every load reads 8 halves / 8 floats inside [0, n).
    unsafe {
        while i + 32 <= n {
            prefetch_ahead(w.wrapping_add(2 * i));
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(
                    load_f16x8(w.add(2 * (i + 8 * j))),
                    _mm256_loadu_ps(x.as_ptr().add(i + 8 * j)),
                    *a,
                );
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(
                load_f16x8(w.add(2 * i)),
                _mm256_loadu_ps(x.as_ptr().add(i)),
                acc[0],
            );
            i += 8;
        }
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    hsum_f32(v) + super::scalar::f16_dot(&row[2 * i..], &x[i..])
}
