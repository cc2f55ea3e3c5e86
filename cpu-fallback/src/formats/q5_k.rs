//! Q5_K rows: dotted with Q8_K-quantized activations, block by block; where the instruction
//! set has a kernel for it, sixteen rows at a time from their interleaved copy
//! ([`crate::interleave_q4_k`], [`rows16_dot`]).

use hesper_engine::formats::{Layout, Q5K};

use super::q4_k::Packed;
use super::{ActivationKind, CpuLayout};
use crate::interleave::ROWS;
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

/// Sixteen Q5_K rows interleaved into one block (`block`, see [`crate::interleave_q4_k`])
/// against the `T` tokens of `p` (packed as for Q4_K rows): `out[t][l]` is row `l` · token `t`,
/// equal bit for bit to [`scalar::q5_k_dot`] on the row.
#[inline]
pub fn rows16_dot<const T: usize>(isa: Isa, block: &[u8], p: &Packed) -> [[f32; ROWS]; T] {
    super::q4_k::k_rows16_dot::<true, T>(isa, block, p, Q5K::row_bytes, scalar::q5_k_dot)
}
