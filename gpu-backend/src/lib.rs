//! hesper-gpu-backend: the BitNet forward pass of `hesper-engine` on WebGPU.
//!
//! Every operation the model asks for is recorded into a pending batch, submitted when a
//! result is read back (the read-back rides in the same command buffer) or, before that, each
//! time it holds [`FLUSH_DISPATCHES`] dispatches ([`GpuBackend::set_flush_dispatches`]): the
//! GPU then runs the first layers of a step while the host records the rest, instead of
//! waiting for the whole step. Errors raised while recording are kept and returned by that
//! read.

mod activations;
mod experts;
mod formats;
mod matrix;
mod matrix_cores;
mod product;
mod shared_input;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use hesper_engine::attention::{AttentionConfig, KvType, SparsePattern};
use hesper_engine::backend::{
    AttentionShape, Backend, BackendError, GateUp, HeadPrep, MatrixUse, Qkv, RopeShape,
};
use hesper_engine::config::Activation;
use hesper_engine::file::ModelFile;
use hesper_engine::memory::MemoryLimits;
use hesper_engine::weights::MatrixDesc;
use hesper_gpu::{Batch, CacheStats, Gpu, GpuBuffer, GpuError, PendingRead};
use hesper_shaders as k;
use product::Form;

use activations::Activations;

pub use hesper_gpu::{hardware_gpu_possible, KernelTime};
pub use hesper_shaders::{GEMM_STEP, TOKEN_TILE, WIDE_STEP};
pub use matrix::{GpuMatrix, HostRows, Kind};
pub use matrix_cores::MatrixCores;

// The argmax kernels flag a non-finite logit as the engine reads it.
const _: () = assert!(k::NON_FINITE == hesper_engine::backend::NON_FINITE);

/// Dispatches after which a pending batch is submitted without waiting for the step's
/// read-back (a few layers of a model), so the host's recording and the GPU's work overlap.
pub const FLUSH_DISPATCHES: usize = 32;

/// Most workgroups of the first argmax stage.
const ARGMAX_GROUPS: usize = 256;

/// RoPE tables kept at once: one per base of a model whose sliding-window layers rotate with
/// their own (Gemma 3), so alternating layers do not rebuild them.
const ROPE_TABLES: usize = 2;

/// Largest head the attention kernel handles (a thread per two dimensions).
pub const MAX_HEAD_DIM: usize = 256;

/// Most globals of a sparse pattern the attention kernel takes (its scattered tile holds them
/// and 32 log-stride positions).
pub const MAX_GLOBALS: usize = 96;

/// The KV cache of every layer, on the GPU: words of one f32 or two f16 (`kv_write`).
pub struct GpuKvCache {
    k: Vec<GpuBuffer<u32>>,
    v: Vec<GpuBuffer<u32>>,
    /// Positions each layer holds: position `p` in slot `p % slots`.
    slots: Vec<usize>,
    kv_dim: usize,
    kv_type: KvType,
    sparse: Option<Sparse>,
    /// Each layer's attention sinks (gpt-oss), uploaded by its first attention.
    sinks: Vec<Option<GpuBuffer<f32>>>,
    /// Each layer's sinks, head-norm gains and biases as `rope_attention` reads them, joined
    /// by its first decoded token.
    layer_params: Vec<Option<LayerParams>>,
}

/// A layer's parameters in one buffer (`rope_attention`'s `layer_params`), and the buffers
/// they were copied from (a hot-swapped piece brings new ones).
struct LayerParams {
    from: Vec<hesper_gpu::wgpu::Buffer>,
    joined: GpuBuffer<f32>,
}

/// What a sparse cache adds: its pattern, its globals on the GPU and the landmarks of each
/// layer (`[block][kv_dim]` means of K and of V; one unused word when landmarks are off).
struct Sparse {
    pattern: SparsePattern,
    globals: GpuBuffer<u32>,
    n_block: usize,
    lk: Vec<GpuBuffer<f32>>,
    lv: Vec<GpuBuffer<f32>>,
}

/// Counters a benchmark reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuStats {
    /// Queue submits.
    pub submits: u64,
    /// Kernel dispatches submitted.
    pub dispatches: u64,
    /// Pipeline-cache hits and misses.
    pub cache: CacheStats,
    /// Bind groups created (reused while the same buffers are bound).
    pub bind_groups: u64,
    /// Bind groups held now (each keeps the buffers it binds alive).
    pub bind_groups_held: usize,
    /// Buffers created (weights, sessions, staging of host data, read-back space).
    pub buffers: u64,
    /// Host nanoseconds spent encoding and submitting steps (native; zero in a browser).
    pub submit_ns: u64,
    /// Host nanoseconds spent waiting for the GPU to deliver read-backs (native).
    pub wait_ns: u64,
}

/// The `(cos, sin)` table of every position up to `positions`, for one rotary shape.
struct RopeTable {
    rope_dim: usize,
    base: f32,
    scale: f32,
    freq_factors: Option<Vec<f32>>,
    attn_factor: f32,
    yarn: Option<hesper_engine::config::Yarn>,
    positions: usize,
    cs: GpuBuffer<f32>,
}

struct State {
    gpu: Gpu,
    batch: Batch,
    /// Dispatches after which a pending batch is submitted before its read-back.
    flush: usize,
    /// The first error raised while recording; returned by the next read.
    error: Option<GpuError>,
    dispatches: u64,
    /// Launches of each matrix kernel instance (one per weight window), by kernel name.
    products: BTreeMap<&'static str, u64>,
    /// The activation scratch the products quantize their input into (`activations.rs`).
    act: Activations,
    /// Whether the I2_S path uses `dot4I8Packed`.
    packed_dot: bool,
    /// Which kernels run the I2_S, TQ, Q8_0 and K-quant products of a step of many tokens
    /// (`matrix_cores.rs`).
    matrix_cores: MatrixCores,
    /// Whether the device's matrix cores failed their check (so they are not used).
    matrix_cores_failed: bool,
    /// Bound as the K and V outputs of the matrix kernels that write only one.
    unused: (GpuBuffer<f32>, GpuBuffer<f32>),
    /// Whether RMSNorm sums with subgroup operations.
    subgroups: bool,
    /// Token ids of the embedding fetch (filled by a recorded copy).
    ids: GpuBuffer<u32>,
    /// Per-workgroup maxima, their indices, and the argmax.
    argmax: (GpuBuffer<f32>, GpuBuffer<u32>, GpuBuffer<u32>),
    /// Top-k candidates: `k` ids (as f32), then their `k` values.
    top: GpuBuffer<f32>,
    /// RoPE tables of the bases a model's layers use (two where sliding-window layers have
    /// their own), the most recently made last.
    ropes: Vec<RopeTable>,
    /// A mixture's buffers between its layers (`experts.rs`).
    moe_pool: experts::Pool,
    /// A second activation scratch, between the layers that share an input
    /// (`shared_input.rs`).
    spare_scratch: Option<Activations>,
    /// The normalized query and key heads of an attention that cannot normalize them in its
    /// one kernel, kept from layer to layer.
    head_scratch: Option<[GpuBuffer<f32>; 2]>,
    /// The buffer whose rows the activation scratch holds quantized, when a fused RMSNorm
    /// left them there for the product that comes next (cleared by any other operation).
    quantized: Option<Quantized>,
    /// Whether a mixture of experts is routed on the GPU (the router never read back) rather
    /// than on the host from its read-back ([`GpuBackend::set_experts_routed_on_gpu`]; a
    /// browser always routes on the GPU).
    #[cfg(not(target_arch = "wasm32"))]
    route_on_gpu: bool,
}

/// What a fused RMSNorm ([`Backend::rms_norm_for`]) quantized: the rows of `buffer`, `cols`
/// wide over `n` rows, in the form `form` for the products that read it.
#[derive(Clone)]
struct Quantized {
    buffer: hesper_gpu::wgpu::Buffer,
    cols: usize,
    n: usize,
    form: product::Form,
}

/// The WebGPU backend.
pub struct GpuBackend {
    state: RefCell<State>,
    name: String,
}

/// Records the two argmax stages over the first `len` values of `logits`; the index lands in
/// `argmax.2[0]`.
fn run_argmax(
    gpu: &mut Gpu,
    batch: &mut Batch,
    logits: &GpuBuffer<f32>,
    len: usize,
    argmax: &mut (GpuBuffer<f32>, GpuBuffer<u32>, GpuBuffer<u32>),
) -> Result<(), GpuError> {
    let (best, best_index, index) = argmax;
    let groups = len.div_ceil(256 * 64).clamp(1, ARGMAX_GROUPS) as u32;
    let per_thread = (len as u32).div_ceil(256 * groups);
    batch.run(
        gpu,
        &k::argmax_partial::Args {
            logits,
            best,
            best_index,
            n: len as u32,
            per_thread,
        },
        [groups, 1, 1],
    )?;
    batch.run(
        gpu,
        &k::argmax_final::Args {
            best,
            best_index,
            index,
            n: groups,
        },
        [1, 1, 1],
    )
}

fn device_error(e: GpuError) -> BackendError {
    BackendError::Device(e.to_string())
}

