//! Weight matrices on the GPU: kept packed as their layout's route reads them
//! ([`crate::formats`]), split into row windows that fit one binding and one dispatch
//! dimension; gate and up joined for the fused FFN; a mixture's experts stacked in one buffer
//! for the products whose rows pick their expert, each expert viewing its rows there.

use std::sync::Arc;

use hesper_engine::backend::BackendError;
use hesper_engine::file::ModelFile;
use hesper_engine::weights::MatrixDesc;
use hesper_gpu::{Gpu, GpuBuffer, GpuError};

use crate::formats::GpuLayout;

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
    /// int8 with f32 scales per 32-block (from Q8_0, and Q4_0 widened to it).
    Q8_0,
    /// bf16 weights.
    Bf16,
    /// K-quant codes as nibbles and their high bits, with each sub-block's integer scale and
    /// minimum, and `d`, `dmin` per 256-block (from Q4_K, Q5_K, Q6_K:
    /// `crate::formats::k_quants`).
    Kq {
        /// Values per sub-block: 32 (Q4_K, Q5_K) or 16 (Q6_K).
        sub: u32,
        /// A code's bits above its nibble: 0 (Q4_K), 1 (Q5_K) or 2 (Q6_K).
        high: u32,
        /// What a code's bits are less: 32 (Q6_K) or 0.
        offset: u32,
    },
}

impl Kind {
    /// Whether matrices of `self` and `other` can become one (their rows read by one kernel
    /// launch): the same route, and for K-quants the same sub-blocks and codes.
    pub fn joins(self, other: Self) -> bool {
        match (self, other) {
            (a @ Self::Kq { .. }, b @ Self::Kq { .. }) => a == b,
            _ => std::mem::discriminant(&self) == std::mem::discriminant(&other),
        }
    }

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
    /// A joined Q/K/V matrix ([`GpuMatrix::join_qkv`]): where its K and V rows start.
    pub qkv: Option<QkvParts>,
    /// The experts stacked in its windows ([`GpuMatrix::stack`]), each of `desc.rows` rows,
    /// one after another, each window holding whole experts; 1 for any other matrix.
    pub experts: usize,
}

