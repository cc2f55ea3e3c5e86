//! Adapter, device and buffer helpers.

use std::sync::Arc;

use thiserror::Error;
use wgpu::util::DeviceExt;

use crate::batch::Batch;
use crate::kernel::KernelSource;
use crate::pipeline::{CacheStats, Pipeline, PipelineCache};

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
    cache: PipelineCache,
    submits: u64,
}

impl Gpu {
    /// Opens the best adapter (`WGPU_BACKEND` may restrict the backends) with its full limits.
    pub fn new() -> Result<Self, GpuError> {
        let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        }))
        .map_err(|e| GpuError::NoAdapter(e.to_string()))?;
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("hesper"),
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| GpuError::Device(e.to_string()))?;
        Ok(Self {
            device,
            queue,
            info: adapter.get_info(),
            limits,
            cache: PipelineCache::default(),
            submits: 0,
        })
    }

    /// The pipeline of `k` (compiled once, then served from the cache).
    pub fn pipeline(&mut self, k: &KernelSource) -> Result<Arc<Pipeline>, GpuError> {
        self.cache.get(&self.device, k)
    }

    /// Pipeline-cache hits and misses.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Queue submits so far.
    pub fn submits(&self) -> u64 {
        self.submits
    }

    /// A new batch of dispatches.
    pub fn batch(&self) -> Batch {
        Batch::new(&self.device)
    }

    /// Submits a batch: one queue submit for all its dispatches.
    pub fn submit(&mut self, batch: Batch) {
        self.queue.submit([batch.finish()]);
        self.submits += 1;
    }

    /// A storage buffer holding `data`.
    pub fn storage<T: bytemuck::Pod>(&self, label: &str, data: &[T]) -> wgpu::Buffer {
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytemuck::cast_slice(data),
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
            })
    }

    /// A zeroed storage buffer of `len` elements of `T`.
    pub fn storage_zeroed<T: bytemuck::Pod>(&self, label: &str, len: usize) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (len * std::mem::size_of::<T>()).max(4) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// A uniform buffer holding the 4-byte fields of a kernel's `Params`, padded to 16 bytes.
    pub fn uniform(&self, label: &str, fields: &[[u8; 4]]) -> wgpu::Buffer {
        let mut bytes: Vec<u8> = fields.concat();
        bytes.resize(bytes.len().div_ceil(16).max(1) * 16, 0);
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &bytes,
                usage: wgpu::BufferUsages::UNIFORM,
            })
    }

    /// Copies `len` elements of `buffer` back to the host (one submit, then a wait).
    pub fn read<T: bytemuck::Pod>(
        &mut self,
        buffer: &wgpu::Buffer,
        len: usize,
    ) -> Result<Vec<T>, GpuError> {
        let size = (len * std::mem::size_of::<T>()) as u64;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: size.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("readback"),
            });
        encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, size);
        self.queue.submit([encoder.finish()]);
        self.submits += 1;
        let slice = staging.slice(..size);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        rx.recv()
            .map_err(|e| GpuError::Readback(e.to_string()))?
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        let view = slice
            .get_mapped_range()
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        Ok(bytemuck::cast_slice(&view).to_vec())
    }
}
