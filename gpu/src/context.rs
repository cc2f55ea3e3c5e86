//! Adapter, device and buffer helpers.

use std::sync::{Arc, Mutex};

use thiserror::Error;
use wgpu::util::DeviceExt;

use crate::batch::Batch;
use crate::buffer::GpuBuffer;
use crate::encode::{encode, BindGroups, ParamBuffer};
use crate::kernel::KernelSource;
use crate::pipeline::{CacheStats, Pipeline, PipelineCache};
use crate::profile::{KernelTime, Profiler};
use crate::readback::PendingRead;

/// GPU errors, each naming what failed.
#[derive(Debug, Error)]
pub enum GpuError {
    /// No adapter: no GPU, or no driver (CI installs Mesa's lavapipe).
    #[error("no WebGPU adapter found ({0}); on Linux without a GPU install mesa-vulkan-drivers (lavapipe)")]
    NoAdapter(String),
    /// The device could not be created.
    #[error("cannot open the GPU device: {0}")]
    Device(String),
    /// A kernel description is inconsistent.
    #[error("kernel {kernel}: {why}")]
    Kernel {
        /// Kernel name.
        kernel: &'static str,
        /// What is wrong.
        why: String,
    },
    /// A buffer larger than the device allows.
    #[error(
        "cannot allocate {bytes} bytes for {what} on the GPU: the device allows {limit} per buffer"
    )]
    TooLarge {
        /// What was being allocated.
        what: String,
        /// Requested size.
        bytes: u64,
        /// The device's limit.
        limit: u64,
    },
    /// A copy outside a buffer.
    #[error("buffer copy out of range: {0}")]
    Copy(String),
    /// The device reported an error (validation, out of memory, device lost).
    #[error("the GPU reported: {0}")]
    Reported(String),
    /// Reading a buffer back failed.
    #[error("cannot read GPU buffer back: {0}")]
    Readback(String),
}

/// An open GPU device with a pipeline cache.
pub struct Gpu {
    /// The device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// What the adapter says about itself.
    pub info: wgpu::AdapterInfo,
    /// The limits the device was opened with (the adapter's own).
    pub limits: wgpu::Limits,
    /// The adapter's optional features (e.g. `SHADER_F16`, `SUBGROUP`, `TIMESTAMP_QUERY`).
    pub features: wgpu::Features,
    /// The WGSL language extensions the implementation accepts (e.g. packed int8 dot
    /// products).
    pub wgsl_features: wgpu::WgslLanguageFeatures,
    cache: PipelineCache,
    bind_groups: BindGroups,
    params: ParamBuffer,
    profiler: Option<Profiler>,
    readback: Option<wgpu::Buffer>,
    buffers_created: std::cell::Cell<u64>,
    submits: u64,
    /// Submits that end a piece of work (a step's read-back, a batch at load): bind groups
    /// live by them; the parts a step is submitted in ([`Gpu::submit_part`]) do not count.
    ticks: u64,
    errors: Arc<Mutex<Option<String>>>,
    /// Host time spent encoding and submitting batches, and waiting for read-backs (native).
    host: HostTimes,
}

/// Host nanoseconds a benchmark splits a step into: encoding and submitting its commands,
/// and waiting for the GPU to deliver its read-back (shared with each [`PendingRead`]).
#[derive(Debug, Default, Clone)]
pub(crate) struct HostTimes {
    pub(crate) submit_ns: Arc<std::sync::atomic::AtomicU64>,
    pub(crate) wait_ns: Arc<std::sync::atomic::AtomicU64>,
}

impl HostTimes {
    /// Runs `f`, adding its duration to `counter` (natively; a browser has no clock here).
    pub(crate) fn time<R>(counter: &std::sync::atomic::AtomicU64, f: impl FnOnce() -> R) -> R {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let t0 = std::time::Instant::now();
            let r = f();
            counter.fetch_add(
                t0.elapsed().as_nanos() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            r
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = counter;
            f()
        }
    }
}

