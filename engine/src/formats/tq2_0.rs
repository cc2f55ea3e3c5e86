//! ggml's TQ2_0: 256 ternary values as 2-bit codes (LSB first) and an f16 scale per block.

use half::f16;

use super::{Encode, Layout};

/// Bytes per TQ2_0 block (64 code bytes + f16 scale) for 256 weights.
pub const TQ2_0_BLOCK_BYTES: usize = 66;

/// The TQ2_0 layout.
#[derive(Debug, Clone, Copy)]
pub struct Tq2_0;

impl Layout for Tq2_0 {
    const NAME: &'static str = "TQ2_0";
    const BLOCK: usize = 256;
    const BLOCK_BYTES: usize = TQ2_0_BLOCK_BYTES;
    const SCALES: &'static [usize] = &[64];

    fn decode_block(&self, blk: &[u8], out: &mut [f32]) {
        let d = f16::from_le_bytes([blk[64], blk[65]]).to_f32();
        for (e, v) in out.iter_mut().enumerate() {
            *v = f32::from(tq2_0_code(blk, e) as i8 - 1) * d;
        }
    }
}

impl Encode for Tq2_0 {
    /// ggml's `quantize_row_tq2_0_ref`: `d = amax` (stored as f16), each value's code
    /// `round(x/d) + 1` (half away from zero).
    fn encode_block(values: &[f32], out: &mut [u8]) {
        let (d, id) = ternary_scale(values);
        out[..64].fill(0);
        for (e, &x) in values.iter().enumerate() {
            out[(e / 128) * 32 + e % 32] |= ternary_code(x, id) << (2 * ((e % 128) / 32));
        }
        out[64..66].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    }
}

/// ggml's ternary scale of a block: `d = max |x|`, and `1/d` (0 for an all-zero block).
pub(super) fn ternary_scale(values: &[f32]) -> (f32, f32) {
    let d = values.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// ggml's ternary code of `x` scaled by `id`: `lroundf(x·id) + 1` (0, 1, 2 for −1, 0, +1).
pub(super) fn ternary_code(x: f32, id: f32) -> u8 {
    ((x * id).round() as i32 + 1).clamp(0, 2) as u8
}

/// Code (0, 1, 2 ↦ −1, 0, +1) of element `e` (0..256) of a TQ2_0 block: LSB-first crumbs,
/// byte `(e/128)*32 + e%32`, shift `2*((e%128)/32)`.
pub fn tq2_0_code(block: &[u8], e: usize) -> u8 {
    let byte = block[(e / 128) * 32 + e % 32];
    (byte >> (2 * ((e % 128) / 32))) & 3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tq2_0_layout_is_lsb_first() {
        let mut blk = [0u8; TQ2_0_BLOCK_BYTES];
        blk[0] = 0b10_01_00_10; // e=0 -> 2, e=32 -> 0, e=64 -> 1, e=96 -> 2
        blk[33] = 0b00_00_00_01; // e=129 -> 1
        assert_eq!(
            [0, 32, 64, 96, 129].map(|e| tq2_0_code(&blk, e)),
            [2, 0, 1, 2, 1]
        );
    }
}
