//! Q6_K rows (LM heads, and the larger tensors of llama.cpp's `_M` mixes): dotted with Q8_K
//! activations, block by block.

use hesper_engine::formats::Q6K;

use super::{ActivationKind, CpuLayout};
#[cfg(target_arch = "x86_64")]
use crate::kernels::avx2;
use crate::kernels::{scalar, Isa};
use crate::quant::{quantize_q8_k, Q8KBlock};

impl CpuLayout for Q6K {
    type Act = Vec<Q8KBlock>;
    const ACT: ActivationKind = ActivationKind::Q8K;

    fn quantize(x: &[f32]) -> Vec<Q8KBlock> {
        quantize_q8_k(x)
    }

    #[inline]
    fn dot(self, isa: Isa, row: &[u8], act: &Vec<Q8KBlock>) -> f32 {
        by_isa!(isa,
            x86: avx2::q6_k_dot(row, act),
            neon: q6_k_dot(row, act),
            scalar: scalar::q6_k_dot(row, act),
        )
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn dot_x4(self, isa: Isa, row: &[u8], act: [&Vec<Q8KBlock>; 4]) -> Option<[f32; 4]> {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: every x86 variant has AVX2 and F16C (`Isa::detect`; `CpuBackend::with_isa`
            // refuses the others); the matrix driver passes whole rows of whole blocks, as many
            // as each token's activations have.
            crate::kernels::x86!() => {
                Some(unsafe { avx2::q6_k_dot_x4(row, act.map(Vec::as_slice)) })
            }
            _ => None,
        }
    }
}
