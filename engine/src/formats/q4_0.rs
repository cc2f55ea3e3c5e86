//! ggml's Q4_0: 32 four-bit values and an f16 scale per block (4.5 bits per weight).
//!
//! Block bytes: `d` (f16), then `qs[16]`: element `j < 16` is the low nibble of `qs[j]`,
//! element `j + 16` its high nibble; the value is `d · (nibble − 8)`.

use half::f16;

use super::Layout;

/// Bytes per Q4_0 block (f16 scale + 16 bytes of nibbles) for 32 weights.
pub const Q4_0_BLOCK_BYTES: usize = 18;

/// The Q4_0 layout.
#[derive(Debug, Clone, Copy)]
pub struct Q4_0;

impl Layout for Q4_0 {
    const NAME: &'static str = "Q4_0";
    const BLOCK: usize = 32;
    const BLOCK_BYTES: usize = Q4_0_BLOCK_BYTES;
    const SCALES: &'static [usize] = &[0];

    fn decode_block(&self, blk: &[u8], out: &mut [f32]) {
        let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        for (e, v) in out.iter_mut().enumerate().take(32) {
            *v = d * f32::from(i16::from(q4_0_code(blk, e)) - 8);
        }
    }
}

/// The four-bit code (0..16; subtract 8 for the signed weight) of element `e` of a block.
#[inline]
pub fn q4_0_code(blk: &[u8], e: usize) -> u8 {
    let byte = blk[2 + e % 16];
    if e < 16 {
        byte & 0xF
    } else {
        byte >> 4
    }
}
