//! F32, F16 and BF16 rows: dotted with f32 activations rounded as the weights are (ggml's
//! rule), so the CPU computes what llama.cpp computes. Where the instruction set has a kernel
//! for it, F16 rows are also dotted sixteen at a time from their interleaved copy
//! ([`crate::interleave_f16`], [`f16_rows16_dot`]).

use hesper_engine::formats::{Bf16, F16, F32};

use super::{ActivationKind, CpuLayout};
use crate::interleave::ROWS;
#[cfg(target_arch = "aarch64")]
use crate::kernels::neon;
#[cfg(target_arch = "x86_64")]
use crate::kernels::{avx2, interleaved_f16, x86};
use crate::kernels::{scalar, Isa};
use crate::quant::{round_bf16, round_f16};

impl CpuLayout for F32 {
    type Act = Vec<f32>;
    const ACT: ActivationKind = ActivationKind::F32;

    fn quantize(x: &[f32]) -> Vec<f32> {
        x.to_vec()
    }

    #[inline]
    fn dot(self, isa: Isa, row: &[u8], x: &Vec<f32>) -> f32 {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: every x86 variant has AVX2 and FMA; the row holds x.len() floats.
            x86!() => unsafe { avx2::f32_dot(row, x) },
            #[cfg(target_arch = "aarch64")]
            Isa::Neon | Isa::NeonDot => neon::f32_dot(row, x),
            _ => scalar::f32_dot(row, x),
        }
    }
}

impl CpuLayout for F16 {
    type Act = Vec<f32>;
    const ACT: ActivationKind = ActivationKind::F16;

    fn quantize(x: &[f32]) -> Vec<f32> {
        round_f16(x)
    }

    #[inline]
    fn dot(self, isa: Isa, row: &[u8], x: &Vec<f32>) -> f32 {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: every x86 variant has AVX2, FMA and F16C; the row holds x.len() halves.
            x86!() => unsafe { avx2::f16_dot(row, x) },
            #[cfg(target_arch = "aarch64")]
            Isa::Neon | Isa::NeonDot => neon::f16_dot(row, x),
            _ => scalar::f16_dot(row, x),
        }
    }

    // The tiles below are x86 ones, each summing a row and token as `dot` does; elsewhere
    // one row and token at a time, and the arguments go unused.

    /// Each run of halves converted once for four tokens.
    #[inline]
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn dot_x4(self, isa: Isa, row: &[u8], x: [&Vec<f32>; 4]) -> Option<[f32; 4]> {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as for `dot`; the row holds x[t].len() halves for every t.
            x86!() => Some(unsafe { avx2::f16_dot_x4(row, x.map(Vec::as_slice)) }[0]),
            _ => None,
        }
    }

    /// Four rows against one token (decode): four accumulator chains instead of one.
    #[inline]
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn dot_rows4(self, isa: Isa, rows: &[u8], x: &Vec<f32>) -> Option<[f32; 4]> {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as for `dot`; `rows` holds four rows of x.len() halves.
            x86!() => Some(unsafe { avx2::f16_dot_rows4(rows, [x]) }.map(|[v]| v)),
            _ => None,
        }
    }

    /// A tile of four rows and four tokens in registers (two tiles of two rows with AVX2's
    /// sixteen registers).
    #[inline]
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn dot_rows4_x4(self, isa: Isa, rows: &[u8], x: [&Vec<f32>; 4]) -> Option<[[f32; 4]; 4]> {
        let x = x.map(Vec::as_slice);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as for `dot`; the AVX-512 variants have AVX-512 F and VL; `rows` holds
            // four rows of x[t].len() halves.
            Isa::Avx512Bw | Isa::Avx512Vnni => {
                Some(unsafe { avx2::f16_dot_rows4_x4_avx512(rows, x) })
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::AvxVnni => {
                let (front, back) = rows.split_at(rows.len() / 2);
                // SAFETY: as above; each half holds two rows.
                let [a, b] = unsafe { avx2::f16_dot_rows2_x4(front, x) };
                // SAFETY: as above.
                let [c, d] = unsafe { avx2::f16_dot_rows2_x4(back, x) };
                Some([a, b, c, d])
            }
            _ => None,
        }
    }
}

impl CpuLayout for Bf16 {
    type Act = Vec<f32>;
    const ACT: ActivationKind = ActivationKind::BF16;

    fn quantize(x: &[f32]) -> Vec<f32> {
        round_bf16(x)
    }

    fn dot(self, _isa: Isa, row: &[u8], x: &Vec<f32>) -> f32 {
        scalar::bf16_dot(row, x)
    }
}

/// `T` tokens' f16-rounded activations packed column by column for [`f16_rows16_dot`]
/// (`out[k·T + t]` is token `t`'s column `k`), so that its kernel reads them through one
/// pointer. One token's activations are already packed.
pub fn pack_f16(x: &[&[f32]]) -> Vec<f32> {
    let cols = x.first().map_or(0, |x| x.len());
    let mut out = vec![0.0; cols * x.len()];
    for (k, column) in out.chunks_exact_mut(x.len().max(1)).enumerate() {
        for (c, x) in column.iter_mut().zip(x) {
            *c = x[k];
        }
    }
    out
}

/// Sixteen F16 rows interleaved into one block (`block`, see [`crate::interleave_f16`]) against
/// `T` tokens' f16-rounded activations packed by [`pack_f16`]: `out[t][l]` is row `l` · token
/// `t`, equal bit for bit to [`scalar::f16_dot`] on the row.
#[inline]
pub fn f16_rows16_dot<const T: usize>(isa: Isa, block: &[u8], x: &[f32]) -> [[f32; ROWS]; T] {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: both AVX-512 variants are chosen only when the CPU reports AVX-512 F
        // (`Isa::detect`; `CpuBackend::with_isa` refuses them otherwise); the kernel asserts
        // the shapes before reading.
        Isa::Avx512Bw | Isa::Avx512Vnni => unsafe {
            interleaved_f16::f16_rows16_avx512::<T>(block, x)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: every x86 variant has AVX2, FMA and F16C; the kernel asserts the shapes.
        Isa::Avx2 | Isa::AvxVnni => unsafe { interleaved_f16::f16_rows16_avx2::<T>(block, x) },
        _ => {
            // The reference: each row taken back out of the block.
            let row_bytes = block.len() / ROWS;
            let mut row = vec![0u8; row_bytes];
            let tokens: Vec<Vec<f32>> = (0..T)
                .map(|t| x.iter().skip(t).step_by(T).copied().collect())
                .collect();
            let mut out = [[0.0f32; ROWS]; T];
            for l in 0..ROWS {
                crate::interleave_f16::row(block, row_bytes, l, &mut row);
                for (o, x) in out.iter_mut().zip(&tokens) {
                    o[l] = scalar::f16_dot(&row, x);
                }
            }
            out
        }
    }
}

/// [`f16_rows16_dot`] for one token and four interleaved blocks (64 rows: decode), the same
/// bits as four calls.
#[inline]
pub fn f16_rows64_dot(isa: Isa, blocks: [&[u8]; 4], x: &[f32]) -> [[f32; ROWS]; 4] {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for `f16_rows16_dot`.
        Isa::Avx512Bw | Isa::Avx512Vnni => unsafe {
            interleaved_f16::f16_blocks4_avx512(blocks, x)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for `f16_rows16_dot`.
        Isa::Avx2 | Isa::AvxVnni => unsafe { interleaved_f16::f16_blocks4_avx2(blocks, x) },
        _ => blocks.map(|b| f16_rows16_dot::<1>(isa, b, x)[0]),
    }
}
