//! Weight matrices on the GPU: kept packed (I2_S as stored, TQ1_0/TQ2_0 repacked into the
//! I2_S code layout with their block scales), split into row windows that fit one binding
//! and one dispatch dimension.

use std::sync::Arc;

use half::f16;
use hesper_engine::backend::BackendError;
use hesper_engine::file::ModelFile;
use hesper_engine::weights::{
    tq1_0_code, tq2_0_code, Format, MatrixDesc, Q8_0_BLOCK_BYTES, TQ1_0_BLOCK_BYTES,
    TQ2_0_BLOCK_BYTES,
};
use hesper_gpu::{Gpu, GpuBuffer, GpuError};

/// Most workgroups a dispatch may have in one dimension (WebGPU's guaranteed minimum).
const MAX_GRID: usize = 65_535;

/// A range of rows of a matrix in its own buffers.
pub struct Window {
    /// First row.
    pub row0: usize,
    /// Rows it holds.
    pub rows: usize,
    /// Weights: f32 elements, pairs of f16, four int8 or 16 ternary codes per word.
    pub data: GpuBuffer<u32>,
    /// Per-(row, block) weight scales (TQ: 256-blocks, Q8_0: 32-blocks; otherwise none).
    pub scales: Option<GpuBuffer<f32>>,
}

impl Window {
    /// The block scales of a layout that has them.
    pub fn scales(&self, matrix: &str) -> Result<&GpuBuffer<f32>, hesper_gpu::GpuError> {
        self.scales
            .as_ref()
            .ok_or_else(|| hesper_gpu::GpuError::Kernel {
                kernel: "matmul",
                why: format!("{matrix}: a window without block scales"),
            })
    }
}

/// How the GPU multiplies with a matrix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// f32 weights.
    F32,
    /// f16 weights.
    F16,
    /// I2_S codes with one scale β.
    I2s {
        /// β.
        beta: f32,
    },
    /// Ternary codes with f32 scales per 256-block (from TQ1_0 / TQ2_0).
    Tq,
    /// int8 with f32 scales per 32-block (from Q8_0).
    Q8_0,
}

impl Kind {
    /// Whether a GPU kernel fetches embedding rows of this layout (the others are decoded on
    /// the host).
    pub fn fetched_on_gpu(self) -> bool {
        matches!(self, Self::F32 | Self::F16)
    }
}

/// A weight matrix prepared for the GPU.
pub struct GpuMatrix {
    /// Shape and source layout.
    pub desc: MatrixDesc,
    /// Compute route.
    pub kind: Kind,
    /// Multiplier applied to every output.
    pub scale: f32,
    /// Row windows covering all rows.
    pub windows: Vec<Window>,
    /// Where embedding rows of layouts without a GPU fetch kernel are decoded from.
    pub host: Option<HostRows>,
    /// A joined gate/up pair ([`GpuMatrix::join`]): the route and scale of the up rows (the
    /// odd ones; the gate's are `kind` and `scale`).
    pub odd: Option<(Kind, f32)>,
}

/// The bytes embedding rows are decoded from on the host; `desc.range` indexes them.
pub enum HostRows {
    /// The model file, held whole (memory-mapped natively).
    File(Arc<ModelFile>),
    /// The table's own bytes, kept from a streamed load.
    Owned(Vec<u8>),
}

impl HostRows {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Self::File(file) => file.bytes(),
            Self::Owned(bytes) => bytes,
        }
    }
}

