//! ggml's TQ1_0: 256 ternary values packed five (or four) base-3 digits per byte, and an f16
//! scale per block.

use half::f16;

use super::tq2_0::{ternary_code, ternary_scale};
use super::{Encode, Layout};

/// Bytes per TQ1_0 block (48 + 4 packed trit bytes + f16 scale) for 256 weights.
pub const TQ1_0_BLOCK_BYTES: usize = 54;

/// The TQ1_0 layout.
#[derive(Debug, Clone, Copy)]
pub struct Tq1_0;

impl Layout for Tq1_0 {
    const NAME: &'static str = "TQ1_0";
    const BLOCK: usize = 256;
    const BLOCK_BYTES: usize = TQ1_0_BLOCK_BYTES;
    const SCALES: &'static [usize] = &[52];

    fn decode_block(&self, blk: &[u8], out: &mut [f32]) {
        let d = f16::from_le_bytes([blk[52], blk[53]]).to_f32();
        for (e, v) in out.iter_mut().enumerate() {
            *v = f32::from(tq1_0_code(blk, e) as i8 - 1) * d;
        }
    }
}

impl Encode for Tq1_0 {
    /// ggml's `quantize_row_tq1_0_ref`: `d = amax` (stored as f16); five codes per byte
    /// (values `j`, `j+32`, … of the first 160; `j`, `j+16`, … of the next 80), then four per
    /// byte for the last 16 (`j`, `j+4`, …, shifted up one trit), each byte `⌈q·256/243⌉`.
    fn encode_block(values: &[f32], out: &mut [u8]) {
        let (d, id) = ternary_scale(values);
        let digits = |idx: &mut dyn Iterator<Item = usize>| {
            idx.fold(0u16, |q, i| q * 3 + u16::from(ternary_code(values[i], id)))
        };
        let byte = |q: u16| ((q * 256).div_ceil(243)) as u8;
        for (j, o) in out[..32].iter_mut().enumerate() {
            *o = byte(digits(&mut (0..5).map(|n| j + 32 * n)));
        }
        for (j, o) in out[32..48].iter_mut().enumerate() {
            *o = byte(digits(&mut (0..5).map(|n| 160 + j + 16 * n)));
        }
        for (j, o) in out[48..52].iter_mut().enumerate() {
            *o = byte(3 * digits(&mut (0..4).map(|m| 240 + j + 4 * m)));
        }
        out[52..54].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    }
}

/// Code (trit + 1) of element `e` (0..256) of a TQ1_0 block.
pub fn tq1_0_code(block: &[u8], e: usize) -> u8 {
    let (byte, n) = match e {
        0..=159 => (block[e % 32], e / 32),
        160..=239 => (block[32 + (e - 160) % 16], (e - 160) / 16),
        _ => (block[48 + (e - 240) % 4], (e - 240) / 4),
    };
    let m = byte.wrapping_mul(3u8.pow(n as u32));
    ((u16::from(m) * 3) >> 8) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tq1_0_packs_five_trits_per_byte() {
        // Encode trits the way ggml's quantizer does and check every position decodes back.
        let codes: Vec<u8> = (0..256).map(|i| ((i * 7 + 3) % 3) as u8).collect();
        let mut blk = [0u8; TQ1_0_BLOCK_BYTES];
        let pack = |digits: &[u8]| -> u8 {
            let q = digits.iter().fold(0u16, |acc, &d| acc * 3 + u16::from(d));
            ((q * 256).div_ceil(243)) as u8
        };
        for j in 0..32 {
            blk[j] = pack(&[
                codes[j],
                codes[32 + j],
                codes[64 + j],
                codes[96 + j],
                codes[128 + j],
            ]);
        }
        for j in 0..16 {
            blk[32 + j] = pack(&[
                codes[160 + j],
                codes[176 + j],
                codes[192 + j],
                codes[208 + j],
                codes[224 + j],
            ]);
        }
        for j in 0..4 {
            let q = [
                codes[240 + j],
                codes[244 + j],
                codes[248 + j],
                codes[252 + j],
            ]
            .iter()
            .fold(0u16, |a, &d| a * 3 + u16::from(d))
                * 3;
            blk[48 + j] = ((q * 256).div_ceil(243)) as u8;
        }
        for (e, &c) in codes.iter().enumerate() {
            assert_eq!(tq1_0_code(&blk, e), c, "element {e}");
        }
    }
}
