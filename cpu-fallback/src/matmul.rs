//! Matrix × activations: quantize each token's activations once, then split weight rows
//! across the thread pool; every weight row is read once and dotted with all tokens.

use std::sync::Arc;

use hesper_engine::file::ModelFile;
use hesper_engine::weights::{Format, MatrixDesc};
use rayon::prelude::*;

use crate::formats::{i2s, row_kernels, Activations, RowKernels};
use crate::interleave::ROWS;
use crate::kernels::Isa;
use crate::quant::I8Row;

/// Where a matrix's bytes live.
enum Storage {
    /// Borrowed from the memory-mapped file (no copy).
    File(Arc<ModelFile>),
    /// Made by hesper-rs (a re-quantized LM head).
    Owned(Vec<u8>),
}

/// A weight matrix: usually borrowed from the memory-mapped file.
pub struct CpuMatrix {
    storage: Storage,
    /// The rows interleaved sixteen deep ([`crate::interleave`]), when the kernels read that
    /// copy instead of `storage`.
    tiles: Option<Vec<u8>>,
    /// Shape, layout and location.
    pub desc: MatrixDesc,
    /// Multiplier applied to every output (mainline `*.scale` tensors).
    pub scale: Option<f32>,
    /// The row kernels of the layout (`desc.format`'s).
    kernels: Box<dyn RowKernels>,
}

impl CpuMatrix {
    /// Wraps `desc` inside `file`.
    pub fn new(file: Arc<ModelFile>, desc: MatrixDesc, scale: Option<f32>) -> Self {
        Self {
            storage: Storage::File(file),
            tiles: None,
            kernels: row_kernels(desc.format),
            desc,
            scale,
        }
    }

    /// Wraps bytes made by hesper-rs; `desc.range` indexes `data`.
    pub fn owned(data: Vec<u8>, desc: MatrixDesc, scale: Option<f32>) -> Self {
        Self {
            storage: Storage::Owned(data),
            tiles: None,
            kernels: row_kernels(desc.format),
            desc,
            scale,
        }
    }

    /// The same matrix computing from an interleaved copy of its I2_S rows (see
    /// [`crate::interleave::fits`] for the shapes that can be): the file's pages are given
    /// back, so the resident size stays about the same.
    pub fn interleaved(mut self) -> Self {
        let tiles = crate::interleave::interleave(self.data(), self.desc.row_bytes());
        if let Storage::File(file) = &self.storage {
            file.release(self.desc.range.clone());
        }
        self.tiles = Some(tiles);
        self
    }

    fn storage_bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::File(f) => f.bytes(),
            Storage::Owned(v) => v,
        }
    }

    /// The weight bytes.
    pub fn data(&self) -> &[u8] {
        &self.storage_bytes()[self.desc.range.clone()]
    }

    /// Decodes row `r` to f32.
    pub fn decode_row(&self, r: usize, out: &mut [f32]) {
        self.desc.decode_row(self.storage_bytes(), r, out);
    }

    fn quantize(&self, x: &[f32], n: usize) -> Activations {
        self.kernels.quantize_batch(x, self.desc.cols, n)
    }

    /// `out[t][r] = W[r] · x[t]` for `n` tokens (`x` is `[n][cols]`, `out` is `[n][rows]`).
    pub fn matmul(&self, isa: Isa, x: &[f32], n: usize, out: &mut [f32]) {
        if n == 1 {
            return matvec_many(isa, &[self], x, &mut [out]);
        }
        let act = self.quantize(x, n);
        if let (Some(tiles), Activations::I8(a), Format::I2S { beta }) =
            (&self.tiles, &act, self.desc.format)
        {
            return self.matmul_tiles(isa, tiles, a, beta, out);
        }
        let rows = self.desc.rows;
        let row_bytes = self.desc.row_bytes();
        let data = self.data();
        let chunk = chunk_rows(rows);
        let scale = self.scale.unwrap_or(1.0);
        // About 16 KiB of int8 activations per token block, in whole groups of four: the
        // chunk's rows (in L2) then pass over activations held in L1. Measured on the 2B4T
        // shape (BENCHMARKS.md): 8–24 KiB alike, 48 KiB 8 % slower, 96 KiB 15 % slower.
        let token_block = ((16 << 10) / self.desc.cols.max(1)).clamp(4, 64) / 4 * 4;
        let blocks: Vec<(usize, Vec<f32>)> = (0..rows.div_ceil(chunk))
            .into_par_iter()
            .map(|ci| {
                let r0 = ci * chunk;
                let r1 = (r0 + chunk).min(rows);
                let width = r1 - r0;
                let chunk_data = &data[r0 * row_bytes..r1 * row_bytes];
                let mut local = vec![0.0; width * n];
                // Tokens in blocks whose activations stay in cache while this chunk's rows
                // (in L2) pass over them.
                for t0 in (0..n).step_by(token_block) {
                    let tokens = t0..(t0 + token_block).min(n);
                    self.kernels
                        .rows_tokens(isa, chunk_data, &act, tokens, scale, &mut local, width);
                }
                (r0, local)
            })
            .collect();
        scatter(blocks, n, rows, out);
    }
}

/// Rows per parallel task: about eight tasks per thread, for balance without much overhead;
/// whole blocks of sixteen, so an interleaved matrix splits between its blocks.
fn chunk_rows(rows: usize) -> usize {
    (rows / (rayon::current_num_threads() * 8))
        .clamp(8, 1024)
        .next_multiple_of(crate::interleave::ROWS)
}

