//! AVX-512 VNNI, AVX-VNNI and AVX2 kernels over Q8_0 weights interleaved sixteen rows deep
//! ([`crate::interleave_q8_0`]): sixteen rows × `T` tokens per pass, each 32-bit lane a row.
//!
//! Per block of 32 columns, eight `vpdpbusd` (offset weights unsigned, each activation dword
//! broadcast) give the sixteen rows' sums of `(w + 128)·q`; subtracting `128·Σq` leaves the
//! exact `Σ w·q`. The float step then runs on sixteen rows at once, as the scalar kernel
//! ([`crate::kernels::scalar::q8_0_dot`]) runs it on one: `acc += sumi · (d_w · d_a)`, a
//! product and a sum rounded in that order, block after block. Every row's result is the
//! scalar one bit for bit, whatever the number of tokens beside it.

use std::arch::x86_64::*;

use super::interleaved_q4_k::{AvxVnniDots, ByteDots};
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

/// One interleaved block's passes for `T` tokens (`T` the caller's const parameter): both halves
/// of the sixteen rows at once for one or two tokens, else each half for up to four tokens at a
/// time. `$pass::<H, U, T>(base, halves, act, t0, acc)` adds the block's float step for the `H`
/// halves and tokens `t0..t0 + U` into `acc[u][h]`.
macro_rules! halves_and_tokens {
    ($pass:ident, $base:expr, $act:expr, $acc:expr) => {
        match T {
            1 => $pass::<2, 1, T>($base, [0, 1], $act, 0, &mut $acc),
            2 => $pass::<2, 2, T>($base, [0, 1], $act, 0, &mut $acc),
            _ => {
                for h in 0..2 {
                    for t0 in (0..T).step_by(4) {
                        let acc = &mut $acc[t0..(t0 + 4).min(T)];
                        match acc.len() {
                            4 => $pass::<1, 4, T>($base, [h], $act, t0, acc),
                            3 => $pass::<1, 3, T>($base, [h], $act, t0, acc),
                            2 => $pass::<1, 2, T>($base, [h], $act, t0, acc),
                            _ => $pass::<1, 1, T>($base, [h], $act, t0, acc),
                        }
                    }
                }
            }
        }
    };
}
pub(crate) use halves_and_tokens;

/// [`q8_0_rows16_vnni512`] on AVX2 (any x86 variant without VNNI): the sixteen rows as two
/// halves of eight, one 256-bit register each. `vpmaddubsw` cannot take the offset weights
/// (their pairs of products would saturate 16 bits), so each tile's weights are made signed
/// again and multiplied as `|w| · (q with w's sign)` — at most 2 · 128 · 127 = 32 512 a pair,
/// with activations within ±127 as Q8_0's are — then widened by `vpmaddwd`: the exact
/// `Σ w·q`, with no offset to take off. Tokens go four at a time, one half of the rows at a
/// time; one or two tokens take both halves in one pass. The float step is
/// [`q8_0_rows16_vnni512`]'s, lane by lane: the bits are the scalar kernel's.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the shapes are those of [`q8_0_rows16_vnni512`]
/// (`bias` is not read).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0_rows16_avx2<const T: usize>(block: &[u8], xq: &[i32], d: &[f32]) -> [Rows16; T] {
    let blocks = d.len() / T;
    assert!(block.len() == blocks * BLOCK_BYTES && d.len() == blocks * T);
    assert!(xq.len() == 8 * d.len());
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..blocks {
        // SAFETY: the asserts above bound every read of block `b`: its 544 bytes, its 8·T
        // dwords and T scales.
        unsafe {
            let base = block.as_ptr().add(b * BLOCK_BYTES);
            if T == 1 {
                for line in (0..BLOCK_BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(4 * BLOCK_BYTES + line).cast());
                }
            }
            let act = (xq.as_ptr().add(8 * T * b), d.as_ptr().add(T * b));
            halves_and_tokens!(q8_0_pass_avx2, base, act, acc);
        }
    }
    super::interleaved_q4_k::rows16_out_avx2(acc)
}

