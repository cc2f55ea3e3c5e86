//! TQ1_0 and TQ2_0 rows: repacked into the I2_S code layout (element `k` of a row in byte
//! `32·(k/128) + k%32`, shift `6 − 2·((k%128)/32)`) with the f16 scale of every 256-block as
//! f32, so one kernel (`bitlinear_tq`) serves both.

use std::borrow::Cow;

use half::f16;
use hesper_engine::formats::{tq1_0_code, tq2_0_code, Layout, Tq1_0, Tq2_0};

use super::GpuLayout;
use crate::matrix::Kind;

impl GpuLayout for Tq1_0 {
    fn route(self, _cols: usize) -> Result<Kind, &'static str> {
        Ok(Kind::Tq)
    }

    fn repack(src: &[u8], cols: usize) -> (Cow<'_, [u8]>, Option<Vec<f32>>) {
        repack::<Self>(src, cols, tq1_0_code)
    }
}

impl GpuLayout for Tq2_0 {
    fn route(self, _cols: usize) -> Result<Kind, &'static str> {
        Ok(Kind::Tq)
    }

    fn repack(src: &[u8], cols: usize) -> (Cow<'_, [u8]>, Option<Vec<f32>>) {
        repack::<Self>(src, cols, tq2_0_code)
    }
}

/// Rows of `L` blocks (whose element `e` has the code `code(block, e)` and whose f16 scale
/// ends the block) → I2_S-layout codes and f32 block scales.
fn repack<L: Layout>(
    src: &[u8],
    cols: usize,
    code: fn(&[u8], usize) -> u8,
) -> (Cow<'static, [u8]>, Option<Vec<f32>>) {
    let blocks = src.len() / L::BLOCK_BYTES;
    let mut bytes = vec![0u8; blocks * 64];
    let mut scales = Vec::with_capacity(blocks);
    let per_row = cols / 256;
    for (b, blk) in src.chunks_exact(L::BLOCK_BYTES).enumerate() {
        let row_base = (b / per_row) * (cols / 4);
        let k0 = (b % per_row) * 256;
        for e in 0..256 {
            let k = k0 + e;
            let at = row_base + 32 * (k / 128) + k % 32;
            bytes[at] |= code(blk, e) << (6 - 2 * ((k % 128) / 32));
        }
        let d = &blk[L::BLOCK_BYTES - 2..];
        scales.push(f16::from_le_bytes([d[0], d[1]]).to_f32());
    }
    (Cow::Owned(bytes), Some(scales))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hesper_engine::formats::{i2s_code, TQ2_0_BLOCK_BYTES};

    #[test]
    fn repacked_tq2_0_codes_read_back_as_i2s() {
        // Two rows of 512: four TQ2_0 blocks with varied codes and scales.
        let cols = 512;
        let mut src = Vec::new();
        for b in 0..4u8 {
            let mut blk: Vec<u8> = (0..64u8)
                .map(|i| i.wrapping_mul(37).wrapping_add(b))
                .collect();
            // Codes 3 do not occur in real files; keep every crumb in 0..=2.
            for byte in &mut blk {
                for s in 0..4 {
                    if (*byte >> (2 * s)) & 3 == 3 {
                        *byte &= !(1 << (2 * s));
                    }
                }
            }
            blk.extend(f16::from_f32(0.5 + f32::from(b)).to_le_bytes());
            src.extend(blk);
        }
        let (bytes, scales) = Tq2_0::repack(&src, cols);
        for r in 0..2 {
            let row = &bytes[r * cols / 4..(r + 1) * cols / 4];
            for k in 0..cols {
                let b = r * 2 + k / 256;
                let blk = &src[b * TQ2_0_BLOCK_BYTES..(b + 1) * TQ2_0_BLOCK_BYTES];
                assert_eq!(
                    i2s_code(row, k),
                    tq2_0_code(blk, k % 256),
                    "row {r} elem {k}"
                );
            }
        }
        assert_eq!(scales, Some(vec![0.5, 1.5, 2.5, 3.5]));
    }
}
