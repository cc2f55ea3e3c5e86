//! Q4_0 rows: dotted with Q8_0-quantized activations, block by block.

use hesper_engine::formats::Q4_0;

use super::{ActivationKind, CpuLayout};
#[cfg(target_arch = "x86_64")]
use crate::kernels::avx2;
use crate::kernels::{scalar, Isa};
use crate::quant::{quantize_q8_0, Q8_0Block};

impl CpuLayout for Q4_0 {
    type Act = Vec<Q8_0Block>;
    const ACT: ActivationKind = ActivationKind::Q8_0;

    fn quantize(x: &[f32]) -> Vec<Q8_0Block> {
        quantize_q8_0(x)
    }

    #[inline]
    fn dot(self, isa: Isa, row: &[u8], act: &Vec<Q8_0Block>) -> f32 {
        by_isa!(isa,
            x86: avx2::q4_0_dot(row, act),
            neon: q4_0_dot(row, act),
            scalar: scalar::q4_0_dot(row, act),
        )
    }
}
