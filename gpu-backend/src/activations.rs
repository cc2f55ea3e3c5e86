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
    /// Where the blocks' scales lie in the codes' buffer (the word past the codes: `packed.0`
    /// for Q8_0 blocks, `q` for Q8_K) when one kernel wrote both there (a decoded token's
    /// attention, `rope_attention`), instead of in `act_scale`; every reservation for a
    /// quantizer clears it.
    pub(crate) scales_in_codes: Option<u32>,
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
            scales_in_codes: None,
        })
    }

    /// Makes the scratch hold at least `q` codes and `scales` scales, for a quantizer that
    /// writes its scales apart.
    pub(crate) fn reserve(&mut self, gpu: &Gpu, q: usize, scales: usize) -> Result<(), GpuError> {
        self.scales_in_codes = None;
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

    /// Makes `packed.0` hold `n` rows of `cols` Q8_0 codes four to a word and, past them, the
    /// blocks' scales (`cols` a multiple of 32), and says the scales lie there.
    pub(crate) fn reserve_q8_0_with_scales(
        &mut self,
        gpu: &Gpu,
        n: usize,
        cols: usize,
    ) -> Result<(), GpuError> {
        let codes = n * cols / 4;
        let words = codes + n * cols / 32;
        if self.packed.0.len() < words {
            self.packed.0 = gpu.zeroed("packed activations", words.next_power_of_two())?;
        }
        self.scales_in_codes = Some(codes as u32);
        Ok(())
    }

    /// Makes `q` hold `n` rows of `cols` Q8_K codes and, past them, the blocks' scales (`cols`
    /// a multiple of 256), and says the scales lie there.
    pub(crate) fn reserve_q8k_with_scales(
        &mut self,
        gpu: &Gpu,
        n: usize,
        cols: usize,
    ) -> Result<(), GpuError> {
        let codes = n * cols;
        let words = codes + n * cols / 256;
        if self.q.len() < words {
            self.q = gpu.zeroed("activation codes", words.next_power_of_two())?;
        }
        self.scales_in_codes = Some(codes as u32);
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
