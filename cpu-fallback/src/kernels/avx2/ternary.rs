//! Ternary rows: bitnet.cpp's I2_S against per-row int8 activations, and ggml's TQ2_0 and
//! TQ1_0 against Q8_K blocks. Integer sums are exact; every result is bit-identical to the
//! scalar path's.

use std::arch::x86_64::*;

use hesper_engine::formats::{I2S_GROUP, TQ1_0_BLOCK_BYTES, TQ2_0_BLOCK_BYTES};

use super::{hsum_i32, hsum_i32_x4, prefetch, prefetch_ahead, ROWS4_PREFETCH_AHEAD};
use crate::quant::Q8KBlock;

/// The four 2-bit planes of 32 code bytes: plane `s` holds bits `2s..2s + 2` of every byte.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn crumb_planes(b: __m256i) -> [__m256i; 4] {
    let mask = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(b, mask),
        _mm256_and_si256(_mm256_srli_epi16::<2>(b), mask),
        _mm256_and_si256(_mm256_srli_epi16::<4>(b), mask),
        _mm256_and_si256(_mm256_srli_epi16::<6>(b), mask),
    ]
}

/// Σ over 32 I2_S code bytes × four 32-byte activation slices (MSB-first: slice 0 pairs with
/// bits 7-6, slice 3 with bits 1-0), as sixteen i16 partial sums, each at most 4·512 = 2048 in
/// magnitude (so up to 8 of them can be added before widening).
#[target_feature(enable = "avx2")]
unsafe fn crumbs_dot(codes: *const u8, q: *const i8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at `codes` and 128 at `q`.
    unsafe {
        let planes = crumb_planes(_mm256_loadu_si256(codes.cast()));
        let mut sum16 = _mm256_setzero_si256();
        for (slice, plane) in planes.iter().rev().enumerate() {
            let qv = _mm256_loadu_si256(q.add(32 * slice).cast());
            // codes are 0..=2 and |q| <= 128, so each i16 pair sum is at most 512 and the
            // sum of four stays far below i16::MAX.
            sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(*plane, qv));
        }
        sum16
    }
}

/// Widens sixteen i16 partial sums to eight i32 ones.
#[target_feature(enable = "avx2")]
unsafe fn widen(sum16: __m256i) -> __m256i {
    _mm256_madd_epi16(sum16, _mm256_set1_epi16(1))
}

/// How a variant adds Σ codes·q of up to eight 32-byte slices (codes unsigned 0..=2, q
/// signed) into eight i32 lanes: AVX2's `vpmaddubsw` chain or a VNNI `vpdpbusd` per slice.
/// Both are exact, so every variant's sums are equal.
pub trait BytePairs {
    /// `acc + Σ_s codes[s]·q[s]`, four bytes per i32 lane.
    ///
    /// # Safety
    /// The CPU runs the variant's instructions.
    unsafe fn dot<const N: usize>(acc: __m256i, codes: &[__m256i; N], q: &[__m256i; N]) -> __m256i;
}

/// AVX2: `vpmaddubsw` into i16 (each pair at most 2·2·128 = 512, eight slices 4096: exact),
/// one `vpmaddwd` to widen.
pub struct Maddubs;

impl BytePairs for Maddubs {
    #[inline(always)]
    unsafe fn dot<const N: usize>(acc: __m256i, codes: &[__m256i; N], q: &[__m256i; N]) -> __m256i {
        let mut sum16 = _mm256_setzero_si256();
        for s in 0..N {
            sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(codes[s], q[s]));
        }
        _mm256_add_epi32(acc, _mm256_madd_epi16(sum16, _mm256_set1_epi16(1)))
    }
}

/// `acc + Σ codes·q` with the `vpdpbusd` intrinsic `$dpbusd` in two chains, even and odd
/// slices, added at the end: one chain of eight would wait on the instruction's latency. (A
/// macro, not a function taking a closure: a closure the compiler does not inline would call
/// each intrinsic out of line.)
macro_rules! two_chains {
    ($acc:expr, $codes:expr, $q:expr, $dpbusd:ident) => {{
        let (codes, q) = ($codes, $q);
        let mut chains = [$acc, _mm256_setzero_si256()];
        for s in 0..codes.len() {
            chains[s % 2] = $dpbusd(chains[s % 2], codes[s], q[s]);
        }
        _mm256_add_epi32(chains[0], chains[1])
    }};
}

/// AVX-512 VNNI's 256-bit (EVEX) `vpdpbusd`.
pub struct Vnni256;

