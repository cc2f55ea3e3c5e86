//! bitnet.cpp's I2_S (x86 / official layout): 2-bit codes (MSB first) in groups of 128, one
//! f32 scale β per tensor stored after the codes.

use super::Layout;

/// Weights per I2_S group.
pub const I2S_GROUP: usize = 128;

/// The I2_S layout with its tensor's scale β.
#[derive(Debug, Clone, Copy)]
pub struct I2s {
    /// The per-tensor weight scale β.
    pub beta: f32,
}

impl Layout for I2s {
    const NAME: &'static str = "I2_S";
    const BLOCK: usize = I2S_GROUP;
    const BLOCK_BYTES: usize = I2S_GROUP / 4;

    fn decode_block(&self, group: &[u8], out: &mut [f32]) {
        for (k, v) in out.iter_mut().enumerate() {
            *v = f32::from(i2s_code(group, k) as i8 - 1) * self.beta;
        }
    }
}

/// Code of element `k` of an I2_S row: 128-element groups of 32 bytes, MSB-first crumbs,
/// byte `32*(k/128) + k%32`, shift `6 - 2*((k%128)/32)`.
pub fn i2s_code(row: &[u8], k: usize) -> u8 {
    let byte = row[32 * (k / I2S_GROUP) + k % 32];
    (byte >> (6 - 2 * ((k % I2S_GROUP) / 32))) & 3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i2s_layout_is_msb_first() {
        let mut row = [0u8; 64];
        row[0] = 0b10_01_00_10; // k=0 -> 2, k=32 -> 1, k=64 -> 0, k=96 -> 2
        row[33] = 0b01_00_00_00; // k=129 -> 1
        assert_eq!(
            [0, 32, 64, 96, 129].map(|k| i2s_code(&row, k)),
            [2, 1, 0, 2, 1]
        );
    }
}
