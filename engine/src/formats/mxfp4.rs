//! MXFP4 (OCP microscaling FP4, ggml type 39): 32 E2M1 values and one E8M0 exponent per
//! block (4.25 bits per weight), as gpt-oss's experts are stored.
//!
//! Block bytes: `e` (the shared exponent), then `qs[16]`: element `j < 16` is the low nibble of
//! `qs[j]`, element `j + 16` its high nibble (Q4_0's order). A nibble is an E2M1 number, kept
//! doubled as the integer [`MXFP4_VALUES`] holds, so the block's value is
//! `MXFP4_VALUES[nibble] · 2^(e − 128)` (the half of `2^(e − 127)` undoes the doubling).

use super::Layout;

/// Bytes per MXFP4 block (exponent + 16 bytes of nibbles) for 32 weights.
pub const MXFP4_BLOCK_BYTES: usize = 17;

/// Twice the E2M1 value of each nibble (sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6): whole
/// numbers, so that products with int8 activations sum exactly as integers.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// The MXFP4 layout.
#[derive(Debug, Clone, Copy)]
pub struct Mxfp4;

impl Layout for Mxfp4 {
    const NAME: &'static str = "MXFP4";
    const BLOCK: usize = 32;
    const BLOCK_BYTES: usize = MXFP4_BLOCK_BYTES;

    fn decode_block(&self, blk: &[u8], out: &mut [f32]) {
        let d = mxfp4_scale(blk[0]);
        for (e, v) in out.iter_mut().enumerate().take(32) {
            *v = d * f32::from(MXFP4_VALUES[usize::from(mxfp4_code(blk, e))]);
        }
    }
}

/// `2^(e − 128)`: half the E8M0 exponent byte's power of two (ggml's
/// `GGML_E8M0_TO_FP32_HALF`), the factor of the doubled values; finite for every byte, with
/// `e` 0 and 1 the two subnormal powers.
#[inline]
pub fn mxfp4_scale(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// The four-bit code of element `e` of a block (an index into [`MXFP4_VALUES`]).
#[inline]
pub fn mxfp4_code(blk: &[u8], e: usize) -> u8 {
    let byte = blk[1 + e % 16];
    if e < 16 {
        byte & 0xF
    } else {
        byte >> 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exponent_byte_is_a_power_of_two_halved() {
        assert_eq!(mxfp4_scale(127), 0.5);
        assert_eq!(mxfp4_scale(128), 1.0);
        assert_eq!(mxfp4_scale(130), 4.0);
        assert_eq!(mxfp4_scale(1), 2f32.powi(-127));
        assert_eq!(mxfp4_scale(0), 2f32.powi(-128));
        assert_eq!(mxfp4_scale(255), 2f32.powi(127));
    }

    #[test]
    fn a_block_decodes_its_nibbles_in_q4_0_order() {
        let mut blk = [0u8; MXFP4_BLOCK_BYTES];
        blk[0] = 128; // a factor of 1: values are the doubled E2M1 numbers
        blk[1] = 0x7F; // element 0: code 15 (−12); element 16: code 7 (12)
        blk[16] = 0x39; // element 15: code 9 (−1); element 31: code 3 (3)
        let mut out = [0.0; 32];
        Mxfp4.decode_block(&blk, &mut out);
        assert_eq!(
            (out[0], out[16], out[15], out[31]),
            (-12.0, 12.0, -1.0, 3.0)
        );
        assert!(out[1..15].iter().all(|&v| v == 0.0));
    }
}
