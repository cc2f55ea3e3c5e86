//! Q6_K rows (LM heads, and the larger tensors of llama.cpp's `_M` mixes): dotted with Q8_K
//! activations, block by block; where the instruction set has a kernel for it, sixteen rows at
//! a time from their interleaved copy ([`crate::interleave_q6_k`], [`rows16_dot`]).

use hesper_engine::formats::Q6K;

use super::q4_k::Packed;
use super::{ActivationKind, CpuLayout};
use crate::interleave::ROWS;
#[cfg(target_arch = "x86_64")]
use crate::kernels::{avx2, interleaved_q6_k};
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
        x86_only!(isa, avx2::q6_k_dot_x4(row, act.map(Vec::as_slice)))
    }
}

/// Sixteen Q6_K rows interleaved into one block (`block`, see [`crate::interleave_q6_k`])
/// against the `T` tokens of `p` (packed as for Q4_K rows): `out[t][l]` is row `l` · token `t`,
/// equal bit for bit to [`scalar::q6_k_dot`] on the row.
#[inline]
pub fn rows16_dot<const T: usize>(isa: Isa, block: &[u8], p: &Packed) -> [[f32; ROWS]; T] {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512Vnni` is chosen only when the CPU reports AVX-512 F, BW, VL and VNNI
        // (`Isa::detect`; `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the
        // shapes before reading.
        Isa::Avx512Vnni => unsafe {
            let (xq, bsum, d) = p.parts::<T>();
            interleaved_q6_k::q6_k_rows16_vnni512::<T>(block, xq, bsum, d)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2` is chosen only on CPUs with AVX2, FMA and F16C; the kernel asserts
        // the shapes before reading.
        Isa::Avx2 => unsafe {
            let (xq, bsum, d) = p.parts::<T>();
            interleaved_q6_k::q6_k_rows16_avx2::<T>(block, xq, bsum, d)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `AvxVnni` is chosen only when the CPU reports AVX2, FMA, F16C and AVX-VNNI;
        // the kernel asserts the shapes before reading.
        Isa::AvxVnni => unsafe {
            let (xq, bsum, d) = p.parts::<T>();
            interleaved_q6_k::q6_k_rows16_avxvnni::<T>(block, xq, bsum, d)
        },
        _ => {
            // The reference: each row taken back out of the block.
            let row_bytes = block.len() / ROWS;
            let acts: Vec<_> = (0..T).map(|t| p.token(t)).collect();
            let row = |l, row: &mut [u8]| crate::interleave_q6_k::row(block, row_bytes, l, row);
            super::rows16_reference::<_, T>(row_bytes, &acts, row, |row, a| {
                scalar::q6_k_dot(row, a)
            })
        }
    }
}