impl BytePairs for Vnni256 {
    #[inline(always)]
    unsafe fn dot<const N: usize>(acc: __m256i, codes: &[__m256i; N], q: &[__m256i; N]) -> __m256i {
        two_chains!(acc, codes, q, _mm256_dpbusd_epi32)
    }
}

/// AVX-VNNI's (VEX) `vpdpbusd`.
pub struct AvxVnni;

impl BytePairs for AvxVnni {
    #[inline(always)]
    unsafe fn dot<const N: usize>(acc: __m256i, codes: &[__m256i; N], q: &[__m256i; N]) -> __m256i {
        two_chains!(acc, codes, q, _mm256_dpbusd_avx_epi32)
    }
}

/// AVX2 version of [`crate::kernels::scalar::i2s_code_dot`].
///
/// # Safety
/// The CPU must support AVX2; `row.len() * 4 == q.len()` and `q.len() % 128 == 0`.
#[target_feature(enable = "avx2")]
pub unsafe fn i2s_code_dot(row: &[u8], q: &[i8]) -> i32 {
    debug_assert!(row.len() * 4 == q.len() && q.len().is_multiple_of(I2S_GROUP));
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
                crumbs_dot(row.as_ptr().add(32 * g), q.as_ptr().add(I2S_GROUP * g))
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
    debug_assert!(rows.len() == q.len() && q.len().is_multiple_of(I2S_GROUP));
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

/// Σ code·q of one I2_S row against four token rows at once: each group's codes are unpacked
/// once and reused for all four tokens (prefill); `P` adds the byte products.
///
/// # Safety
/// The CPU runs AVX2 and `P`'s instructions; every `q` has `row.len() * 4` values, a multiple
/// of 128.
#[inline(always)]
pub unsafe fn i2s_code_dot_x4<P: BytePairs>(row: &[u8], q: [&[i8]; 4]) -> [i32; 4] {
    debug_assert!(q
        .iter()
        .all(|q| q.len() == row.len() * 4 && q.len() % I2S_GROUP == 0));
    let mut acc = [_mm256_setzero_si256(); 4];
    for g in 0..row.len() / 32 {
        // SAFETY: group g covers bytes [32g, 32g+32) of row and [128g, 128g+128) of each q.
        unsafe {
            // MSB-first: activation slice 0 pairs with bits 7-6, slice 3 with bits 1-0.
            let mut planes = crumb_planes(_mm256_loadu_si256(row.as_ptr().add(32 * g).cast()));
            planes.reverse();
            for (a, qt) in acc.iter_mut().zip(q) {
                let base = qt.as_ptr().add(I2S_GROUP * g);
                let mut qv = [_mm256_setzero_si256(); 4];
                for (s, v) in qv.iter_mut().enumerate() {
                    *v = _mm256_loadu_si256(base.add(32 * s).cast());
                }
                *a = P::dot(*a, &planes, &qv);
            }
        }
    }
    acc.map(|a| hsum_i32(a))
}

/// The 256 codes (0..=2, weight + 1) of one ggml ternary block as eight 32-byte slices, slice
/// `s` pairing with activations `32s..32s + 32`; `BYTES` names the layout (TQ2_0 or TQ1_0).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_codes<const BYTES: usize>(blk: *const u8) -> [__m256i; 8] {
    // SAFETY: the caller guarantees a whole block at `blk`.
    unsafe {
        if BYTES == TQ1_0_BLOCK_BYTES {
            tq1_0_codes(blk)
        } else {
            tq2_0_codes(blk)
        }
    }
}

/// TQ2_0: two 32-byte halves of LSB-first 2-bit codes; half `h`, bits `2s..2s + 2` pair with
/// activations `128h + 32s..`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn tq2_0_codes(blk: *const u8) -> [__m256i; 8] {
    // SAFETY: a TQ2_0 block starts with 64 code bytes.
    let halves = unsafe {
        [
            _mm256_loadu_si256(blk.cast()),
            _mm256_loadu_si256(blk.add(32).cast()),
        ]
    };
    let mut out = [_mm256_setzero_si256(); 8];
    for (h, b) in halves.into_iter().enumerate() {
        out[4 * h..4 * h + 4].copy_from_slice(&crumb_planes(b));
    }
    out
}

/// `3·q` in every byte, wrapping (ggml's TQ1_0 digit shift). It commutes with the `q − 128`
/// offset [`trit`] compares in: 3·(q − 128) ≡ 3·q − 128 (mod 256).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn times3(q: __m256i) -> __m256i {
    let mut t = _mm256_add_epi8(q, _mm256_add_epi8(q, q));
    // SAFETY: an empty template: only hides the value from LLVM.
    unsafe { std::arch::asm!("/* {0} */", inout(ymm_reg) t, options(pure, nomem, nostack)) };
    t
}

