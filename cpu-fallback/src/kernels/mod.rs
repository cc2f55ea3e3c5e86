//! Row dot-product kernels and the run-time choice between them.

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "aarch64")]
pub mod neon;
pub mod scalar;

#[cfg(target_arch = "x86_64")]
use hesper_engine::weights::{TQ1_0_BLOCK_BYTES, TQ2_0_BLOCK_BYTES};

use crate::quant::{Q8KBlock, Q8_0Block};

/// The instruction set the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable scalar code (the reference).
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// AArch64 NEON without the dot-product extension (Cortex-A53/A72: Raspberry Pi 3/4).
    #[cfg(target_arch = "aarch64")]
    Neon,
    /// AArch64 NEON with `SDOT` (`dotprod`: Apple M-series, Graviton 2+, Cortex-A55/A76+).
    #[cfg(target_arch = "aarch64")]
    NeonDot,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return Self::Avx2;
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            if std::arch::is_aarch64_feature_detected!("dotprod") {
                return Self::NeonDot;
            }
            return Self::Neon;
        }
        Self::Scalar
    }

    /// Whether this CPU can run `self`.
    pub fn is_supported(self) -> bool {
        match self {
            Self::Scalar => true,
            Self::Avx2 => Self::detect() == Self::Avx2,
            #[cfg(target_arch = "aarch64")]
            Self::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            Self::NeonDot => Self::detect() == Self::NeonDot,
        }
    }

    /// Every instruction set this CPU can run, the scalar reference first (tests force each).
    pub fn supported() -> Vec<Self> {
        let mut all = vec![Self::Scalar, Self::Avx2];
        #[cfg(target_arch = "aarch64")]
        all.extend([Self::Neon, Self::NeonDot]);
        all.retain(|isa| isa.is_supported());
        all
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            #[cfg(target_arch = "aarch64")]
            Self::Neon => "neon",
            #[cfg(target_arch = "aarch64")]
            Self::NeonDot => "neon-dotprod",
        }
    }

    /// Σ code·q over an I2_S row.
    #[inline]
    pub fn i2s_code_dot(self, row: &[u8], q: &[i8]) -> i32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only constructed after the CPU reported AVX2; lengths are
            // checked by the matmul driver (rows of whole 128-element groups).
            Self::Avx2 => unsafe { avx2::i2s_code_dot(row, q) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon => neon::plain::i2s_code_dot(row, q),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `NeonDot` is chosen only when the CPU reports `dotprod` (`detect`;
            // `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the shapes.
            Self::NeonDot => unsafe { neon::dotprod::i2s_code_dot(row, q) },
            _ => scalar::i2s_code_dot(row, q),
        }
    }

    /// Σ code·q of four consecutive I2_S rows (`rows` holds all four) against one token row.
    #[inline]
    pub fn i2s_code_dot_rows4(self, rows: &[u8], q: &[i8]) -> [i32; 4] {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as for `i2s_code_dot`; the matmul driver passes four whole rows.
            Self::Avx2 => unsafe { avx2::i2s_code_dot_rows4(rows, q) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon => neon::plain::i2s_code_dot_rows4(rows, q),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `NeonDot` is chosen only when the CPU reports `dotprod` (`detect`;
            // `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the shapes.
            Self::NeonDot => unsafe { neon::dotprod::i2s_code_dot_rows4(rows, q) },
            _ => each_of_four_rows(rows, |row| scalar::i2s_code_dot(row, q)),
        }
    }

    /// Σ code·q of one I2_S row against four token rows.
    #[inline]
    pub fn i2s_code_dot_x4(self, row: &[u8], q: [&[i8]; 4]) -> [i32; 4] {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as for `i2s_code_dot`, for each of the four rows.
            Self::Avx2 => unsafe { avx2::i2s_code_dot_x4(row, q) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon => neon::plain::i2s_code_dot_x4(row, q),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `NeonDot` is chosen only when the CPU reports `dotprod` (`detect`;
            // `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the shapes.
            Self::NeonDot => unsafe { neon::dotprod::i2s_code_dot_x4(row, q) },
            _ => q.map(|q| scalar::i2s_code_dot(row, q)),
        }
    }

    /// TQ2_0 row · Q8_K activations.
    #[inline]
    pub fn tq2_0_dot(self, row: &[u8], act: &[Q8KBlock]) -> f32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` implies AVX2 and F16C; the row holds one block per activation block.
            Self::Avx2 => unsafe { avx2::ternary_dot::<TQ2_0_BLOCK_BYTES>(row, act) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon => neon::plain::tq2_0_dot(row, act),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `NeonDot` is chosen only when the CPU reports `dotprod` (`detect`;
            // `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the shapes.
            Self::NeonDot => unsafe { neon::dotprod::tq2_0_dot(row, act) },
            _ => scalar::tq2_0_dot(row, act),
        }
    }

    /// Four consecutive TQ2_0 rows (`rows` holds all four) · Q8_K activations.
    #[inline]
    pub fn tq2_0_dot_rows4(self, rows: &[u8], act: &[Q8KBlock]) -> [f32; 4] {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` implies AVX2 and F16C; the matmul driver passes four whole rows.
            Self::Avx2 => unsafe { avx2::ternary_dot_rows4::<TQ2_0_BLOCK_BYTES>(rows, act) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon => neon::plain::tq2_0_dot_rows4(rows, act),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `NeonDot` is chosen only when the CPU reports `dotprod` (`detect`;
            // `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the shapes.
            Self::NeonDot => unsafe { neon::dotprod::tq2_0_dot_rows4(rows, act) },
            _ => each_of_four_rows(rows, |row| scalar::tq2_0_dot(row, act)),
        }
    }

    /// TQ2_0 row · Q8_K activations of four tokens.
    #[inline]
    pub fn tq2_0_dot_x4(self, row: &[u8], act: [&[Q8KBlock]; 4]) -> [f32; 4] {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: see `tq2_0_dot`.
            Self::Avx2 => unsafe { avx2::ternary_dot_x4::<TQ2_0_BLOCK_BYTES>(row, act) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon => neon::plain::tq2_0_dot_x4(row, act),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `NeonDot` is chosen only when the CPU reports `dotprod` (`detect`;
            // `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the shapes.
            Self::NeonDot => unsafe { neon::dotprod::tq2_0_dot_x4(row, act) },
            _ => act.map(|a| scalar::tq2_0_dot(row, a)),
        }
    }

    /// TQ1_0 row · Q8_K activations.
    #[inline]
    pub fn tq1_0_dot(self, row: &[u8], act: &[Q8KBlock]) -> f32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` implies AVX2 and F16C; the row holds one block per activation block.
            Self::Avx2 => unsafe { avx2::ternary_dot::<TQ1_0_BLOCK_BYTES>(row, act) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon => neon::plain::tq1_0_dot(row, act),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `NeonDot` is chosen only when the CPU reports `dotprod` (`detect`;
            // `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the shapes.
            Self::NeonDot => unsafe { neon::dotprod::tq1_0_dot(row, act) },
            _ => scalar::tq1_0_dot(row, act),
        }
    }

    /// TQ1_0 row · Q8_K activations of four tokens.
    #[inline]
    pub fn tq1_0_dot_x4(self, row: &[u8], act: [&[Q8KBlock]; 4]) -> [f32; 4] {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: see `tq1_0_dot`.
            Self::Avx2 => unsafe { avx2::ternary_dot_x4::<TQ1_0_BLOCK_BYTES>(row, act) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon => neon::plain::tq1_0_dot_x4(row, act),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `NeonDot` is chosen only when the CPU reports `dotprod` (`detect`;
            // `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the shapes.
            Self::NeonDot => unsafe { neon::dotprod::tq1_0_dot_x4(row, act) },
            _ => act.map(|a| scalar::tq1_0_dot(row, a)),
        }
    }

    /// Four consecutive TQ1_0 rows (`rows` holds all four) · Q8_K activations.
    #[inline]
    pub fn tq1_0_dot_rows4(self, rows: &[u8], act: &[Q8KBlock]) -> [f32; 4] {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` implies AVX2 and F16C; the matmul driver passes four whole rows.
            Self::Avx2 => unsafe { avx2::ternary_dot_rows4::<TQ1_0_BLOCK_BYTES>(rows, act) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon => neon::plain::tq1_0_dot_rows4(rows, act),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `NeonDot` is chosen only when the CPU reports `dotprod` (`detect`;
            // `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the shapes.
            Self::NeonDot => unsafe { neon::dotprod::tq1_0_dot_rows4(rows, act) },
            _ => each_of_four_rows(rows, |row| scalar::tq1_0_dot(row, act)),
        }
    }

    /// Q6_K row · Q8_K activations.
    #[inline]
    pub fn q6_k_dot(self, row: &[u8], act: &[Q8KBlock]) -> f32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` implies AVX2 and F16C; the row holds one block per activation block.
            Self::Avx2 => unsafe { avx2::q6_k_dot(row, act) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon => neon::plain::q6_k_dot(row, act),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `NeonDot` is chosen only when the CPU reports `dotprod` (`detect`;
            // `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the shapes.
            Self::NeonDot => unsafe { neon::dotprod::q6_k_dot(row, act) },
            _ => scalar::q6_k_dot(row, act),
        }
    }

    /// Q8_0 row · Q8_0 activations.
    #[inline]
    pub fn q8_0_dot(self, row: &[u8], act: &[Q8_0Block]) -> f32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` implies AVX2, FMA and F16C; the row holds one block per activation block.
            Self::Avx2 => unsafe { avx2::q8_0_dot(row, act) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon => neon::plain::q8_0_dot(row, act),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `NeonDot` is chosen only when the CPU reports `dotprod` (`detect`;
            // `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the shapes.
            Self::NeonDot => unsafe { neon::dotprod::q8_0_dot(row, act) },
            _ => scalar::q8_0_dot(row, act),
        }
    }

    /// F32 row · x.
    #[inline]
    pub fn f32_dot(self, row: &[u8], x: &[f32]) -> f32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` implies AVX2 and FMA; the row holds x.len() floats.
            Self::Avx2 => unsafe { avx2::f32_dot(row, x) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon | Self::NeonDot => neon::f32_dot(row, x),
            _ => scalar::f32_dot(row, x),
        }
    }

    /// Attention scores: `out[j] = q · k[j·stride ..][..q.len()]`.
    #[inline]
    pub fn scores(self, q: &[f32], k: &[f32], stride: usize, out: &mut [f32]) {
        assert!(out.is_empty() || k.len() >= (out.len() - 1) * stride + q.len());
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` implies AVX2 and FMA; the assert above bounds every key.
            Self::Avx2 => unsafe { avx2::scores(q, k, stride, out) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon | Self::NeonDot => neon::scores(q, k, stride, out),
            _ => scalar::scores(q, k, stride, out),
        }
    }

    /// Attention's weighted sum: `out = Σ_j p[j] · v[j·stride ..][..out.len()]`.
    #[inline]
    pub fn weighted_sum(self, p: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
        assert!(p.is_empty() || v.len() >= (p.len() - 1) * stride + out.len());
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` implies AVX2 and FMA; the assert above bounds every value.
            Self::Avx2 => unsafe { avx2::weighted_sum(p, v, stride, out) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon | Self::NeonDot => neon::weighted_sum(p, v, stride, out),
            _ => scalar::weighted_sum(p, v, stride, out),
        }
    }

    /// F16 row · x.
    #[inline]
    pub fn f16_dot(self, row: &[u8], x: &[f32]) -> f32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` implies AVX2, FMA and F16C; the row holds x.len() halves.
            Self::Avx2 => unsafe { avx2::f16_dot(row, x) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon | Self::NeonDot => neon::f16_dot(row, x),
            _ => scalar::f16_dot(row, x),
        }
    }
}

/// `f` of each of the four equal rows `rows` holds (the scalar side of the four-row kernels).
fn each_of_four_rows<T>(rows: &[u8], f: impl Fn(&[u8]) -> T) -> [T; 4] {
    let row_bytes = rows.len() / 4;
    std::array::from_fn(|k| f(&rows[k * row_bytes..(k + 1) * row_bytes]))
}

#[cfg(test)]
mod tests {
    use super::Isa;

    /// `detect` picks the last (best) of the supported instruction sets; with
    /// `HESPER_EXPECT_ISA` set (CI does, for each emulated CPU) it must pick that one.
    #[test]
    fn detect_picks_the_best_supported_isa() {
        let supported = Isa::supported();
        assert_eq!(supported.first(), Some(&Isa::Scalar));
        assert_eq!(supported.last(), Some(&Isa::detect()));
        let names: Vec<&str> = supported.iter().map(|isa| isa.name()).collect();
        println!("supported: {names:?}, detected: {}", Isa::detect().name());
        if let Ok(want) = std::env::var("HESPER_EXPECT_ISA") {
            assert_eq!(Isa::detect().name(), want);
        }
    }
}
