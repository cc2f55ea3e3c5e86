//! Q4_0, Q4_K and Q5_K rows against their block-quantized activations: the exact integer
//! sums of each block in vector lanes, then the scalar path's float steps (lane by lane where
//! four rows run at once), so every result equals [`crate::kernels::scalar`]'s bit for bit.

use std::arch::x86_64::*;

use hesper_engine::formats::q4_k::{k_scales_mins, Q4_K_BLOCK_BYTES, Q4_K_QS};
use hesper_engine::formats::q5_k::{Q5_K_BLOCK_BYTES, Q5_K_QH, Q5_K_QS};
use hesper_engine::formats::{mxfp4_scale, MXFP4_BLOCK_BYTES, MXFP4_VALUES, Q4_0_BLOCK_BYTES};

use super::{hsum_i32, prefetch, prefetch_ahead, totals4, ROWS4_PREFETCH_AHEAD};
use crate::quant::{Q8KBlock, Q8_0Block};

/// AVX2 version of [`crate::kernels::scalar::q4_0_dot`]; bit-identical. Four blocks' integer
/// sums come out of one reduction, then are added to the total one after another.
///
/// # Safety
/// The CPU must support AVX2 and F16C; `row` holds `act.len()` Q4_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_0_dot(row: &[u8], act: &[Q8_0Block]) -> f32 {
    debug_assert!(row.len() == act.len() * Q4_0_BLOCK_BYTES);
    let mut acc = 0.0f32;
    let groups = row
        .chunks_exact(4 * Q4_0_BLOCK_BYTES)
        .zip(act.chunks_exact(4));
    let done = groups.len() * 4;
    for (blks, acts) in groups {
        // SAFETY: four whole blocks and their activations (the chunks above); a prefetch hint
        // never faults.
        unsafe {
            prefetch_ahead(blks.as_ptr());
            prefetch_ahead(blks.as_ptr().wrapping_add(64));
            // Plain calls, not a closure: a closure does not inherit the target features, and
            // each block's sum would be a call.
            let blk = |k: usize| &blks[k * Q4_0_BLOCK_BYTES..];
            let p = [
                q4_0_block_pairs(blk(0), &acts[0]),
                q4_0_block_pairs(blk(1), &acts[1]),
                q4_0_block_pairs(blk(2), &acts[2]),
                q4_0_block_pairs(blk(3), &acts[3]),
            ];
            let mut sumi = [0i32; 4];
            _mm_storeu_si128(sumi.as_mut_ptr().cast(), totals4(p));
            for (k, s) in sumi.into_iter().enumerate() {
                acc += s as f32 * (f16_at(blks.as_ptr().add(k * Q4_0_BLOCK_BYTES)) * acts[k].d);
            }
        }
    }
    let tail = row[done * Q4_0_BLOCK_BYTES..]
        .chunks_exact(Q4_0_BLOCK_BYTES)
        .zip(&act[done..]);
    for (blk, a) in tail {
        // SAFETY: a whole block and its activations.
        unsafe {
            let s = hsum_i32(q4_0_block_pairs(blk, a));
            acc += s as f32 * (f16_at(blk.as_ptr()) * a.d);
        }
    }
    acc
}

/// The f16 at `p` (little-endian, any alignment), widened.
///
/// # Safety
/// Two bytes must be readable at `p`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller's contract.
    let bits = unsafe { p.cast::<u16>().read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// Eight i32 lanes whose total is the Q4_0 block's Σ(code − 8)·q.
///
/// # Safety
/// `blk` holds a whole block (18 bytes).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q4_0_block_pairs(blk: &[u8], a: &Q8_0Block) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe { q4_0_pairs(q4_0_weights(blk), a) }
}

