//! Typed views of weight tensors: a matrix's shape, layout and bytes, read and checked from
//! the file, and decoded or re-encoded through its layout ([`crate::formats`], where the
//! reference decoders live).

use std::ops::Range;

use thiserror::Error;

use crate::formats::{
    Bf16, Encode, Layout, Tq1_0, Tq2_0, F16, F32, I2S_GROUP, Q4K, Q5K, Q6K, Q8_0,
};
use crate::gguf::{GgmlType, TensorError, TensorInfo};

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
    /// ggml Q4_0 blocks (see [`crate::formats::Q4_0`]).
    Q4_0,
    /// ggml Q4_K blocks (see [`crate::formats::q4_k`]).
    Q4K,
    /// ggml Q5_K blocks (see [`crate::formats::q5_k`]).
    Q5K,
    /// ggml Q6_K blocks (see [`crate::formats::q6_k`]).
    Q6K,
    /// MXFP4 blocks (see [`crate::formats::Mxfp4`]).
    MXFP4,
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
    #[error("tensor {name:?} has type {ty}, which hesper-rs cannot compute with (it runs F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, MXFP4, I2_S, TQ1_0 and TQ2_0)")]
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
    /// A layout (stored, or the target of a re-quantization) needs rows of whole blocks.
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
    /// Values that I2_S cannot hold: it stores codes −1, 0, +1 times one scale per tensor.
    #[error("tensor {name:?}: I2_S holds ternary values with one scale per tensor, and this one has magnitudes {} and {} (TQ1_0 and TQ2_0 keep a scale per 256 values)", magnitudes[0], magnitudes[1])]
    NotTernary {
        /// Tensor name.
        name: String,
        /// Two of its nonzero magnitudes that differ.
        magnitudes: [f32; 2],
    },
    /// A 32-bit float in the file is not finite where it must be.
    #[error("tensor {name:?}: scale {value} is not a finite number")]
    BadScale {
        /// Tensor name.
        name: String,
        /// The value read.
        value: f32,
    },
    /// A block's scale is infinite or NaN: every value of the block would be too.
    #[error("tensor {name:?}: block {block} (of {format}) has scale {value}, which is not a finite number")]
    BadBlockScale {
        /// Tensor name.
        name: String,
        /// The block's index in the tensor, from 0.
        block: usize,
        /// The layout's name.
        format: &'static str,
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
        let mut format = match info.ty {
            GgmlType::F32 => Format::F32,
            GgmlType::F16 => Format::F16,
            GgmlType::BF16 => Format::BF16,
            GgmlType::Q8_0 => Format::Q8_0,
            GgmlType::Q4_0 => Format::Q4_0,
            GgmlType::Q4K => Format::Q4K,
            GgmlType::Q5K => Format::Q5K,
            GgmlType::Q6K => Format::Q6K,
            GgmlType::MXFP4 => Format::MXFP4,
            GgmlType::TQ1_0 => Format::TQ1_0,
            GgmlType::TQ2_0 => Format::TQ2_0,
            // β is read below, once the rows are known to be whole groups.
            GgmlType::I2S => Format::I2S { beta: 0.0 },
            GgmlType::Other(_) | GgmlType::Unknown(_) => return Err(unsupported()),
        };
        let (block, layout) = crate::with_layout!(format, |l| (block_of(l), name_of(l)));
        if !cols.is_multiple_of(block) {
            return Err(WeightError::BlockRow {
                name: info.name.clone(),
                cols,
                block,
                format: layout,
            });
        }
        let not_in_file = || TensorError::NotInBuffer {
            name: info.name.clone(),
        };
        let mut end = start + nbytes as usize;
        if let Format::I2S { beta } = &mut format {
            // The range covers the codes only; β follows them.
            end = start + rows * (cols / 4);
            let raw = file.get(end..end + 4).ok_or_else(not_in_file)?;
            *beta = f32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
            if !beta.is_finite() {
                return Err(WeightError::BadScale {
                    name: info.name.clone(),
                    value: *beta,
                });
            }
        }
        if file.len() < end {
            return Err(not_in_file().into());
        }
        let bad = crate::with_layout!(format, |l| l.non_finite_scale(&file[start..end]));
        if let Some((block, value)) = bad {
            return Err(WeightError::BadBlockScale {
                name: info.name.clone(),
                block,
                format: layout,
                value,
            });
        }
        Ok(Self {
            name: info.name.clone(),
            rows,
            cols,
            format,
            range: start..end,
        })
    }

    /// Bytes of one row (for I2_S: of the codes).
    pub fn row_bytes(&self) -> usize {
        crate::with_layout!(self.format, |l| row_bytes_of(l, self.cols))
    }

    /// Decodes row `r` to f32 with the reference decoders (`data` = the whole file).
    pub fn decode_row(&self, data: &[u8], r: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        let row = &data[self.range.start + r * rb..self.range.start + (r + 1) * rb];
        decode_row(self.format, row, out);
    }
}

/// Values per block of `layout`.
fn block_of<L: Layout>(_: L) -> usize {
    L::BLOCK
}

