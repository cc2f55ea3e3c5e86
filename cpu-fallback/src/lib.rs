//! hesper-cpu: the CPU backend of hesper-rs (see the crate README).

pub mod attention;
pub mod experts;
pub mod formats;
pub mod interleave;
pub mod interleave_f16;
pub mod interleave_mxfp4;
pub mod interleave_q4_0;
pub mod interleave_q4_k;
pub mod interleave_q6_k;
pub mod interleave_q8_0;
pub mod kernels;
pub mod matmul;
pub mod membw;
pub mod meminfo;
pub mod ops;
pub mod profile;
pub mod quant;
pub mod tq1_0_as_tq2_0;

use std::future::Future;
use std::sync::Arc;

use hesper_engine::attention::AttentionConfig;
use hesper_engine::backend::{
    matmul_each, AttentionShape, Backend, BackendError, MatrixUse, Moe, RopeShape,
};
use hesper_engine::config::{Activation, Experts};
use hesper_engine::file::ModelFile;
use hesper_engine::memory::MemoryLimits;
use hesper_engine::weights::{Format, MatrixDesc};

pub use attention::KvCache;
pub use kernels::Isa;
pub use matmul::CpuMatrix;
use profile::OpProfile;
pub use profile::{Op, OpTime};

/// The CPU backend: a thread pool and an instruction set.
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    isa: Isa,
    repack: bool,
    profile: OpProfile,
}

impl CpuBackend {
    /// A backend with `threads` workers (0 = one per core) on the best instruction set.
    pub fn new(threads: usize) -> Result<Self, BackendError> {
        Self::with_isa(threads, Isa::detect())
    }

    /// A backend forced onto `isa` (tests compare instruction sets).
    pub fn with_isa(threads: usize, isa: Isa) -> Result<Self, BackendError> {
        if !isa.is_supported() {
            return Err(BackendError::Device(format!(
                "this CPU cannot run the {} kernels",
                isa.name()
            )));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("hesper-cpu-{i}"))
            .build()
            .map_err(|e| BackendError::Device(format!("cannot start {threads} threads: {e}")))?;
        Ok(Self {
            pool,
            isa,
            repack: true,
            profile: OpProfile::default(),
        })
    }

    /// Whether to repack weights at load into the layout this instruction set's kernels read
    /// best (I2_S interleaved sixteen rows deep on AVX-512 and AVX-VNNI, Q8_0, Q4_0 and the
    /// K-quants on AVX-512 VNNI, F16 on every x86 variant; see [`interleave`],
    /// [`interleave_q8_0`] and [`interleave_f16`]; TQ1_0 rewritten as TQ2_0 on every x86
    /// variant, [`tq1_0_as_tq2_0`]); on by default, off computes from the memory-mapped file
    /// as it is.
    pub fn with_repack(mut self, repack: bool) -> Self {
        self.repack = repack;
        self
    }

    /// Turns timing per operation kind on (counters cleared) or off.
    pub fn set_profiling(&self, on: bool) {
        self.profile.set(on);
    }

    /// Calls and time per operation kind since profiling was turned on.
    pub fn op_times(&self) -> Vec<OpTime> {
        self.profile.times()
    }

    /// Whether `desc`, loaded for `usage`, is interleaved at load (see
    /// [`CpuBackend::with_repack`]). Not an F16 embedding table that is only looked up (its
    /// rows are read one per token either way; a tied head is repacked: decode of the 2B4T
    /// shape 1.1–1.3× faster from the copy on a Zen 4).
    fn interleaves(&self, desc: &MatrixDesc, usage: MatrixUse) -> bool {
        self.repack
            && match desc.format {
                Format::I2S { .. } => {
                    self.isa.interleaves_i2s() && interleave::fits(desc.rows, desc.cols)
                }
                Format::Q8_0 => {
                    self.isa.interleaves_q8_0() && interleave_q8_0::fits(desc.rows, desc.cols)
                }
                Format::Q4_0 => {
                    self.isa.interleaves_q4_0() && interleave_q4_0::fits(desc.rows, desc.cols)
                }
                Format::MXFP4 => {
                    self.isa.interleaves_mxfp4() && interleave_mxfp4::fits(desc.rows, desc.cols)
                }
                Format::Q4K | Format::Q5K => {
                    self.isa.interleaves_q4_k() && interleave_q4_k::fits(desc.rows, desc.cols)
                }
                Format::Q6K => {
                    self.isa.interleaves_q6_k() && interleave_q6_k::fits(desc.rows, desc.cols)
                }
                Format::F16 => {
                    usage != MatrixUse::Embedding
                        && self.isa.interleaves_f16()
                        && interleave_f16::fits(desc.rows, desc.cols)
                }
                _ => false,
            }
    }