/// The 32 signed weights (code − 8) of a Q4_0 block: elements 0..16 (low nibbles) in the low
/// half, 16..32 (high nibbles) in the high one.
///
/// # Safety
/// `blk` holds a whole block (18 bytes).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q4_0_weights(blk: &[u8]) -> __m256i {
    debug_assert!(blk.len() >= Q4_0_BLOCK_BYTES);
    // SAFETY: the 16 nibble bytes follow the 2 scale bytes.
    let b = unsafe { _mm_loadu_si128(blk.as_ptr().add(2).cast()) };
    let codes = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16::<4>(b), b),
        _mm256_set1_epi8(0x0F),
    );
    _mm256_sub_epi8(codes, _mm256_set1_epi8(8))
}

/// Eight i32 lanes whose total is Σ w·q over one block's weights `w` (|w| ≤ 12: each pair of
/// products stays inside maddubs' i16) and activations.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q4_0_pairs(w: __m256i, a: &Q8_0Block) -> __m256i {
    // SAFETY: `a.qs` holds 32 activations.
    let x = unsafe { _mm256_loadu_si256(a.qs.as_ptr().cast()) };
    // |w| · (x · sign w): maddubs needs one unsigned operand.
    let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    _mm256_madd_epi16(p16, _mm256_set1_epi16(1))
}

/// [`q4_0_dot`] of one row against four tokens (prefill), each block unpacked once; each
/// result bit-identical to [`q4_0_dot`]'s.
///
/// # Safety
/// The CPU must support AVX2 and F16C; `row` holds as many Q4_0 blocks as each token.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_0_dot_x4(row: &[u8], act: [&[Q8_0Block]; 4]) -> [f32; 4] {
    assert!(act.iter().all(|a| row.len() == a.len() * Q4_0_BLOCK_BYTES));
    let mut acc = [0.0f32; 4];
    for (b, blk) in row.chunks_exact(Q4_0_BLOCK_BYTES).enumerate() {
        // SAFETY: a whole block; each token's block holds 32 activations.
        unsafe {
            let w = q4_0_weights(blk);
            let p = [
                q4_0_pairs(w, &act[0][b]),
                q4_0_pairs(w, &act[1][b]),
                q4_0_pairs(w, &act[2][b]),
                q4_0_pairs(w, &act[3][b]),
            ];
            let mut sumi = [0i32; 4];
            _mm_storeu_si128(sumi.as_mut_ptr().cast(), totals4(p));
            let d = f16_at(blk.as_ptr());
            for ((acc, s), a) in acc.iter_mut().zip(sumi).zip(act) {
                *acc += s as f32 * (d * a[b].d);
            }
        }
    }
    acc
}

/// [`q4_0_dot`] of four consecutive rows (`rows` holds all four) against one token (decode),
/// read as one stream; each row's float steps in its own lane, so each result is bit-identical
/// to [`q4_0_dot`]'s.
///
/// # Safety
/// The CPU must support AVX2 and F16C; `rows` holds four rows of `act.len()` Q4_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_0_dot_rows4(rows: &[u8], act: &[Q8_0Block]) -> [f32; 4] {
    assert!(rows.len() == 4 * act.len() * Q4_0_BLOCK_BYTES);
    let row_bytes = rows.len() / 4;
    let p = rows.as_ptr();
    let mut acc = _mm_setzero_ps();
    for (b, a) in act.iter().enumerate() {
        let at = b * Q4_0_BLOCK_BYTES;
        // The four rows' region swept four times as fast as one row's blocks advance.
        let ahead = p.wrapping_add(ROWS4_PREFETCH_AHEAD + 4 * at);
        // SAFETY: a prefetch hint never faults; block b of row k is the 18 bytes at
        // k·row_bytes + at, and `a` holds 32 activations.
        unsafe {
            prefetch(ahead);
            prefetch(ahead.wrapping_add(64));
            let blk = |k: usize| &rows[k * row_bytes + at..];
            let sums = [
                q4_0_block_pairs(blk(0), a),
                q4_0_block_pairs(blk(1), a),
                q4_0_block_pairs(blk(2), a),
                q4_0_block_pairs(blk(3), a),
            ];
            let d = [
                f16_at(p.add(at)),
                f16_at(p.add(row_bytes + at)),
                f16_at(p.add(2 * row_bytes + at)),
                f16_at(p.add(3 * row_bytes + at)),
            ];
            let scale = _mm_mul_ps(_mm_loadu_ps(d.as_ptr()), _mm_set1_ps(a.d));
            acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(totals4(sums)), scale));
        }
    }
    let mut out = [0.0f32; 4];
    // SAFETY: `out` holds exactly four floats.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
    out
}

