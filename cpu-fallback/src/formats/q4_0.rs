//! Q4_0 rows: dotted with Q8_0-quantized activations, block by block; where the instruction
//! set has a kernel for it, sixteen rows at a time from their interleaved copy
//! ([`crate::interleave_q4_0`], [`rows16_dot`]).

use hesper_engine::formats::Q4_0;

use super::q8_0::Packed;
use super::{ActivationKind, CpuLayout};
use crate::interleave::ROWS;
#[cfg(target_arch = "x86_64")]
use crate::kernels::{avx2, interleaved_q4_0};
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

    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn dot_x4(self, isa: Isa, row: &[u8], act: [&Vec<Q8_0Block>; 4]) -> Option<[f32; 4]> {
        x86_only!(isa, avx2::q4_0_dot_x4(row, act.map(Vec::as_slice)))
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn dot_rows4(self, isa: Isa, rows: &[u8], act: &Vec<Q8_0Block>) -> Option<[f32; 4]> {
        x86_only!(isa, avx2::q4_0_dot_rows4(rows, act))
    }
}

/// Sixteen Q4_0 rows interleaved into one block (`block`, see [`crate::interleave_q4_0`])
/// against the `T` tokens of `p` (packed as for Q8_0 rows): `out[t][l]` is row `l` · token `t`,
/// equal bit for bit to [`scalar::q4_0_dot`] on the row.
#[inline]
pub fn rows16_dot<const T: usize>(isa: Isa, block: &[u8], p: &Packed) -> [[f32; ROWS]; T] {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512Vnni` is chosen only when the CPU reports AVX-512 F, BW, VL and VNNI
        // (`Isa::detect`; `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the
        // shapes before reading.
        Isa::Avx512Vnni => unsafe {
            let (xq, d, bias) = p.parts::<T>();
            interleaved_q4_0::q4_0_rows16_vnni512::<T>(block, xq, d, bias)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: both variants are chosen only on CPUs with AVX2, FMA and F16C; the kernel
        // asserts the shapes before reading.
        Isa::Avx2 | Isa::AvxVnni => unsafe {
            let (xq, d, bias) = p.parts::<T>();
            interleaved_q4_0::q4_0_rows16_avx2::<T>(block, xq, d, bias)
        },
        _ => {
            // The reference: each row taken back out of the block.
            let row_bytes = block.len() / ROWS;
            let acts: Vec<_> = (0..T).map(|t| p.token(t)).collect();
            let row = |l, row: &mut [u8]| crate::interleave_q4_0::row(block, row_bytes, l, row);
            super::rows16_reference::<_, T>(row_bytes, &acts, row, |row, a| {
                scalar::q4_0_dot(row, a)
            })
        }
    }
}
