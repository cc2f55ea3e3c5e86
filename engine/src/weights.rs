//! Typed views of weight tensors and the reference decoders of every weight layout.
//!
//! The decoders here define what each stored byte means; backends may use faster routes but
//! are tested against these.

use std::ops::Range;

use half::{bf16, f16};
use thiserror::Error;

use crate::gguf::{GgmlType, TensorError, TensorInfo};
use crate::q6_k::{decode_q6_k_block, q6_k_block, Q6_K_BLOCK, Q6_K_BLOCK_BYTES};

/// Bytes per TQ2_0 block (64 code bytes + f16 scale) for 256 weights.
pub const TQ2_0_BLOCK_BYTES: usize = 66;
/// Bytes per TQ1_0 block (48 + 4 packed trit bytes + f16 scale) for 256 weights.
pub const TQ1_0_BLOCK_BYTES: usize = 54;
/// Bytes per Q8_0 block (f16 scale + 32 × i8) for 32 weights.
pub const Q8_0_BLOCK_BYTES: usize = 34;
/// Weights per I2_S group (x86 / official layout).
pub const I2S_GROUP: usize = 128;

/// How a matrix's elements are stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Format {
    /// f32 elements.
    F32,
    /// f16 elements.
    F16,
    /// bf16 elements.
    BF16,
    /// ggml Q8_0 blocks.
    Q8_0,
    /// ggml Q6_K blocks (see [`crate::q6_k`]).
    Q6K,
    /// ggml TQ1_0 blocks.
    TQ1_0,
    /// ggml TQ2_0 blocks.
    TQ2_0,
    /// bitnet.cpp I2_S: codes only (the f32 scale is lifted out into `beta`).
    I2S {
        /// The per-tensor weight scale β.
        beta: f32,
    },
}

/// A 2-D weight matrix: `rows` outputs of `cols` inputs each (GGUF `ne = [cols, rows]`).
#[derive(Debug, Clone)]
pub struct MatrixDesc {
    /// Tensor name.
    pub name: String,
    /// Output rows.
    pub rows: usize,
    /// Inputs per row.
    pub cols: usize,
    /// Element layout.
    pub format: Format,
    /// Byte range of the element data inside the file (for I2_S, the codes only).
    pub range: Range<usize>,
}

/// Errors raised while interpreting a tensor as a weight.
#[derive(Debug, Error, PartialEq)]
pub enum WeightError {
    /// The tensor's type is not usable as a weight matrix.
    #[error("tensor {name:?} has type {ty}, which hesper-rs cannot compute with")]
    UnsupportedType {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: String,
    },
    /// The tensor's shape is not what the model needs.
    #[error("tensor {name:?} has shape {got:?}, expected {expected:?}")]
    Shape {
        /// Tensor name.
        name: String,
        /// Its dims.
        got: Vec<u64>,
        /// The dims the model needs.
        expected: Vec<u64>,
    },
    /// The tensor data cannot be used (unknown type id or outside the file).
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// I2_S rows must cover whole 128-element groups.
    #[error("tensor {name:?}: I2_S needs rows that are a multiple of 128 elements, got {cols}")]
    I2sRow {
        /// Tensor name.
        name: String,
        /// Row length.
        cols: usize,
    },
    /// A re-quantization target needs rows of whole blocks.
    #[error("tensor {name:?}: rows of {cols} values are not whole {block}-value blocks, which {format} needs")]
    BlockRow {
        /// Tensor name.
        name: String,
        /// Row length.
        cols: usize,
        /// The target's block length.
        block: usize,
        /// The target layout's name.
        format: &'static str,
    },
    /// A 32-bit float in the file is not finite where it must be.
    #[error("tensor {name:?}: scale {value} is not a finite number")]
    BadScale {
        /// Tensor name.
        name: String,
        /// The value read.
        value: f32,
    },
}

