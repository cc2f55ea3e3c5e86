//! Q5_K rows: dotted with Q8_K-quantized activations, block by block.

use hesper_engine::formats::Q5K;

use super::{ActivationKind, CpuLayout};
#[cfg(target_arch = "x86_64")]
use crate::kernels::avx2;
use crate::kernels::{scalar, Isa};
use crate::quant::{quantize_q8_k, Q8KBlock};

impl CpuLayout for Q5K {
    type Act = Vec<Q8KBlock>;
    const ACT: ActivationKind = ActivationKind::Q8K;

    fn quantize(x: &[f32]) -> Vec<Q8KBlock> {
        quantize_q8_k(x)
    }

    #[inline]
    fn dot(self, isa: Isa, row: &[u8], act: &Vec<Q8KBlock>) -> f32 {
        by_isa!(isa,
            x86: avx2::q5_k_dot(row, act),
            neon: q5_k_dot(row, act),
            scalar: scalar::q5_k_dot(row, act),
        )
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn dot_x4(self, isa: Isa, row: &[u8], act: [&Vec<Q8KBlock>; 4]) -> Option<[f32; 4]> {
        x86_only!(isa, avx2::q5_k_dot_x4(row, act.map(Vec::as_slice)))
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn dot_rows4(self, isa: Isa, rows: &[u8], act: &Vec<Q8KBlock>) -> Option<[f32; 4]> {
        x86_only!(isa, avx2::q5_k_dot_rows4(rows, act))
    }
}