impl Gpu {
    /// Opens the best adapter (`WGPU_BACKEND` may restrict the backends) with its full limits
    /// (native: waits for it; in a browser use [`Gpu::open`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<Self, GpuError> {
        pollster::block_on(Self::open())
    }

    /// Opens the best adapter with its full limits, as a future (what a browser awaits).
    pub async fn open() -> Result<Self, GpuError> {
        let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError::NoAdapter(e.to_string()))?;
        let limits = adapter.limits();
        // Matrix cores where they multiply 16×16 halves into f32 (`matrix_cores`); a device
        // that refuses them (an experimental feature) is opened without.
        let with_cores = if matrix_cores(&adapter) {
            request_device(&adapter, &limits, true).await.ok()
        } else {
            None
        };
        let (device, queue) = match with_cores {
            Some(opened) => opened,
            None => request_device(&adapter, &limits, false).await?,
        };
        // Errors become values: the first one is kept and returned by the next submit or
        // read instead of wgpu's default panic.
        let errors = Arc::new(Mutex::new(None::<String>));
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut slot = sink.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| e.to_string());
        }));
        let lost = errors.clone();
        device.set_device_lost_callback(move |reason, msg| {
            let mut slot = lost.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| format!("device lost ({reason:?}): {msg}"));
        });
        Ok(Self {
            device,
            queue,
            info: adapter.get_info(),
            features: adapter.features(),
            wgsl_features: instance.wgsl_language_features(),
            limits,
            cache: PipelineCache::default(),
            bind_groups: BindGroups::default(),
            params: ParamBuffer::default(),
            profiler: None,
            readback: None,
            buffers_created: Default::default(),
            submits: 0,
            ticks: 0,
            errors,
            host: HostTimes::default(),
        })
    }

    /// Whether the device multiplies on matrix cores: the cooperative-matrix kernels
    /// (`features(cooperative_matrix)`) run on it.
    pub fn has_matrix_cores(&self) -> bool {
        self.device
            .features()
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    }

    /// The pipeline of `k` specialised with `constants` (compiled once, then served from the
    /// cache).
    pub fn pipeline(
        &mut self,
        k: &KernelSource,
        constants: &[(&str, f64)],
    ) -> Result<Arc<Pipeline>, GpuError> {
        self.cache.get(&self.device, k, constants)
    }

    /// Pipeline-cache hits and misses.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Bind groups created so far (they are reused while the same buffers are bound).
    pub fn bind_groups_created(&self) -> u64 {
        self.bind_groups.created
    }

    /// Bind groups held in the cache now (each keeps the buffers it binds alive).
    pub fn bind_groups_held(&self) -> usize {
        self.bind_groups.held()
    }

    /// Turns per-kernel GPU timing on or off; returns whether the device can time kernels
    /// (`TIMESTAMP_QUERY`). While on, every dispatch gets its own compute pass and each submit
    /// waits for its timestamps.
    pub fn set_profiling(&mut self, on: bool) -> bool {
        // Collecting timestamps waits for each submit, which a browser cannot do.
        let supported = cfg!(not(target_arch = "wasm32"))
            && self
                .device
                .features()
                .contains(wgpu::Features::TIMESTAMP_QUERY);
        self.profiler = (on && supported).then(|| Profiler::new(&self.device, &self.queue));
        supported
    }

    /// GPU time per kernel since the last call (slowest first); empty unless profiling.
    pub fn kernel_times(&mut self) -> Vec<KernelTime> {
        self.profiler
            .as_mut()
            .map(Profiler::take)
            .unwrap_or_default()
    }

    /// Buffers created so far (uploads, zeroed buffers, read-back space).
    pub fn buffers_created(&self) -> u64 {
        self.buffers_created.get()
    }

    /// Queue submits so far.
    pub fn submits(&self) -> u64 {
        self.submits
    }

    /// Host nanoseconds so far spent encoding and submitting batches, and waiting for their
    /// read-backs (natively; zero in a browser).
    pub fn host_times(&self) -> (u64, u64) {
        let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        (get(&self.host.submit_ns), get(&self.host.wait_ns))
    }

    /// A new, empty batch.
    pub fn batch(&self) -> Batch {
        Batch::new(self.limits.min_uniform_buffer_offset_alignment)
    }

    /// Submits a batch: one queue submit for all its commands.
    pub fn submit(&mut self, batch: Batch) -> Result<(), GpuError> {
        self.ticks += 1;
        self.submit_part(batch)
    }

    /// Submits a batch that is one part of a larger piece of work (the first layers of a step,
    /// while the rest is recorded): bind groups its work shares with the other parts stay
    /// cached as for one submit.
    pub fn submit_part(&mut self, batch: Batch) -> Result<(), GpuError> {
        self.submits += 1;
        let timed = HostTimes::time(&self.host.submit_ns, || {
            let (commands, timed) = encode(
                &self.device,
                &self.queue,
                &mut self.bind_groups,
                &mut self.params,
                self.profiler.as_ref(),
                batch,
                self.ticks,
            );
            self.queue.submit([commands]);
            timed
        });
        if let Some(p) = self.profiler.as_mut() {
            p.collect(&self.device, &timed)
                .map_err(GpuError::Readback)?;
        }
        self.check()
    }

    /// The first error the device reported since the last check, as a value.
    pub fn check(&self) -> Result<(), GpuError> {
        let mut slot = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        match slot.take() {
            Some(e) => Err(GpuError::Reported(e)),
            None => Ok(()),
        }
    }

    fn check_size(&self, what: &str, bytes: u64) -> Result<(), GpuError> {
        let limit = self.max_binding();
        if bytes > limit {
            return Err(GpuError::TooLarge {
                what: what.into(),
                bytes,
                limit,
            });
        }
        Ok(())
    }

    /// Largest storage binding in bytes.
    pub fn max_binding(&self) -> u64 {
        self.limits
            .max_buffer_size
            .min(self.limits.max_storage_buffer_binding_size)
    }

    /// `len` elements of `buffer` from element `at` on, as a buffer of their own sharing its
    /// bytes (kernels bind just those), or `None` where they do not start at a multiple of the
    /// device's storage offset alignment or lie past its end.
    pub fn view<T: bytemuck::Pod>(
        &self,
        buffer: &GpuBuffer<T>,
        at: usize,
        len: usize,
    ) -> Option<GpuBuffer<T>> {
        let start = buffer.offset() + (at * std::mem::size_of::<T>()) as u64;
        let aligned =
            start.is_multiple_of(u64::from(self.limits.min_storage_buffer_offset_alignment));
        (aligned && at + len <= buffer.len()).then(|| buffer.view(at, len))
    }

    /// A storage buffer holding `data`.
    pub fn upload<T: bytemuck::Pod>(
        &self,
        what: &str,
        data: &[T],
    ) -> Result<GpuBuffer<T>, GpuError> {
        self.upload_bytes(what, bytemuck::cast_slice(data))
    }

    /// A storage buffer of elements `T` holding `bytes` as they are (e.g. weights straight
    /// from the memory-mapped file, whatever their alignment in host memory).
    pub fn upload_bytes<T: bytemuck::Pod>(
        &self,
        what: &str,
        bytes: &[u8],
    ) -> Result<GpuBuffer<T>, GpuError> {
        let size = std::mem::size_of::<T>();
        if !bytes.len().is_multiple_of(size) {
            return Err(GpuError::Copy(format!(
                "{what}: {} bytes is not a whole number of {size}-byte elements",
                bytes.len()
            )));
        }
        self.check_size(what, bytes.len() as u64)?;
        self.buffers_created.set(self.buffers_created.get() + 1);
        let raw = if bytes.is_empty() {
            self.raw_zeroed(what, 4)
        } else if cfg!(target_arch = "wasm32") && bytes.len().is_multiple_of(4) {
            // In a browser, `writeBuffer` copies straight out of wasm memory; a buffer mapped
            // at creation would first take a copy of the same size inside wasm memory (a
            // streamed load's peak would be twice the largest tensor).
            let raw = self.raw_zeroed(what, bytes.len() as u64);
            self.queue.write_buffer(&raw, 0, bytes);
            raw
        } else {
            self.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(what),
                    contents: bytes,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                })
        };
        self.check()?;
        Ok(GpuBuffer::new(raw, bytes.len() / size))
    }

    /// A zeroed storage buffer of `len` elements.
    pub fn zeroed<T: bytemuck::Pod>(
        &self,
        what: &str,
        len: usize,
    ) -> Result<GpuBuffer<T>, GpuError> {
        // A length whose byte size overflows is larger than any binding.
        let bytes = (len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        self.check_size(what, bytes)?;
        self.buffers_created.set(self.buffers_created.get() + 1);
        let raw = self.raw_zeroed(what, bytes.next_multiple_of(4).max(4));
        self.check()?;
        Ok(GpuBuffer::new(raw, len))
    }

    /// A zeroed storage buffer of `len` words that dispatches also take their grids from
    /// ([`Batch::open_gate`]).
    pub fn indirect_args(&self, what: &str, len: usize) -> Result<GpuBuffer<u32>, GpuError> {
        let bytes = (len as u64).saturating_mul(4);
        self.check_size(what, bytes)?;
        self.buffers_created.set(self.buffers_created.get() + 1);
        let raw = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(what),
            size: bytes.max(4),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::INDIRECT
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.check()?;
        Ok(GpuBuffer::new(raw, len))
    }

    fn raw_zeroed(&self, what: &str, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(what),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Queues a write of `data` at element `at` of `dst`; it lands before the next submit's
    /// commands run (so a batch recorded before it already sees it).
    pub fn write<T: bytemuck::Pod>(
        &self,
        dst: &mut GpuBuffer<T>,
        at: usize,
        data: &[T],
    ) -> Result<(), GpuError> {
        if at + data.len() > dst.len() {
            return Err(GpuError::Copy(format!(
                "writing {} elements at {at} into a buffer of {}",
                data.len(),
                dst.len()
            )));
        }
        let bytes: &[u8] = bytemuck::cast_slice(data);
        // write_buffer needs a multiple of 4 bytes; every element type here is 4 bytes wide.
        if !bytes.is_empty() {
            let offset = dst.offset() + (at * std::mem::size_of::<T>()) as u64;
            self.queue.write_buffer(dst.raw(), offset, bytes);
        }
        Ok(())
    }

    /// Copies the first `len` elements of `buffer` back to the host (one submit, then a wait;
    /// native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read<T: bytemuck::Pod>(
        &mut self,
        buffer: &GpuBuffer<T>,
        len: usize,
    ) -> Result<Vec<T>, GpuError> {
        let batch = self.batch();
        self.submit_and_read(batch, buffer, len)
    }

    /// [`Gpu::submit_for_read`], waited for (native only: a browser cannot block).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn submit_and_read<T: bytemuck::Pod>(
        &mut self,
        batch: Batch,
        buffer: &GpuBuffer<T>,
        len: usize,
    ) -> Result<Vec<T>, GpuError> {
        pollster::block_on(self.submit_for_read(batch, buffer, len)?.wait())
    }

    /// Records `batch` and the copy of `len` elements of `buffer` to the read-back buffer, and
    /// submits them as one command buffer; the returned read delivers the elements when
    /// awaited.
    pub fn submit_for_read<T: bytemuck::Pod>(
        &mut self,
        mut batch: Batch,
        buffer: &GpuBuffer<T>,
        len: usize,
    ) -> Result<PendingRead<T>, GpuError> {
        if len > buffer.len() {
            return Err(GpuError::Copy(format!(
                "reading {len} elements of a buffer of {}",
                buffer.len()
            )));
        }
        let size = (len * std::mem::size_of::<T>()) as u64;
        // One read-back buffer, reused: a step's read is awaited before the next step starts.
        let fits = self
            .readback
            .as_ref()
            .is_some_and(|b| b.size() >= size.max(4));
        if !fits {
            self.buffers_created.set(self.buffers_created.get() + 1);
            self.readback = Some(self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: size.max(4).next_power_of_two(),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        let Some(staging) = self.readback.clone() else {
            unreachable!("made above");
        };
        batch.read_into(buffer, &staging, size);
        self.submit(batch)?;
        Ok(PendingRead::start(
            &self.device,
            staging,
            size,
            len,
            self.errors.clone(),
            self.host.wait_ns.clone(),
        ))
    }
}

/// Maps `slice` for reading and waits until it is mapped.
pub(crate) fn map_and_wait(device: &wgpu::Device, slice: &wgpu::BufferSlice) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| e.to_string())?;
    rx.recv()
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// Whether `adapter` has cooperative matrices of the one shape the kernels use: 16×16×16, f16
/// operands, f32 accumulators (wgpu reports every shape the driver offers; Metal's are 8×8).
fn matrix_cores(adapter: &wgpu::Adapter) -> bool {
    use wgpu::CooperativeScalarType::{F16, F32};
    adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16)
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16) && p.ab_type == F16 && p.cr_type == F32
        })
}

/// Opens `adapter`'s device with its own `limits` and the optional features the kernels use
/// where it has them: timestamps for `bench`'s per-kernel GPU time, subgroup operations for the
/// kernels that have a subgroup variant, halves for those that hold them, and, with
/// `matrix_cores`, cooperative matrices.
async fn request_device(
    adapter: &wgpu::Adapter,
    limits: &wgpu::Limits,
    matrix_cores: bool,
) -> Result<(wgpu::Device, wgpu::Queue), GpuError> {
    let mut wanted =
        wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16;
    if matrix_cores {
        wanted |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    }
    adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("hesper"),
            required_limits: limits.clone(),
            required_features: adapter.features() & wanted,
            experimental_features: if matrix_cores {
                // SAFETY: wgpu marks its cooperative-matrix support experimental (it may hold
                // bugs); it is asked for only where the adapter reports the 16×16 f16 → f32
                // tile the kernels use, and those kernels are checked against the plain ones on
                // the device before they run a model (`hesper-gpu-backend`'s `matrix_cores.rs`).
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            ..Default::default()
        })
        .await
        .map_err(|e| GpuError::Device(e.to_string()))
}
