//! Turning a [`Batch`] into one command buffer, with bind groups reused across batches.

use std::collections::HashMap;

use crate::batch::{Batch, Command, Grid};
use crate::pipeline::Pipeline;
use crate::profile::{Profiler, MAX_TIMED};

/// What a bind group binds: a pipeline's layout, its storage buffers and the uniform slice.
#[derive(Hash, PartialEq, Eq)]
struct BindKey {
    pipeline: [u8; 32],
    buffers: Vec<crate::Bound>,
    params: Option<(wgpu::Buffer, u64)>,
}

struct Entry {
    group: wgpu::BindGroup,
    last_used: u64,
}

/// Bind groups by what they bind. Decoding token after token binds the same buffers in the
/// same order, so after the first token every bind group comes from here; groups unused by
/// the last two whole submits (a step's, however many parts it was submitted in, or a batch
/// at load) are dropped, so the buffers they hold — a finished session's, or weights a load
/// replaced — are freed.
#[derive(Default)]
pub(crate) struct BindGroups {
    groups: HashMap<BindKey, Entry>,
    /// Bind groups created so far.
    pub created: u64,
}

/// The device's persistent uniform buffer, grown on demand.
#[derive(Default)]
pub(crate) struct ParamBuffer {
    buffer: Option<wgpu::Buffer>,
}

impl ParamBuffer {
    /// Writes `block` (queue-ordered after earlier submits) and returns the buffer holding it.
    fn write(
        &mut self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        block: &[u8],
    ) -> Option<wgpu::Buffer> {
        if block.is_empty() {
            return None;
        }
        let fits = self
            .buffer
            .as_ref()
            .is_some_and(|b| b.size() >= block.len() as u64);
        if !fits {
            self.buffer = Some(device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("hesper params"),
                size: (block.len() as u64).next_power_of_two().max(4096),
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        let buffer = self.buffer.clone()?;
        queue.write_buffer(&buffer, 0, block);
        Some(buffer)
    }
}

impl BindGroups {
    /// Bind groups held now (each keeps the buffers it binds alive).
    pub fn held(&self) -> usize {
        self.groups.len()
    }

    fn get(
        &mut self,
        device: &wgpu::Device,
        pipeline: &Pipeline,
        buffers: Vec<crate::Bound>,
        params: Option<(wgpu::Buffer, u64)>,
        now: u64,
    ) -> wgpu::BindGroup {
        let key = BindKey {
            pipeline: pipeline.key,
            buffers,
            params,
        };
        if let Some(e) = self.groups.get_mut(&key) {
            e.last_used = now;
            return e.group.clone();
        }
        let mut entries: Vec<wgpu::BindGroupEntry> = key
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &b.buffer,
                    offset: b.offset,
                    size: b.size.and_then(std::num::NonZeroU64::new),
                }),
            })
            .collect();
        if let Some((p, size)) = &key.params {
            entries.push(wgpu::BindGroupEntry {
                binding: key.buffers.len() as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: p,
                    offset: 0,
                    size: std::num::NonZeroU64::new(*size),
                }),
            });
        }
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(pipeline.source.name),
            layout: &pipeline.layout,
            entries: &entries,
        });
        self.created += 1;
        self.groups.insert(
            key,
            Entry {
                group: group.clone(),
                last_used: now,
            },
        );
        group
    }

    /// Drops the groups not used by the last two whole submits.
    fn evict(&mut self, now: u64) {
        self.groups.retain(|_, e| e.last_used + 2 > now);
    }
}

/// Encodes `batch` (part of whole submit number `now`) into one command buffer: its
/// uniforms written to the persistent buffer, runs of dispatches in one compute pass, copies
/// between them. With a profiler every dispatch gets its own timed pass; the names and traffic
/// of the timed kernels are returned in order.
pub(crate) fn encode(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    groups: &mut BindGroups,
    params: &mut ParamBuffer,
    profiler: Option<&Profiler>,
    batch: Batch,
    now: u64,
) -> (wgpu::CommandBuffer, Vec<(&'static str, u64)>) {
    let mut timed = Vec::new();
    let (commands, block) = batch.into_parts();
    let param_buffer = params.write(device, queue, &block);
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("hesper batch"),
    });
    let mut commands = commands.into_iter().peekable();
    while let Some(first) = commands.next() {
        let first = match first {
            Command::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                size,
            } => {
                encoder.copy_buffer_to_buffer(&src, src_offset, &dst, dst_offset, size);
                continue;
            }
            dispatch => dispatch,
        };
        // A run of dispatches shares one compute pass; WebGPU orders their storage accesses,
        // so each sees the writes of those before it.
        let timestamps = profiler
            .filter(|_| timed.len() < MAX_TIMED as usize)
            .map(|p| p.writes(timed.len() as u32));
        if timestamps.is_some() {
            if let Command::Dispatch {
                pipeline, traffic, ..
            } = &first
            {
                timed.push((pipeline.source.name, *traffic));
            }
        }
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("hesper pass"),
            timestamp_writes: timestamps,
        });
        let mut next = Some(first);
        while let Some(Command::Dispatch {
            pipeline,
            buffers,
            params: range,
            grid,
            ..
        }) = next
        {
            let uniform = range
                .as_ref()
                .and_then(|r| param_buffer.clone().map(|b| (b, r.end - r.start)));
            let group = groups.get(device, &pipeline, buffers, uniform, now);
            let offsets: Vec<u32> = range.iter().map(|r| r.start as u32).collect();
            pass.set_pipeline(&pipeline.pipeline);
            pass.set_bind_group(0, &group, &offsets);
            match grid {
                Grid::Direct([x, y, z]) => pass.dispatch_workgroups(x, y, z),
                Grid::Indirect { args, offset } => pass.dispatch_workgroups_indirect(&args, offset),
            }
            // Profiling times each dispatch in a pass of its own.
            next = match commands.peek() {
                Some(Command::Dispatch { .. }) if profiler.is_none() => commands.next(),
                _ => None,
            };
        }
    }
    if let Some(p) = profiler {
        p.resolve(&mut encoder, timed.len() as u32);
    }
    groups.evict(now);
    (encoder.finish(), timed)
}
