//! MXFP4 rows (gpt-oss's experts): dotted with Q8_0-quantized activations, block by block,
//! their doubled E2M1 values looked up from a 16-entry table in vector registers; on x86,
//! sixteen rows at a time from their interleaved copy ([`crate::interleave_mxfp4`],
//! [`rows16_dot`]).

use hesper_engine::formats::Mxfp4;

use super::q8_0::Packed;
use super::{ActivationKind, CpuLayout};
use crate::interleave::ROWS;
#[cfg(target_arch = "x86_64")]
use crate::kernels::{avx2, interleaved_mxfp4};
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
}

/// Sixteen MXFP4 rows interleaved into one block (`block`, see [`crate::interleave_mxfp4`])
/// against the `T` tokens of `p` (packed as for Q8_0 rows): `out[t][l]` is row `l` · token `t`,
/// equal bit for bit to [`scalar::mxfp4_dot`] on the row.
#[inline]
pub fn rows16_dot<const T: usize>(isa: Isa, block: &[u8], p: &Packed) -> [[f32; ROWS]; T] {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: every x86 variant has AVX2 and FMA (`Isa::detect`; `CpuBackend::with_isa`
        // refuses the others); the kernel asserts the shapes before reading.
        crate::kernels::x86!() => unsafe {
            let (xq, d, _) = p.parts::<T>();
            interleaved_mxfp4::mxfp4_rows16_avx2::<T>(block, xq, d)
        },
        _ => {
            // The reference: each row taken back out of the block.
            let row_bytes = block.len() / ROWS;
            let acts: Vec<_> = (0..T).map(|t| p.token(t)).collect();
            let row = |l, row: &mut [u8]| crate::interleave_mxfp4::row(block, row_bytes, l, row);
            super::rows16_reference::<_, T>(row_bytes, &acts, row, |row, a| {
                scalar::mxfp4_dot(row, a)
            })
        }
    }
}