/// The halves `hs` of one interleaved block at `base` times tokens `t0..t0 + U` of `T`, whose
/// block's dwords and scales start at `act`: adds the block's float step into `acc[u][h]`.
///
/// # Safety
/// As for [`q8_0_rows16_avx2`].
#[inline(always)]
unsafe fn q8_0_pass_avx2<const H: usize, const U: usize, const T: usize>(
    base: *const u8,
    hs: [usize; H],
    (x, d): (*const i32, *const f32),
    t0: usize,
    acc: &mut [[__m256; 2]],
) {
    let offset = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut sum = [[_mm256_setzero_si256(); U]; H];
    // SAFETY: the caller bounds the block's bytes and tokens t0..t0 + U of its activations.
    unsafe {
        for g in 0..8 {
            let xg: [__m256i; U] =
                std::array::from_fn(|u| _mm256_set1_epi32(*x.add(g * T + t0 + u)));
            for (i, &h) in hs.iter().enumerate() {
                let tile = _mm256_loadu_si256(base.add(SCALE_BYTES + 64 * g + 32 * h).cast());
                let w = _mm256_xor_si256(tile, offset);
                let magnitude = _mm256_abs_epi8(w);
                for u in 0..U {
                    let p = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xg[u], w));
                    sum[i][u] = _mm256_add_epi32(sum[i][u], _mm256_madd_epi16(p, ones));
                }
            }
        }
        for (i, &h) in hs.iter().enumerate() {
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(base.add(16 * h).cast()));
            for u in 0..U {
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*d.add(t0 + u)));
                let s = _mm256_cvtepi32_ps(sum[i][u]);
                acc[u][h] = _mm256_add_ps(acc[u][h], _mm256_mul_ps(s, scale));
            }
        }
    }
}

/// [`q8_0_rows16_avx2`] with AVX-VNNI's 256-bit `vpdpbusd` (Intel Alder Lake and later
/// clients): the offset weights meet a token's activations in one instruction, as in
/// [`q8_0_rows16_vnni512`] (`128 · Σq` taken off after the block), instead of the sign trick's
/// four. Both halves of the sixteen rows go together, four tokens at a time. The integer sums
/// are exact and the float step is [`q8_0_rows16_vnni512`]'s: the bits are the scalar kernel's.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-VNNI; the shapes are those of
/// [`q8_0_rows16_vnni512`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn q8_0_rows16_avxvnni<const T: usize>(
    block: &[u8],
    xq: &[i32],
    d: &[f32],
    bias: &[i32],
) -> [Rows16; T] {
    // SAFETY: this function's features are the AVX-VNNI passes'.
    unsafe { q8_0_rows16_vnni256::<AvxVnniDots, T>(block, xq, d, bias) }
}

/// The body of [`q8_0_rows16_avxvnni`], its sums made as `D` makes them (`D::WIDE`: 32-bit
/// `vpdpbusd`; the tests run it with the instruction's EVEX form).
///
/// # Safety
/// As for the kernel that inlines it.
#[inline(always)]
pub(crate) unsafe fn q8_0_rows16_vnni256<D: ByteDots, const T: usize>(
    block: &[u8],
    xq: &[i32],
    d: &[f32],
    bias: &[i32],
) -> [Rows16; T] {
    const { assert!(D::WIDE, "the offset weights' sums need 32 bits") };
    let blocks = d.len() / T;
    assert!(block.len() == blocks * BLOCK_BYTES && d.len() == blocks * T);
    assert!(xq.len() == 8 * d.len() && bias.len() == d.len());
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..blocks {
        // SAFETY: the asserts above bound every read of block `b`: its 544 bytes, its 8·T
        // dwords, T scales and T sums.
        unsafe {
            let base = block.as_ptr().add(b * BLOCK_BYTES);
            if T == 1 {
                for line in (0..BLOCK_BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(4 * BLOCK_BYTES + line).cast());
                }
            }
            let act = (
                xq.as_ptr().add(8 * T * b),
                d.as_ptr().add(T * b),
                bias.as_ptr().add(T * b),
            );
            for t0 in (0..T).step_by(4) {
                let acc = &mut acc[t0..(t0 + 4).min(T)];
                match acc.len() {
                    4 => q8_0_pass_vnni256::<D, 4, T>(base, act, t0, acc),
                    3 => q8_0_pass_vnni256::<D, 3, T>(base, act, t0, acc),
                    2 => q8_0_pass_vnni256::<D, 2, T>(base, act, t0, acc),
                    _ => q8_0_pass_vnni256::<D, 1, T>(base, act, t0, acc),
                }
            }
        }
    }
    super::interleaved_q4_k::rows16_out_avx2(acc)
}

