//! MXFP4 rows (gpt-oss's experts): dotted with Q8_0-quantized activations, block by block,
//! their doubled E2M1 values looked up from a 16-entry table in vector registers.

use hesper_engine::formats::Mxfp4;

use super::{ActivationKind, CpuLayout};
#[cfg(target_arch = "x86_64")]
use crate::kernels::avx2;
use crate::kernels::{scalar, Isa};
use crate::quant::{quantize_q8_0, Q8_0Block};

impl CpuLayout for Mxfp4 {
    type Act = Vec<Q8_0Block>;
    const ACT: ActivationKind = ActivationKind::Q8_0;

    fn quantize(x: &[f32]) -> Vec<Q8_0Block> {
        quantize_q8_0(x)
    }

    #[inline]
    fn dot(self, isa: Isa, row: &[u8], act: &Vec<Q8_0Block>) -> f32 {
        by_isa!(isa,
            x86: avx2::mxfp4_dot(row, act),
            neon: mxfp4_dot(row, act),
            scalar: scalar::mxfp4_dot(row, act),
        )
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn dot_x4(self, isa: Isa, row: &[u8], act: [&Vec<Q8_0Block>; 4]) -> Option<[f32; 4]> {
        x86_only!(isa, avx2::mxfp4_dot_x4(row, act.map(Vec::as_slice)))
    }
}
