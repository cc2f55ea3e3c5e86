//! Q8_0 rows: dotted with Q8_0-quantized activations, block by block.

use hesper_engine::formats::Q8_0;

use super::{ActivationKind, CpuLayout};
#[cfg(target_arch = "x86_64")]
use crate::kernels::avx2;
use crate::kernels::{scalar, Isa};
use crate::quant::{quantize_q8_0, Q8_0Block};

impl CpuLayout for Q8_0 {
    type Act = Vec<Q8_0Block>;
    const ACT: ActivationKind = ActivationKind::Q8_0;

    fn quantize(x: &[f32]) -> Vec<Q8_0Block> {
        quantize_q8_0(x)
    }

    #[inline]
    fn dot(self, isa: Isa, row: &[u8], act: &Vec<Q8_0Block>) -> f32 {
        by_isa!(isa,
            x86: avx2::q8_0_dot(row, act),
            neon: q8_0_dot(row, act),
            scalar: scalar::q8_0_dot(row, act),
        )
    }

    /// x86 only: each block's weights serve four tokens. Elsewhere one token at a time.
    #[inline]
    // The kernels are x86 ones; elsewhere the arguments go unused.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn dot_x4(self, isa: Isa, row: &[u8], act: [&Vec<Q8_0Block>; 4]) -> Option<[f32; 4]> {
        let act = act.map(Vec::as_slice);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: see `dot`; `Avx512Vnni` has AVX-512 F/VL/VNNI besides AVX2, FMA, F16C.
            Isa::Avx512Vnni => Some(unsafe { avx2::q8_0_dot_x4_vnni(row, act) }),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above; `AvxVnni` has AVX-VNNI besides AVX2, FMA and F16C.
            Isa::AvxVnni => Some(unsafe { avx2::q8_0_dot_x4_avxvnni(row, act) }),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Isa::Avx2 | Isa::Avx512Bw => Some(unsafe { avx2::q8_0_dot_x4_avx2(row, act) }),
            _ => None,
        }
    }
}