impl GpuBackend {
    /// Opens the best adapter (`WGPU_BACKEND=vulkan|metal|dx12|gl` restricts the choice);
    /// native only (a browser awaits [`GpuBackend::open`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<Self, BackendError> {
        pollster::block_on(Self::open())
    }

    /// Opens the best adapter, as a future.
    pub async fn open() -> Result<Self, BackendError> {
        Self::with_gpu(Gpu::open().await.map_err(device_error)?)
    }

    fn with_gpu(mut gpu: Gpu) -> Result<Self, BackendError> {
        let name = format!("gpu ({}, {:?})", gpu.info.name, gpu.info.backend);
        let batch = gpu.batch();
        let act = Activations::new(&gpu, "activation").map_err(device_error)?;
        let ids = gpu.zeroed("token ids", 1).map_err(device_error)?;
        let packed_dot = supports_packed_dot(&gpu);
        // Matrix cores run I2_S, TQ, Q8_0 and K-quant prompts once they gave the portable kernels'
        // bits here.
        let has_cores = packed_dot && MatrixCores::On.runs_on(&gpu);
        let matrix_cores_failed = has_cores && !check_matrix_cores(&mut gpu, MatrixCores::On);
        let matrix_cores = if has_cores && !matrix_cores_failed {
            MatrixCores::On
        } else {
            MatrixCores::Off
        };
        let unused = (
            gpu.zeroed("unused outputs", 1).map_err(device_error)?,
            gpu.zeroed("unused outputs", 1).map_err(device_error)?,
        );
        let subgroups = gpu
            .device
            .features()
            .contains(hesper_gpu::wgpu::Features::SUBGROUP);
        let top = gpu.zeroed("top-k candidates", 1).map_err(device_error)?;
        let argmax = (
            gpu.zeroed("argmax values", ARGMAX_GROUPS)
                .map_err(device_error)?,
            gpu.zeroed("argmax indices", ARGMAX_GROUPS)
                .map_err(device_error)?,
            gpu.zeroed("argmax", 1).map_err(device_error)?,
        );
        Ok(Self {
            state: RefCell::new(State {
                gpu,
                batch,
                flush: FLUSH_DISPATCHES,
                error: None,
                dispatches: 0,
                act,
                packed_dot,
                matrix_cores,
                matrix_cores_failed,
                unused,
                subgroups,
                ids,
                argmax,
                top,
                ropes: Vec::new(),
                quantized: None,
                spare_scratch: None,
                head_scratch: None,
                moe_pool: experts::Pool::default(),
                products: BTreeMap::new(),
                #[cfg(not(target_arch = "wasm32"))]
                route_on_gpu: false,
            }),
            name,
        })
    }

    /// Records the two argmax stages over the first `len` values of `logits` after the
    /// recorded step, and submits it all with the 4-byte read-back.
    fn record_argmax(
        &self,
        logits: &GpuBuffer<f32>,
        len: usize,
    ) -> Result<PendingRead<u32>, BackendError> {
        let mut st = self.state.borrow_mut();
        if let Some(e) = st.error.take() {
            st.batch = st.gpu.batch();
            return Err(device_error(e));
        }
        let st = &mut *st;
        run_argmax(&mut st.gpu, &mut st.batch, logits, len, &mut st.argmax)
            .map_err(device_error)?;
        let batch = std::mem::replace(&mut st.batch, st.gpu.batch());
        st.dispatches += batch.dispatches() as u64;
        st.gpu
            .submit_for_read(batch, &st.argmax.2, 1)
            .map_err(device_error)
    }

    /// Records `k` rounds of argmax, each taking its maximum out of `logits` into the top-k
    /// buffer (ids, then values), and submits the step with the read-back of that buffer.
    fn record_top_k(
        &self,
        logits: &mut GpuBuffer<f32>,
        len: usize,
        k: usize,
    ) -> Result<PendingRead<f32>, BackendError> {
        let mut st = self.state.borrow_mut();
        if let Some(e) = st.error.take() {
            st.batch = st.gpu.batch();
            return Err(device_error(e));
        }
        let st = &mut *st;
        if st.top.len() < 2 * k {
            st.top = st
                .gpu
                .zeroed("top-k candidates", (2 * k).next_power_of_two())
                .map_err(device_error)?;
        }
        let State {
            gpu,
            batch,
            argmax,
            top,
            ..
        } = st;
        let mut run = || -> Result<(), GpuError> {
            for slot in 0..k as u32 {
                run_argmax(gpu, batch, logits, len, argmax)?;
                batch.run(
                    gpu,
                    &k::take_top::Args {
                        index: &argmax.2,
                        logits,
                        top,
                        slot,
                        k: k as u32,
                    },
                    [1, 1, 1],
                )?;
            }
            Ok(())
        };
        run().map_err(device_error)?;
        let batch = std::mem::replace(&mut st.batch, st.gpu.batch());
        st.dispatches += batch.dispatches() as u64;
        st.gpu
            .submit_for_read(batch, &st.top, 2 * k)
            .map_err(device_error)
    }

    /// Submits the recorded step with the read-back of the first `len` values of `src`.
    fn submit_for_read<T: bytemuck::Pod>(
        &self,
        src: &GpuBuffer<T>,
        len: usize,
    ) -> Result<PendingRead<T>, BackendError> {
        let mut st = self.state.borrow_mut();
        let st = &mut *st;
        let batch = std::mem::replace(&mut st.batch, st.gpu.batch());
        if let Some(e) = st.error.take() {
            return Err(device_error(e));
        }
        st.dispatches += batch.dispatches() as u64;
        st.gpu
            .submit_for_read(batch, src, len)
            .map_err(device_error)
    }

    /// Whether the adapter is hardware (not a software rasterizer such as lavapipe, which
    /// runs on the CPU far slower than the CPU backend).
    pub fn is_hardware(&self) -> bool {
        self.state.borrow().gpu.info.device_type != hesper_gpu::wgpu::DeviceType::Cpu
    }

    /// The adapter, its limits and the features hesper-rs uses, in words, for
    /// `hesper-rs info --backend gpu`.
    pub fn describe(&self) -> String {
        use hesper_gpu::wgpu::{DeviceType, Features};
        let st = self.state.borrow();
        let g = &st.gpu;
        let l = &g.limits;
        let kind = match g.info.device_type {
            DeviceType::DiscreteGpu => "a discrete GPU",
            DeviceType::IntegratedGpu => "an integrated GPU",
            DeviceType::VirtualGpu => "a virtual GPU",
            DeviceType::Cpu => "a software adapter running on the CPU (the CPU backend is faster)",
            DeviceType::Other => "an adapter of unknown kind",
        };
        let yes_no = |f: Features| if g.features.contains(f) { "yes" } else { "no" };
        format!(
            "adapter: {} through {:?}, {kind}; driver {} {}\nlimits: buffers up to {} MiB, storage bindings up to {} MiB, {} invocations and {} KiB of shared memory per workgroup\nkernels: I2_S dot products with {}; I2_S, TQ, Q8_0 and K-quant prompts {}; RMSNorm sums {}\nfeatures: shader-f16 {}, subgroups {}, timestamp queries {}, cooperative matrices {}",
            g.info.name,
            g.info.backend,
            g.info.driver,
            g.info.driver_info,
            l.max_buffer_size >> 20,
            l.max_storage_buffer_binding_size >> 20,
            l.max_compute_invocations_per_workgroup,
            l.max_compute_workgroup_storage_size >> 10,
            if st.packed_dot {
                "dot4I8Packed"
            } else {
                "the plain int8 path"
            },
            match (st.matrix_cores, st.matrix_cores_failed) {
                (MatrixCores::On, _) => "on matrix cores",
                (MatrixCores::StandIn, _) => "by the matrix-core kernels' stand-ins",
                (MatrixCores::Off, true) => {
                    "on the shader cores (the matrix cores failed their check)"
                }
                (MatrixCores::Off, false) => "on the shader cores",
            },
            if st.subgroups {
                "with subgroup operations"
            } else {
                "by a workgroup tree"
            },
            yes_no(Features::SHADER_F16),
            yes_no(Features::SUBGROUP),
            yes_no(Features::TIMESTAMP_QUERY),
            yes_no(Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
        )
    }

    /// Submits, dispatches and pipeline-cache counters so far.
    pub fn stats(&self) -> GpuStats {
        let st = self.state.borrow();
        let (submit_ns, wait_ns) = st.gpu.host_times();
        GpuStats {
            submits: st.gpu.submits(),
            dispatches: st.dispatches,
            cache: st.gpu.cache_stats(),
            bind_groups: st.gpu.bind_groups_created(),
            bind_groups_held: st.gpu.bind_groups_held(),
            buffers: st.gpu.buffers_created(),
            submit_ns,
            wait_ns,
        }
    }

    /// How many times each matrix kernel instance has been launched (once per weight window
    /// a product reads), by kernel name: which instance, decode or wide-step, the products of
    /// a step ran.
    pub fn product_launches(&self) -> BTreeMap<&'static str, u64> {
        self.state.borrow().products.clone()
    }

    /// The device's copy bandwidth in bytes per second, read plus written (best of `rounds`
    /// timed submits of buffer-to-buffer copies); native only.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn copy_bandwidth(&self, rounds: u32) -> Result<f64, BackendError> {
        self.state
            .borrow()
            .gpu
            .copy_bandwidth(rounds)
            .map_err(device_error)
    }

    /// Turns per-kernel GPU timing (timestamp queries) on or off; returns whether the adapter
    /// supports it.
    pub fn set_profiling(&self, on: bool) -> bool {
        self.state.borrow_mut().gpu.set_profiling(on)
    }

    /// GPU time per kernel since the last call, slowest first.
    pub fn kernel_times(&self) -> Vec<KernelTime> {
        self.state.borrow_mut().gpu.kernel_times()
    }

    /// Whether ternary I2_S products use `dot4I8Packed` (WGSL's packed 4×8-bit integer dot
    /// product) rather than the plain per-element path.
    pub fn packed_dot(&self) -> bool {
        self.state.borrow().packed_dot
    }

    /// Submits a step's pending batch each time it holds `dispatches` dispatches (default
    /// [`FLUSH_DISPATCHES`]; `usize::MAX`: only with the step's read-back). Results do not
    /// change, only when the GPU starts.
    pub fn set_flush_dispatches(&self, dispatches: usize) {
        self.state.borrow_mut().flush = dispatches.max(1);
    }

    /// Gates every step too long to multiply by id expert by expert on the GPU when `on`, as
    /// a browser routes experts that do not group; by default, natively, such a step is
    /// grouped by expert on the GPU where its experts stacked (and, quantized, the adapter has
    /// `dot4I8Packed`), a short one of experts that did not stack gated, and any other's
    /// routing read back once a layer so that its rows are gathered by expert. All give the
    /// same bits for every row (`experts.rs`).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn set_experts_routed_on_gpu(&self, on: bool) {
        self.state.borrow_mut().route_on_gpu = on;
    }

    /// Whether RMSNorm sums with subgroup operations (the device has `SUBGROUP`).
    pub fn uses_subgroups(&self) -> bool {
        self.state.borrow().subgroups
    }

    /// Chooses the I2_S path: `dot4I8Packed` when `on` and the implementation has it, else the
    /// plain one. Returns the path now in use (`true` = packed).
    pub fn set_packed_dot(&self, on: bool) -> bool {
        let mut st = self.state.borrow_mut();
        st.packed_dot = on && supports_packed_dot(&st.gpu);
        st.packed_dot
    }

    /// Which kernels run the I2_S, TQ, Q8_0 and K-quant products of a step of at least
    /// [`GEMM_STEP`] tokens.
    pub fn matrix_cores(&self) -> MatrixCores {
        self.state.borrow().matrix_cores
    }

    /// Chooses the kernels of I2_S, TQ, Q8_0 and K-quant steps of many tokens: `variant` where
    /// the device runs it (matrix cores only where they passed their check), else the portable
    /// tiled ones.
    /// Returns the kernel now in use. Every choice gives the same bits.
    pub fn set_matrix_cores(&self, variant: MatrixCores) -> MatrixCores {
        let mut st = self.state.borrow_mut();
        let usable = match variant {
            MatrixCores::On => !st.matrix_cores_failed,
            _ => true,
        };
        st.matrix_cores = if usable && st.packed_dot && variant.runs_on(&st.gpu) {
            variant
        } else {
            MatrixCores::Off
        };
        st.matrix_cores
    }

    /// Runs the check the device's matrix cores pass before they are used (their kernels and
    /// the portable ones on one product each, bit for bit) for `variant`; native only. `false`
    /// where the device cannot run it.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn matrix_cores_agree(&self, variant: MatrixCores) -> bool {
        let mut st = self.state.borrow_mut();
        variant.runs_on(&st.gpu) && check_matrix_cores(&mut st.gpu, variant)
    }

    /// Records commands with `f`; the first failure is kept for the next read. Rows a fused
    /// RMSNorm quantized are forgotten first: only [`GpuBackend::record_product`] reads them.
    fn record(&self, f: impl FnOnce(&mut State) -> Result<(), GpuError>) {
        self.state.borrow_mut().quantized = None;
        self.record_product(f);
    }

    /// [`experts::moe_ffn`] into `out` (added to it where `add`), its failure kept for the
    /// step's read-back as every recorded operation's is (an earlier failure explains it).
    #[allow(clippy::too_many_arguments)]
    fn mixture(
        &self,
        moe: &hesper_engine::backend::Moe<GpuMatrix, GpuBuffer<f32>>,
        routing: &hesper_engine::config::Experts,
        act: Activation,
        x: &GpuBuffer<f32>,
        n: usize,
        out: &mut GpuBuffer<f32>,
        add: bool,
    ) {
        if let Err(e) = experts::moe_ffn(self, moe, routing, act, x, n, out, add) {
            let mut st = self.state.borrow_mut();
            if st.error.is_none() {
                st.error = Some(GpuError::Kernel {
                    kernel: "experts",
                    why: e.to_string(),
                });
            }
        }
    }

    /// [`GpuBackend::record`] for products, which may use the rows a fused RMSNorm quantized
    /// (`product::quantize` consumes them).
    fn record_product(&self, f: impl FnOnce(&mut State) -> Result<(), GpuError>) {
        let mut st = self.state.borrow_mut();
        if st.error.is_none() {
            if let Err(e) = f(&mut st).and_then(|()| st.flush_if_long()) {
                st.error = Some(e);
            }
        }
    }

    /// Whether `workgroups` fit one dimension of a grid (a launch past it is refused).
    fn fits_one_dimension(&self, workgroups: usize) -> bool {
        let max = self
            .state
            .borrow()
            .gpu
            .limits
            .max_compute_workgroups_per_dimension;
        workgroups <= max as usize
    }

    /// Refuses heads wider than the attention kernel takes.
    fn check_head(&self, shape: &AttentionShape) -> Result<(), GpuError> {
        if shape.head_dim > MAX_HEAD_DIM {
            return Err(self.unsupported(
                "attention",
                format!("heads of {} (at most {MAX_HEAD_DIM})", shape.head_dim),
            ));
        }
        Ok(())
    }

    /// The backend's scratch for normalized query and key heads, at least `lens` long each;
    /// `None` (the error kept for the next read) where it cannot be made.
    fn take_head_scratch(&self, lens: [usize; 2]) -> Option<[GpuBuffer<f32>; 2]> {
        let mut st = self.state.borrow_mut();
        let held = st.head_scratch.take();
        let made = match held {
            Some([q, k]) if q.len() >= lens[0] && k.len() >= lens[1] => Ok([q, k]),
            _ => st
                .gpu
                .zeroed("normalized query heads", lens[0])
                .and_then(|q| Ok([q, st.gpu.zeroed("normalized key heads", lens[1])?])),
        };
        match made {
            Ok(scratch) => Some(scratch),
            Err(e) => {
                st.error.get_or_insert(e);
                None
            }
        }
    }

    /// [`Backend::rope_attention`] once what prepares the heads is settled: `prep` is
    /// handed over only where `step` runs in one kernel, which applies it.
    #[allow(clippy::too_many_arguments)]
    fn rope_attend_step(
        &self,
        step: Step,
        q: &mut GpuBuffer<f32>,
        k_new: &mut GpuBuffer<f32>,
        v_new: &GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
        next: Option<&GpuMatrix>,
        prep: Option<HeadPrep<'_, GpuBuffer<f32>>>,
    ) {
        let (fused, decode) = (step.fused(), step.one_kernel());
        let (n, pos0, shape, [rope_q, rope_k]) = (step.n, step.pos0, step.shape, step.rope);
        if !fused {
            self.rope(q, n, pos0, rope_q);
            self.rope(k_new, n, pos0, rope_k);
            let (cache, layer) = (step.cache, step.layer);
            return self.attention(cache, layer, q, k_new, v_new, n, pos0, shape, out);
        }
        self.record(|st| {
            self.check_head(shape)?;
            let at = st.rope_table(rope_q, pos0 + n)?;
            if decode {
                let form = next.and_then(|m| attention_form(m, shape, st.packed_dot));
                let prepared = join_layer_params(st, step.cache, step.layer, shape, prep.as_ref())?;
                return rope_attend(st, step, at, q, k_new, v_new, out, form, prepared);
            }
            let (cache, layer) = (step.cache, step.layer);
            let table = &st.ropes[at];
            let kv = cache.kv_dim;
            let pairs = n * shape.n_head * rope_q.rope_dim / 2;
            let threads = pairs + n * kv / 2;
            // The queries' pairs and angles (as `rope_neox`), the new keys and values read and
            // written to the cache (as `kv_write`; a key's angles are read again from cache).
            let traffic = 24 * pairs as u64 + kv_write_bytes(n * kv, cache.kv_type);
            st.batch.run_moving(
                &mut st.gpu,
                &k::rope_neox_kv_write::Args {
                    q: &mut *q,
                    k: k_new,
                    v: v_new,
                    cs: &table.cs,
                    k_cache: &mut cache.k[layer],
                    v_cache: &mut cache.v[layer],
                    n_tokens: n as u32,
                    n_head: shape.n_head as u32,
                    n_head_kv: shape.n_head_kv as u32,
                    head_dim: shape.head_dim as u32,
                    rope_dim: rope_q.rope_dim as u32,
                    pos0: pos0 as u32,
                    at: (pos0 * kv) as u32,
                    ring: (cache.slots[layer] * kv) as u32,
                    f16: u32::from(cache.kv_type == KvType::F16),
                },
                k::rope_neox_kv_write::grid_for(threads as u32),
                traffic,
            )?;
            attend(st, cache, layer, q, k_new, v_new, n, pos0, shape, out)
        });
    }

    fn unsupported(&self, what: &str, why: String) -> GpuError {
        GpuError::Kernel {
            kernel: "backend",
            why: format!("{what}: {why} ({})", self.name),
        }
    }
}

