//! ggml's Q8_0: 32 int8 values and an f16 scale per block.

use half::f16;

use super::{Encode, Layout};

/// Bytes per Q8_0 block (f16 scale + 32 × i8) for 32 weights.
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// The Q8_0 layout.
#[derive(Debug, Clone, Copy)]
pub struct Q8_0;

impl Layout for Q8_0 {
    const NAME: &'static str = "Q8_0";
    const BLOCK: usize = 32;
    const BLOCK_BYTES: usize = Q8_0_BLOCK_BYTES;
    const SCALES: &'static [usize] = &[0];

    fn decode_block(&self, blk: &[u8], out: &mut [f32]) {
        let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        for (v, &q) in out.iter_mut().zip(&blk[2..]) {
            *v = f32::from(q as i8) * d;
        }
    }
}

impl Encode for Q8_0 {
    fn encode_block(values: &[f32], out: &mut [u8]) {
        let (d, qs) = q8_0_block(values);
        out[..2].copy_from_slice(&d.to_le_bytes());
        for (o, q) in out[2..].iter_mut().zip(qs) {
            *o = q as u8;
        }
    }
}

/// Quantizes 32 values like ggml's `quantize_row_q8_0_ref`: `d = amax/127` (stored as f16),
/// `q = roundf(x/d)` (half away from zero). Returns `(d as f16, q)`.
pub fn q8_0_block(x: &[f32]) -> (f16, [i8; 32]) {
    let amax = x.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    (f16::from_f32(d), qs)
}