    /// `matrix` as this backend's kernels read it best for `usage`: interleaved sixteen rows
    /// deep ([`CpuMatrix::interleaved`]), TQ1_0 rewritten as TQ2_0 ([`CpuMatrix::as_tq2_0`]),
    /// or as it is.
    fn repacked(&self, matrix: CpuMatrix, usage: MatrixUse) -> CpuMatrix {
        if self.interleaves(&matrix.desc, usage) {
            self.pool.install(|| matrix.interleaved())
        } else if self.repack
            && matrix.desc.format == Format::TQ1_0
            && usage != MatrixUse::Embedding
            && self.isa.rewrites_tq1_0()
        {
            self.pool.install(|| matrix.as_tq2_0())
        } else {
            matrix
        }
    }

    /// Whether weights are repacked at load (see [`CpuBackend::with_repack`]).
    pub fn repacks(&self) -> bool {
        self.repack
            && (self.isa.interleaves_i2s()
                || self.isa.interleaves_q8_0()
                || self.isa.interleaves_q4_0()
                || self.isa.interleaves_mxfp4()
                || self.isa.interleaves_q4_k()
                || self.isa.interleaves_q6_k()
                || self.isa.interleaves_f16()
                || self.isa.rewrites_tq1_0())
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Runs `f` on one of the backend's own threads: every operation `f` calls then splits its
    /// work from inside the pool instead of handing it over from outside and sleeping until
    /// it is done (two thread wake-ups per matrix product, measured as ~14 % of decode time).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
}

impl Backend for CpuBackend {
    type Buffer = Vec<f32>;
    type Matrix = CpuMatrix;
    type Vector = Vec<f32>;
    type Cache = KvCache;

    fn name(&self) -> String {
        format!("cpu ({}, {} threads)", self.isa.name(), self.threads())
    }

    fn load_matrix(
        &self,
        file: &Arc<ModelFile>,
        desc: MatrixDesc,
        scale: Option<f32>,
        usage: MatrixUse,
    ) -> Result<CpuMatrix, BackendError> {
        let matrix = CpuMatrix::new(file.clone(), desc, scale);
        Ok(self.repacked(matrix, usage))
    }

    fn load_owned_matrix(
        &self,
        desc: MatrixDesc,
        data: Vec<u8>,
        scale: Option<f32>,
        usage: MatrixUse,
    ) -> Result<CpuMatrix, BackendError> {
        if data.len() < desc.range.end {
            return Err(BackendError::Unsupported {
                backend: self.name(),
                tensor: desc.name,
                why: "the data is shorter than the matrix".into(),
            });
        }
        // Repacked as from a file, so that a streamed load computes the same bits at the same
        // speed.
        let matrix = CpuMatrix::owned(data, desc, scale);
        Ok(self.repacked(matrix, usage))
    }

    fn load_vector(&self, data: Vec<f32>) -> Result<Vec<f32>, BackendError> {
        Ok(data)
    }

    fn memory_limits(&self) -> MemoryLimits {
        MemoryLimits {
            // A Vec holds at most isize::MAX bytes.
            max_buffer: Some(isize::MAX as u64),
            available: meminfo::available_bytes(),
        }
    }

    fn alloc(&self, len: usize) -> Result<Vec<f32>, BackendError> {
        let bytes = len.checked_mul(4).filter(|&b| b <= isize::MAX as usize);
        match bytes {
            Some(_) => Ok(vec![0.0; len]),
            None => Err(BackendError::Allocation {
                what: "activations".into(),
                bytes: (len as u64).saturating_mul(4),
                why: "larger than the address space".into(),
            }),
        }
    }

    fn new_cache(
        &self,
        slots: &[usize],
        kv_dim: usize,
        config: &AttentionConfig,
    ) -> Result<KvCache, BackendError> {
        let bytes = slots
            .iter()
            .try_fold(0u64, |sum, &n| sum.checked_add(n as u64))
            .and_then(|b| b.checked_mul(kv_dim as u64))
            .and_then(|b| b.checked_mul(2 * config.kv_type.bytes() as u64));
        if bytes.is_none_or(|b| b > isize::MAX as u64 / 2) {
            return Err(BackendError::Allocation {
                what: "KV cache".into(),
                bytes: bytes.unwrap_or(u64::MAX),
                why: "larger than the address space".into(),
            });
        }
        Ok(KvCache::with_config(slots, kv_dim, config))
    }