/// Bytes `q` moved to the signed domain `q − 128`, where [`trit`] compares.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn offset(q: __m256i) -> __m256i {
    _mm256_xor_si256(q, _mm256_set1_epi8(i8::MIN))
}

/// The ternary digit ggml reads from a byte `q` given as `q − 128`: `(3·q) >> 8`, i.e. 1 from
/// q = 86 and 2 from q = 171 (each true comparison is −1).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn trit(q_offset: __m256i) -> __m256i {
    // q > 85 is (q − 128) > −43; q > 170 is (q − 128) > 42.
    let from86 = _mm256_cmpgt_epi8(q_offset, _mm256_set1_epi8(-43));
    let from171 = _mm256_cmpgt_epi8(q_offset, _mm256_set1_epi8(42));
    _mm256_abs_epi8(_mm256_add_epi8(from86, from171))
}

/// TQ1_0: byte `m` of `qs[0..32]` times 3ⁿ holds element `32n + m`, byte `m` of `qs[32..48]`
/// times 3ⁿ element `160 + 16n + m`, byte `j` of `qh` times 3ⁿ element `240 + 4n + j`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn tq1_0_codes(blk: *const u8) -> [__m256i; 8] {
    let mut out = [_mm256_setzero_si256(); 8];
    // SAFETY: a TQ1_0 block is qs (48 bytes), qh (4 bytes), then the scale.
    unsafe {
        let mut q = offset(_mm256_loadu_si256(blk.cast()));
        for slice in out.iter_mut().take(5) {
            *slice = trit(q);
            q = times3(q);
        }
        // qs[32..48] in both halves; the high half one digit further: elements 160.. | 176..
        let w = offset(_mm256_broadcastsi128_si256(_mm_loadu_si128(
            blk.add(32).cast(),
        )));
        let pair = _mm256_blend_epi32::<0xF0>(w, times3(w));
        out[5] = trit(pair);
        let pair = times3(times3(pair));
        out[6] = trit(pair);
        // Last slice: qs[32..48]·81 (elements 224..240) | qh·1, ·3, ·9, ·27 (elements 240..256).
        let low = times3(times3(pair));
        let qh = i32::from_le_bytes(*blk.add(48).cast::<[u8; 4]>());
        let h1 = offset(_mm256_set1_epi32(qh));
        let h3 = times3(h1);
        let h9 = times3(h3);
        let h27 = times3(h9);
        let last = _mm256_blend_epi32::<0x10>(low, h1);
        let last = _mm256_blend_epi32::<0x20>(last, h3);
        let last = _mm256_blend_epi32::<0x40>(last, h9);
        out[7] = trit(_mm256_blend_epi32::<0x80>(last, h27));
    }
    out
}

/// One TQ1_0 block at `src` rewritten as the TQ2_0 block at `dst` (the same codes and scale):
/// [`tq1_0_codes`]' slice `s` (elements `32s..32s + 32`) goes to bits `2·(s % 4)` of the
/// 32 bytes of half `s / 4` (codes are at most 2, so a 16-bit shift keeps them in their byte).
///
/// # Safety
/// The CPU must support AVX2; `src` holds a TQ1_0 block and `dst` has room for a TQ2_0 block.
#[target_feature(enable = "avx2")]
pub unsafe fn tq1_0_as_tq2_0_block(src: *const u8, dst: *mut u8) {
    // SAFETY: the caller guarantees both blocks.
    unsafe {
        let codes = tq1_0_codes(src);
        for (h, four) in codes.chunks_exact(4).enumerate() {
            let b = _mm256_or_si256(
                _mm256_or_si256(four[0], _mm256_slli_epi16::<2>(four[1])),
                _mm256_or_si256(
                    _mm256_slli_epi16::<4>(four[2]),
                    _mm256_slli_epi16::<6>(four[3]),
                ),
            );
            _mm256_storeu_si256(dst.add(32 * h).cast(), b);
        }
        std::ptr::copy_nonoverlapping(
            src.add(TQ1_0_BLOCK_BYTES - 2),
            dst.add(TQ2_0_BLOCK_BYTES - 2),
            2,
        );
    }
}