/// Whether `variant`'s kernel gives the portable tiled kernel's bits on `gpu` (a failure to
/// run it counts as no). A browser has no matrix cores, and cannot wait for the check.
fn check_matrix_cores(gpu: &mut Gpu, variant: MatrixCores) -> bool {
    #[cfg(not(target_arch = "wasm32"))]
    {
        matrix_cores::agrees(gpu, variant).unwrap_or(false)
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = (gpu, variant);
        false
    }
}

/// Whether the WGSL implementation accepts `dot4I8Packed`.
fn supports_packed_dot(gpu: &Gpu) -> bool {
    gpu.wgsl_features
        .contains(hesper_gpu::wgpu::WgslLanguageFeatures::Packed4x8IntegerDotProduct)
}

/// Puts host data at the front of `dst`, in order with the work recorded in `batch`: written
/// straight into it when nothing is pending (the start of a token: no allocation), otherwise
/// staged in a fresh buffer and copied by a recorded command.
fn put<T: bytemuck::Pod>(
    gpu: &Gpu,
    batch: &mut Batch,
    dst: &mut GpuBuffer<T>,
    data: &[T],
) -> Result<(), GpuError> {
    if batch.is_empty() {
        return gpu.write(dst, 0, data);
    }
    let staged = gpu.upload("host data", data)?;
    batch.copy(&staged, 0, dst, 0, data.len())
}

impl State {
    /// Submits the pending batch once it holds `self.flush` dispatches.
    fn flush_if_long(&mut self) -> Result<(), GpuError> {
        if self.batch.dispatches() < self.flush {
            return Ok(());
        }
        let batch = std::mem::replace(&mut self.batch, self.gpu.batch());
        self.dispatches += batch.dispatches() as u64;
        self.gpu.submit_part(batch)
    }

    /// Records RMSNorm of `n` rows of `x` into `out`, or added to `out` where `add` is set
    /// (with subgroup sums where the device has subgroups).
    fn rms_norm(
        &mut self,
        x: &GpuBuffer<f32>,
        w: &GpuBuffer<f32>,
        n: usize,
        eps: f32,
        out: &mut GpuBuffer<f32>,
        add: bool,
    ) -> Result<(), GpuError> {
        let (width, grid) = (w.len() as u32, k::row_grid(n as u32));
        // An add reads the output rows too.
        let traffic = norm_bytes(n, w.len()) + if add { 4 * (n * w.len()) as u64 } else { 0 };
        let add = u32::from(add);
        if self.subgroups {
            self.batch.run_moving(
                &mut self.gpu,
                &k::rms_norm_sg::Args {
                    x,
                    w,
                    y: out,
                    width,
                    eps,
                    add,
                },
                grid,
                traffic,
            )
        } else {
            self.batch.run_moving(
                &mut self.gpu,
                &k::rms_norm::Args {
                    x,
                    w,
                    y: out,
                    width,
                    eps,
                    add,
                },
                grid,
                traffic,
            )
        }
    }