/// Declares the public Q4_K and Q5_K kernels over the generic bodies below.
macro_rules! k_kernels {
    ($five:literal, $bytes:ident, $qs:ident, $dot:ident, $x4:ident, $rows4:ident, $name:literal) => {
        #[doc = concat!("AVX2 version of [`crate::kernels::scalar::", stringify!($dot), "`]; bit-identical.")]
        ///
        /// # Safety
        #[doc = concat!("The CPU must support AVX2 and F16C; `row` holds `act.len()` ", $name, " blocks.")]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $dot(row: &[u8], act: &[Q8KBlock]) -> f32 {
            // SAFETY: this function's contract.
            unsafe { k_dot::<$five, 1>(row, [act], $bytes, $qs)[0] }
        }

        #[doc = concat!("[`", stringify!($dot), "`] of one row against four tokens, each block unpacked once; each result bit-identical.")]
        ///
        /// # Safety
        #[doc = concat!("The CPU must support AVX2 and F16C; `row` holds as many ", $name, " blocks as each token.")]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $x4(row: &[u8], act: [&[Q8KBlock]; 4]) -> [f32; 4] {
            // SAFETY: this function's contract.
            unsafe { k_dot::<$five, 4>(row, act, $bytes, $qs) }
        }

        #[doc = concat!("[`", stringify!($dot), "`] of four consecutive rows (`rows` holds all four) against one token (decode), read as one stream; each result bit-identical.")]
        ///
        /// # Safety
        #[doc = concat!("The CPU must support AVX2 and F16C; `rows` holds four rows of `act.len()` ", $name, " blocks.")]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $rows4(rows: &[u8], act: &[Q8KBlock]) -> [f32; 4] {
            // SAFETY: this function's contract.
            unsafe { k_dot_rows4::<$five>(rows, act, $bytes, $qs) }
        }
    };
}

k_kernels!(
    false,
    Q4_K_BLOCK_BYTES,
    Q4_K_QS,
    q4_k_dot,
    q4_k_dot_x4,
    q4_k_dot_rows4,
    "Q4_K"
);
k_kernels!(
    true,
    Q5_K_BLOCK_BYTES,
    Q5_K_QS,
    q5_k_dot,
    q5_k_dot_x4,
    q5_k_dot_rows4,
    "Q5_K"
);

/// What one Q4_K or Q5_K block needs besides its codes: the eight sub-block scales, the
/// minimums spread over sixteen i16 lanes (each twice, beside the activations' sixteen partial
/// sums), and `d`, `dmin`.
struct BlockHead {
    scales: [u8; 8],
    mins: __m256i,
    d: f32,
    dmin: f32,
}

impl BlockHead {
    /// The head of the block at `blk`.
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn of(blk: &[u8]) -> Self {
        let (scales, mins) = k_scales_mins(blk);
        let m = _mm_loadl_epi64(mins.as_ptr().cast());
        // SAFETY: a block starts with d and dmin (two f16).
        let dd = unsafe { blk.as_ptr().cast::<i32>().read_unaligned() };
        let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(dd));
        Self {
            scales,
            mins: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m)),
            d: _mm_cvtss_f32(dd),
            dmin: _mm_cvtss_f32(_mm_movehdup_ps(dd)),
        }
    }
}