/// The K and V rows of a joined Q/K/V matrix (its Q rows come first, with the matrix's own
/// `kind` and `scale`).
#[derive(Debug, Clone, Copy)]
pub struct QkvParts {
    /// First K row.
    pub k_row: usize,
    /// First V row.
    pub v_row: usize,
    /// Route and scale of the K rows.
    pub k: (Kind, f32),
    /// Route and scale of the V rows.
    pub v: (Kind, f32),
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
        let data = bytes
            .get(desc.range.clone())
            .ok_or_else(|| unsupported("the tensor data lies outside the file"))?;
        let (kind, windows) = hesper_engine::with_layout!(desc.format, |layout| {
            upload_windows(gpu, layout, &desc, data)
        })
        .map_err(|e| match e {
            Upload::Refused(why) => unsupported(why),
            Upload::Device(e) => BackendError::Allocation {
                what: desc.name.clone(),
                bytes: desc.rows as u64 * desc.row_bytes() as u64,
                why: e.to_string(),
            },
        })?;
        Ok(Self {
            desc,
            kind,
            scale: scale.unwrap_or(1.0),
            windows,
            host: None,
            odd: None,
            qkv: None,
            experts: 1,
        })
    }

    /// The output multipliers: of the (even) rows, of the odd rows of a joined gate/up pair or
    /// the K rows of a joined Q/K/V matrix, and of its V rows (0 where there are none): β
    /// times the matrix scale for I2_S, the scale otherwise.
    pub fn out_scales(&self) -> (f32, f32, f32) {
        let of = |(kind, scale): (Kind, f32)| match kind {
            Kind::I2s { beta } => beta * scale,
            _ => scale,
        };
        let second = self.odd.or(self.qkv.map(|p| p.k)).map_or(0.0, of);
        let third = self.qkv.map_or(0.0, |p| of(p.v));
        (of((self.kind, self.scale)), second, third)
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
        let fits = gate.kind.joins(up.kind)
            && (up.desc.rows, up.desc.cols) == (rows, cols)
            && gate.windows.len() == 1
            && up.windows.len() == 1
            && [&gate, &up]
                .iter()
                .all(|m| m.odd.is_none() && m.qkv.is_none())
            && 2 * rows <= rows_per_window(gpu, gate.kind.row_bytes(cols));
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
            qkv: None,
            experts: 1,
        }))
    }

    /// Joins an attention block's Q, K and (where given) V into one matrix of their rows one
    /// after the other (copied on the GPU), for one pass that writes the three outputs
    /// (`hesper_shaders::SPLIT_QKV`; without V its rows start past the last, so none is
    /// written as one). Returns them untouched where they differ in layout or width, or would
    /// not fit one window.
    #[allow(clippy::type_complexity)]
    pub fn join_qkv(
        gpu: &mut Gpu,
        q: Self,
        k: Self,
        v: Option<Self>,
    ) -> Result<Result<Self, (Self, Self, Option<Self>)>, GpuError> {
        let cols = q.desc.cols;
        let parts: Vec<&Self> = [&q, &k].into_iter().chain(v.as_ref()).collect();
        let rows: usize = parts.iter().map(|m| m.desc.rows).sum();
        let row_words = q.kind.row_bytes(cols) / 4;
        let fits = parts.iter().all(|m| {
            m.kind.joins(q.kind)
                && m.desc.cols == cols
                && m.windows.len() == 1
                && m.odd.is_none()
                && m.qkv.is_none()
                && m.windows[0].scales.is_some() == q.windows[0].scales.is_some()
        }) && rows <= rows_per_window(gpu, q.kind.row_bytes(cols));
        if !fits {
            return Ok(Err((q, k, v)));
        }
        let mut batch = gpu.batch();
        let mut data = gpu.zeroed("q+k+v", rows * row_words)?;
        let mut scales = match &q.windows[0].scales {
            Some(s) => Some((gpu.zeroed("q+k+v scales", s.len() / q.desc.rows * rows)?, 0)),
            None => None,
        };
        let mut at = 0;
        for m in &parts {
            let w = &m.windows[0];
            batch.copy(&w.data, 0, &mut data, at, m.desc.rows * row_words)?;
            at += m.desc.rows * row_words;
            if let (Some((all, at)), Some(s)) = (scales.as_mut(), &w.scales) {
                batch.copy(s, 0, all, *at, s.len())?;
                *at += s.len();
            }
        }
        gpu.submit(batch)?;
        let names: Vec<&str> = parts.iter().map(|m| m.desc.name.as_str()).collect();
        let desc = MatrixDesc {
            name: names.join("+"),
            rows,
            ..q.desc.clone()
        };
        // Without V, its route and scale are K's (no row reads them).
        let v_part = v.as_ref().unwrap_or(&k);
        Ok(Ok(Self {
            desc,
            kind: q.kind,
            scale: q.scale,
            windows: vec![Window {
                row0: 0,
                rows,
                data,
                scales: scales.map(|(s, _)| s),
            }],
            host: None,
            odd: None,
            qkv: Some(QkvParts {
                k_row: q.desc.rows,
                v_row: q.desc.rows + k.desc.rows,
                k: (k.kind, k.scale),
                v: (v_part.kind, v_part.scale),
            }),
            experts: 1,
        }))
    }

    /// Stacks a mixture's expert matrices (of one shape and route, one window each) for
    /// products whose rows each pick their expert (`product::Outputs::ById`): expert `e`'s
    /// rows after expert `e − 1`'s, in windows of as many whole experts as one binding holds
    /// (a product launches once a window); each expert's window then views its rows there, so
    /// no byte is held twice. Returns the stack and the experts, or the experts untouched where
    /// they differ, their route has no such kernel, one expert alone would not fit a binding,
    /// or an expert's bytes would not start at the device's storage offset alignment.
    #[allow(clippy::type_complexity)]
    pub fn stack(
        gpu: &mut Gpu,
        mut parts: Vec<Self>,
    ) -> Result<Result<(Self, Vec<Self>), Vec<Self>>, GpuError> {
        let Some(first) = parts.first() else {
            return Ok(Err(parts));
        };
        let n = parts.len();
        let (data_len, scales_len) = {
            let w = &first.windows[0];
            (w.data.len(), w.scales.as_ref().map(GpuBuffer::len))
        };
        let alike = parts.iter().all(|m| {
            m.kind == first.kind
                && m.scale == first.scale
                && m.odd == first.odd
                && m.qkv.is_none()
                && m.experts == 1
                && (m.desc.rows, m.desc.cols) == (first.desc.rows, first.desc.cols)
                && m.windows.len() == 1
                && m.windows[0].data.len() == data_len
                && m.windows[0].scales.as_ref().map(GpuBuffer::len) == scales_len
        });
        // Experts a window holds: as many as one binding takes of the weights and the scales.
        let fit = |len: usize| (gpu.max_binding() / (4 * len.max(1)) as u64) as usize;
        let per_window = fit(data_len).min(scales_len.map_or(n, fit)).min(n);
        if !(first.kind.by_id() && alike && per_window > 0) {
            return Ok(Err(parts));
        }
        let rows = first.desc.rows;
        let mut batch = gpu.batch();
        let mut windows = Vec::new();
        let mut views = Vec::with_capacity(n);
        for e0 in (0..n).step_by(per_window) {
            let k = per_window.min(n - e0);
            let data = gpu.zeroed::<u32>("experts", k * data_len)?;
            let scales = match scales_len {
                Some(len) => Some(gpu.zeroed::<f32>("experts' scales", k * len)?),
                None => None,
            };
            // Each expert's bytes must start where a binding may.
            for e in 0..k {
                let d = gpu.view(&data, e * data_len, data_len);
                let s = match (&scales, scales_len) {
                    (Some(all), Some(len)) => gpu.view(all, e * len, len).map(Some),
                    _ => Some(None),
                };
                let (Some(d), Some(s)) = (d, s) else {
                    return Ok(Err(parts));
                };
                views.push((d, s));
            }
            windows.push(Window {
                row0: e0 * rows,
                rows: k * rows,
                data,
                scales,
            });
        }
        for (e, m) in parts.iter().enumerate() {
            let (from, win) = (&m.windows[0], &mut windows[e / per_window]);
            let at = e % per_window;
            batch.copy(&from.data, 0, &mut win.data, at * data_len, data_len)?;
            if let (Some(all), Some(s), Some(len)) = (win.scales.as_mut(), &from.scales, scales_len)
            {
                batch.copy(s, 0, all, at * len, len)?;
            }
        }
        gpu.submit(batch)?;
        for (m, (data, scales)) in parts.iter_mut().zip(views) {
            m.windows[0].data = data;
            m.windows[0].scales = scales;
        }
        let first = &parts[0];
        let name = first.desc.name.split('[').next().unwrap_or_default();
        let stacked = Self {
            desc: MatrixDesc {
                name: format!("{name} (all {n})"),
                ..first.desc.clone()
            },
            kind: first.kind,
            scale: first.scale,
            windows,
            host: None,
            odd: first.odd,
            qkv: None,
            experts: n,
        };
        Ok(Ok((stacked, parts)))
    }
}

