//! Many dispatches recorded into one command buffer.

use crate::context::{Gpu, GpuError};
use crate::kernel::KernelSource;

/// A command encoder collecting dispatches until [`Gpu::submit`].
pub struct Batch {
    encoder: wgpu::CommandEncoder,
    dispatches: u32,
}

impl Batch {
    pub(crate) fn new(device: &wgpu::Device) -> Self {
        Self {
            encoder: device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("hesper batch"),
            }),
            dispatches: 0,
        }
    }

    /// Records `k` over `workgroups` with `buffers` bound in binding order.
    pub fn dispatch(
        &mut self,
        gpu: &mut Gpu,
        k: &KernelSource,
        buffers: &[&wgpu::Buffer],
        workgroups: [u32; 3],
    ) -> Result<(), GpuError> {
        if buffers.len() != k.bindings.len() {
            return Err(GpuError::Kernel {
                kernel: k.name,
                why: format!(
                    "{} buffers given for {} bindings",
                    buffers.len(),
                    k.bindings.len()
                ),
            });
        }
        let max = gpu.limits.max_compute_workgroups_per_dimension;
        if workgroups.iter().any(|&w| w == 0 || w > max) {
            return Err(GpuError::Kernel {
                kernel: k.name,
                why: format!("grid {workgroups:?} outside 1..={max} per dimension"),
            });
        }
        let pipeline = gpu.pipeline(k)?;
        let entries: Vec<wgpu::BindGroupEntry> = k
            .bindings
            .iter()
            .zip(buffers)
            .map(|(&(binding, _, _), b)| wgpu::BindGroupEntry {
                binding,
                resource: b.as_entire_binding(),
            })
            .collect();
        let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(k.name),
            layout: &pipeline.layout,
            entries: &entries,
        });
        let mut pass = self
            .encoder
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(k.name),
                timestamp_writes: None,
            });
        pass.set_pipeline(&pipeline.pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        self.dispatches += 1;
        Ok(())
    }

    /// Dispatches recorded so far.
    pub fn dispatches(&self) -> u32 {
        self.dispatches
    }

    pub(crate) fn finish(self) -> wgpu::CommandBuffer {
        self.encoder.finish()
    }
}