    /// Makes the activation scratch hold at least `q` codes and `scales` scales.
    fn reserve(&mut self, q: usize, scales: usize) -> Result<(), GpuError> {
        self.act.reserve(&self.gpu, q, scales)
    }

    /// Makes the f16 activation scratch hold at least `words` words.
    fn reserve_halves(&mut self, words: usize) -> Result<(), GpuError> {
        self.act.reserve_halves(&self.gpu, words)
    }

    /// Makes a rotary table cover positions `0..positions` for `shape`; its index in
    /// `ropes`.
    fn rope_table(&mut self, shape: &RopeShape, positions: usize) -> Result<usize, GpuError> {
        let fits = self.ropes.iter().position(|t| {
            t.rope_dim == shape.rope_dim
                && t.base == shape.base
                && t.scale == shape.scale
                && t.freq_factors.as_deref() == shape.freq_factors
                && t.attn_factor == shape.attn_factor
                && t.yarn == shape.yarn
                && t.positions >= positions
        });
        if let Some(at) = fits {
            return Ok(at);
        }
        let positions = positions.next_power_of_two().max(256);
        // A fresh buffer (not a queued write) so work recorded earlier keeps the old one.
        let cs = self.gpu.upload("rope table", &shape.angles(0, positions))?;
        if self.ropes.len() == ROPE_TABLES {
            self.ropes.remove(0);
        }
        self.ropes.push(RopeTable {
            rope_dim: shape.rope_dim,
            base: shape.base,
            scale: shape.scale,
            freq_factors: shape.freq_factors.map(<[f32]>::to_vec),
            attn_factor: shape.attn_factor,
            yarn: shape.yarn,
            positions,
            cs,
        });
        Ok(self.ropes.len() - 1)
    }
}

impl Backend for GpuBackend {
    type Buffer = GpuBuffer<f32>;
    type Matrix = GpuMatrix;
    type Vector = GpuBuffer<f32>;
    type Cache = GpuKvCache;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn load_matrix(
        &self,
        file: &Arc<ModelFile>,
        desc: MatrixDesc,
        scale: Option<f32>,
        usage: MatrixUse,
    ) -> Result<GpuMatrix, BackendError> {
        let st = self.state.borrow();
        let mut m = GpuMatrix::upload(&st.gpu, desc, file.bytes(), scale, &self.name)?;
        if usage.looked_up() && !m.kind.fetched_on_gpu() {
            m.host = Some(HostRows::File(file.clone()));
        }
        Ok(m)
    }

    fn load_owned_matrix(
        &self,
        desc: MatrixDesc,
        data: Vec<u8>,
        scale: Option<f32>,
        usage: MatrixUse,
    ) -> Result<GpuMatrix, BackendError> {
        let st = self.state.borrow();
        let mut m = GpuMatrix::upload(&st.gpu, desc, &data, scale, &self.name)?;
        if usage.looked_up() && !m.kind.fetched_on_gpu() {
            m.host = Some(HostRows::Owned(data));
        }
        Ok(m)
    }

    fn load_vector(&self, data: Vec<f32>) -> Result<GpuBuffer<f32>, BackendError> {
        let st = self.state.borrow();
        st.gpu.upload("norm gains", &data).map_err(device_error)
    }

    fn memory_limits(&self) -> MemoryLimits {
        MemoryLimits {
            max_buffer: Some(self.state.borrow().gpu.max_binding()),
            // WebGPU does not say how much device memory is free.
            available: None,
        }
    }

    fn alloc(&self, len: usize) -> Result<GpuBuffer<f32>, BackendError> {
        let st = self.state.borrow();
        st.gpu
            .zeroed("activations", len)
            .map_err(|e| BackendError::Allocation {
                what: "activations".into(),
                bytes: len as u64 * 4,
                why: e.to_string(),
            })
    }

    fn new_cache(
        &self,
        slots: &[usize],
        kv_dim: usize,
        config: &AttentionConfig,
    ) -> Result<GpuKvCache, BackendError> {
        let st = self.state.borrow();
        let kv_type = config.kv_type;
        let n_layer = slots.len();
        let n_ctx = slots.iter().max().copied().unwrap_or(0);
        let words = |slots: usize| match kv_type {
            KvType::F32 => slots.saturating_mul(kv_dim),
            KvType::F16 => slots.saturating_mul(kv_dim) / 2,
        };
        let error = |what: &str, bytes: u64, e: GpuError| BackendError::Allocation {
            what: format!("{what} ({n_layer} layers × up to {n_ctx} positions)"),
            bytes,
            why: e.to_string(),
        };
        let cache_bytes = slots
            .iter()
            .fold(0u64, |sum, &n| sum.saturating_add(8 * words(n) as u64));
        let alloc = |what: &str, slots: usize| {
            st.gpu
                .zeroed::<u32>(what, words(slots))
                .map_err(|e| error("KV cache", cache_bytes, e))
        };
        if kv_type == KvType::F16 && kv_dim % 2 == 1 {
            return Err(BackendError::Unsupported {
                backend: self.name.clone(),
                tensor: "KV cache".into(),
                why: format!("an f16 cache packs pairs of values; {kv_dim} per position is odd"),
            });
        }
        let sparse = match &config.sparse {
            None => None,
            Some(p) => {
                if p.globals.len() > MAX_GLOBALS {
                    return Err(BackendError::Unsupported {
                        backend: self.name.clone(),
                        tensor: "KV cache".into(),
                        why: format!(
                            "{} global positions (at most {MAX_GLOBALS})",
                            p.globals.len()
                        ),
                    });
                }
                let n_block = if p.landmarks { n_ctx / p.block } else { 0 };
                let len = (n_block * kv_dim).max(1);
                let bytes = (len as u64).saturating_mul(8 * n_layer as u64);
                let mut lk = Vec::with_capacity(n_layer);
                let mut lv = Vec::with_capacity(n_layer);
                for _ in 0..n_layer {
                    for marks in [&mut lk, &mut lv] {
                        let b = st.gpu.zeroed::<f32>("landmarks", len);
                        marks.push(b.map_err(|e| error("landmarks", bytes, e))?);
                    }
                }
                let globals: Vec<u32> = p.globals.iter().map(|&g| g as u32).collect();
                let globals = if globals.is_empty() { vec![0] } else { globals };
                Some(Sparse {
                    pattern: p.clone(),
                    globals: st.gpu.upload("globals", &globals).map_err(device_error)?,
                    n_block,
                    lk,
                    lv,
                })
            }
        };
        let mut cache = GpuKvCache {
            k: Vec::with_capacity(n_layer),
            v: Vec::with_capacity(n_layer),
            slots: slots.to_vec(),
            kv_dim,
            kv_type,
            sparse,
            sinks: Vec::with_capacity(n_layer),
            layer_params: Vec::with_capacity(n_layer),
        };
        for &n in slots {
            cache.k.push(alloc("K cache", n)?);
            cache.v.push(alloc("V cache", n)?);
            cache.sinks.push(None);
            cache.layer_params.push(None);
        }
        Ok(cache)
    }

    fn write(&self, dst: &mut GpuBuffer<f32>, data: &[f32]) -> Result<(), BackendError> {
        let mut st = self.state.borrow_mut();
        let st = &mut *st;
        st.quantized = None;
        put(&st.gpu, &mut st.batch, dst, data).map_err(device_error)
    }

    fn read(
        &self,
        src: &GpuBuffer<f32>,
        out: &mut [f32],
    ) -> impl Future<Output = Result<(), BackendError>> {
        // Submitted now; the state is not borrowed across the wait.
        let pending = self.submit_for_read(src, out.len());
        async move {
            let got = pending?.wait().await.map_err(device_error)?;
            out.copy_from_slice(&got);
            Ok(())
        }
    }

    /// The index of the largest of the first `len` values of `logits` (the first on ties),
    /// computed on the GPU: the recorded work, two argmax stages and a 4-byte read-back in
    /// one submit.
    fn argmax(
        &self,
        logits: &GpuBuffer<f32>,
        len: usize,
    ) -> impl Future<Output = Result<u32, BackendError>> {
        let pending = self.record_argmax(logits, len);
        async move { Ok(pending?.wait().await.map_err(device_error)?[0]) }
    }

    fn top_k(
        &self,
        logits: &mut GpuBuffer<f32>,
        len: usize,
        k: usize,
    ) -> impl Future<Output = Result<Vec<(u32, f32)>, BackendError>> {
        let pending = self.record_top_k(logits, len, k);
        async move {
            let top = pending?.wait().await.map_err(device_error)?;
            let (ids, values) = top.split_at(k);
            Ok(ids
                .iter()
                .map(|&i| i as u32)
                .zip(values.iter().copied())
                .collect())
        }
    }

    fn embed(&self, table: &GpuMatrix, tokens: &[u32], out: &mut GpuBuffer<f32>) {
        let cols = table.desc.cols;
        self.record(|st| {
            if let Some(host) = &table.host {
                let mut rows = vec![0.0f32; tokens.len() * cols];
                for (&t, row) in tokens.iter().zip(rows.chunks_exact_mut(cols)) {
                    table.desc.decode_row(host.bytes(), t as usize, row);
                }
                return put(&st.gpu, &mut st.batch, out, &rows);
            }
            // Into the persistent id buffer, so the fetch's bind groups stay the same from
            // token to token.
            if st.ids.len() < tokens.len() {
                st.ids = st
                    .gpu
                    .zeroed("token ids", tokens.len().next_power_of_two())?;
            }
            put(&st.gpu, &mut st.batch, &mut st.ids, tokens)?;
            let ids = &st.ids;
            let n = tokens.len() as u32;
            // The rows fetched (f32 or f16) and written; counted on the first window.
            let element = if matches!(table.kind, Kind::F32) {
                4
            } else {
                2
            };
            let mut traffic = (tokens.len() * cols * (element + 4)) as u64;
            for w in &table.windows {
                let (row0, rows) = (w.row0 as u32, w.rows as u32);
                let moved = std::mem::take(&mut traffic);
                match table.kind {
                    Kind::F32 => st.batch.run_moving(
                        &mut st.gpu,
                        &k::embed_f32::Args {
                            table: &w.data,
                            ids,
                            out: &mut *out,
                            cols: cols as u32,
                            n,
                            row0,
                            rows,
                        },
                        k::embed_f32::grid_for((tokens.len() * cols) as u32),
                        moved,
                    )?,
                    _ => st.batch.run_moving(
                        &mut st.gpu,
                        &k::embed_f16::Args {
                            table: &w.data,
                            ids,
                            out: &mut *out,
                            cols: cols as u32,
                            n,
                            row0,
                            rows,
                        },
                        k::embed_f16::grid_for((tokens.len() * cols / 2) as u32),
                        moved,
                    )?,
                }
            }
            Ok(())
        });
    }

