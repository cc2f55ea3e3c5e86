//! Unquantized layouts: one value per block.

use half::{bf16, f16};

use super::{Encode, Layout};

/// f32 values.
#[derive(Debug, Clone, Copy)]
pub struct F32;

/// f16 values.
#[derive(Debug, Clone, Copy)]
pub struct F16;

/// bf16 values.
#[derive(Debug, Clone, Copy)]
pub struct Bf16;

impl Layout for F32 {
    const NAME: &'static str = "F32";
    const BLOCK: usize = 1;
    const BLOCK_BYTES: usize = 4;

    fn decode_block(&self, b: &[u8], out: &mut [f32]) {
        out[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

impl Layout for F16 {
    const NAME: &'static str = "F16";
    const BLOCK: usize = 1;
    const BLOCK_BYTES: usize = 2;

    fn decode_block(&self, b: &[u8], out: &mut [f32]) {
        out[0] = f16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

impl Layout for Bf16 {
    const NAME: &'static str = "BF16";
    const BLOCK: usize = 1;
    const BLOCK_BYTES: usize = 2;

    fn decode_block(&self, b: &[u8], out: &mut [f32]) {
        out[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

impl Encode for F32 {
    fn encode_block(values: &[f32], out: &mut [u8]) {
        out.copy_from_slice(&values[0].to_le_bytes());
    }
}

/// Rounded to nearest, ties to even, as ggml's F16C conversion does.
impl Encode for F16 {
    fn encode_block(values: &[f32], out: &mut [u8]) {
        out.copy_from_slice(&f16::from_f32(values[0]).to_le_bytes());
    }
}

/// Rounded to nearest, ties to even, as ggml's `ggml_compute_fp32_to_bf16` does (a NaN stays
/// a quiet NaN).
impl Encode for Bf16 {
    fn encode_block(values: &[f32], out: &mut [u8]) {
        out.copy_from_slice(&bf16::from_f32(values[0]).to_le_bytes());
    }
}
