//! Many dispatches and copies recorded into one command buffer, submitted once.

use std::ops::Range;
use std::sync::Arc;

use crate::buffer::GpuBuffer;
use crate::context::{Gpu, GpuError};
use crate::kernel::KernelArgs;
use crate::pipeline::Pipeline;

/// One recorded command.
enum Command {
    Dispatch {
        pipeline: Arc<Pipeline>,
        buffers: Vec<wgpu::Buffer>,
        /// Byte range of this dispatch's uniforms inside the batch's parameter block.
        params: Option<Range<u64>>,
        grid: [u32; 3],
    },
    Copy {
        src: wgpu::Buffer,
        src_offset: u64,
        dst: wgpu::Buffer,
        dst_offset: u64,
        size: u64,
    },
}

/// Commands collected until [`Gpu::submit`]. Every dispatch's uniforms go into one
/// parameter buffer (each at an aligned offset), created once per batch.
pub struct Batch {
    commands: Vec<Command>,
    params: Vec<u8>,
    align: usize,
}

impl Batch {
    pub(crate) fn new(align: u32) -> Self {
        Self {
            commands: Vec::new(),
            params: Vec::new(),
            align: align.max(16) as usize,
        }
    }

    /// Records one launch of the kernel `A` describes over `grid` workgroups.
    pub fn run<A: KernelArgs>(
        &mut self,
        gpu: &mut Gpu,
        args: &A,
        grid: [u32; 3],
    ) -> Result<(), GpuError> {
        let k = A::SOURCE;
        let max = gpu.limits.max_compute_workgroups_per_dimension;
        if grid.iter().any(|&w| w == 0 || w > max) {
            return Err(GpuError::Kernel {
                kernel: k.name,
                why: format!("grid {grid:?} outside 1..={max} per dimension"),
            });
        }
        let pipeline = gpu.pipeline(&k)?;
        let fields = args.params();
        let params = (!fields.is_empty()).then(|| {
            let start = self.params.len().next_multiple_of(self.align);
            self.params.resize(start, 0);
            self.params.extend(fields.concat());
            let end = self.params.len().next_multiple_of(16);
            self.params.resize(end, 0);
            start as u64..end as u64
        });
        self.commands.push(Command::Dispatch {
            pipeline,
            buffers: args.buffers().into_iter().cloned().collect(),
            params,
            grid,
        });
        Ok(())
    }

    /// Records a copy of `len` elements from `src[src_at..]` to `dst[dst_at..]`.
    pub fn copy<T: bytemuck::Pod>(
        &mut self,
        src: &GpuBuffer<T>,
        src_at: usize,
        dst: &mut GpuBuffer<T>,
        dst_at: usize,
        len: usize,
    ) -> Result<(), GpuError> {
        if src_at + len > src.len() || dst_at + len > dst.len() {
            return Err(GpuError::Copy(format!(
                "{len} elements from {src_at} of {} to {dst_at} of {}",
                src.len(),
                dst.len()
            )));
        }
        let size = std::mem::size_of::<T>() as u64;
        if len > 0 {
            self.commands.push(Command::Copy {
                src: src.raw().clone(),
                src_offset: src_at as u64 * size,
                dst: dst.raw().clone(),
                dst_offset: dst_at as u64 * size,
                size: len as u64 * size,
            });
        }
        Ok(())
    }

    /// Records a copy of `size` bytes from the front of `src` into `staging` (for read-back).
    pub(crate) fn read_into(&mut self, src: &wgpu::Buffer, staging: &wgpu::Buffer, size: u64) {
        if size > 0 {
            self.commands.push(Command::Copy {
                src: src.clone(),
                src_offset: 0,
                dst: staging.clone(),
                dst_offset: 0,
                size,
            });
        }
    }

    /// Dispatches recorded so far.
    pub fn dispatches(&self) -> usize {
        self.commands
            .iter()
            .filter(|c| matches!(c, Command::Dispatch { .. }))
            .count()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// Encodes everything into one command buffer.
    pub(crate) fn encode(self, device: &wgpu::Device) -> wgpu::CommandBuffer {
        use wgpu::util::DeviceExt;
        let params = (!self.params.is_empty()).then(|| {
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("hesper params"),
                contents: &self.params,
                usage: wgpu::BufferUsages::UNIFORM,
            })
        });
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("hesper batch"),
        });
        let mut commands = self.commands.into_iter().peekable();
        while let Some(first) = commands.peek() {
            if let Command::Copy { .. } = first {
                let Some(Command::Copy {
                    src,
                    src_offset,
                    dst,
                    dst_offset,
                    size,
                }) = commands.next()
                else {
                    unreachable!("peeked a copy");
                };
                encoder.copy_buffer_to_buffer(&src, src_offset, &dst, dst_offset, size);
                continue;
            }
            // A run of dispatches shares one compute pass; WebGPU orders their storage
            // accesses, so each sees the writes of those before it.
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("hesper pass"),
                timestamp_writes: None,
            });
            while let Some(Command::Dispatch { .. }) = commands.peek() {
                let Some(Command::Dispatch {
                    pipeline,
                    buffers,
                    params: range,
                    grid,
                }) = commands.next()
                else {
                    unreachable!("peeked a dispatch");
                };
                let mut entries: Vec<wgpu::BindGroupEntry> = buffers
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry {
                        binding: i as u32,
                        resource: b.as_entire_binding(),
                    })
                    .collect();
                if let (Some(range), Some(p)) = (range, params.as_ref()) {
                    entries.push(wgpu::BindGroupEntry {
                        binding: buffers.len() as u32,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: p,
                            offset: range.start,
                            size: std::num::NonZeroU64::new(range.end - range.start),
                        }),
                    });
                }
                let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(pipeline.source.name),
                    layout: &pipeline.layout,
                    entries: &entries,
                });
                pass.set_pipeline(&pipeline.pipeline);
                pass.set_bind_group(0, &bind_group, &[]);
                pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
            }
        }
        encoder.finish()
    }
}
