//! Many dispatches and copies recorded into one command buffer, submitted once.

use std::ops::Range;
use std::sync::Arc;

use crate::buffer::GpuBuffer;
use crate::context::{Gpu, GpuError};
use crate::kernel::KernelArgs;
use crate::pipeline::Pipeline;

/// One recorded command.
pub(crate) enum Command {
    Dispatch {
        pipeline: Arc<Pipeline>,
        buffers: Vec<crate::Bound>,
        /// Byte range of this dispatch's uniforms inside the batch's parameter block.
        params: Option<Range<u64>>,
        grid: Grid,
        /// Bytes of memory the launch reads and writes, as its recorder counted them (0:
        /// not counted); the profile divides them by the launch's time.
        traffic: u64,
    },
    Copy {
        src: wgpu::Buffer,
        src_offset: u64,
        dst: wgpu::Buffer,
        dst_offset: u64,
        size: u64,
    },
}

/// How many workgroups a recorded dispatch launches.
pub(crate) enum Grid {
    /// As many as the recorder said.
    Direct([u32; 3]),
    /// As many as the three words at `offset` bytes into `args` say when it runs.
    Indirect { args: wgpu::Buffer, offset: u64 },
}

/// An open gate ([`Batch::open_gate`]): the slots of its indirect grids and the grids its
/// launches were recorded with.
struct Gate {
    args: wgpu::Buffer,
    first: usize,
    slots: usize,
    grids: Vec<[u32; 3]>,
}

/// Commands collected until [`Gpu::submit`]. Every dispatch's uniforms go into one parameter
/// block (each at an aligned offset), written to the device's persistent uniform buffer at
/// submit and selected per dispatch by a dynamic offset.
pub struct Batch {
    commands: Vec<Command>,
    dispatches: usize,
    params: Vec<u8>,
    align: usize,
    gate: Option<Gate>,
}

impl Batch {
    pub(crate) fn new(align: u32) -> Self {
        Self {
            commands: Vec::new(),
            dispatches: 0,
            params: Vec::new(),
            align: align.max(16) as usize,
            gate: None,
        }
    }

    /// Records one launch of the kernel `A` describes over `grid` workgroups.
    pub fn run<A: KernelArgs>(
        &mut self,
        gpu: &mut Gpu,
        args: &A,
        grid: [u32; 3],
    ) -> Result<(), GpuError> {
        self.run_moving(gpu, args, grid, 0)
    }

    /// [`Batch::run`] of a launch that reads and writes `traffic` bytes of memory, for the
    /// bandwidth each kernel reaches in a profile ([`crate::KernelTime::bytes`]).
    pub fn run_moving<A: KernelArgs>(
        &mut self,
        gpu: &mut Gpu,
        args: &A,
        grid: [u32; 3],
        traffic: u64,
    ) -> Result<(), GpuError> {
        let k = A::SOURCE;
        let missing = k.device_features() - gpu.device.features();
        if !missing.is_empty() {
            return Err(GpuError::Kernel {
                kernel: k.name,
                why: format!("the device lacks {missing:?}"),
            });
        }
        let max = gpu.limits.max_compute_workgroups_per_dimension;
        if grid.iter().any(|&w| w == 0 || w > max) {
            return Err(GpuError::Kernel {
                kernel: k.name,
                why: format!("grid {grid:?} outside 1..={max} per dimension"),
            });
        }
        let pipeline = gpu.pipeline(&k, &args.constants())?;
        let fields = args.params();
        let params = (!fields.is_empty()).then(|| {
            let start = self.params.len().next_multiple_of(self.align);
            self.params.resize(start, 0);
            self.params.extend(fields.concat());
            let end = self.params.len().next_multiple_of(16);
            self.params.resize(end, 0);
            start as u64..end as u64
        });
        let grid = match &mut self.gate {
            None => Grid::Direct(grid),
            Some(gate) if gate.grids.len() == gate.slots => {
                return Err(GpuError::Kernel {
                    kernel: k.name,
                    why: format!("a gate holds {} launches", gate.slots),
                })
            }
            Some(gate) => {
                let slot = (gate.first + gate.grids.len()) as u64;
                gate.grids.push(grid);
                Grid::Indirect {
                    args: gate.args.clone(),
                    offset: slot * 12,
                }
            }
        };
        self.dispatches += 1;
        self.commands.push(Command::Dispatch {
            pipeline,
            buffers: args.buffers(),
            params,
            grid,
            traffic,
        });
        Ok(())
    }

    /// Until [`Batch::close_gate`], each launch recorded takes its grid from the next of the
    /// `slots` three-word slots of `args` from slot `first` on (an indirect dispatch), so
    /// that a kernel run earlier in the same submit decides whether they run: it writes each
    /// slot the grid the launch was recorded with (returned by [`Batch::close_gate`]) or
    /// zeros. Recording more launches than `slots` is an error; so is a copy, which no grid
    /// gates. `args` needs [`Gpu::indirect_args`]' usage.
    pub fn open_gate(
        &mut self,
        args: &GpuBuffer<u32>,
        first: usize,
        slots: usize,
    ) -> Result<(), GpuError> {
        if (first + slots) * 3 > args.len() || self.gate.is_some() {
            return Err(GpuError::Copy(format!(
                "a gate of slots {first}..{} in {} words (or inside another gate)",
                first + slots,
                args.len()
            )));
        }
        self.gate = Some(Gate {
            args: args.raw().clone(),
            first,
            slots,
            grids: Vec::new(),
        });
        Ok(())
    }

    /// Closes the open gate; returns the grids its launches were recorded with, in order.
    pub fn close_gate(&mut self) -> Vec<[u32; 3]> {
        self.gate.take().map(|g| g.grids).unwrap_or_default()
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
        if self.gate.is_some() {
            return Err(GpuError::Copy(
                "a copy inside a gate (no grid gates it)".into(),
            ));
        }
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
                src_offset: src.offset() + src_at as u64 * size,
                dst: dst.raw().clone(),
                dst_offset: dst.offset() + dst_at as u64 * size,
                size: len as u64 * size,
            });
        }
        Ok(())
    }

    /// Records a copy of `size` bytes from the front of `src` into `staging` (for read-back).
    pub(crate) fn read_into<T: bytemuck::Pod>(
        &mut self,
        src: &GpuBuffer<T>,
        staging: &wgpu::Buffer,
        size: u64,
    ) {
        if size > 0 {
            self.commands.push(Command::Copy {
                src: src.raw().clone(),
                src_offset: src.offset(),
                dst: staging.clone(),
                dst_offset: 0,
                size,
            });
        }
    }

    /// Dispatches recorded so far.
    pub fn dispatches(&self) -> usize {
        self.dispatches
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// The recorded commands and the parameter block they index.
    pub(crate) fn into_parts(self) -> (Vec<Command>, Vec<u8>) {
        (self.commands, self.params)
    }
}
