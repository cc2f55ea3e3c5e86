//! Matrix × activations: quantize each token's activations once, then split weight rows
//! across the thread pool; every weight row is read once and dotted with all tokens.

use std::sync::Arc;

use hesper_engine::file::ModelFile;
use hesper_engine::weights::{Format, MatrixDesc};
use rayon::prelude::*;

use crate::formats::{
    float, i2s, mxfp4, q4_0, q4_k, q5_k, q6_k, q8_0, row_kernels, Activations, RowKernels,
};
use crate::interleave::ROWS;
use crate::kernels::Isa;
use crate::quant::{I8Row, Q8KBlock, Q8_0Block};

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
    /// The rows interleaved sixteen deep ([`crate::interleave`] for I2_S,
    /// [`crate::interleave_q8_0`] for Q8_0, [`crate::interleave_q4_0`] for Q4_0,
    /// [`crate::interleave_q4_k`] for Q4_K and Q5_K, [`crate::interleave_q6_k`] for Q6_K,
    /// [`crate::interleave_f16`] for F16), when the kernels read that copy instead of
    /// `storage`.
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

    /// The same matrix computing from an interleaved copy of its I2_S, Q8_0, Q4_0, MXFP4, Q4_K,
    /// Q5_K, Q6_K or F16 rows (see the `fits` of [`crate::interleave`],
    /// [`crate::interleave_q8_0`], [`crate::interleave_q4_0`], [`crate::interleave_mxfp4`],
    /// [`crate::interleave_q4_k`], [`crate::interleave_q6_k`] and
    /// [`crate::interleave_f16`] for the shapes that can be; other layouts stay as they are):
    /// the file's pages are given back, so the resident size stays about the same. Owned bytes
    /// of the layouts but I2_S are dropped: their rows are then decoded from the copy.
    pub fn interleaved(mut self) -> Self {
        let row_bytes = self.desc.row_bytes();
        let tiles = match self.desc.format {
            Format::I2S { .. } => crate::interleave::interleave(self.data(), row_bytes),
            Format::Q8_0 => crate::interleave_q8_0::interleave(self.data(), row_bytes),
            Format::Q4_0 => crate::interleave_q4_0::interleave(self.data(), row_bytes),
            Format::MXFP4 => crate::interleave_mxfp4::interleave(self.data(), row_bytes),
            Format::Q4K => crate::interleave_q4_k::interleave::<false>(self.data(), row_bytes),
            Format::Q5K => crate::interleave_q4_k::interleave::<true>(self.data(), row_bytes),
            Format::Q6K => crate::interleave_q6_k::interleave(self.data(), row_bytes),
            Format::F16 => crate::interleave_f16::interleave(self.data(), row_bytes),
            _ => return self,
        };
        match &mut self.storage {
            Storage::File(file) => file.release(self.desc.range.clone()),
            Storage::Owned(bytes) if !matches!(self.desc.format, Format::I2S { .. }) => {
                *bytes = Vec::new();
                self.desc.range = 0..0;
            }
            Storage::Owned(_) => {}
        }
        self.tiles = Some(tiles);
        self
    }

    /// The same matrix computing from its TQ1_0 blocks rewritten as TQ2_0 blocks
    /// ([`crate::tq1_0_as_tq2_0`]: the same codes and scales, so the same products), owned,
    /// the file's pages given back; a matrix of another layout stays as it is.
    pub fn as_tq2_0(self) -> Self {
        if self.desc.format != Format::TQ1_0 {
            return self;
        }
        let data = crate::tq1_0_as_tq2_0::rewrite(self.data());
        if let Storage::File(file) = &self.storage {
            file.release(self.desc.range.clone());
        }
        let desc = MatrixDesc {
            format: Format::TQ2_0,
            range: 0..data.len(),
            ..self.desc
        };
        Self::owned(data, desc, self.scale)
    }

    /// Whether the kernels read an interleaved copy made at load ([`CpuMatrix::interleaved`])
    /// rather than the rows as stored.
    pub fn is_interleaved(&self) -> bool {
        self.tiles.is_some()
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
        match (&self.tiles, &self.storage) {
            (Some(tiles), Storage::Owned(bytes)) if bytes.is_empty() => {
                // Owned rows of the interleaved layouts but I2_S live only in the copy.
                let mut row = vec![0u8; self.desc.row_bytes()];
                match self.desc.format {
                    Format::F16 => crate::interleave_f16::row(tiles, row.len(), r, &mut row),
                    Format::Q4_0 => crate::interleave_q4_0::row(tiles, row.len(), r, &mut row),
                    Format::MXFP4 => crate::interleave_mxfp4::row(tiles, row.len(), r, &mut row),
                    Format::Q4K => {
                        crate::interleave_q4_k::row::<false>(tiles, self.desc.cols, r, &mut row)
                    }
                    Format::Q5K => {
                        crate::interleave_q4_k::row::<true>(tiles, self.desc.cols, r, &mut row)
                    }
                    Format::Q6K => crate::interleave_q6_k::row(tiles, row.len(), r, &mut row),
                    _ => crate::interleave_q8_0::row(tiles, row.len(), r, &mut row),
                }
                hesper_engine::weights::decode_row(self.desc.format, &row, out);
            }
            _ => self.desc.decode_row(self.storage_bytes(), r, out),
        }
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
        if let Some(tiles) = &self.tiles {
            let tile = match self.desc.format {
                Format::F16 => f16_tile_tokens(isa),
                _ => TILE_TOKENS,
            };
            let groups = token_groups(n, tile);
            match (&act, self.desc.format) {
                (Activations::I8(a), Format::I2S { beta }) => {
                    let dot = self.i2s_blocks(isa, a, beta, &groups);
                    return self.matmul_tiles(tiles, n, out, &groups, &dot);
                }
                (Activations::Q8_0(a), Format::Q8_0) => {
                    let dot = self.packed_blocks(isa, a, &groups, q8_0::Packed::new, tiles!(q8_0));
                    return self.matmul_tiles(tiles, n, out, &groups, &dot);
                }
                (Activations::Q8_0(a), Format::Q4_0) => {
                    let dot = self.packed_blocks(isa, a, &groups, q8_0::Packed::new, tiles!(q4_0));
                    return self.matmul_tiles(tiles, n, out, &groups, &dot);
                }
                (Activations::Q8_0(a), Format::MXFP4) => {
                    let dot = self.packed_blocks(isa, a, &groups, q8_0::Packed::new, tiles!(mxfp4));
                    return self.matmul_tiles(tiles, n, out, &groups, &dot);
                }
                (Activations::Q8K(a), Format::Q4K) => {
                    let dot = self.packed_blocks(isa, a, &groups, q4_k::Packed::new, tiles!(q4_k));
                    return self.matmul_tiles(tiles, n, out, &groups, &dot);
                }
                (Activations::Q8K(a), Format::Q5K) => {
                    let dot = self.packed_blocks(isa, a, &groups, q4_k::Packed::new, tiles!(q5_k));
                    return self.matmul_tiles(tiles, n, out, &groups, &dot);
                }
                (Activations::Q8K(a), Format::Q6K) => {
                    let dot = self.packed_blocks(isa, a, &groups, q4_k::Packed::new, tiles!(q6_k));
                    return self.matmul_tiles(tiles, n, out, &groups, &dot);
                }
                (Activations::Float(x), Format::F16) => {
                    let dot = self.f16_blocks(isa, x, &groups);
                    return self.matmul_tiles(tiles, n, out, &groups, &*dot);
                }
                _ => {}
            }
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

/// Tokens per group of the interleaved F16 kernel on AVX-VNNI machines (Intel Alder Lake and
/// later clients): two passes of six, whose twelve FMA chains keep both FMA pipes busy while
/// the weights' conversions take their share of them (eight chains ran 12–15 % slower with these
/// kernels on a Zen 5 core). AVX2 alone keeps eight: twelve measured 5 % slower on a Zen 3.
const F16_AVX_VNNI_TILE_TOKENS: usize = 12;

/// Tokens per group of the interleaved F16 kernel for `isa`.
fn f16_tile_tokens(isa: Isa) -> usize {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni => F16_AVX_VNNI_TILE_TOKENS,
        _ => TILE_TOKENS,
    }
}

/// The tokens of a product over an interleaved copy in groups `(first, size)`: `tile` at a
/// time, then four, then one.
fn token_groups(n: usize, tile: usize) -> Vec<(usize, usize)> {
    let mut groups = Vec::new();
    let mut t = 0;
    for size in [tile, 4, 1] {
        while t + size <= n {
            groups.push((t, size));
            t += size;
        }
    }
    groups
}

/// One interleaved block of sixteen rows against token group `g` (of [`token_groups`]): appends
/// the outputs, token by token, sixteen each.
type BlockDot<'a> = dyn Fn(&[u8], usize, &mut Vec<f32>) + Sync + 'a;

/// A float-result interleaved kernel (Q8_0, F16) at each tile size (`N` tokens, four, one),
/// over activations packed as `P` for one token group.
struct FloatTiles<P, const N: usize = TILE_TOKENS> {
    first: fn(Isa, &[u8], &P) -> [[f32; ROWS]; N],
    four: fn(Isa, &[u8], &P) -> [[f32; ROWS]; 4],
    one: fn(Isa, &[u8], &P) -> [[f32; ROWS]; 1],
}

/// The [`FloatTiles`] of a layout module's `rows16_dot`.
macro_rules! tiles {
    ($layout:ident) => {
        FloatTiles {
            first: $layout::rows16_dot::<TILE_TOKENS>,
            four: $layout::rows16_dot::<4>,
            one: $layout::rows16_dot::<1>,
        }
    };
}
use tiles;

/// The [`BlockDot`] of a float-result kernel: `packed[g]` is group `g`'s size and activations;
/// each row's sum times `scale` is appended.
fn float_blocks<P: Sync, const N: usize>(
    isa: Isa,
    scale: f32,
    packed: Vec<(usize, P)>,
    kernels: FloatTiles<P, N>,
) -> impl Fn(&[u8], usize, &mut Vec<f32>) + Sync {
    move |block, g, local| {
        let (size, p) = &packed[g];
        let values: &[[f32; ROWS]] = match *size {
            4 => &(kernels.four)(isa, block, p),
            1 => &(kernels.one)(isa, block, p),
            _ => &(kernels.first)(isa, block, p),
        };
        for v in values {
            local.extend(v.iter().map(|v| v * scale));
        }
    }
}

impl CpuMatrix {
    /// The I2_S kernel of [`CpuMatrix::matmul_tiles`]: integer sums, then each token's scale.
    fn i2s_blocks<'a>(
        &'a self,
        isa: Isa,
        a: &'a [I8Row],
        beta: f32,
        groups: &'a [(usize, usize)],
    ) -> impl Fn(&[u8], usize, &mut Vec<f32>) + Sync + 'a {
        move |block, g, local| {
            let (t, size) = groups[g];
            let q = |k: usize| a[t + k].q.as_slice();
            let mut put = |sums: &[[i32; ROWS]]| {
                for (k, sums) in sums.iter().enumerate() {
                    local.extend(i2s::outputs(sums, &a[t + k], beta, self.scale));
                }
            };
            match size {
                TILE_TOKENS => put(&i2s::rows16_dot::<TILE_TOKENS>(
                    isa,
                    block,
                    std::array::from_fn(q),
                )),
                4 => put(&i2s::rows16_dot::<4>(isa, block, std::array::from_fn(q))),
                _ => put(&i2s::rows16_dot::<1>(isa, block, [q(0)])),
            }
        }
    }

    /// The kernel of [`CpuMatrix::matmul_tiles`] for a layout whose interleaved kernels
    /// (`kernels`) read activations of blocks `T` packed by `pack`: each group's activations
    /// packed once, each row's sum as the single-row scalar kernel makes it, times the matrix's
    /// scale.
    fn packed_blocks<T: Sync, P: Send + Sync>(
        &self,
        isa: Isa,
        a: &[Vec<T>],
        groups: &[(usize, usize)],
        pack: fn(&[&[T]]) -> P,
        kernels: FloatTiles<P>,
    ) -> impl Fn(&[u8], usize, &mut Vec<f32>) + Sync {
        let packed = groups
            .par_iter()
            .map(|&(t, size)| {
                let acts: Vec<&[T]> = a[t..t + size].iter().map(Vec::as_slice).collect();
                (size, pack(&acts))
            })
            .collect();
        float_blocks(isa, self.scale.unwrap_or(1.0), packed, kernels)
    }

    /// Bytes of a row in the interleaved copy (a Q4_K or Q5_K row holds its scales as whole
    /// bytes there; the other layouts keep their size).
    fn tile_row_bytes(&self) -> usize {
        match self.desc.format {
            Format::Q4K => crate::interleave_q4_k::interleaved_row_bytes(self.desc.cols, false),
            Format::Q5K => crate::interleave_q4_k::interleaved_row_bytes(self.desc.cols, true),
            _ => self.desc.row_bytes(),
        }
    }

    /// The F16 kernel of [`CpuMatrix::matmul_tiles`] (`x` rounded through f16): each group's
    /// activations packed once, each row's sum as the single-row scalar kernel makes it, times
    /// the matrix's scale.
    fn f16_blocks(
        &self,
        isa: Isa,
        x: &[Vec<f32>],
        groups: &[(usize, usize)],
    ) -> Box<BlockDot<'static>> {
        let packed: Vec<_> = groups
            .par_iter()
            .map(|&(t, size)| {
                let xs: Vec<&[f32]> = x[t..t + size].iter().map(Vec::as_slice).collect();
                (size, float::pack_f16(&xs))
            })
            .collect();
        let scale = self.scale.unwrap_or(1.0);
        let four = |isa, block: &[u8], x: &Vec<f32>| float::f16_rows16_dot::<4>(isa, block, x);
        let one = |isa, block: &[u8], x: &Vec<f32>| float::f16_rows16_dot::<1>(isa, block, x);
        if f16_tile_tokens(isa) == F16_AVX_VNNI_TILE_TOKENS {
            let first = |isa, block: &[u8], x: &Vec<f32>| {
                float::f16_rows16_dot::<F16_AVX_VNNI_TILE_TOKENS>(isa, block, x)
            };
            let kernels = FloatTiles { first, four, one };
            return Box::new(float_blocks(isa, scale, packed, kernels));
        }
        let first =
            |isa, block: &[u8], x: &Vec<f32>| float::f16_rows16_dot::<TILE_TOKENS>(isa, block, x);
        let kernels = FloatTiles { first, four, one };
        Box::new(float_blocks(isa, scale, packed, kernels))
    }

    /// [`CpuMatrix::matmul`] over the interleaved copy: chunks of whole sixteen-row blocks in
    /// parallel; in each, every token group (`groups`, of [`token_groups`]) meets every block
    /// of the chunk through `block_dot`. Each task appends its results in the order it makes
    /// them (no zeroed buffer), then they are copied into place.
    fn matmul_tiles(
        &self,
        tiles: &[u8],
        n: usize,
        out: &mut [f32],
        groups: &[(usize, usize)],
        block_dot: &BlockDot<'_>,
    ) {
        let rows = self.desc.rows;
        let block_bytes = ROWS * self.tile_row_bytes();
        let chunk = chunk_rows(rows);
        let parts: Vec<(usize, Vec<f32>)> = (0..rows.div_ceil(chunk))
            .into_par_iter()
            .map(|ci| {
                let (r0, r1) = (ci * chunk, (ci * chunk + chunk).min(rows));
                let mut local = Vec::with_capacity((r1 - r0) * n);
                for g in 0..groups.len() {
                    for r in (r0..r1).step_by(ROWS) {
                        let block = &tiles[r / ROWS * block_bytes..][..block_bytes];
                        block_dot(block, g, &mut local);
                    }
                }
                (r0, local)
            })
            .collect();
        // A task's results: per token group, per block, per token, sixteen rows.
        for (r0, local) in parts {
            let blocks = local.len() / (n * ROWS);
            let mut at = local.chunks_exact(ROWS);
            for &(t, size) in groups {
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
    /// `out` (whole blocks of sixteen rows from row `r0`) for one token of activations packed
    /// as `packed`, from the interleaved copy `tiles` through `dot`, times the matrix's scale.
    fn rows16_one<P>(
        &self,
        isa: Isa,
        tiles: &[u8],
        r0: usize,
        out: &mut [f32],
        packed: &P,
        dot: fn(Isa, &[u8], &P) -> [[f32; ROWS]; 1],
    ) {
        let scale = self.scale.unwrap_or(1.0);
        let block_bytes = ROWS * self.tile_row_bytes();
        let blocks = tiles[r0 / ROWS * block_bytes..].chunks_exact(block_bytes);
        for (o, block) in out.chunks_exact_mut(ROWS).zip(blocks) {
            let [values] = dot(isa, block, packed);
            for (o, v) in o.iter_mut().zip(values) {
                *o = v * scale;
            }
        }
    }

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
        if let Some(tiles) = &self.tiles {
            let one = |a: &[Q8_0Block]| q8_0::Packed::new(&[a]);
            let one_k = |a: &[Q8KBlock]| q4_k::Packed::new(&[a]);
            match (self.desc.format, act) {
                (Format::Q8_0, Activations::Q8_0(a)) => {
                    let packed = one(&a[0]);
                    return self.rows16_one(isa, tiles, r0, out, &packed, q8_0::rows16_dot::<1>);
                }
                (Format::Q4_0, Activations::Q8_0(a)) => {
                    let packed = one(&a[0]);
                    return self.rows16_one(isa, tiles, r0, out, &packed, q4_0::rows16_dot::<1>);
                }
                (Format::MXFP4, Activations::Q8_0(a)) => {
                    let packed = one(&a[0]);
                    return self.rows16_one(isa, tiles, r0, out, &packed, mxfp4::rows16_dot::<1>);
                }
                (Format::Q4K, Activations::Q8K(a)) => {
                    let packed = one_k(&a[0]);
                    return self.rows16_one(isa, tiles, r0, out, &packed, q4_k::rows16_dot::<1>);
                }
                (Format::Q5K, Activations::Q8K(a)) => {
                    let packed = one_k(&a[0]);
                    return self.rows16_one(isa, tiles, r0, out, &packed, q5_k::rows16_dot::<1>);
                }
                (Format::Q6K, Activations::Q8K(a)) => {
                    let packed = one_k(&a[0]);
                    return self.rows16_one(isa, tiles, r0, out, &packed, q6_k::rows16_dot::<1>);
                }
                _ => {}
            }
        }
        if let (Some(tiles), Format::F16, Activations::Float(x)) =
            (&self.tiles, self.desc.format, act)
        {
            let scale = self.scale.unwrap_or(1.0);
            let block_bytes = ROWS * row_bytes;
            let tiles = &tiles[r0 / ROWS * block_bytes..][..out.len() * row_bytes];
            // Four blocks at a time (four FMA chains), then one.
            let (fours, rest) = tiles.split_at(tiles.len() / (4 * block_bytes) * 4 * block_bytes);
            let (out4, out1) = out.split_at_mut(fours.len() / row_bytes);
            for (o, four) in out4
                .chunks_exact_mut(4 * ROWS)
                .zip(fours.chunks_exact(4 * block_bytes))
            {
                let blocks: [&[u8]; 4] =
                    std::array::from_fn(|i| &four[i * block_bytes..(i + 1) * block_bytes]);
                let values = float::f16_rows64_dot(isa, blocks, &x[0]);
                for (o, v) in o.iter_mut().zip(values.as_flattened()) {
                    *o = v * scale;
                }
            }
            for (o, block) in out1
                .chunks_exact_mut(ROWS)
                .zip(rest.chunks_exact(block_bytes))
            {
                let [values] = float::f16_rows16_dot::<1>(isa, block, &x[0]);
                for (o, v) in o.iter_mut().zip(values) {
                    *o = v * scale;
                }
            }
            return;
        }
        let data = &self.data()[r0 * row_bytes..(r0 + out.len()) * row_bytes];
        let scale = self.scale.unwrap_or(1.0);
        self.kernels.rows_dot(isa, data, act, scale, out);
    }
}