impl GpuMatrix {
    /// Uploads `desc` from `bytes` (`desc.range` indexes it).
    pub fn upload(
        gpu: &Gpu,
        desc: MatrixDesc,
        bytes: &[u8],
        scale: Option<f32>,
        backend: &str,
    ) -> Result<Self, BackendError> {
        let unsupported = |why: &str| BackendError::Unsupported {
            backend: backend.into(),
            tensor: desc.name.clone(),
            why: why.into(),
        };
        let kind = match desc.format {
            Format::F32 => Kind::F32,
            Format::F16 if desc.cols.is_multiple_of(2) => Kind::F16,
            Format::F16 => return Err(unsupported("F16 rows must have an even length")),
            Format::I2S { beta } => Kind::I2s { beta },
            Format::TQ1_0 | Format::TQ2_0 if desc.cols.is_multiple_of(256) => Kind::Tq,
            Format::TQ1_0 | Format::TQ2_0 => {
                return Err(unsupported("TQ rows must be whole 256-element blocks"))
            }
            Format::Q8_0 if desc.cols.is_multiple_of(32) => Kind::Q8_0,
            Format::Q8_0 => return Err(unsupported("Q8_0 rows must be whole 32-element blocks")),
            Format::BF16 | Format::Q6K => {
                return Err(unsupported(
                    "no GPU kernel for BF16 or Q6_K weights yet (F32, F16, Q8_0, I2_S, TQ1_0 and TQ2_0 have one); use --backend cpu (or --lm-head q8_0 for a re-quantized head)",
                ))
            }
        };
        let data = bytes
            .get(desc.range.clone())
            .ok_or_else(|| unsupported("the tensor data lies outside the file"))?;
        let gpu_row_bytes = kind.row_bytes(desc.cols);
        let per_window = rows_per_window(gpu, gpu_row_bytes);
        if per_window == 0 {
            return Err(unsupported(
                "one row is larger than the GPU's largest binding",
            ));
        }
        let device = |e: hesper_gpu::GpuError| BackendError::Allocation {
            what: desc.name.clone(),
            bytes: (desc.rows * gpu_row_bytes) as u64,
            why: e.to_string(),
        };
        let src_row_bytes = desc.row_bytes();
        let mut windows = Vec::new();
        let mut row0 = 0;
        while row0 < desc.rows {
            let rows = per_window.min(desc.rows - row0);
            let src = &data[row0 * src_row_bytes..(row0 + rows) * src_row_bytes];
            let window = match kind {
                Kind::Tq => {
                    let (codes, scales) = repack_tq(desc.format, src, desc.cols);
                    Window {
                        row0,
                        rows,
                        data: gpu.upload(&desc.name, &codes).map_err(device)?,
                        scales: Some(gpu.upload(&desc.name, &scales).map_err(device)?),
                    }
                }
                Kind::Q8_0 => {
                    let (qs, scales) = repack_q8_0(src);
                    Window {
                        row0,
                        rows,
                        data: gpu.upload(&desc.name, &qs).map_err(device)?,
                        scales: Some(gpu.upload(&desc.name, &scales).map_err(device)?),
                    }
                }
                _ => Window {
                    row0,
                    rows,
                    data: gpu.upload_bytes(&desc.name, src).map_err(device)?,
                    scales: None,
                },
            };
            windows.push(window);
            row0 += rows;
        }
        Ok(Self {
            desc,
            kind,
            scale: scale.unwrap_or(1.0),
            windows,
            host: None,
            odd: None,
        })
    }

    /// The output multipliers of the even and odd rows (odd: only for a joined pair): β times
    /// the matrix scale for I2_S, the scale otherwise.
    pub fn out_scales(&self) -> (f32, f32) {
        let of = |kind: Kind, scale: f32| match kind {
            Kind::I2s { beta } => beta * scale,
            _ => scale,
        };
        let odd = self.odd.map_or(0.0, |(kind, scale)| of(kind, scale));
        (of(self.kind, self.scale), odd)
    }

    /// Joins an FFN's gate and up into one matrix whose rows interleave them (gate row `i` at
    /// `2i`, up row `i` at `2i + 1`), moved on the GPU by `interleave_rows`, for one fused pass
    /// (`hesper_shaders::GLU_RELU2`). Returns them untouched where they differ in layout or
    /// shape, or the pair would not fit one window.
    pub fn join(
        gpu: &mut Gpu,
        gate: Self,
        up: Self,
    ) -> Result<Result<Self, (Self, Self)>, GpuError> {
        let (rows, cols) = (gate.desc.rows, gate.desc.cols);
        let row_words = gate.kind.row_bytes(cols) / 4;
        let fits = std::mem::discriminant(&gate.kind) == std::mem::discriminant(&up.kind)
            && (up.desc.rows, up.desc.cols) == (rows, cols)
            && gate.windows.len() == 1
            && up.windows.len() == 1
            && gate.odd.is_none()
            && up.odd.is_none()
            && 2 * rows <= rows_per_window(gpu, gate.kind.row_bytes(cols))
            && (2 * rows * row_words)
                .div_ceil(hesper_shaders::interleave_rows::WORKGROUP_SIZE as usize)
                <= MAX_GRID;
        if !fits {
            return Ok(Err((gate, up)));
        }
        let (mut g, mut u) = (gate.windows, up.windows);
        let (g, u) = (g.remove(0), u.remove(0));
        let mut batch = gpu.batch();
        let data = interleave(gpu, &mut batch, &g.data, &u.data, rows, row_words)?;
        let scales = match (g.scales, u.scales) {
            (Some(a), Some(b)) => {
                let (a, b) = (a.into_elements::<u32>(), b.into_elements::<u32>());
                let per_row = a.len() / rows;
                Some(interleave(gpu, &mut batch, &a, &b, rows, per_row)?.into_elements())
            }
            _ => None,
        };
        gpu.submit(batch)?;
        let desc = MatrixDesc {
            name: format!("{}+{}", gate.desc.name, up.desc.name),
            rows: 2 * rows,
            ..gate.desc
        };
        Ok(Ok(Self {
            desc,
            kind: gate.kind,
            scale: gate.scale,
            windows: vec![Window {
                row0: 0,
                rows: 2 * rows,
                data,
                scales,
            }],
            host: None,
            odd: Some((up.kind, up.scale)),
        }))
    }
}

