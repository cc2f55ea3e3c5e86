//! hesper-gpu: the WebGPU runtime under the GPU backend.
//!
//! * [`Gpu`]: adapter and device, requested with the adapter's real limits (the 2B4T LM head
//!   alone is above WebGPU's default 128 MiB binding);
//! * [`PipelineCache`]: compute pipelines keyed by SHA-256 of WGSL text, entry point and layout,
//!   with hit/miss counters;
//! * [`Batch`]: many dispatches recorded into one command buffer, one queue submit;
//!   [`PendingRead`]: its read-back, awaited (natively a wait on the device, in a browser the
//!   event loop's map callback);
//! * [`Gpu::copy_bandwidth`]: the device's memory bandwidth, the decode roofline (native);
//! * [`hardware_gpu_possible`]: whether probing for a hardware adapter is worth its cost;
//! * [`GpuBuffer`] (or a view of some of one's elements, [`Gpu::view`]), [`KernelArgs`],
//!   [`KernelSource`]: typed buffers and the typed launch arguments every `#[kernel]` of
//!   `hesper-shaders` generates.
//!
//! Its own crate (not inside `hesper-engine`) so the engine core stays free of wgpu for builds
//! that only need the CPU.

#[cfg(not(target_arch = "wasm32"))]
mod bandwidth;
mod batch;
mod buffer;
mod context;
mod encode;
mod kernel;
mod pipeline;
mod probe;
mod profile;
mod readback;
pub mod twin;
pub mod wgsl_text;

pub use batch::Batch;
pub use buffer::{Bound, GpuBuffer};
pub use context::{Gpu, GpuError};
pub use kernel::{BindingKind, KernelArgs, KernelSource};
pub use pipeline::{CacheStats, PipelineCache};
pub use probe::hardware_gpu_possible;
pub use profile::KernelTime;
pub use readback::PendingRead;
/// The wgpu version the runtime is built on (generated kernel code names its types).
pub use wgpu;
