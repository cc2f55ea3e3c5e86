//! The device's memory bandwidth, measured by buffer-to-buffer copies: the roofline a
//! weight-streaming decode is held against.

use std::time::Instant;

use crate::context::{Gpu, GpuError};

/// Bytes of each of the two buffers copied back and forth (or the largest buffer the device
/// allows, if smaller): far above any GPU's last-level cache.
const COPY_BYTES: u64 = 512 << 20;

/// How long one timed submit of copies should last: long enough that the submit and the wait
/// are a small part of it.
const TARGET_SECONDS: f64 = 0.05;

/// Most copies recorded into one timed submit.
const MAX_COPIES: u32 = 256;

impl Gpu {
    /// The device's copy bandwidth in bytes per second, counting the bytes read and the bytes
    /// written (as CUDA's and llama.cpp's bandwidth tests do), the best of `rounds` timed
    /// submits of buffer-to-buffer copies, each submit waited for. Native only: a browser
    /// cannot wait for a submit.
    pub fn copy_bandwidth(&self, rounds: u32) -> Result<f64, GpuError> {
        let bytes = COPY_BYTES.min(self.max_binding()) / 4 * 4;
        let a = self.zeroed::<u32>("bandwidth a", (bytes / 4) as usize)?;
        let b = self.zeroed::<u32>("bandwidth b", (bytes / 4) as usize)?;
        let timed = |copies: u32| -> Result<f64, GpuError> {
            let mut encoder = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("bandwidth"),
                });
            for i in 0..copies {
                let (src, dst) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
                encoder.copy_buffer_to_buffer(src.raw(), 0, dst.raw(), 0, bytes);
            }
            let t0 = Instant::now();
            self.queue.submit([encoder.finish()]);
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| GpuError::Readback(e.to_string()))?;
            let seconds = t0.elapsed().as_secs_f64();
            self.check()?;
            Ok(seconds)
        };
        // The first submit also pays for the buffers' first touch. Then the copies per submit
        // double until a submit lasts TARGET_SECONDS, so that its fixed cost (the submit and
        // the wait, which on a fast GPU outlast a few copies) is a small part of it.
        timed(1)?;
        let mut copies = 2;
        while copies < MAX_COPIES && timed(copies)? < TARGET_SECONDS {
            copies *= 2;
        }
        let mut best = f64::INFINITY;
        for _ in 0..rounds.max(1) {
            best = best.min(timed(copies)?);
        }
        Ok(2.0 * bytes as f64 * f64::from(copies) / best)
    }
}