    fn rms_norm(
        &self,
        x: &GpuBuffer<f32>,
        w: &GpuBuffer<f32>,
        n: usize,
        eps: f32,
        out: &mut GpuBuffer<f32>,
    ) {
        self.record(|st| st.rms_norm(x, w, n, eps, out, false));
    }

    /// The norm and the add in one kernel: each product written, then added, as the unfused
    /// ops do it.
    fn rms_norm_add(
        &self,
        x: &GpuBuffer<f32>,
        w: &GpuBuffer<f32>,
        n: usize,
        _width: usize,
        eps: f32,
        out: &mut GpuBuffer<f32>,
        _scratch: &mut GpuBuffer<f32>,
    ) {
        self.record(|st| st.rms_norm(x, w, n, eps, out, true));
    }

    /// One kernel (`rms_norm_add_norm_sg`) where the device has subgroups and `next` reads
    /// floats or F16 halves (which it leaves for the product, as `rms_norm_for` does); else
    /// the add and `rms_norm_for` apart (the block and per-token quantizers spread a row over
    /// workgroups or take their own kernels).
    fn rms_norm_add_norm_for(
        &self,
        y: &GpuBuffer<f32>,
        w_add: &GpuBuffer<f32>,
        x: &mut GpuBuffer<f32>,
        w: &GpuBuffer<f32>,
        n: usize,
        width: usize,
        eps: f32,
        out: &mut GpuBuffer<f32>,
        next: &GpuMatrix,
    ) {
        // Whether the one kernel leaves halves (else floats), where it runs.
        let halves = {
            let st = self.state.borrow();
            let form = product::fused_form(next.kind, st.packed_dot);
            match form {
                _ if !st.subgroups || w_add.len() != width || w.len() != width => None,
                None => Some(false),
                Some(product::Form::Halves)
                    if next.desc.cols == width && width.is_multiple_of(2) =>
                {
                    Some(true)
                }
                Some(_) => None,
            }
        };
        let Some(halves) = halves else {
            self.rms_norm_add(y, w_add, n, width, eps, x, out);
            return self.rms_norm_for(x, w, n, eps, out, next);
        };
        self.record(|st| {
            if halves {
                st.reserve_halves(n * width / 2)?;
            }
            // Both rows read, the stream written, the output written (and its halves).
            let traffic = norm_bytes(n, width)
                + norm_bytes(n, width)
                + if halves { 2 * (n * width) as u64 } else { 0 };
            let State {
                gpu,
                batch,
                act: Activations { halves: h, .. },
                unused,
                ..
            } = st;
            let mut run = |h: &mut GpuBuffer<u32>| {
                batch.run_moving(
                    gpu,
                    &k::rms_norm_add_norm_sg::Args {
                        y,
                        w_add,
                        x: &mut *x,
                        w,
                        out: &mut *out,
                        h,
                        width: width as u32,
                        eps,
                        halves: u32::from(halves),
                    },
                    k::row_grid(n as u32),
                    traffic,
                )
            };
            if !halves {
                return unused.0.as_elements_mut(run);
            }
            run(h)?;
            st.quantized = Some(Quantized {
                buffer: out.raw().clone(),
                cols: width,
                n,
                form: product::Form::Halves,
            });
            Ok(())
        });
    }

    /// Both head norms in one launch (`rms_norm_heads`: the order in which `rope_attention`
    /// normalizes a decoded token's heads) where the heads are one width of at most
    /// [`MAX_HEAD_DIM`] and their rows fit one grid dimension (else the two norms apart).
    fn rms_norm_qk(
        &self,
        x: [&GpuBuffer<f32>; 2],
        w: [&GpuBuffer<f32>; 2],
        n: [usize; 2],
        eps: f32,
        out: [&mut GpuBuffer<f32>; 2],
    ) {
        let ([xq, xk], [wq, wk], [yq, yk]) = (x, w, out);
        let width = wq.len();
        if width != wk.len() || width > MAX_HEAD_DIM || !self.fits_one_dimension(n[0] + n[1]) {
            self.rms_norm(xq, wq, n[0], eps, yq);
            return self.rms_norm(xk, wk, n[1], eps, yk);
        }
        self.record(|st| {
            st.batch.run_moving(
                &mut st.gpu,
                &k::rms_norm_heads::Args {
                    xq,
                    wq,
                    yq,
                    xk,
                    wk,
                    yk,
                    q_rows: n[0] as u32,
                    width: width as u32,
                    eps,
                },
                k::row_grid((n[0] + n[1]) as u32),
                norm_bytes(n[0], width) + norm_bytes(n[1], width),
            )
        });
    }

    /// RMSNorm and, where the device has subgroups, the activations `next`'s product reads in
    /// the same kernel, left for it: I2_S's per-token int8 codes on the packed path
    /// (`dot4I8Packed`), F16's halves (`pack_f16`'s), Q8_0's blocks (Q4_0 and MXFP4 too, widened
    /// to Q8_0) and the K-quants' and TQ's Q8_K blocks. The per-token forms take a workgroup a
    /// row; the block forms a workgroup for each 256 values of a row, every one of them summing
    /// the row's squares itself (a Q8_K quantizer fused one workgroup a row, quantizing the
    /// row's blocks in turn, took 33.8 µs per 2560-wide row on an H100 against 21.4 µs for the
    /// two kernels). The outputs have the unfused kernels' bits.
    fn rms_norm_for(
        &self,
        x: &GpuBuffer<f32>,
        w: &GpuBuffer<f32>,
        n: usize,
        eps: f32,
        out: &mut GpuBuffer<f32>,
        next: &GpuMatrix,
    ) {
        self.record(|st| {
            let cols = w.len();
            let form = match product::fused_form(next.kind, st.packed_dot) {
                Some(form) if st.subgroups && next.desc.cols == cols => form,
                _ => return st.rms_norm(x, w, n, eps, out, false),
            };
            let traffic = norm_bytes(n, cols) + product::activation_bytes(next.kind, true, n, cols);
            let (width, rows) = (cols as u32, n as u32);
            match form {
                product::Form::Halves => {
                    st.reserve_halves(n * cols / 2)?;
                    let State {
                        gpu,
                        batch,
                        act: Activations { halves, .. },
                        ..
                    } = st;
                    batch.run_moving(
                        gpu,
                        &k::rms_norm_pack_f16_sg::Args {
                            x,
                            w,
                            y: out,
                            h: halves,
                            width,
                            eps,
                        },
                        k::row_grid(rows),
                        traffic,
                    )?;
                }
                product::Form::I8Packed => {
                    st.reserve(n * cols, n)?;
                    let State {
                        gpu,
                        batch,
                        act:
                            Activations {
                                packed, act_scale, ..
                            },
                        ..
                    } = st;
                    batch.run_moving(
                        gpu,
                        &k::rms_norm_quantize_i8_packed_sg::Args {
                            x,
                            w,
                            y: out,
                            q: &mut packed.0,
                            scale: act_scale,
                            sum: &mut packed.1,
                            width,
                            eps,
                        },
                        k::row_grid(rows),
                        traffic,
                    )?;
                }
                product::Form::Q8_0 | product::Form::Q8K => {
                    let per_block = if form == product::Form::Q8K { 256 } else { 32 };
                    st.reserve(n * cols, n * cols / per_block)?;
                    let State {
                        gpu,
                        batch,
                        act:
                            Activations {
                                q,
                                packed,
                                act_scale,
                                ..
                            },
                        ..
                    } = st;
                    let grid = k::span_grid(width, rows);
                    if form == product::Form::Q8K {
                        let args = k::rms_norm_quantize_q8k_sg::Args {
                            x,
                            w,
                            y: out,
                            q,
                            d: act_scale,
                            width,
                            eps,
                        };
                        batch.run_moving(gpu, &args, grid, traffic)?;
                    } else {
                        let args = k::rms_norm_quantize_q8_0_sg::Args {
                            x,
                            w,
                            y: out,
                            q: &mut packed.0,
                            d: act_scale,
                            width,
                            eps,
                        };
                        batch.run_moving(gpu, &args, grid, traffic)?;
                    }
                }
            }
            st.quantized = Some(Quantized {
                buffer: out.raw().clone(),
                cols,
                n,
                form,
            });
            Ok(())
        });
    }

    fn matmul(&self, w: &GpuMatrix, x: &GpuBuffer<f32>, n: usize, out: &mut GpuBuffer<f32>) {
        self.record_product(|st| {
            product::quantize(st, w, x, n)?;
            product::multiply(st, w, x, n, out, k::STORE)
        });
    }

    /// Quantizes the input once for every matrix that reads it the same way.
    fn matmul_many(
        &self,
        ws: &[&GpuMatrix],
        x: &GpuBuffer<f32>,
        n: usize,
        outs: &mut [&mut GpuBuffer<f32>],
    ) {
        self.record_product(|st| product::multiply_each(st, ws, x, n, outs, k::STORE, None));
    }

    /// The residual add fused into the product's output stage.
    fn matmul_add(
        &self,
        w: &GpuMatrix,
        x: &GpuBuffer<f32>,
        n: usize,
        _width: usize,
        out: &mut GpuBuffer<f32>,
        _scratch: &mut GpuBuffer<f32>,
    ) {
        self.record_product(|st| {
            product::quantize(st, w, x, n)?;
            product::multiply(st, w, x, n, out, k::ADD)
        });
    }

    /// Puts the rows of Q, K and V one after the other so one pass of the matrix kernel
    /// computes all three; where V cannot join them (a layout of its own), Q and K alone;
    /// matrices that do not fit one window stay apart.
    fn join_qkv(
        &self,
        q: GpuMatrix,
        k: GpuMatrix,
        v: GpuMatrix,
    ) -> Result<Qkv<GpuMatrix>, BackendError> {
        let gpu = &mut self.state.borrow_mut().gpu;
        let (q, k, v) = match GpuMatrix::join_qkv(gpu, q, k, Some(v)).map_err(device_error)? {
            Ok(joined) => return Ok(Qkv::Joined(joined)),
            Err((q, k, Some(v))) => (q, k, v),
            Err((_, _, None)) => unreachable!("V was handed to the join"),
        };
        match GpuMatrix::join_qkv(gpu, q, k, None).map_err(device_error)? {
            Ok(qk) => Ok(Qkv::JoinedQk { qk, v }),
            Err((q, k, _)) => Ok(Qkv::Apart { q, k, v }),
        }
    }