/// Tokens per pass of the interleaved kernel: eight chains of `vpdpbusd` keep the multiplier
/// busy, and eight tokens' activations (20 KiB at 2560 columns) stay in L1.
const TILE_TOKENS: usize = 8;

impl CpuMatrix {
    /// [`CpuMatrix::matmul`] over the interleaved copy: chunks of whole sixteen-row blocks in
    /// parallel; in each, eight tokens at a time (then four, then one) meet every block of the
    /// chunk. Each task appends its results in the order it makes them (no zeroed buffer),
    /// then they are copied into place.
    fn matmul_tiles(&self, isa: Isa, tiles: &[u8], a: &[I8Row], beta: f32, out: &mut [f32]) {
        let (rows, n) = (self.desc.rows, a.len());
        let block_bytes = ROWS * self.desc.row_bytes();
        let chunk = chunk_rows(rows);
        let mut groups = Vec::new();
        let mut t = 0;
        for size in [TILE_TOKENS, 4, 1] {
            while t + size <= n {
                groups.push((t, size));
                t += size;
            }
        }
        let parts: Vec<(usize, Vec<f32>)> = (0..rows.div_ceil(chunk))
            .into_par_iter()
            .map(|ci| {
                let (r0, r1) = (ci * chunk, (ci * chunk + chunk).min(rows));
                let mut local = Vec::with_capacity((r1 - r0) * n);
                let mut put = |t: usize, sums: &[[i32; ROWS]]| {
                    for (k, sums) in sums.iter().enumerate() {
                        local.extend(i2s::outputs(sums, &a[t + k], beta, self.scale));
                    }
                };
                for &(t, size) in &groups {
                    let q = |k: usize| a[t + k].q.as_slice();
                    for r in (r0..r1).step_by(ROWS) {
                        let block = &tiles[r / ROWS * block_bytes..][..block_bytes];
                        match size {
                            TILE_TOKENS => put(
                                t,
                                &i2s::rows16_dot::<TILE_TOKENS>(isa, block, std::array::from_fn(q)),
                            ),
                            4 => put(t, &i2s::rows16_dot::<4>(isa, block, std::array::from_fn(q))),
                            _ => put(t, &i2s::rows16_dot::<1>(isa, block, [q(0)])),
                        }
                    }
                }
                (r0, local)
            })
            .collect();
        // A task's results: per token group, per block, per token, sixteen rows.
        for (r0, local) in parts {
            let blocks = local.len() / (n * ROWS);
            let mut at = local.chunks_exact(ROWS);
            for &(t, size) in &groups {
                for b in 0..blocks {
                    for k in 0..size {
                        let row0 = (t + k) * rows + r0 + b * ROWS;
                        out[row0..row0 + ROWS].copy_from_slice(at.next().unwrap_or_default());
                    }
                }
            }
        }
    }
}

/// Copies each task's `[n][width]` results into `out` (`[n][rows]`) at its first row.
fn scatter(parts: Vec<(usize, Vec<f32>)>, n: usize, rows: usize, out: &mut [f32]) {
    for (r0, local) in parts {
        let width = local.len() / n;
        for t in 0..n {
            out[t * rows + r0..t * rows + r0 + width]
                .copy_from_slice(&local[t * width..(t + 1) * width]);
        }
    }
}

/// `outs[j] = ws[j] · x` for one token and several matrices that read it: the activations
/// are quantized once per layout and every matrix's rows go into one parallel pass (one
/// synchronisation instead of one per matrix).
pub fn matvec_many(isa: Isa, ws: &[&CpuMatrix], x: &[f32], outs: &mut [&mut [f32]]) {
    let mut acts: Vec<Activations> = Vec::new();
    let mut act_of = Vec::with_capacity(ws.len());
    for (j, w) in ws.iter().enumerate() {
        match ws[..j]
            .iter()
            .position(|p| p.kernels.activation() == w.kernels.activation())
        {
            Some(prev) => act_of.push(act_of[prev]),
            None => {
                acts.push(w.quantize(x, 1));
                act_of.push(acts.len() - 1);
            }
        }
    }
    let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::new();
    for (j, (w, out)) in ws.iter().zip(outs.iter_mut()).enumerate() {
        let chunk = chunk_rows(w.desc.rows);
        for (ci, o) in out[..w.desc.rows].chunks_mut(chunk).enumerate() {
            tasks.push((j, ci * chunk, o));
        }
    }
    tasks
        .into_par_iter()
        .for_each(|(j, r0, o)| ws[j].rows_dot(isa, &acts[act_of[j]], r0, o));
}

impl CpuMatrix {
    /// `out[i] = W[r0 + i] · x` for token 0 of `act`.
    fn rows_dot(&self, isa: Isa, act: &Activations, r0: usize, out: &mut [f32]) {
        let row_bytes = self.desc.row_bytes();
        if let (Some(tiles), Format::I2S { beta }, Activations::I8(a)) =
            (&self.tiles, self.desc.format, act)
        {
            // `chunk_rows` splits between blocks: r0 starts one and `out` holds whole ones.
            let block_bytes = ROWS * row_bytes;
            let blocks = tiles[r0 / ROWS * block_bytes..].chunks_exact(block_bytes);
            for (o, block) in out.chunks_exact_mut(ROWS).zip(blocks) {
                let [sums] = i2s::rows16_dot::<1>(isa, block, [&a[0].q]);
                o.copy_from_slice(&i2s::outputs(&sums, &a[0], beta, self.scale));
            }
            return;
        }
        let data = &self.data()[r0 * row_bytes..(r0 + out.len()) * row_bytes];
        let scale = self.scale.unwrap_or(1.0);
        self.kernels.rows_dot(isa, data, act, scale, out);
    }
}