/// The body of the Q4_K (`FIVE` false) and Q5_K dots of one row against `T` tokens: blocks of
/// `block_bytes` whose nibbles start at `qs` (and, for Q5_K, whose fifth bits are at
/// `Q5_K_QH`), each block's codes unpacked once for every token.
///
/// # Safety
/// The CPU must support AVX2; `row` holds as many blocks of that layout as each token.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k_dot<const FIVE: bool, const T: usize>(
    row: &[u8],
    act: [&[Q8KBlock]; T],
    block_bytes: usize,
    qs: usize,
) -> [f32; T] {
    assert!(act.iter().all(|a| row.len() == a.len() * block_bytes));
    let mut acc = [0.0f32; T];
    for (b, blk) in row.chunks_exact(block_bytes).enumerate() {
        let p = blk.as_ptr();
        // SAFETY: a whole block; a prefetch hint never faults.
        let (head, codes) = unsafe {
            for line in (0..block_bytes).step_by(64) {
                prefetch_ahead(p.wrapping_add(line));
            }
            (
                BlockHead::of(blk),
                k_codes::<FIVE>(p.add(qs), p.add(Q5_K_QH)),
            )
        };
        for (acc, a) in acc.iter_mut().zip(act.map(|a| &a[b])) {
            // SAFETY: the activations hold 256 values and 16 partial sums.
            let (sumi, summ) = unsafe {
                let (s, m) = k_block_lanes(&codes, &head, a);
                (hsum_i32(s), hsum_i32(m))
            };
            *acc += (head.d * a.d) * sumi as f32 - (head.dmin * a.d) * summ as f32;
        }
    }
    acc
}

/// Four consecutive rows of Q4_K (`FIVE` false) or Q5_K blocks against one token: one
/// reduction for the four rows' sums, each row's float steps in its own lane (the scalar path's
/// operations, so each lane equals its single dot).
///
/// # Safety
/// The CPU must support AVX2 and F16C; `rows` holds four rows of `act.len()` blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k_dot_rows4<const FIVE: bool>(
    rows: &[u8],
    act: &[Q8KBlock],
    block_bytes: usize,
    qs: usize,
) -> [f32; 4] {
    assert!(rows.len() == 4 * act.len() * block_bytes);
    let row_bytes = rows.len() / 4;
    let p = rows.as_ptr();
    let mut acc = _mm_setzero_ps();
    for (b, a) in act.iter().enumerate() {
        let at = b * block_bytes;
        // The four rows' region swept four times as fast as one row's blocks advance.
        let ahead = p.wrapping_add(ROWS4_PREFETCH_AHEAD + 4 * at);
        for line in 0..(4 * block_bytes).div_ceil(64) {
            // SAFETY: a prefetch hint never faults.
            unsafe { prefetch(ahead.wrapping_add(64 * line)) };
        }
        let (mut s, mut m) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
        let (mut d, mut dmin) = ([0.0f32; 4], [0.0f32; 4]);
        for k in 0..4 {
            let blk = &rows[k * row_bytes + at..k * row_bytes + at + block_bytes];
            // SAFETY: a whole block; the activations hold 256 values and 16 partial sums.
            unsafe {
                let head = BlockHead::of(blk);
                let codes = k_codes::<FIVE>(blk.as_ptr().add(qs), blk.as_ptr().add(Q5_K_QH));
                (s[k], m[k]) = k_block_lanes(&codes, &head, a);
                (d[k], dmin[k]) = (head.d, head.dmin);
            }
        }
        // SAFETY: `d` and `dmin` hold four floats each.
        let (d, dmin) = unsafe { (_mm_loadu_ps(d.as_ptr()), _mm_loadu_ps(dmin.as_ptr())) };
        let ad = _mm_set1_ps(a.d);
        let sumi = _mm_mul_ps(_mm_mul_ps(d, ad), _mm_cvtepi32_ps(totals4(s)));
        let summ = _mm_mul_ps(_mm_mul_ps(dmin, ad), _mm_cvtepi32_ps(totals4(m)));
        acc = _mm_add_ps(acc, _mm_sub_ps(sumi, summ));
    }
    let mut out = [0.0f32; 4];
    // SAFETY: `out` holds exactly four floats.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
    out
}