    fn qkv(
        &self,
        w: &Qkv<GpuMatrix>,
        x: &GpuBuffer<f32>,
        n: usize,
        outs: [&mut GpuBuffer<f32>; 3],
    ) {
        match w {
            Qkv::Joined(m) => self.record_product(|st| {
                product::quantize(st, m, x, n)?;
                product::multiply_into(st, m, x, n, product::Outputs::Qkv(outs))
            }),
            // V's product reads the input Q and K's quantized where it reads it so.
            Qkv::JoinedQk { qk, v } => self.record_product(|st| {
                let [oq, ok, ov] = outs;
                product::quantize(st, qk, x, n)?;
                let joined = product::Outputs::Qkv([oq, ok, &mut *ov]);
                product::multiply_into(st, qk, x, n, joined)?;
                if !product::same_input(qk, v) {
                    product::quantize(st, v, x, n)?;
                }
                product::multiply(st, v, x, n, ov, k::STORE)
            }),
            Qkv::Apart { q, k, v } => {
                let [oq, ok, ov] = outs;
                self.matmul_many(&[q, k, v], x, n, &mut [oq, ok, ov]);
            }
        }
    }

    /// Interleaves the rows of gate and up (gate row `i` at `2i`, up row `i` at `2i + 1`) so one
    /// pass of the matrix kernel computes both and writes `act(g)·u`; pairs that do not fit one
    /// window stay apart.
    fn join_gate_up(
        &self,
        gate: GpuMatrix,
        up: GpuMatrix,
    ) -> Result<GateUp<GpuMatrix>, BackendError> {
        let mut st = self.state.borrow_mut();
        match GpuMatrix::join(&mut st.gpu, gate, up).map_err(device_error)? {
            Ok(joined) => Ok(GateUp::Joined(joined)),
            Err((gate, up)) => Ok(GateUp::Apart { gate, up }),
        }
    }

    fn gate_up(
        &self,
        w: &GateUp<GpuMatrix>,
        x: &GpuBuffer<f32>,
        n: usize,
        width: usize,
        act: Activation,
        scratch: [&mut GpuBuffer<f32>; 2],
        out: &mut GpuBuffer<f32>,
    ) {
        match w {
            GateUp::Joined(m) => self.record_product(|st| {
                product::quantize(st, m, x, n)?;
                product::multiply(st, m, x, n, out, product::glu_mode(act))
            }),
            GateUp::Apart { gate, up } => {
                let [g, u] = scratch;
                self.matmul_many(&[gate, up], x, n, &mut [&mut *g, &mut *u]);
                self.glu(g, u, n * width, act, out);
            }
        }
    }

    fn rope(&self, x: &mut GpuBuffer<f32>, n: usize, pos0: usize, shape: &RopeShape) {
        self.record(|st| {
            let at = st.rope_table(shape, pos0 + n)?;
            let State {
                gpu, batch, ropes, ..
            } = st;
            let table = &ropes[at];
            let pairs = n * shape.n_head * shape.rope_dim / 2;
            // Each pair read and written, and its (cos, sin).
            let traffic = 24 * pairs as u64;
            batch.run_moving(
                gpu,
                &k::rope_neox::Args {
                    x,
                    cs: &table.cs,
                    n_tokens: n as u32,
                    n_head: shape.n_head as u32,
                    head_dim: shape.head_dim as u32,
                    rope_dim: shape.rope_dim as u32,
                    pos0: pos0 as u32,
                },
                k::rope_neox::grid_for(pairs as u32),
                traffic,
            )
        });
    }

    fn attention(
        &self,
        cache: &mut GpuKvCache,
        layer: usize,
        q: &GpuBuffer<f32>,
        k_new: &GpuBuffer<f32>,
        v_new: &GpuBuffer<f32>,
        n: usize,
        pos0: usize,
        shape: &AttentionShape,
        out: &mut GpuBuffer<f32>,
    ) {
        self.record(|st| {
            self.check_head(shape)?;
            let kv = cache.kv_dim;
            let len = n * kv;
            let f16 = u32::from(cache.kv_type == KvType::F16);
            st.batch.run_moving(
                &mut st.gpu,
                &k::kv_write::Args {
                    k: k_new,
                    v: v_new,
                    k_cache: &mut cache.k[layer],
                    v_cache: &mut cache.v[layer],
                    len: len as u32,
                    at: (pos0 * kv) as u32,
                    ring: (cache.slots[layer] * kv) as u32,
                    f16,
                },
                k::kv_write::grid_for(len as u32),
                kv_write_bytes(len, cache.kv_type),
            )?;
            attend(st, cache, layer, q, k_new, v_new, n, pos0, shape, out)
        });
    }

    /// Always: in the one kernel of a decoded token (`rope_attention`), else with
    /// `add_qkv_bias`, `scale` and `rms_norm_heads` first, which give the same bits.
    fn prepares_heads_in_attention(&self) -> bool {
        true
    }

    /// Where the cache is dense: a decode-sized step (fewer than [`k::WIDE_STEP`] rows) in one
    /// kernel (`rope_attention`: the heads' preparation, the rotations, the cache write and
    /// attention); a longer one prepares the heads by their own launches (the biases and
    /// scale in place, the norms into a scratch of the backend's), rotates Q and K and writes
    /// the cache in one kernel (`rope_neox_kv_write`), then attends (`rope_attention` would
    /// prepare the step's keys again in each row's workgroups, work that grows with the
    /// square of the step). Both give every row the same bits. Where the one kernel runs and
    /// `next` reads halves (F16) or Q8_0 blocks that a head holds whole, that kernel leaves the
    /// outputs so (`pack_f16`'s words, or `quantize_q8_0`'s codes with their scales past them:
    /// `attention_form`) instead of as floats, and the product reads them as they are.
    fn rope_attention(
        &self,
        cache: &mut GpuKvCache,
        layer: usize,
        q: &mut GpuBuffer<f32>,
        k_new: &mut GpuBuffer<f32>,
        v_new: &mut GpuBuffer<f32>,
        n: usize,
        pos0: usize,
        rope_q: &RopeShape,
        rope_k: &RopeShape,
        shape: &AttentionShape,
        out: &mut GpuBuffer<f32>,
        next: Option<&GpuMatrix>,
        prep: Option<HeadPrep<'_, GpuBuffer<f32>>>,
    ) {
        let step = Step {
            cache,
            layer,
            n,
            pos0,
            rope: [rope_q, rope_k],
            shape,
        };
        let Some(p) = prep else {
            return self.rope_attend_step(step, q, k_new, v_new, out, next, None);
        };
        let head = shape.head_dim;
        let widths = [
            shape.n_head * head,
            shape.n_head_kv * head,
            shape.n_head_kv * head,
        ];
        let one_kernel = step.one_kernel()
            && p.norms
                .is_none_or(|h| h.gains.iter().all(|g| g.len() == head))
            && p.bias
                .is_none_or(|b| b.iter().zip(widths).all(|(b, w)| b.len() == w));
        if one_kernel {
            return self.rope_attend_step(step, q, k_new, v_new, out, next, Some(p));
        }
        self.add_bias_and_scale_queries(&p, [&mut *q, &mut *k_new, &mut *v_new], n, widths[0]);
        let Some(norms) = p.norms else {
            return self.rope_attend_step(step, q, k_new, v_new, out, next, None);
        };
        let lens = [n * widths[0], n * widths[1]];
        let Some([mut hq, mut hk]) = self.take_head_scratch(lens) else {
            return;
        };
        self.rms_norm_qk(
            [&*q, &*k_new],
            norms.gains,
            [n * shape.n_head, n * shape.n_head_kv],
            norms.eps,
            [&mut hq, &mut hk],
        );
        self.rope_attend_step(step, &mut hq, &mut hk, v_new, out, next, None);
        self.state.borrow_mut().head_scratch = Some([hq, hk]);
    }

    fn shift_cache(
        &self,
        cache: &mut GpuKvCache,
        keep: usize,
        discard: usize,
        used: usize,
        rope: &RopeShape,
    ) {
        self.record(|st| {
            let f16 = cache.kv_type == KvType::F16;
            if cache.sparse.is_some() || (f16 && !rope.rope_dim.is_multiple_of(4)) {
                return Err(self.unsupported(
                    "context shift",
                    "a sparse cache, or an f16 cache with rotary dims not a multiple of 4".into(),
                ));
            }
            let words = if f16 { cache.kv_dim / 2 } else { cache.kv_dim };
            // Each layer's moved positions: from `keep + discard`, or from the first a layer of
            // fewer slots still holds; all read into `k_out`, `v_out` before any is stored.
            let moved = |slots: usize| (keep + discard).max(used.saturating_sub(slots))..used;
            let most = cache
                .slots
                .iter()
                .map(|&n| moved(n).len())
                .max()
                .unwrap_or(0);
            if most == 0 {
                return Ok(());
            }
            let cs = st.gpu.upload("shift angles", &rope.shift_angles(discard))?;
            let mut k_out = st.gpu.zeroed::<u32>("shifted keys", most * words)?;
            let mut v_out = st.gpu.zeroed::<u32>("shifted values", most * words)?;
            let layers = cache.k.iter_mut().zip(cache.v.iter_mut());
            for ((k, v), &slots) in layers.zip(&cache.slots) {
                let rows = moved(slots);
                if rows.is_empty() {
                    continue;
                }
                let len = rows.len() * words;
                st.batch.run(
                    &mut st.gpu,
                    &k::kv_shift::Args {
                        k_cache: k,
                        v_cache: v,
                        cs: &cs,
                        k_out: &mut k_out,
                        v_out: &mut v_out,
                        words: words as u32,
                        rows: rows.len() as u32,
                        src: rows.start as u32,
                        slots: slots as u32,
                        head_dim: rope.head_dim as u32,
                        rope_dim: rope.rope_dim as u32,
                        f16: u32::from(f16),
                    },
                    k::kv_shift::grid_for(len as u32),
                )?;
                // Back to their new slots: up to the last, then on from the first.
                let to = (rows.start - discard) % slots;
                let first = rows.len().min(slots - to) * words;
                for (from, at, n) in [(0, to * words, first), (first, 0, len - first)] {
                    if n > 0 {
                        st.batch.copy(&k_out, from, k, at, n)?;
                        st.batch.copy(&v_out, from, v, at, n)?;
                    }
                }
            }
            Ok(())
        });
    }