    fn write(&self, dst: &mut Vec<f32>, data: &[f32]) -> Result<(), BackendError> {
        dst[..data.len()].copy_from_slice(data);
        Ok(())
    }

    fn read(
        &self,
        src: &Vec<f32>,
        out: &mut [f32],
    ) -> impl Future<Output = Result<(), BackendError>> {
        // Already computed: the future is ready.
        out.copy_from_slice(&src[..out.len()]);
        std::future::ready(Ok(()))
    }

    fn embed(&self, table: &CpuMatrix, tokens: &[u32], out: &mut Vec<f32>) {
        let d = table.desc.cols;
        self.profile.time(Op::Copy, || {
            for (&t, row) in tokens.iter().zip(out.chunks_exact_mut(d)) {
                table.decode_row(t as usize, row);
            }
        });
    }

    fn rms_norm(&self, x: &Vec<f32>, w: &Vec<f32>, n: usize, eps: f32, out: &mut Vec<f32>) {
        self.profile.time(Op::RmsNorm, || {
            self.pool
                .install(|| ops::rms_norm(self.isa, x, w, n, eps, out))
        });
    }

    fn matmul(&self, w: &CpuMatrix, x: &Vec<f32>, n: usize, out: &mut Vec<f32>) {
        self.profile.time(Op::Matmul, || {
            self.pool.install(|| w.matmul(self.isa, x, n, out))
        });
    }

    fn matmul_many(&self, ws: &[&CpuMatrix], x: &Vec<f32>, n: usize, outs: &mut [&mut Vec<f32>]) {
        if n != 1 {
            // Prefill already reads each matrix once for many tokens.
            return matmul_each(self, ws, x, n, outs);
        }
        let mut outs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        self.profile.time(Op::Matmul, || {
            self.pool
                .install(|| matmul::matvec_many(self.isa, ws, x, &mut outs))
        });
    }

    fn rope(&self, x: &mut Vec<f32>, n: usize, pos0: usize, shape: &RopeShape) {
        self.profile.time(Op::Rope, || ops::rope(x, n, pos0, shape));
    }

    fn attention(
        &self,
        cache: &mut KvCache,
        layer: usize,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        n: usize,
        pos0: usize,
        shape: &AttentionShape,
        out: &mut Vec<f32>,
    ) {
        self.profile.time(Op::Attention, || {
            self.pool.install(|| {
                attention::attention(self.isa, cache, layer, q, k, v, n, pos0, shape, out)
            })
        });
    }

    fn shift_cache(
        &self,
        cache: &mut KvCache,
        keep: usize,
        discard: usize,
        used: usize,
        rope: &RopeShape,
    ) {
        self.profile
            .time(Op::Copy, || cache.shift(keep, discard, used, rope));
    }

    fn glu(&self, gate: &Vec<f32>, up: &Vec<f32>, len: usize, act: Activation, out: &mut Vec<f32>) {
        self.profile
            .time(Op::Glu, || ops::glu(gate, up, len, act, out));
    }

    fn runs_experts(&self) -> bool {
        true
    }

    fn moe_ffn(
        &self,
        moe: &Moe<CpuMatrix, Vec<f32>>,
        routing: &Experts,
        act: Activation,
        x: &Vec<f32>,
        n: usize,
        out: &mut Vec<f32>,
    ) {
        experts::moe_ffn(self, moe, routing, act, x, n, out);
    }

    fn scale(&self, x: &mut Vec<f32>, len: usize, s: f32) {
        x[..len].iter_mut().for_each(|v| *v *= s);
    }

    fn softcap(&self, x: &mut Vec<f32>, len: usize, cap: f32) {
        ops::softcap(&mut x[..len], 1.0, cap);
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) {
        self.profile.time(Op::Add, || {
            for (a, b) in x[..len].iter_mut().zip(&y[..len]) {
                *a += b;
            }
        });
    }

    fn add_bias(&self, x: &mut Vec<f32>, bias: &Vec<f32>, n: usize) {
        self.profile.time(Op::Add, || {
            for row in x[..n * bias.len()].chunks_exact_mut(bias.len()) {
                for (a, b) in row.iter_mut().zip(bias) {
                    *a += b;
                }
            }
        });
    }

    fn copy_rows(
        &self,
        src: &Vec<f32>,
        row0: usize,
        n_rows: usize,
        width: usize,
        dst: &mut Vec<f32>,
        dst_row0: usize,
    ) {
        self.profile.time(Op::Copy, || {
            dst[dst_row0 * width..(dst_row0 + n_rows) * width]
                .copy_from_slice(&src[row0 * width..(row0 + n_rows) * width])
        });
    }
}