impl Kind {
    /// Bytes of one row as uploaded (TQ becomes 2-bit codes: cols/4).
    fn row_bytes(self, cols: usize) -> usize {
        match self {
            Kind::F32 => cols * 4,
            Kind::F16 => cols * 2,
            Kind::I2s { .. } | Kind::Tq => cols / 4,
            Kind::Q8_0 => cols,
        }
    }
}

/// Rows of `row_bytes` one window may hold: one binding, and one dispatch dimension.
fn rows_per_window(gpu: &Gpu, row_bytes: usize) -> usize {
    (gpu.max_binding() as usize / row_bytes.max(1)).min(MAX_GRID)
}

/// `a` and `b` (`rows × row_words`) with their rows interleaved, recorded into `batch`.
fn interleave(
    gpu: &mut Gpu,
    batch: &mut hesper_gpu::Batch,
    a: &GpuBuffer<u32>,
    b: &GpuBuffer<u32>,
    rows: usize,
    row_words: usize,
) -> Result<GpuBuffer<u32>, GpuError> {
    let mut out = gpu.zeroed("gate+up", 2 * rows * row_words)?;
    let words = (2 * rows * row_words) as u32;
    batch.run(
        gpu,
        &hesper_shaders::interleave_rows::Args {
            a,
            b,
            out: &mut out,
            row_words: row_words as u32,
            rows: rows as u32,
        },
        hesper_shaders::interleave_rows::grid_for(words),
    )?;
    Ok(out)
}

/// Q8_0 blocks → their int8 values as little-endian words (8 per block) and their f16
/// scales as f32.
fn repack_q8_0(src: &[u8]) -> (Vec<u32>, Vec<f32>) {
    let blocks = src.chunks_exact(Q8_0_BLOCK_BYTES);
    let scales = blocks
        .clone()
        .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect();
    let words = blocks
        .flat_map(|b| {
            b[2..]
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        })
        .collect();
    (words, scales)
}

/// The code (0, 1, 2) of element `e` of a ternary block.
type CodeOf = fn(&[u8], usize) -> u8;

/// TQ1_0/TQ2_0 rows → ternary codes in the I2_S layout (element `k` of a row in byte
/// `32·(k/128) + k%32`, shift `6 − 2·((k%128)/32)`) as little-endian words, plus the f16
/// scale of every 256-block as f32.
fn repack_tq(format: Format, src: &[u8], cols: usize) -> (Vec<u32>, Vec<f32>) {
    let (block_bytes, code): (usize, CodeOf) = match format {
        Format::TQ1_0 => (TQ1_0_BLOCK_BYTES, tq1_0_code),
        _ => (TQ2_0_BLOCK_BYTES, tq2_0_code),
    };
    let blocks = src.len() / block_bytes;
    let mut bytes = vec![0u8; blocks * 64];
    let mut scales = Vec::with_capacity(blocks);
    let per_row = cols / 256;
    for (b, blk) in src.chunks_exact(block_bytes).enumerate() {
        let row_base = (b / per_row) * (cols / 4);
        let k0 = (b % per_row) * 256;
        for e in 0..256 {
            let k = k0 + e;
            let at = row_base + 32 * (k / 128) + k % 32;
            bytes[at] |= code(blk, e) << (6 - 2 * ((k % 128) / 32));
        }
        scales.push(f16::from_le_bytes([blk[block_bytes - 2], blk[block_bytes - 1]]).to_f32());
    }
    let words = bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    (words, scales)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hesper_engine::weights::i2s_code;

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
        let (words, scales) = repack_tq(Format::TQ2_0, &src, cols);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
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
        assert_eq!(scales, vec![0.5, 1.5, 2.5, 3.5]);
    }
}