    fn glu(
        &self,
        gate: &GpuBuffer<f32>,
        up: &GpuBuffer<f32>,
        len: usize,
        act: Activation,
        out: &mut GpuBuffer<f32>,
    ) {
        self.record(|st| {
            let n = len as u32;
            match act {
                Activation::Relu2 => st.batch.run(
                    &mut st.gpu,
                    &k::relu2_mul::Args { gate, up, out, n },
                    k::relu2_mul::grid_for(n),
                ),
                Activation::Silu => st.batch.run(
                    &mut st.gpu,
                    &k::silu_mul::Args { gate, up, out, n },
                    k::silu_mul::grid_for(n),
                ),
                Activation::GeluTanh => st.batch.run(
                    &mut st.gpu,
                    &k::gelu_mul::Args { gate, up, out, n },
                    k::gelu_mul::grid_for(n),
                ),
                Activation::SwigluClamped => st.batch.run(
                    &mut st.gpu,
                    &k::swiglu_clamped_mul::Args { gate, up, out, n },
                    k::swiglu_clamped_mul::grid_for(n),
                ),
            }
        });
    }

    fn runs_experts(&self) -> bool {
        true
    }

    /// Stacks the experts' matrices where they stack, so a short step multiplies its chosen
    /// experts in one launch a matrix (`experts.rs`).
    #[allow(clippy::type_complexity)]
    fn stack_experts(
        &self,
        experts: Vec<hesper_engine::backend::Expert<GpuMatrix, GpuBuffer<f32>>>,
    ) -> Result<
        (
            Vec<hesper_engine::backend::Expert<GpuMatrix, GpuBuffer<f32>>>,
            Option<hesper_engine::backend::Expert<GpuMatrix, GpuBuffer<f32>>>,
        ),
        BackendError,
    > {
        experts::stack(self, experts)
    }

    fn moe_ffn(
        &self,
        moe: &hesper_engine::backend::Moe<GpuMatrix, GpuBuffer<f32>>,
        routing: &hesper_engine::config::Experts,
        act: Activation,
        x: &GpuBuffer<f32>,
        n: usize,
        out: &mut GpuBuffer<f32>,
    ) {
        self.mixture(moe, routing, act, x, n, out, false);
    }

    /// The weighted sum added to the residual as it is written (`moe_combine`'s `add`).
    fn moe_ffn_add(
        &self,
        moe: &hesper_engine::backend::Moe<GpuMatrix, GpuBuffer<f32>>,
        routing: &hesper_engine::config::Experts,
        act: Activation,
        h: &GpuBuffer<f32>,
        n: usize,
        _width: usize,
        x: &mut GpuBuffer<f32>,
        _scratch: &mut GpuBuffer<f32>,
    ) {
        self.mixture(moe, routing, act, h, n, x, true);
    }

    fn add_bias(&self, x: &mut GpuBuffer<f32>, bias: &GpuBuffer<f32>, n: usize) {
        let len = (n * bias.len()) as u32;
        self.record(|st| {
            st.batch.run(
                &mut st.gpu,
                &k::add_bias::Args {
                    x,
                    b: bias,
                    width: bias.len() as u32,
                    n: len,
                },
                k::add_bias::grid_for(len),
            )
        });
    }

    /// The three biases in one launch (`add_qkv_bias`) where keys and values are one width
    /// and the launch's workgroups fit one grid dimension (else the three launches).
    fn add_qkv_bias(&self, outs: [&mut GpuBuffer<f32>; 3], bias: &[GpuBuffer<f32>; 3], n: usize) {
        let [q, k, v] = outs;
        let [bq, bk, bv] = bias;
        let (q_width, kv_width) = (bq.len(), bk.len());
        let len = n * (q_width + 2 * kv_width);
        let workgroups = len.div_ceil(k::add_qkv_bias::WORKGROUP_SIZE as usize);
        if bv.len() != kv_width || !self.fits_one_dimension(workgroups) {
            for (x, b) in [q, k, v].into_iter().zip(bias) {
                self.add_bias(x, b, n);
            }
            return;
        }
        let len = len as u32;
        self.record(|st| {
            st.batch.run(
                &mut st.gpu,
                &k::add_qkv_bias::Args {
                    q,
                    k,
                    v,
                    bq,
                    bk,
                    bv,
                    q_width: q_width as u32,
                    kv_width: kv_width as u32,
                    n: n as u32,
                },
                k::add_qkv_bias::grid_for(len),
            )
        });
    }

    fn scale(&self, x: &mut GpuBuffer<f32>, len: usize, s: f32) {
        self.record(|st| {
            st.batch.run(
                &mut st.gpu,
                &k::scale_assign::Args {
                    x,
                    s,
                    n: len as u32,
                },
                k::scale_assign::grid_for(len as u32),
            )
        });
    }

    fn softcap(&self, x: &mut GpuBuffer<f32>, len: usize, cap: f32) {
        self.record(|st| {
            st.batch.run(
                &mut st.gpu,
                &k::softcap_assign::Args {
                    x,
                    cap,
                    n: len as u32,
                },
                k::softcap_assign::grid_for(len as u32),
            )
        });
    }

    fn add(&self, x: &mut GpuBuffer<f32>, y: &GpuBuffer<f32>, len: usize) {
        self.record(|st| {
            st.batch.run(
                &mut st.gpu,
                &k::add_assign::Args {
                    x,
                    y,
                    n: len as u32,
                },
                k::add_assign::grid_for(len as u32),
            )
        });
    }

    fn copy_rows(
        &self,
        src: &GpuBuffer<f32>,
        row0: usize,
        n_rows: usize,
        width: usize,
        dst: &mut GpuBuffer<f32>,
        dst_row0: usize,
    ) {
        self.record(|st| {
            st.batch
                .copy(src, row0 * width, dst, dst_row0 * width, n_rows * width)
        });
    }
}

/// Records attention of `n` query rows over layer `layer` of the cache, whose new positions
/// are written already (the landmarks of a sparse cache are updated from `k_new`, `v_new`).
#[allow(clippy::too_many_arguments)]
fn attend(
    st: &mut State,
    cache: &mut GpuKvCache,
    layer: usize,
    q: &GpuBuffer<f32>,
    k_new: &GpuBuffer<f32>,
    v_new: &GpuBuffer<f32>,
    n: usize,
    pos0: usize,
    shape: &AttentionShape,
    out: &mut GpuBuffer<f32>,
) -> Result<(), GpuError> {
    let kv = cache.kv_dim;
    let f16 = u32::from(cache.kv_type == KvType::F16);
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    upload_sinks(st, cache, layer, shape)?;
    // Unread without sinks: the queries stand in.
    let (sink, sinks) = sink_binding(&cache.sinks[layer], shape, q);
    let (n_head, n_head_kv) = (shape.n_head as u32, shape.n_head_kv as u32);
    let head_dim = shape.head_dim as u32;
    let Some(sp) = &mut cache.sparse else {
        // Dense: the landmark and globals bindings are not read; the K cache stands in. The
        // cache's attended rows read once, the queries read and the outputs written. A sliding
        // window is the sparse pattern's window with nothing attended outside it.
        let traffic = dense_cache_bytes(cache, shape, n, pos0)
            + (8 * n * shape.n_head * shape.head_dim) as u64;
        return st.batch.run_moving(
            &mut st.gpu,
            &k::attention::Args {
                q,
                k_cache: &cache.k[layer],
                v_cache: &cache.v[layer],
                lk: q,
                lv: q,
                globals: &cache.k[layer],
                sink,
                out,
                n_head,
                n_head_kv,
                head_dim,
                pos0: pos0 as u32,
                scale,
                f16,
                slots: cache.slots[layer] as u32,
                window: shape.window.map_or(0, |w| w as u32),
                n_global: 0,
                log_stride: 0,
                landmarks: 0,
                block: 1,
                softcap: shape.softcap.unwrap_or(0.0),
                sinks,
            },
            k::attention_grid(n_head, n as u32),
            traffic,
        );
    };
    let p = &sp.pattern;
    if sp.n_block > 0 {
        st.batch.run(
            &mut st.gpu,
            &k::landmark_update::Args {
                k: k_new,
                v: v_new,
                lk: &mut sp.lk[layer],
                lv: &mut sp.lv[layer],
                kv_dim: kv as u32,
                pos0: pos0 as u32,
                n: n as u32,
                block: p.block as u32,
                n_block: sp.n_block as u32,
            },
            k::landmark_grid(kv as u32, pos0 as u32, n as u32, p.block as u32),
        )?;
    }
    st.batch.run(
        &mut st.gpu,
        &k::attention::Args {
            q,
            k_cache: &cache.k[layer],
            v_cache: &cache.v[layer],
            lk: &sp.lk[layer],
            lv: &sp.lv[layer],
            globals: &sp.globals,
            sink,
            out,
            n_head,
            n_head_kv,
            head_dim,
            pos0: pos0 as u32,
            scale,
            f16,
            slots: cache.slots[layer] as u32,
            window: p.window.max(1) as u32,
            n_global: p.globals.len() as u32,
            log_stride: u32::from(p.log_stride),
            landmarks: u32::from(sp.n_block > 0),
            block: p.block as u32,
            softcap: shape.softcap.unwrap_or(0.0),
            sinks,
        },
        k::attention_grid(n_head, n as u32),
    )
}

/// Uploads layer `layer`'s attention sinks (gpt-oss) the first time they are needed.
fn upload_sinks(
    st: &mut State,
    cache: &mut GpuKvCache,
    layer: usize,
    shape: &AttentionShape,
) -> Result<(), GpuError> {
    if let (Some(sinks), None) = (shape.sinks, &cache.sinks[layer]) {
        cache.sinks[layer] = Some(st.gpu.upload("attention sinks", sinks)?);
    }
    Ok(())
}