/// Both halves of one interleaved block at `base` times tokens `t0..t0 + U` of `T`, whose
/// block's dwords, scales and `128 · Σq` start at `act`: adds the block's float step into
/// `acc[u]`. One or two tokens keep two chains of sums each (even and odd dwords), so that they
/// do not wait on eight dependent `vpdpbusd`; more tokens have chains enough with one.
///
/// # Safety
/// As for [`q8_0_rows16_avxvnni`].
#[inline(always)]
unsafe fn q8_0_pass_vnni256<D: ByteDots, const U: usize, const T: usize>(
    base: *const u8,
    (x, d, bias): (*const i32, *const f32, *const i32),
    t0: usize,
    acc: &mut [[__m256; 2]],
) {
    let mut even = [[_mm256_setzero_si256(); 2]; U];
    let mut odd = [[_mm256_setzero_si256(); 2]; U];
    // SAFETY: the caller bounds the block's bytes and tokens t0..t0 + U of its activations.
    unsafe {
        let tile =
            |g: usize, h: usize| _mm256_loadu_si256(base.add(SCALE_BYTES + 64 * g + 32 * h).cast());
        for g in (0..8).step_by(2) {
            let w = [[tile(g, 0), tile(g, 1)], [tile(g + 1, 0), tile(g + 1, 1)]];
            for u in 0..U {
                let x0 = _mm256_set1_epi32(*x.add(g * T + t0 + u));
                let x1 = _mm256_set1_epi32(*x.add((g + 1) * T + t0 + u));
                for h in 0..2 {
                    even[u][h] = D::add(even[u][h], w[0][h], x0);
                    if U <= 2 {
                        odd[u][h] = D::add(odd[u][h], w[1][h], x1);
                    } else {
                        even[u][h] = D::add(even[u][h], w[1][h], x1);
                    }
                }
            }
        }
        for h in 0..2 {
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(base.add(16 * h).cast()));
            for u in 0..U {
                let sum = _mm256_sub_epi32(
                    _mm256_add_epi32(even[u][h], odd[u][h]),
                    _mm256_set1_epi32(*bias.add(t0 + u)),
                );
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*d.add(t0 + u)));
                let s = _mm256_cvtepi32_ps(sum);
                acc[u][h] = _mm256_add_ps(acc[u][h], _mm256_mul_ps(s, scale));
            }
        }
    }
}

/// Asks for the `bytes` of the interleaved block `ahead` blocks of `bytes` after `base`: decode
/// streams the weights once, and the hardware prefetcher alone leaves the kernels waiting (a
/// hint, never faults past the end). For blocks of a few lines; a larger one is asked for a
/// part at a time ([`prefetch_part`]).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn prefetch_block(base: *const u8, bytes: usize, ahead: usize) {
    for line in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(ahead * bytes + line).cast());
    }
}

/// Asks for part `part` of `parts` of the interleaved block `ahead` blocks of `bytes` after
/// `base` (a hint, never faults past the end): a kernel over a block of many lines (Q4_K, Q5_K,
/// Q6_K: 37 to 53) asks for the block ahead in step with its sub-blocks. Asked for all at once,
/// most of the requests are dropped: on a Zen 4, decode of a Q6_K matrix from memory ran at
/// 7 GB/s a thread so, and 17–19 GB/s a part at a time (`cpu_kernels 1 256 1 q6_k`).
#[inline(always)]
pub(crate) fn prefetch_part(
    base: *const u8,
    bytes: usize,
    ahead: usize,
    part: usize,
    parts: usize,
) {
    let lines = bytes.div_ceil(64);
    let each = lines.div_ceil(parts);
    let first = base.wrapping_add(ahead * bytes);
    for line in part * each..(part * each + each).min(lines) {
        // SAFETY: a prefetch is a hint: it reads nothing and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(first.wrapping_add(64 * line).cast()) };
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