impl MatrixDesc {
    /// Describes `info` (found in `file`) as a `[rows, cols]` matrix; checks the shape.
    pub fn new(
        info: &TensorInfo,
        file: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, WeightError> {
        let expected = vec![cols as u64, rows as u64];
        let dims: Vec<u64> = info.ne.iter().copied().filter(|&d| d != 1).collect();
        let shape_ok =
            info.ne[0] == cols as u64 && info.ne[1..].iter().product::<u64>() == rows as u64;
        if !shape_ok {
            return Err(WeightError::Shape {
                name: info.name.clone(),
                got: dims,
                expected,
            });
        }
        let unsupported = || WeightError::UnsupportedType {
            name: info.name.clone(),
            ty: info.ty.to_string(),
        };
        let nbytes = info.nbytes.ok_or_else(|| TensorError::UnknownType {
            name: info.name.clone(),
            id: info.ty.id(),
        })?;
        let start = info.start as usize;
        let format = match info.ty {
            GgmlType::F32 => Format::F32,
            GgmlType::F16 => Format::F16,
            GgmlType::BF16 => Format::BF16,
            GgmlType::Q8_0 => Format::Q8_0,
            GgmlType::Q6K => Format::Q6K,
            GgmlType::TQ1_0 => Format::TQ1_0,
            GgmlType::TQ2_0 => Format::TQ2_0,
            GgmlType::I2S => {
                if !cols.is_multiple_of(I2S_GROUP) {
                    return Err(WeightError::I2sRow {
                        name: info.name.clone(),
                        cols,
                    });
                }
                let codes = rows * cols / 4;
                let at = start + codes;
                let raw = file
                    .get(at..at + 4)
                    .ok_or_else(|| TensorError::NotInBuffer {
                        name: info.name.clone(),
                    })?;
                let beta = f32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
                if !beta.is_finite() {
                    return Err(WeightError::BadScale {
                        name: info.name.clone(),
                        value: beta,
                    });
                }
                return Ok(Self {
                    name: info.name.clone(),
                    rows,
                    cols,
                    format: Format::I2S { beta },
                    range: start..start + codes,
                });
            }
            GgmlType::Other(_) | GgmlType::Unknown(_) => return Err(unsupported()),
        };
        if file.len() < start + nbytes as usize {
            return Err(TensorError::NotInBuffer {
                name: info.name.clone(),
            }
            .into());
        }
        Ok(Self {
            name: info.name.clone(),
            rows,
            cols,
            format,
            range: start..start + nbytes as usize,
        })
    }

    /// Bytes of one row (for I2_S: of the codes).
    pub fn row_bytes(&self) -> usize {
        match self.format {
            Format::F32 => self.cols * 4,
            Format::F16 | Format::BF16 => self.cols * 2,
            Format::Q8_0 => self.cols / 32 * Q8_0_BLOCK_BYTES,
            Format::Q6K => self.cols / Q6_K_BLOCK * Q6_K_BLOCK_BYTES,
            Format::TQ1_0 => self.cols / 256 * TQ1_0_BLOCK_BYTES,
            Format::TQ2_0 => self.cols / 256 * TQ2_0_BLOCK_BYTES,
            Format::I2S { .. } => self.cols / 4,
        }
    }

    /// Decodes row `r` to f32 with the reference decoders (`data` = the whole file).
    pub fn decode_row(&self, data: &[u8], r: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        let row = &data[self.range.start + r * rb..self.range.start + (r + 1) * rb];
        decode_row(self.format, row, out);
    }
}

/// Decodes one stored row of `format` into `out` (whose length is the row length).
pub fn decode_row(format: Format, row: &[u8], out: &mut [f32]) {
    match format {
        Format::F32 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Format::F16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        Format::BF16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        Format::Q8_0 => {
            for (o, blk) in out
                .chunks_exact_mut(32)
                .zip(row.chunks_exact(Q8_0_BLOCK_BYTES))
            {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                for (v, &q) in o.iter_mut().zip(&blk[2..]) {
                    *v = f32::from(q as i8) * d;
                }
            }
        }
        Format::Q6K => {
            for (o, blk) in out
                .chunks_exact_mut(Q6_K_BLOCK)
                .zip(row.chunks_exact(Q6_K_BLOCK_BYTES))
            {
                decode_q6_k_block(blk, o);
            }
        }
        Format::TQ2_0 => {
            for (o, blk) in out
                .chunks_exact_mut(256)
                .zip(row.chunks_exact(TQ2_0_BLOCK_BYTES))
            {
                let d = f16::from_le_bytes([blk[64], blk[65]]).to_f32();
                for (e, v) in o.iter_mut().enumerate() {
                    *v = f32::from(tq2_0_code(blk, e) as i8 - 1) * d;
                }
            }
        }
        Format::TQ1_0 => {
            for (o, blk) in out
                .chunks_exact_mut(256)
                .zip(row.chunks_exact(TQ1_0_BLOCK_BYTES))
            {
                let d = f16::from_le_bytes([blk[52], blk[53]]).to_f32();
                for (e, v) in o.iter_mut().enumerate() {
                    *v = f32::from(tq1_0_code(blk, e) as i8 - 1) * d;
                }
            }
        }
        Format::I2S { beta } => {
            for (k, v) in out.iter_mut().enumerate() {
                *v = f32::from(i2s_code(row, k) as i8 - 1) * beta;
            }
        }
    }
}

/// Code (0, 1, 2 ↦ −1, 0, +1) of element `e` (0..256) of a TQ2_0 block: LSB-first crumbs,
/// byte `(e/128)*32 + e%32`, shift `2*((e%128)/32)`.
pub fn tq2_0_code(block: &[u8], e: usize) -> u8 {
    let byte = block[(e / 128) * 32 + e % 32];
    (byte >> (2 * ((e % 128) / 32))) & 3
}

/// Code of element `k` of an I2_S row: 128-element groups of 32 bytes, MSB-first crumbs,
/// byte `32*(k/128) + k%32`, shift `6 - 2*((k%128)/32)`.
pub fn i2s_code(row: &[u8], k: usize) -> u8 {
    let byte = row[32 * (k / I2S_GROUP) + k % 32];
    (byte >> (6 - 2 * ((k % I2S_GROUP) / 32))) & 3
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

/// Re-encodes a matrix as `format` — Q8_0 or Q6_K — (e.g. an F16 LM head, to cut the bytes
/// read per token). Returns the new description (its range covers the returned bytes) and
/// the bytes.
pub fn requantize(
    desc: &MatrixDesc,
    file: &[u8],
    format: Format,
) -> Result<(MatrixDesc, Vec<u8>), WeightError> {
    let (block, format_name) = match format {
        Format::Q8_0 => (32, "Q8_0"),
        Format::Q6K => (Q6_K_BLOCK, "Q6_K"),
        _ => {
            return Err(WeightError::UnsupportedType {
                name: desc.name.clone(),
                ty: format!("{format:?} (as a re-quantization target)"),
            })
        }
    };
    if !desc.cols.is_multiple_of(block) {
        return Err(WeightError::BlockRow {
            name: desc.name.clone(),
            cols: desc.cols,
            block,
            format: format_name,
        });
    }
    let new = MatrixDesc {
        name: desc.name.clone(),
        rows: desc.rows,
        cols: desc.cols,
        format,
        range: 0..0,
    };
    let row_bytes = new.row_bytes();
    let mut out = vec![0u8; desc.rows * row_bytes];
    let encode_rows = |r0: usize, dst: &mut [u8]| {
        let mut row = vec![0.0f32; desc.cols];
        for (r, encoded) in (r0..).zip(dst.chunks_exact_mut(row_bytes)) {
            desc.decode_row(file, r, &mut row);
            let blocks = row.chunks_exact(block);
            if format == Format::Q6K {
                for (values, b) in blocks.zip(encoded.chunks_exact_mut(Q6_K_BLOCK_BYTES)) {
                    b.copy_from_slice(&q6_k_block(values));
                }
            } else {
                for (values, b) in blocks.zip(encoded.chunks_exact_mut(Q8_0_BLOCK_BYTES)) {
                    let (d, qs) = q8_0_block(values);
                    b[..2].copy_from_slice(&d.to_le_bytes());
                    for (o, q) in b[2..].iter_mut().zip(qs) {
                        *o = q as u8;
                    }
                }
            }
        }
    };
    // Rows are independent: natively they are spread over the cores (a 2B4T head is 328 M
    // values); wasm32 has no threads here.
    #[cfg(not(target_arch = "wasm32"))]
    {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per = desc.rows.div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            for (i, dst) in out.chunks_mut(per * row_bytes).enumerate() {
                let encode_rows = &encode_rows;
                scope.spawn(move || encode_rows(i * per, dst));
            }
        });
    }
    #[cfg(target_arch = "wasm32")]
    encode_rows(0, &mut out);
    let range = 0..out.len();
    Ok((MatrixDesc { range, ..new }, out))
}

/// Reads an F32 vector tensor (norm gains, scales).
pub fn read_f32_vector(
    info: &TensorInfo,
    data: &[u8],
    len: usize,
) -> Result<Vec<f32>, WeightError> {
    if info.n_elements() != len as u64 {
        return Err(WeightError::Shape {
            name: info.name.clone(),
            got: info.dims().to_vec(),
            expected: vec![len as u64],
        });
    }
    let mut out = vec![0.0; len];
    match info.ty {
        GgmlType::F32 => decode_row(Format::F32, data, &mut out),
        GgmlType::F16 => decode_row(Format::F16, data, &mut out),
        GgmlType::BF16 => decode_row(Format::BF16, data, &mut out),
        _ => {
            return Err(WeightError::UnsupportedType {
                name: info.name.clone(),
                ty: info.ty.to_string(),
            })
        }
    }
    Ok(out)
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
