//! ggml's Q5_K: Q4_K's blocks with a fifth bit per value (5.5 bits per weight); the bulk of
//! every `Q5_K_M` file.
//!
//! Block bytes: `d` (f16), `dmin` (f16), `scales[12]` (as Q4_K's), `qh[32]`, `qs[128]`. The
//! low four bits of element `e` are Q4_K's (from `qs`); its fifth bit is bit `e / 32` of
//! `qh[e % 32]`.

use super::k_quant::{k_block, Q5_K_FIT};
use super::q4_k::{decode_k_block, K_SCALES, QK_K};
use super::{Encode, Layout};

/// Bytes per Q5_K block.
pub const Q5_K_BLOCK_BYTES: usize = 176;
/// Offset of `qh` in a Q5_K block.
pub const Q5_K_QH: usize = 16;
/// Offset of `qs` in a Q5_K block.
pub const Q5_K_QS: usize = 48;

/// The Q5_K layout.
#[derive(Debug, Clone, Copy)]
pub struct Q5K;

impl Layout for Q5K {
    const NAME: &'static str = "Q5_K";
    const BLOCK: usize = QK_K;
    const BLOCK_BYTES: usize = Q5_K_BLOCK_BYTES;
    const SCALES: &'static [usize] = &[0, 2];

    fn decode_block(&self, blk: &[u8], out: &mut [f32]) {
        decode_k_block(blk, out, |e| q5_k_code(blk, e));
    }
}

impl Encode for Q5K {
    /// ggml's `quantize_row_q5_K_ref` (see `k_quant`): Q4_K's low nibbles, the fifth bit of
    /// element `64j + l` (and `64j + 32 + l`) in bit `2j` (`2j + 1`) of `qh[l]`.
    fn encode_block(values: &[f32], out: &mut [u8]) {
        let b = k_block(values, &Q5_K_FIT);
        out[..2].copy_from_slice(&b.d.to_le_bytes());
        out[2..4].copy_from_slice(&b.dmin.to_le_bytes());
        out[K_SCALES..K_SCALES + 12].copy_from_slice(&b.scales);
        out[Q5_K_QH..Q5_K_QS].fill(0);
        for j in 0..4 {
            for l in 0..32 {
                let (lo, hi) = (b.levels[64 * j + l], b.levels[64 * j + l + 32]);
                out[Q5_K_QH + l] |= ((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1));
                out[Q5_K_QS + 32 * j + l] = (lo & 0xF) | ((hi & 0xF) << 4);
            }
        }
    }
}

/// The five-bit code of element `e` (0..256) of a Q5_K block.
#[inline]
pub fn q5_k_code(blk: &[u8], e: usize) -> u8 {
    let (j, half, l) = (e / 64, (e / 32) % 2, e % 32);
    let byte = blk[Q5_K_QS + 32 * j + l];
    let low = if half == 0 { byte & 0xF } else { byte >> 4 };
    let high = (blk[Q5_K_QH + l] >> (e / 32)) & 1;
    low | (high << 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fifth_bit_comes_from_qh() {
        let mut blk = [0u8; Q5_K_BLOCK_BYTES];
        blk[Q5_K_QS + 64 + 3] = 0x5E;
        blk[Q5_K_QH + 3] = 0b0000_1000;
        assert_eq!(
            q5_k_code(&blk, 128 + 3),
            14,
            "bit 4 of qh[3] is not element 131's"
        );
        assert_eq!(
            q5_k_code(&blk, 96 + 3),
            16,
            "bit 3 of qh[3] is element 99's"
        );
        assert_eq!(q5_k_code(&blk, 160 + 3), 5);
        blk[Q5_K_QH + 3] = 0b0010_0000;
        assert_eq!(q5_k_code(&blk, 160 + 3), 5 | 16);
        blk[Q5_K_QH + 3] = 0b1000_0000;
        assert_eq!(q5_k_code(&blk, 224 + 3), 16);
    }
}
