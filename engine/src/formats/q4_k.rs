//! ggml's Q4_K: 256-element blocks of four-bit values in eight sub-blocks of 32, each with a
//! six-bit scale and a six-bit minimum, under an f16 scale and an f16 minimum per block (4.5
//! bits per weight). The bulk of every `Q4_K_M` file.
//!
//! Block bytes: `d` (f16), `dmin` (f16), `scales[12]` (the sixteen six-bit numbers, see
//! [`k_scale_min`]), `qs[128]`. Sub-block `s` lies in chunk `j = s / 2` of 64 elements:
//! element `l < 32` of sub-block `2j` is the low nibble of `qs[32j + l]`, of sub-block
//! `2j + 1` its high nibble. The value is `d · scale_s · code − dmin · min_s`.

use half::f16;

use super::k_quant::{k_block, Q4_K_FIT};
use super::{Encode, Layout};

/// Elements per K-quant block.
pub const QK_K: usize = 256;
/// Bytes per Q4_K block.
pub const Q4_K_BLOCK_BYTES: usize = 144;
/// Offset of the twelve bytes of sub-block scales and minimums in a Q4_K or Q5_K block.
pub const K_SCALES: usize = 4;
/// Offset of `qs` in a Q4_K block.
pub const Q4_K_QS: usize = 16;

/// The Q4_K layout.
#[derive(Debug, Clone, Copy)]
pub struct Q4K;

impl Layout for Q4K {
    const NAME: &'static str = "Q4_K";
    const BLOCK: usize = QK_K;
    const BLOCK_BYTES: usize = Q4_K_BLOCK_BYTES;
    const SCALES: &'static [usize] = &[0, 2];

    fn decode_block(&self, blk: &[u8], out: &mut [f32]) {
        decode_k_block(blk, out, |e| q4_k_code(blk, e));
    }
}

/// The f16 scale `d` and minimum `dmin` of a Q4_K or Q5_K block (its first four bytes).
#[inline]
pub fn k_d_dmin(blk: &[u8]) -> (f32, f32) {
    let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
    let dmin = f16::from_le_bytes([blk[2], blk[3]]).to_f32();
    (d, dmin)
}

/// The six-bit scale and minimum of sub-block `s` (0..8) from a Q4_K or Q5_K block's twelve
/// scale bytes: sub-blocks 0..4 keep theirs in the low six bits of bytes `s` and `s + 4`;
/// sub-blocks 4..8 a low nibble from byte `s + 4` (scale: low, minimum: high) and their top two
/// bits in the top bits of bytes `s − 4` and `s` (ggml's `get_scale_min_k4`).
#[inline]
pub fn k_scale_min(scales: &[u8], s: usize) -> (u8, u8) {
    if s < 4 {
        (scales[s] & 63, scales[s + 4] & 63)
    } else {
        (
            (scales[s + 4] & 0xF) | ((scales[s - 4] >> 6) << 4),
            (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4),
        )
    }
}

/// The eight six-bit scales and eight six-bit minimums of a Q4_K or Q5_K block (`blk` starts
/// at the block), all at once: [`k_scale_min`] of every sub-block, with word operations as ggml
/// unpacks them.
#[inline]
pub fn k_scales_mins(blk: &[u8]) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| {
        let b = &blk[K_SCALES + 4 * i..K_SCALES + 4 * i + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    };
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let scales = [w0 & LOW6, (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4)];
    let mins = [w1 & LOW6, ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4)];
    let bytes = |w: [u32; 2]| {
        let (a, b) = (w[0].to_le_bytes(), w[1].to_le_bytes());
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    };
    (bytes(scales), bytes(mins))
}

impl Encode for Q4K {
    /// ggml's `quantize_row_q4_K_ref` (see `k_quant`).
    fn encode_block(values: &[f32], out: &mut [u8]) {
        let b = k_block(values, &Q4_K_FIT);
        out[..2].copy_from_slice(&b.d.to_le_bytes());
        out[2..4].copy_from_slice(&b.dmin.to_le_bytes());
        out[K_SCALES..K_SCALES + 12].copy_from_slice(&b.scales);
        for (j, chunk) in out[Q4_K_QS..Q4_K_QS + 128].chunks_exact_mut(32).enumerate() {
            for (l, q) in chunk.iter_mut().enumerate() {
                *q = b.levels[64 * j + l] | (b.levels[64 * j + l + 32] << 4);
            }
        }
    }
}

