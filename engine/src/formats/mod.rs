//! Weight layouts, one file each: what a stored block means ([`Layout`]) and, for the layouts
//! hesper-rs writes, how to make one ([`Encode`]). Backends extend [`Layout`] with their own
//! traits (the CPU's kernels, the GPU's upload and kernel), so a new layout is one file here
//! and one per backend; [`with_layout!`](crate::with_layout) is the one place a [`Format`]
//! value becomes its layout type.
//!
//! [`Format`]: crate::weights::Format

mod float;
mod i2s;
mod k_quant;
mod mxfp4;
mod q4_0;
pub mod q4_k;
pub mod q5_k;
pub mod q6_k;
mod q8_0;
mod tq1_0;
mod tq2_0;

pub use float::{Bf16, F16, F32};
pub use i2s::{i2s_code, I2s, I2S_GROUP};
pub use mxfp4::{mxfp4_code, mxfp4_scale, Mxfp4, MXFP4_BLOCK_BYTES, MXFP4_VALUES};
pub use q4_0::{q4_0_code, Q4_0, Q4_0_BLOCK_BYTES};
pub use q4_k::Q4K;
pub use q5_k::Q5K;
pub use q6_k::Q6K;
pub use q8_0::{q8_0_block, Q8_0, Q8_0_BLOCK_BYTES};
pub use tq1_0::{tq1_0_code, Tq1_0, TQ1_0_BLOCK_BYTES};
pub use tq2_0::{tq2_0_code, Tq2_0, TQ2_0_BLOCK_BYTES};

/// A weight layout: rows of whole blocks, each block `BLOCK_BYTES` bytes for `BLOCK` values.
/// A value of the type carries what the layout keeps outside its blocks (I2_S: its scale).
pub trait Layout: Copy + Send + Sync + 'static {
    /// The name ggml gives the layout.
    const NAME: &'static str;
    /// Values per block (a row holds whole blocks).
    const BLOCK: usize;
    /// Bytes per block.
    const BLOCK_BYTES: usize;
    /// Where a block keeps its f16 scales (the block scale `d`, and the K-quants' `dmin`), as
    /// byte offsets; none for the float layouts and I2_S (whose one f32 scale follows the codes).
    const SCALES: &'static [usize] = &[];

    /// Decodes one block into its `BLOCK` values: the reference every kernel is tested
    /// against.
    fn decode_block(&self, block: &[u8], out: &mut [f32]);

    /// Bytes of a row of `cols` values.
    fn row_bytes(cols: usize) -> usize {
        cols / Self::BLOCK * Self::BLOCK_BYTES
    }

    /// Decodes a stored row into `out` (whose length is the row length).
    fn decode_row(&self, row: &[u8], out: &mut [f32]) {
        for (values, block) in out
            .chunks_exact_mut(Self::BLOCK)
            .zip(row.chunks_exact(Self::BLOCK_BYTES))
        {
            self.decode_block(block, values);
        }
    }

    /// The first of `blocks` (whole blocks) with a scale that is infinite or NaN: its index
    /// and value. Such a scale makes every value of its block, and so every sum it enters,
    /// infinite or NaN; ggml computes with it all the same.
    fn non_finite_scale(&self, blocks: &[u8]) -> Option<(usize, f32)> {
        if Self::SCALES.is_empty() {
            return None;
        }
        // An f16 is infinite or NaN exactly when its five exponent bits are all set.
        const EXPONENT: u16 = 0x7c00;
        blocks
            .chunks_exact(Self::BLOCK_BYTES)
            .enumerate()
            .find_map(|(i, block)| {
                Self::SCALES.iter().find_map(|&at| {
                    let bits = u16::from_le_bytes([block[at], block[at + 1]]);
                    (bits & EXPONENT == EXPONENT).then(|| (i, half::f16::from_bits(bits).to_f32()))
                })
            })
    }
}

/// A layout hesper-rs can write (`--lm-head`, re-quantized tables).
pub trait Encode: Layout {
    /// Encodes `BLOCK` values into one block of `BLOCK_BYTES` bytes.
    fn encode_block(values: &[f32], out: &mut [u8]);
}

/// Evaluates `$body` with `$layout` bound to the [`Layout`] value of a
/// [`Format`](crate::weights::Format): the one match from a format to its type, so code
/// generic over [`Layout`] (or a backend's extension of it) serves every format.
#[macro_export]
macro_rules! with_layout {
    ($format:expr, |$layout:ident| $body:expr) => {
        $crate::with_layout!(@table $format, $layout, $body;
            F32 => F32, F16 => F16, BF16 => Bf16, Q8_0 => Q8_0, Q4_0 => Q4_0, Q4K => Q4K,
            Q5K => Q5K, Q6K => Q6K, MXFP4 => Mxfp4,
            TQ1_0 => Tq1_0, TQ2_0 => Tq2_0, I2S { beta } => I2s { beta })
    };
    (@table $format:expr, $layout:ident, $body:expr;
        $($variant:ident $({ $field:ident })? => $ty:ident $({ $value:ident })?),*) => {
        match $format {
            $($crate::weights::Format::$variant $({ $field })? => {
                let $layout = $crate::formats::$ty $({ $value })?;
                $body
            })*
        }
    };
}

/// The value of largest magnitude, with its sign (the first one on ties; 0 for an empty or
/// all-zero slice): ggml's K-quant scales are `±levels / max`, so the sign decides which end
/// of the level range the extreme value lands on.
#[inline]
pub fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// ggml's `nearest_int`: round half to even through the float mantissa (exact for
/// |v| < 2^22, which covers every clamped quantization level).
#[inline]
pub fn nearest_int(v: f32) -> i32 {
    let v = v.clamp(-4_194_303.0, 4_194_303.0);
    ((v + 12_582_912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Format;

    /// Every format's layout answers for the same bytes: a row's size and its first value.
    #[test]
    fn every_format_has_its_layout() {
        let formats = [
            (Format::F32, 4 * 256),
            (Format::F16, 2 * 256),
            (Format::BF16, 2 * 256),
            (Format::Q8_0, 8 * 34),
            (Format::Q4_0, 8 * 18),
            (Format::Q4K, 144),
            (Format::Q5K, 176),
            (Format::Q6K, 210),
            (Format::MXFP4, 8 * 17),
            (Format::TQ1_0, 54),
            (Format::TQ2_0, 66),
            (Format::I2S { beta: 2.0 }, 64),
        ];
        for (format, bytes) in formats {
            let size = crate::with_layout!(format, |layout| row_bytes_of(layout, 256));
            assert_eq!(size, bytes, "{format:?}");
        }
    }

    fn row_bytes_of<L: Layout>(_: L, cols: usize) -> usize {
        L::row_bytes(cols)
    }
}
