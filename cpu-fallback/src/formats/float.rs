//! F32, F16 and BF16 rows: dotted with f32 activations rounded as the weights are (ggml's
//! rule), so the CPU computes what llama.cpp computes.

use hesper_engine::formats::{Bf16, F16, F32};

use super::{ActivationKind, CpuLayout};
#[cfg(target_arch = "aarch64")]
use crate::kernels::neon;
#[cfg(target_arch = "x86_64")]
use crate::kernels::{avx2, x86};
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