/// One session's attention step: its cache and layer, `n` rows from `pos0`, the RoPE of its
/// queries and keys, its heads.
struct Step<'s, 'a> {
    cache: &'s mut GpuKvCache,
    layer: usize,
    n: usize,
    pos0: usize,
    rope: [&'s RopeShape<'a>; 2],
    shape: &'s AttentionShape<'a>,
}

impl Step<'_, '_> {
    /// Whether the rotations fold into the attention's kernels: a dense cache, one RoPE for
    /// queries and keys, whole pairs of a head's dimensions.
    fn fused(&self) -> bool {
        let ([q, k], head_dim) = (self.rope, self.shape.head_dim);
        self.cache.sparse.is_none()
            && q.rope_dim == k.rope_dim
            && q.base == k.base
            && q.scale == k.scale
            && q.freq_factors == k.freq_factors
            && q.attn_factor == k.attn_factor
            && q.yarn == k.yarn
            && q.head_dim == head_dim
            && k.head_dim == head_dim
            && q.rope_dim.is_multiple_of(2)
    }

    /// Whether the step runs in one kernel (`rope_attention`): fused and decode-sized.
    fn one_kernel(&self) -> bool {
        self.fused() && self.n < k::WIDE_STEP as usize
    }
}

/// How `rope_attention` prepares a layer's heads: what its `layer_params` binding holds (the
/// sinks, the head norms' gains and their epsilon, the biases) and the queries' factor.
#[derive(Clone, Copy)]
struct Prepared {
    sinks: bool,
    norm: Option<f32>,
    biased: bool,
    query_scale: f32,
}

impl Prepared {
    /// Whether `layer_params` holds anything.
    fn any(&self) -> bool {
        self.sinks || self.norm.is_some() || self.biased
    }
}

/// Joins what layer `layer`'s `rope_attention` reads beside its inputs — the sinks of `shape`
/// (uploaded first where they are not yet), the head-norm gains and the biases of `prep` —
/// into one buffer, once (again where a hot swap brought the layer new ones); says how the
/// kernel prepares the heads.
fn join_layer_params(
    st: &mut State,
    cache: &mut GpuKvCache,
    layer: usize,
    shape: &AttentionShape,
    prep: Option<&HeadPrep<'_, GpuBuffer<f32>>>,
) -> Result<Prepared, GpuError> {
    upload_sinks(st, cache, layer, shape)?;
    let sinks = cache.sinks[layer]
        .as_ref()
        .filter(|_| shape.sinks.is_some());
    let norms = prep.and_then(|p| p.norms);
    let bias = prep.and_then(|p| p.bias);
    let parts: Vec<&GpuBuffer<f32>> = sinks
        .into_iter()
        .chain(norms.iter().flat_map(|h| h.gains))
        .chain(bias.into_iter().flatten())
        .collect();
    let held = Prepared {
        sinks: sinks.is_some(),
        norm: norms.map(|h| h.eps),
        biased: bias.is_some(),
        query_scale: prep.map_or(1.0, |p| p.query_scale),
    };
    if parts.is_empty() {
        return Ok(held);
    }
    let from: Vec<_> = parts.iter().map(|b| b.raw().clone()).collect();
    if matches!(&cache.layer_params[layer], Some(j) if j.from == from) {
        return Ok(held);
    }
    let len = parts.iter().map(|b| b.len()).sum();
    let mut joined = st.gpu.zeroed("attention layer parameters", len)?;
    let mut at = 0;
    for part in parts {
        st.batch.copy(part, 0, &mut joined, at, part.len())?;
        at += part.len();
    }
    cache.layer_params[layer] = Some(LayerParams { from, joined });
    Ok(held)
}

/// The buffer an attention kernel's `sink` binding takes and its `sinks` flag: a layer's
/// `uploaded` sinks where the shape has them, else `stand_in` (unread).
fn sink_binding<'a>(
    uploaded: &'a Option<GpuBuffer<f32>>,
    shape: &AttentionShape,
    stand_in: &'a GpuBuffer<f32>,
) -> (&'a GpuBuffer<f32>, u32) {
    match uploaded {
        Some(b) if shape.sinks.is_some() => (b, 1),
        _ => (stand_in, 0),
    }
}

/// Bytes dense attention of `n` rows from `pos0` reads from the cache: every attended
/// position's key and value once (each kv head serves its query heads from the same rows), a
/// sliding window's positions only.
fn dense_cache_bytes(cache: &GpuKvCache, shape: &AttentionShape, n: usize, pos0: usize) -> u64 {
    let element = if cache.kv_type == KvType::F16 { 2 } else { 4 };
    let keys = shape.window.map_or(pos0 + n, |w| (pos0 + n).min(w + n - 1));
    (2 * keys * cache.kv_dim * element) as u64
}

/// The form in which a decoded token's attention kernel can leave its outputs for `next`, the
/// one product that reads them, instead of floats: an F16 product's halves, or a Q8_0
/// product's blocks where each head holds whole ones (Q4_0 and MXFP4 read Q8_0 too). Q8_K's
/// blocks of 256 and I2_S's one scale a row span heads, which the kernel's workgroups hold
/// one each.
fn attention_form(next: &GpuMatrix, shape: &AttentionShape, packed_dot: bool) -> Option<Form> {
    let head = shape.head_dim;
    let form = product::fused_form(next.kind, packed_dot)?;
    let whole = match form {
        Form::Halves => head.is_multiple_of(2),
        Form::Q8_0 => head.is_multiple_of(32),
        // A head of 256 is one Q8_K block (the kernel's heads are at most 256 wide); the TQ
        // kernels read their scales apart.
        Form::Q8K => head == 256 && matches!(next.kind, Kind::Kq { .. }),
        Form::I8Packed => false,
    };
    (whole && next.desc.cols == shape.n_head * head).then_some(form)
}

/// A decode-sized step's preparation of its heads (`prepared`, its parameters joined in the
/// cache), NeoX RoPE, cache write and dense attention in one dispatch (`rope_attention`), the
/// angles from RoPE table `table`; with `form`, the outputs left in the activation scratch as
/// the product that reads them next reads them ([`attention_form`]).
#[allow(clippy::too_many_arguments)]
fn rope_attend(
    st: &mut State,
    step: Step,
    table: usize,
    q: &mut GpuBuffer<f32>,
    k_new: &GpuBuffer<f32>,
    v_new: &GpuBuffer<f32>,
    out: &mut GpuBuffer<f32>,
    form: Option<Form>,
    prepared: Prepared,
) -> Result<(), GpuError> {
    let Step {
        cache,
        layer,
        n,
        pos0,
        rope: [rope, _],
        shape,
    } = step;
    let cols = shape.n_head * shape.head_dim;
    // Where the kernel writes: the outputs as floats, or the product's halves, Q8_0 or Q8_K
    // blocks in the activation scratch, with the scales past the codes.
    let (code, scales_at, written) = match form {
        None => (k::OUT_F32, 0, 4 * n * cols),
        Some(Form::Halves) => {
            st.reserve_halves(n * cols / 2)?;
            (k::OUT_HALVES, 0, 2 * n * cols)
        }
        Some(Form::Q8K) => {
            st.act.reserve_q8k_with_scales(&st.gpu, n, cols)?;
            (k::OUT_Q8_K, n * cols, 4 * n * cols + n * cols / 64)
        }
        Some(_) => {
            st.act.reserve_q8_0_with_scales(&st.gpu, n, cols)?;
            (k::OUT_Q8_0, n * cols / 4, n * cols + n * cols / 8)
        }
    };
    // The attended positions' keys and values read once, the step's new ones read and
    // written, the queries read and written back rotated, the outputs written.
    let traffic = dense_cache_bytes(cache, shape, n, pos0)
        + kv_write_bytes(n * cache.kv_dim, cache.kv_type)
        + (8 * n * cols + written) as u64;
    let State {
        gpu,
        batch,
        ropes,
        act,
        ..
    } = st;
    // The layer's joined parameters; unread without any: the angle table stands in (the
    // queries are bound for writing).
    let layer_params = match &cache.layer_params[layer] {
        Some(joined) if prepared.any() => &joined.joined,
        _ => &ropes[table].cs,
    };
    let mut run = |out: &mut GpuBuffer<u32>| {
        batch.run_moving(
            gpu,
            &k::rope_attention::Args {
                q: &mut *q,
                k: k_new,
                v: v_new,
                cs: &ropes[table].cs,
                k_cache: &mut cache.k[layer],
                v_cache: &mut cache.v[layer],
                layer_params,
                out,
                n_head: shape.n_head as u32,
                n_head_kv: shape.n_head_kv as u32,
                head_dim: shape.head_dim as u32,
                rope_dim: rope.rope_dim as u32,
                pos0: pos0 as u32,
                scale: 1.0 / (shape.head_dim as f32).sqrt(),
                f16: u32::from(cache.kv_type == KvType::F16),
                slots: cache.slots[layer] as u32,
                window: shape.window.map_or(0, |w| w as u32),
                softcap: shape.softcap.unwrap_or(0.0),
                sinks: u32::from(prepared.sinks),
                form: code,
                scales_at: scales_at as u32,
                norm: u32::from(prepared.norm.is_some()),
                eps: prepared.norm.unwrap_or(0.0),
                biased: u32::from(prepared.biased),
                query_scale: prepared.query_scale,
            },
            k::attention_grid(shape.n_head as u32, n as u32),
            traffic,
        )
    };
    let Some(form) = form else {
        return out.as_elements_mut(run);
    };
    match form {
        Form::Halves => run(&mut act.halves)?,
        Form::Q8K => act.q.as_elements_mut(run)?,
        _ => run(&mut act.packed.0)?,
    }
    // The output projection reads them as `pack_f16` or `quantize_q8_0` would have left them.
    st.quantized = Some(Quantized {
        buffer: out.raw().clone(),
        cols,
        n,
        form,
    });
    Ok(())
}

/// Bytes RMSNorm of `n` rows of `width` moves: the rows read and written, and the gains.
fn norm_bytes(n: usize, width: usize) -> u64 {
    4 * (2 * n * width + width) as u64
}

/// Bytes the cache write of `len` new key and value elements moves: both read as f32 and
/// written as `kv_type`.
fn kv_write_bytes(len: usize, kv_type: KvType) -> u64 {
    let element = if kv_type == KvType::F16 { 2 } else { 4 };
    (2 * len * (4 + element)) as u64
}