/// The twelve scale bytes of a Q4_K or Q5_K block holding `scales` and `mins` (each below 64):
/// the inverse of [`k_scale_min`].
pub fn k_pack_scales_mins(scales: &[u8; 8], mins: &[u8; 8]) -> [u8; 12] {
    let mut packed = [0u8; 12];
    for s in 0..4 {
        packed[s] = scales[s] | ((scales[s + 4] >> 4) << 6);
        packed[s + 4] = mins[s] | ((mins[s + 4] >> 4) << 6);
        packed[s + 8] = (scales[s + 4] & 0xF) | ((mins[s + 4] & 0xF) << 4);
    }
    packed
}

/// The four-bit code of element `e` (0..256) of a Q4_K block.
#[inline]
pub fn q4_k_code(blk: &[u8], e: usize) -> u8 {
    let (j, half, l) = (e / 64, (e / 32) % 2, e % 32);
    let byte = blk[Q4_K_QS + 32 * j + l];
    if half == 0 {
        byte & 0xF
    } else {
        byte >> 4
    }
}

/// Decodes a Q4_K or Q5_K block whose element `e` has the code `code(e)`: `d · scale ·
/// code − dmin · min`, in ggml's order (`d · scale` and `dmin · min` rounded first).
pub(super) fn decode_k_block(blk: &[u8], out: &mut [f32], code: impl Fn(usize) -> u8) {
    let (d, dmin) = k_d_dmin(blk);
    let scales = &blk[K_SCALES..K_SCALES + 12];
    for (s, values) in out.chunks_exact_mut(32).enumerate().take(8) {
        let (sc, m) = k_scale_min(scales, s);
        let (step, offset) = (d * f32::from(sc), dmin * f32::from(m));
        for (l, v) in values.iter_mut().enumerate() {
            *v = step * f32::from(code(32 * s + l)) - offset;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The twelve bytes hold sixteen six-bit numbers: each comes back as packed.
    #[test]
    fn scales_and_minimums_unpack_as_packed() {
        let sc: [u8; 8] = [1, 63, 17, 40, 5, 62, 33, 48];
        let m: [u8; 8] = [60, 2, 45, 9, 63, 0, 21, 38];
        let packed = k_pack_scales_mins(&sc, &m);
        for s in 0..8 {
            assert_eq!(k_scale_min(&packed, s), (sc[s], m[s]), "sub-block {s}");
        }
    }

    /// The word-wise unpacking equals the per-sub-block one for every byte pattern tried.
    #[test]
    fn all_at_once_equals_one_by_one() {
        let mut blk = [0u8; Q4_K_BLOCK_BYTES];
        for seed in 0..200u32 {
            for (i, b) in blk[K_SCALES..K_SCALES + 12].iter_mut().enumerate() {
                *b = (seed.wrapping_mul(2_654_435_761).rotate_left(i as u32 * 5) >> 7) as u8;
            }
            let (scales, mins) = k_scales_mins(&blk);
            for s in 0..8 {
                let want = k_scale_min(&blk[K_SCALES..K_SCALES + 12], s);
                assert_eq!((scales[s], mins[s]), want, "seed {seed}, sub-block {s}");
            }
        }
    }

    #[test]
    fn codes_follow_the_chunks() {
        let mut blk = [0u8; Q4_K_BLOCK_BYTES];
        blk[Q4_K_QS] = 0xA3;
        blk[Q4_K_QS + 32 + 5] = 0x7C;
        assert_eq!(q4_k_code(&blk, 0), 3);
        assert_eq!(q4_k_code(&blk, 32), 10);
        assert_eq!(q4_k_code(&blk, 64 + 5), 12);
        assert_eq!(q4_k_code(&blk, 96 + 5), 7);
    }
}