/// The 256 codes of one Q4_K or Q5_K block as eight vectors of 32 bytes, sub-block by
/// sub-block.
///
/// # Safety
/// 128 nibble bytes must be readable at `qs` and, with `FIVE`, 32 bytes of fifth bits at `qh`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn k_codes<const FIVE: bool>(qs: *const u8, qh: *const u8) -> [__m256i; 8] {
    let low4 = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let mut codes = [_mm256_setzero_si256(); 8];
    // SAFETY: the caller's contract.
    unsafe {
        let mut high = if FIVE {
            _mm256_loadu_si256(qh.cast())
        } else {
            _mm256_setzero_si256()
        };
        for j in 0..4 {
            let b = _mm256_loadu_si256(qs.add(32 * j).cast());
            let mut lo = _mm256_and_si256(b, low4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(b), low4);
            if FIVE {
                // Bits 2j and 2j + 1 of each qh byte (shifted down to bits 0 and 1) → bit 4.
                lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(_mm256_and_si256(high, one)));
                let h1 = _mm256_and_si256(_mm256_srli_epi16::<1>(high), one);
                hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(h1));
                high = _mm256_srli_epi16::<2>(high);
            }
            codes[2 * j] = lo;
            codes[2 * j + 1] = hi;
        }
    }
    codes
}

/// Eight i32 lanes totalling one block's exact `Σ_s scale_s · Σ code·q`, and eight totalling
/// its `Σ_s min_s · Σ q` (what [`crate::kernels::scalar::k_mins_sum`] computes).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn k_block_lanes(
    codes: &[__m256i; 8],
    head: &BlockHead,
    a: &Q8KBlock,
) -> (__m256i, __m256i) {
    let q = a.qs.as_ptr();
    let mut sum = _mm256_setzero_si256();
    for (s, (&c, &sc)) in codes.iter().zip(&head.scales).enumerate() {
        // SAFETY: the activations hold 256 values.
        let x = unsafe { _mm256_loadu_si256(q.add(32 * s).cast()) };
        // Codes 0..=31 × |q| ≤ 127: pair sums ≤ 7 874, inside i16; times a scale ≤ 63.
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(c, x), _mm256_set1_epi16(i16::from(sc)));
        sum = _mm256_add_epi32(sum, p);
    }
    // SAFETY: sixteen i16 partial sums.
    let bsums = unsafe { _mm256_loadu_si256(a.bsums.as_ptr().cast()) };
    // Lane s: min_s · (bsums[2s] + bsums[2s + 1]) (|bsum| ≤ 16·127, min ≤ 63).
    (sum, _mm256_madd_epi16(bsums, head.mins))
}

/// The 32 doubled E2M1 values of an MXFP4 block, looked up from its nibbles: elements 0..16
/// (low nibbles) in the low half, 16..32 (high nibbles) in the high one.
///
/// # Safety
/// `blk` holds a whole block (17 bytes).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mxfp4_weights(blk: &[u8]) -> __m256i {
    debug_assert!(blk.len() >= MXFP4_BLOCK_BYTES);
    // SAFETY: the 16 nibble bytes follow the exponent byte; the table is 16 bytes.
    let (b, table) = unsafe {
        (
            _mm_loadu_si128(blk.as_ptr().add(1).cast()),
            _mm_loadu_si128(MXFP4_VALUES.as_ptr().cast()),
        )
    };
    let codes = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16::<4>(b), b),
        _mm256_set1_epi8(0x0F),
    );
    _mm256_shuffle_epi8(_mm256_set_m128i(table, table), codes)
}

/// AVX2 version of [`crate::kernels::scalar::mxfp4_dot`]; bit-identical.
///
/// # Safety
/// The CPU must support AVX2; `row` holds `act.len()` MXFP4 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mxfp4_dot(row: &[u8], act: &[Q8_0Block]) -> f32 {
    assert!(row.len() == act.len() * MXFP4_BLOCK_BYTES);
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(MXFP4_BLOCK_BYTES).zip(act) {
        // SAFETY: a whole block and its activations; a prefetch hint never faults.
        unsafe {
            prefetch_ahead(blk.as_ptr());
            let s = hsum_i32(q4_0_pairs(mxfp4_weights(blk), a));
            acc += s as f32 * (mxfp4_scale(blk[0]) * a.d);
        }
    }
    acc
}