/// Σ code·q of one block's codes against 256 activations, as eight i32 partial sums.
#[inline(always)]
unsafe fn codes_dot<P: BytePairs>(codes: &[__m256i; 8], q: *const i8) -> __m256i {
    // SAFETY: the caller runs `P`'s instructions and guarantees 256 activations at `q`.
    unsafe {
        let mut qv = [_mm256_setzero_si256(); 8];
        for (s, v) in qv.iter_mut().enumerate() {
            *v = _mm256_loadu_si256(q.add(32 * s).cast());
        }
        P::dot(_mm256_setzero_si256(), codes, &qv)
    }
}

/// The f16 scale in a ternary block's last two bytes.
#[inline]
#[target_feature(enable = "f16c")]
unsafe fn block_scale<const BYTES: usize>(blk: *const u8) -> f32 {
    // SAFETY: the caller guarantees a whole block at `blk`.
    let bits = unsafe { u16::from_le_bytes([*blk.add(BYTES - 2), *blk.add(BYTES - 1)]) };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// AVX2 version of [`crate::kernels::scalar::tq2_0_dot`] and `tq1_0_dot` (`BYTES` is the
/// layout's block size): per block the exact Σ(code − 1)·q, then the scalar path's
/// `acc += sumi · (d_act · d_weight)`, so the result is bit-identical.
///
/// # Safety
/// The CPU must support AVX2 and F16C; `BYTES` is `TQ2_0_BLOCK_BYTES` or `TQ1_0_BLOCK_BYTES`
/// and `row` holds `act.len()` such blocks.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn ternary_dot<const BYTES: usize>(row: &[u8], act: &[Q8KBlock]) -> f32 {
    debug_assert!(row.len() == act.len() * BYTES);
    let mut acc = 0.0f32;
    for (blk, a) in row.chunks_exact(BYTES).zip(act) {
        // SAFETY: `blk` is a whole block; `a` holds 256 activations.
        unsafe {
            let p = blk.as_ptr();
            prefetch_ahead(p);
            prefetch_ahead(p.wrapping_add(BYTES - 1));
            let codes_q = hsum_i32(codes_dot::<Maddubs>(
                &block_codes::<BYTES>(p),
                a.qs.as_ptr(),
            ));
            acc += (codes_q - a.sum) as f32 * (a.d * block_scale::<BYTES>(p));
        }
    }
    acc
}

/// Four rows' (or tokens') `acc += (Σ lanes − offset) · d`, one per lane: the scalar path's
/// float steps, so each lane is bit-identical to it.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn ternary_step4(acc: __m128, sums: [__m256i; 4], offsets: __m128i, d: __m128) -> __m128 {
    let codes_q = hsum_i32_x4(sums);
    // SAFETY: `codes_q` holds four i32.
    let codes_q = unsafe { _mm_loadu_si128(codes_q.as_ptr().cast()) };
    let sumi = _mm_sub_epi32(codes_q, offsets);
    _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(sumi), d))
}

/// The four floats of `v`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn lanes(v: __m128) -> [f32; 4] {
    let mut out = [0.0f32; 4];
    // SAFETY: `out` holds exactly four floats.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// [`ternary_dot`] of one row against four token rows (prefill): each block's codes are
/// unpacked once for all four tokens; `P` adds the byte products. Bit-identical to four single
/// dots.
///
/// # Safety
/// As for [`ternary_dot`], for each of the four activation rows; the CPU also runs `P`'s
/// instructions.
#[inline(always)]
pub unsafe fn ternary_dot_x4<const BYTES: usize, P: BytePairs>(
    row: &[u8],
    act: [&[Q8KBlock]; 4],
) -> [f32; 4] {
    let mut acc = _mm_setzero_ps();
    for (b, blk) in row.chunks_exact(BYTES).enumerate() {
        let a: [&Q8KBlock; 4] = std::array::from_fn(|t| &act[t][b]);
        // SAFETY: `blk` is a whole block; every `a` holds 256 activations.
        unsafe {
            let codes = block_codes::<BYTES>(blk.as_ptr());
            let mut sums = [_mm256_setzero_si256(); 4];
            for (sum, a) in sums.iter_mut().zip(a) {
                *sum = codes_dot::<P>(&codes, a.qs.as_ptr());
            }
            let offsets = _mm_setr_epi32(a[0].sum, a[1].sum, a[2].sum, a[3].sum);
            let d = _mm_mul_ps(
                _mm_setr_ps(a[0].d, a[1].d, a[2].d, a[3].d),
                _mm_set1_ps(block_scale::<BYTES>(blk.as_ptr())),
            );
            acc = ternary_step4(acc, sums, offsets, d);
        }
    }
    lanes(acc)
}