impl Kind {
    /// Whether its matrix-vector kernel has an `_id` instance, whose rows each pick an expert
    /// of a stacked matrix ([`GpuMatrix::stack`]).
    pub fn by_id(self) -> bool {
        matches!(self, Self::F16 | Self::Bf16 | Self::Q8_0 | Self::Kq { .. })
    }

    /// Bytes of one row as uploaded (TQ becomes 2-bit codes: cols/4; a K-quant row its codes,
    /// then two bytes per sub-block).
    fn row_bytes(self, cols: usize) -> usize {
        match self {
            Kind::F32 => cols * 4,
            Kind::F16 | Kind::Bf16 => cols * 2,
            Kind::I2s { .. } | Kind::Tq => cols / 4,
            Kind::Q8_0 => cols,
            Kind::Kq { sub, high, .. } => {
                cols / 2 + cols * high as usize / 8 + 2 * cols / sub as usize
            }
        }
    }
}

/// Why an upload failed.
enum Upload {
    /// The layout has no GPU route for this matrix (the reason).
    Refused(&'static str),
    /// The device refused a buffer.
    Device(GpuError),
}

/// `desc`'s rows (`data`, of `layout`) repacked for its route and uploaded in windows that
/// each fit one binding and one dispatch dimension.
fn upload_windows<L: GpuLayout>(
    gpu: &Gpu,
    layout: L,
    desc: &MatrixDesc,
    data: &[u8],
) -> Result<(Kind, Vec<Window>), Upload> {
    let kind = layout.route(desc.cols).map_err(Upload::Refused)?;
    let per_window = rows_per_window(gpu, kind.row_bytes(desc.cols));
    if per_window == 0 {
        return Err(Upload::Refused(
            "one row is larger than the GPU's largest binding",
        ));
    }
    let src_row_bytes = L::row_bytes(desc.cols);
    let mut windows = Vec::new();
    let mut row0 = 0;
    while row0 < desc.rows {
        let rows = per_window.min(desc.rows - row0);
        let src = &data[row0 * src_row_bytes..(row0 + rows) * src_row_bytes];
        let (weights, scales) = L::repack(src, desc.cols);
        windows.push(Window {
            row0,
            rows,
            data: gpu
                .upload_bytes(&desc.name, &weights)
                .map_err(Upload::Device)?,
            scales: scales
                .map(|s| gpu.upload(&desc.name, &s))
                .transpose()
                .map_err(Upload::Device)?,
        });
        row0 += rows;
    }
    Ok((kind, windows))
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
    let [groups, ..] = hesper_shaders::interleave_rows::grid_for(words);
    let groups = groups.min(MAX_GRID as u32);
    batch.run(
        gpu,
        &hesper_shaders::interleave_rows::Args {
            a,
            b,
            out: &mut out,
            row_words: row_words as u32,
            rows: rows as u32,
            stride: groups * hesper_shaders::interleave_rows::WORKGROUP_SIZE,
        },
        [groups, 1, 1],
    )?;
    Ok(out)
}