/// The name of `layout`.
fn name_of<L: Layout>(_: L) -> &'static str {
    L::NAME
}

/// Bytes of a row of `cols` values of `layout`.
fn row_bytes_of<L: Layout>(_: L, cols: usize) -> usize {
    L::row_bytes(cols)
}

/// Decodes one stored row of `format` into `out` (whose length is the row length).
pub fn decode_row(format: Format, row: &[u8], out: &mut [f32]) {
    crate::with_layout!(format, |l| l.decode_row(row, out));
}

/// Re-encodes a matrix as `format` — Q8_0, Q6_K, Q5_K, Q4_K, F32, F16, BF16, TQ1_0, TQ2_0, or I2_S from
/// ternary values with one scale — (an F16 LM head, to cut the bytes read per token;
/// `hesper-rs quantize`). Returns the new description (its range covers the returned bytes;
/// for I2_S the codes, its β in the format) and the bytes.
pub fn requantize(
    desc: &MatrixDesc,
    file: &[u8],
    format: Format,
) -> Result<(MatrixDesc, Vec<u8>), WeightError> {
    match format {
        Format::Q8_0 => encode::<Q8_0>(desc, file, format),
        Format::Q6K => encode::<Q6K>(desc, file, format),
        Format::Q5K => encode::<Q5K>(desc, file, format),
        Format::Q4K => encode::<Q4K>(desc, file, format),
        Format::F32 => encode::<F32>(desc, file, format),
        Format::F16 => encode::<F16>(desc, file, format),
        Format::BF16 => encode::<Bf16>(desc, file, format),
        Format::TQ1_0 => encode::<Tq1_0>(desc, file, format),
        Format::TQ2_0 => encode::<Tq2_0>(desc, file, format),
        Format::I2S { .. } => encode_i2s(desc, file),
        _ => Err(WeightError::UnsupportedType {
            name: desc.name.clone(),
            ty: format!("{format:?} (as a re-quantization target)"),
        }),
    }
}

/// [`requantize`] into the layout `L` (of `format`).
fn encode<L: Encode>(
    desc: &MatrixDesc,
    file: &[u8],
    format: Format,
) -> Result<(MatrixDesc, Vec<u8>), WeightError> {
    if !desc.cols.is_multiple_of(L::BLOCK) {
        return Err(WeightError::BlockRow {
            name: desc.name.clone(),
            cols: desc.cols,
            block: L::BLOCK,
            format: L::NAME,
        });
    }
    let row_bytes = L::row_bytes(desc.cols);
    let mut out = vec![0u8; desc.rows * row_bytes];
    let encode_rows = |r0: usize, dst: &mut [u8]| {
        let mut row = vec![0.0f32; desc.cols];
        for (r, encoded) in (r0..).zip(dst.chunks_exact_mut(row_bytes)) {
            desc.decode_row(file, r, &mut row);
            for (values, b) in row
                .chunks_exact(L::BLOCK)
                .zip(encoded.chunks_exact_mut(L::BLOCK_BYTES))
            {
                L::encode_block(values, b);
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
    let desc = MatrixDesc {
        name: desc.name.clone(),
        rows: desc.rows,
        cols: desc.cols,
        format,
        range: 0..out.len(),
    };
    Ok((desc, out))
}

/// [`requantize`] into I2_S: one scale β for the whole tensor, so only values that are
/// ternary with one magnitude (a ternary tensor of another layout whose blocks share their
/// scale) are taken, and kept exactly.
fn encode_i2s(desc: &MatrixDesc, file: &[u8]) -> Result<(MatrixDesc, Vec<u8>), WeightError> {
    if !desc.cols.is_multiple_of(I2S_GROUP) {
        return Err(WeightError::BlockRow {
            name: desc.name.clone(),
            cols: desc.cols,
            block: I2S_GROUP,
            format: "I2_S",
        });
    }
    let row_bytes = desc.cols / 4;
    let mut out = vec![0u8; desc.rows * row_bytes];
    let mut row = vec![0.0f32; desc.cols];
    let mut beta = 0.0f32;
    for (r, codes) in out.chunks_exact_mut(row_bytes).enumerate() {
        desc.decode_row(file, r, &mut row);
        for (k, &v) in row.iter().enumerate() {
            if v != 0.0 && beta == 0.0 {
                beta = v.abs();
            }
            if v != 0.0 && v.abs() != beta {
                return Err(WeightError::NotTernary {
                    name: desc.name.clone(),
                    magnitudes: [beta, v.abs()],
                });
            }
            let code = 1 + i32::from(v > 0.0) - i32::from(v < 0.0);
            codes[32 * (k / I2S_GROUP) + k % 32] |=
                (code as u8) << (6 - 2 * ((k % I2S_GROUP) / 32));
        }
    }
    let desc = MatrixDesc {
        name: desc.name.clone(),
        rows: desc.rows,
        cols: desc.cols,
        format: Format::I2S { beta },
        range: 0..out.len(),
    };
    Ok((desc, out))
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