/// [`ternary_dot`] of four consecutive rows (`rows` holds all four) against one token
/// (decode), the four rows read as one stream; `P` adds the byte products. Bit-identical to
/// four single dots.
///
/// # Safety
/// As for [`ternary_dot`]; `rows` holds four rows of `act.len()` blocks; the CPU also runs
/// `P`'s instructions.
#[inline(always)]
pub unsafe fn ternary_dot_rows4<const BYTES: usize, P: BytePairs>(
    rows: &[u8],
    act: &[Q8KBlock],
) -> [f32; 4] {
    debug_assert!(rows.len() == 4 * act.len() * BYTES);
    let row_bytes = rows.len() / 4;
    let p = rows.as_ptr();
    let mut acc = _mm_setzero_ps();
    for (b, a) in act.iter().enumerate() {
        let at = b * BYTES;
        let ahead = p.wrapping_add(ROWS4_PREFETCH_AHEAD + 4 * at);
        for line in 0..(4 * BYTES).div_ceil(64) + 1 {
            prefetch(ahead.wrapping_add(64 * line));
        }
        // SAFETY: block b of row k is the BYTES bytes at k·row_bytes + b·BYTES; `a` holds 256
        // activations.
        unsafe {
            // Plain loops, not closures: each row's unpack and dot must inline here.
            let mut sums = [_mm256_setzero_si256(); 4];
            let mut scales = [0.0f32; 4];
            for k in 0..4 {
                let blk = p.add(k * row_bytes + at);
                sums[k] = codes_dot::<P>(&block_codes::<BYTES>(blk), a.qs.as_ptr());
                scales[k] = block_scale::<BYTES>(blk);
            }
            let d = _mm_mul_ps(_mm_set1_ps(a.d), _mm_loadu_ps(scales.as_ptr()));
            acc = ternary_step4(acc, sums, _mm_set1_epi32(a.sum), d);
        }
    }
    lanes(acc)
}

/// The four-token and four-row kernels compiled for one way of adding byte products.
macro_rules! four_token_kernels {
    ($i2s:ident, $ternary:ident, $rows4:ident, $pairs:ty, $features:literal, $what:literal) => {
        #[doc = concat!("[`i2s_code_dot_x4`] with ", $what, ".")]
        ///
        /// # Safety
        /// As for [`i2s_code_dot_x4`], on a CPU with these features.
        #[target_feature(enable = $features)]
        pub unsafe fn $i2s(row: &[u8], q: [&[i8]; 4]) -> [i32; 4] {
            // SAFETY: forwarded from the caller.
            unsafe { i2s_code_dot_x4::<$pairs>(row, q) }
        }

        #[doc = concat!("[`ternary_dot_x4`] with ", $what, ".")]
        ///
        /// # Safety
        /// As for [`ternary_dot_x4`], on a CPU with these features.
        #[target_feature(enable = $features)]
        pub unsafe fn $ternary<const BYTES: usize>(row: &[u8], act: [&[Q8KBlock]; 4]) -> [f32; 4] {
            // SAFETY: forwarded from the caller.
            unsafe { ternary_dot_x4::<BYTES, $pairs>(row, act) }
        }

        #[doc = concat!("[`ternary_dot_rows4`] with ", $what, ".")]
        ///
        /// # Safety
        /// As for [`ternary_dot_rows4`], on a CPU with these features.
        #[target_feature(enable = $features)]
        pub unsafe fn $rows4<const BYTES: usize>(rows: &[u8], act: &[Q8KBlock]) -> [f32; 4] {
            // SAFETY: forwarded from the caller.
            unsafe { ternary_dot_rows4::<BYTES, $pairs>(rows, act) }
        }
    };
}

four_token_kernels!(
    i2s_code_dot_x4_avx2,
    ternary_dot_x4_avx2,
    ternary_dot_rows4_avx2,
    Maddubs,
    "avx2,f16c",
    "AVX2's `vpmaddubsw`"
);
four_token_kernels!(
    i2s_code_dot_x4_vnni,
    ternary_dot_x4_vnni,
    ternary_dot_rows4_vnni,
    Vnni256,
    "avx2,f16c,avx512f,avx512vl,avx512vnni",
    "AVX-512 VNNI's 256-bit `vpdpbusd`"
);
four_token_kernels!(
    i2s_code_dot_x4_avxvnni,
    ternary_dot_x4_avxvnni,
    ternary_dot_rows4_avxvnni,
    AvxVnni,
    "avx2,f16c,avxvnni",
    "AVX-VNNI's `vpdpbusd`"
);
