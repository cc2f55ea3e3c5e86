//! The scratch a product quantizes its input into (or a fused RMSNorm quantizes for it): int8
//! codes, the same packed four to a word with each row's `Σq`, scales, and halves two to a
//! word. The backend holds one for its products and, between the layers that share an input,
//! a second (`shared_input.rs`), swapped in whole.

use hesper_gpu::{Gpu, GpuBuffer, GpuError};

/// One activation scratch; each buffer grows to the largest step it served.
pub(crate) struct Activations {
    /// Quantized activations of the matrix being multiplied.
    pub(crate) q: GpuBuffer<i32>,
    /// The same, packed four int8 to a word (packed I2_S and every Q8_0 product, for
    /// `dot4I8Packed`), and `Σq` per token (I2_S).
    pub(crate) packed: (GpuBuffer<u32>, GpuBuffer<i32>),
    /// Their scales (per token or per block).
    pub(crate) act_scale: GpuBuffer<f32>,
    /// The activations of an F16 product as halves, two to a word (`pack_f16`).
    pub(crate) halves: GpuBuffer<u32>,
}

impl Activations {
    /// Empty buffers (`what` begins their labels); the products' reservations grow them.
    pub(crate) fn new(gpu: &Gpu, what: &str) -> Result<Self, GpuError> {
        Ok(Self {
            q: gpu.zeroed(&format!("{what} codes"), 1)?,
            packed: (
                gpu.zeroed(&format!("{what} packed codes"), 1)?,
                gpu.zeroed(&format!("{what} sums"), 1)?,
            ),
            act_scale: gpu.zeroed(&format!("{what} scales"), 1)?,
            halves: gpu.zeroed(&format!("{what} halves"), 1)?,
        })
    }

    /// Makes the scratch hold at least `q` codes and `scales` scales.
    pub(crate) fn reserve(&mut self, gpu: &Gpu, q: usize, scales: usize) -> Result<(), GpuError> {
        if self.q.len() < q {
            self.q = gpu.zeroed("activation codes", q.next_power_of_two())?;
            self.packed.0 = gpu.zeroed("packed activations", q.div_ceil(4).next_power_of_two())?;
        }
        if self.packed.1.len() < scales {
            self.packed.1 = gpu.zeroed("activation sums", scales.next_power_of_two())?;
        }
        if self.act_scale.len() < scales {
            self.act_scale = gpu.zeroed("activation scales", scales.next_power_of_two())?;
        }
        Ok(())
    }

    /// Makes the halves hold at least `words` words.
    pub(crate) fn reserve_halves(&mut self, gpu: &Gpu, words: usize) -> Result<(), GpuError> {
        if self.halves.len() < words {
            self.halves = gpu.zeroed("f16 activations", words.next_power_of_two())?;
        }
        Ok(())
    }
}
