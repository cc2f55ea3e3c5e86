//! GPU time per kernel from timestamp queries (where the adapter has `TIMESTAMP_QUERY`).

use std::collections::HashMap;

/// Accumulated GPU time of one kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTime {
    /// Kernel name.
    pub name: &'static str,
    /// Launches timed.
    pub calls: u64,
    /// GPU nanoseconds, summed over the launches.
    pub ns: f64,
    /// Bytes the launches read and wrote, as their recorders counted them (0 where a launch
    /// was recorded without a count: `Batch::run` rather than `Batch::run_moving`).
    pub bytes: u64,
}

/// Timestamp queries around every dispatch of a profiled batch (each dispatch then gets its
/// own compute pass, which costs a little; profiling is for benchmarks).
pub(crate) struct Profiler {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    staging: wgpu::Buffer,
    /// Nanoseconds per timestamp tick.
    period: f64,
    totals: HashMap<&'static str, (u64, f64, u64)>,
}

/// Dispatches timed per batch (two queries each; wgpu allows 4096 queries in a set).
pub(crate) const MAX_TIMED: u32 = 2048;

impl Profiler {
    pub(crate) fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Self {
        let bytes = u64::from(MAX_TIMED) * 16;
        Self {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("hesper timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: MAX_TIMED * 2,
            }),
            resolve: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("timestamps"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            staging: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("timestamps readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            period: f64::from(queue.get_timestamp_period()),
            totals: HashMap::new(),
        }
    }

    /// The timestamp writes of the `i`-th timed dispatch of a batch.
    pub(crate) fn writes(&self, i: u32) -> wgpu::ComputePassTimestampWrites<'_> {
        wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(2 * i),
            end_of_pass_write_index: Some(2 * i + 1),
        }
    }

    /// Records the copy of `timed` dispatches' timestamps to the read-back buffer.
    pub(crate) fn resolve(&self, encoder: &mut wgpu::CommandEncoder, timed: u32) {
        if timed > 0 {
            encoder.resolve_query_set(&self.queries, 0..2 * timed, &self.resolve, 0);
            encoder.copy_buffer_to_buffer(
                &self.resolve,
                0,
                &self.staging,
                0,
                u64::from(timed) * 16,
            );
        }
    }

    /// Waits for the submitted batch and adds its timings (and traffic) to the totals.
    pub(crate) fn collect(
        &mut self,
        device: &wgpu::Device,
        names: &[(&'static str, u64)],
    ) -> Result<(), String> {
        if names.is_empty() {
            return Ok(());
        }
        let size = names.len() as u64 * 16;
        let slice = self.staging.slice(..size);
        crate::context::map_and_wait(device, &slice)?;
        {
            let view = slice.get_mapped_range().map_err(|e| e.to_string())?;
            let ticks: &[u64] = bytemuck::cast_slice(&view);
            for ((name, traffic), pair) in names.iter().zip(ticks.chunks_exact(2)) {
                let entry = self.totals.entry(name).or_insert((0, 0.0, 0));
                entry.0 += 1;
                entry.1 += pair[1].saturating_sub(pair[0]) as f64 * self.period;
                entry.2 += traffic;
            }
        }
        self.staging.unmap();
        Ok(())
    }

    /// The totals so far, slowest kernel first; clears them.
    pub(crate) fn take(&mut self) -> Vec<KernelTime> {
        let mut out: Vec<KernelTime> = self
            .totals
            .drain()
            .map(|(name, (calls, ns, bytes))| KernelTime {
                name,
                calls,
                ns,
                bytes,
            })
            .collect();
        out.sort_by(|a, b| b.ns.total_cmp(&a.ns));
        out
    }
}
