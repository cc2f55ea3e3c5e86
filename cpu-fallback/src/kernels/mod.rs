//! The instruction sets and the run-time choice between them; the SIMD and scalar kernels,
//! which each weight layout dispatches to in [`crate::formats`]; attention's and RMSNorm's
//! row operations.

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "x86_64")]
pub mod interleaved;
#[cfg(target_arch = "x86_64")]
pub mod interleaved_f16;
#[cfg(target_arch = "x86_64")]
pub mod interleaved_mxfp4;
#[cfg(target_arch = "x86_64")]
pub mod interleaved_q4_0;
#[cfg(target_arch = "x86_64")]
pub mod interleaved_q4_k;
#[cfg(target_arch = "x86_64")]
pub mod interleaved_q6_k;
#[cfg(target_arch = "x86_64")]
pub mod interleaved_q8_0;
#[cfg(target_arch = "aarch64")]
pub mod neon;
pub mod scalar;
#[cfg(all(test, target_arch = "x86_64"))]
mod vnni256_tests;

/// Every x86_64 variant: each has AVX2, FMA and F16C and runs the AVX2 kernels wherever it has
/// none of its own.
#[cfg(target_arch = "x86_64")]
macro_rules! x86 {
    () => {
        $crate::kernels::Isa::Avx2
            | $crate::kernels::Isa::Avx512Bw
            | $crate::kernels::Isa::AvxVnni
            | $crate::kernels::Isa::Avx512Vnni
    };
}
#[cfg(target_arch = "x86_64")]
pub(crate) use x86;

/// The instruction set the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable scalar code (the reference).
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 kernels, and I2_S interleaved sixteen rows deep with 512-bit `vpmaddubsw`
    /// (AVX-512 F/BW without VNNI: Intel Skylake-X).
    Avx512Bw,
    /// AVX2 kernels, and I2_S, Q8_0 and the K-quants interleaved sixteen rows deep under
    /// 256-bit VEX `vpdpbusd`, F16 prefill in groups of twelve tokens (AVX-VNNI without
    /// AVX-512: Intel Alder Lake and later client cores).
    AvxVnni,
    /// AVX2 kernels, and I2_S interleaved sixteen rows deep with 512-bit `vpdpbusd`
    /// (AVX-512 F/BW/VNNI: Intel Ice Lake and later servers, AMD Zen 4 and later).
    Avx512Vnni,
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
        if Self::Avx2.is_supported() {
            // The last supported of these is the best.
            return [Self::Avx512Bw, Self::AvxVnni, Self::Avx512Vnni]
                .into_iter()
                .rfind(|isa| isa.is_supported())
                .unwrap_or(Self::Avx2);
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
        #[cfg(target_arch = "x86_64")]
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        #[cfg(target_arch = "x86_64")]
        let avx512bw =
            avx2 && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw");
        match self {
            Self::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => avx2,
            #[cfg(target_arch = "x86_64")]
            Self::Avx512Bw => avx512bw,
            #[cfg(target_arch = "x86_64")]
            Self::AvxVnni => avx2 && is_x86_feature_detected!("avxvnni"),
            #[cfg(target_arch = "x86_64")]
            Self::Avx512Vnni => avx512bw && is_x86_feature_detected!("avx512vnni"),
            #[cfg(not(target_arch = "x86_64"))]
            Self::Avx2 | Self::Avx512Bw | Self::AvxVnni | Self::Avx512Vnni => false,
            #[cfg(target_arch = "aarch64")]
            Self::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            Self::NeonDot => Self::detect() == Self::NeonDot,
        }
    }

    /// Every instruction set this CPU can run, the scalar reference first (tests force each).
    pub fn supported() -> Vec<Self> {
        let mut all = vec![
            Self::Scalar,
            Self::Avx2,
            Self::Avx512Bw,
            Self::AvxVnni,
            Self::Avx512Vnni,
        ];
        #[cfg(target_arch = "aarch64")]
        all.extend([Self::Neon, Self::NeonDot]);
        all.retain(|isa| isa.is_supported());
        all
    }

    /// Every instruction set of this target architecture, supported here or not.
    pub fn all() -> Vec<Self> {
        let mut all = vec![Self::Scalar];
        #[cfg(target_arch = "x86_64")]
        all.extend([Self::Avx2, Self::Avx512Bw, Self::AvxVnni, Self::Avx512Vnni]);
        #[cfg(target_arch = "aarch64")]
        all.extend([Self::Neon, Self::NeonDot]);
        all
    }

    /// The instruction set named `name` (as [`Isa::name`] writes it), of this architecture.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::all().into_iter().find(|isa| isa.name() == name)
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            Self::Avx512Bw => "avx512bw",
            Self::AvxVnni => "avx-vnni",
            Self::Avx512Vnni => "avx512-vnni",
            #[cfg(target_arch = "aarch64")]
            Self::Neon => "neon",
            #[cfg(target_arch = "aarch64")]
            Self::NeonDot => "neon-dotprod",
        }
    }

    /// Whether I2_S matrices are worth interleaving sixteen rows deep for this instruction
    /// set ([`crate::interleave`]): only where [`crate::formats::i2s::rows16_dot`] has a kernel of its own.
    /// Not for AVX2: measured with the same 256-bit `vpmaddubsw` body, prefill gains 8 % but
    /// decode loses 5 % against the file layout's four-row kernel (BENCHMARKS.md).
    pub fn interleaves_i2s(self) -> bool {
        matches!(self, Self::Avx512Bw | Self::AvxVnni | Self::Avx512Vnni)
    }

    /// Whether Q8_0 weights are interleaved sixteen rows deep at load for this instruction set
    /// ([`crate::interleave_q8_0`]): where [`crate::formats::q8_0::rows16_dot`] has a kernel
    /// of its own (AVX-512 VNNI with `vpdpbusd`; AVX2 and AVX-VNNI with `vpmaddubsw`).
    pub fn interleaves_q8_0(self) -> bool {
        matches!(self, Self::Avx2 | Self::AvxVnni | Self::Avx512Vnni)
    }

    /// Whether Q4_0 weights are interleaved sixteen rows deep at load for this instruction set
    /// ([`crate::interleave_q4_0`]): where [`crate::formats::q4_0::rows16_dot`] has a kernel
    /// of its own (AVX-512 VNNI with `vpdpbusd`; AVX2 and AVX-VNNI with `vpmaddubsw`).
    pub fn interleaves_q4_0(self) -> bool {
        matches!(self, Self::Avx2 | Self::AvxVnni | Self::Avx512Vnni)
    }

    /// Whether MXFP4 weights are interleaved sixteen rows deep at load for this instruction set
    /// ([`crate::interleave_mxfp4`]): on every x86 variant, whose AVX2 `vpmaddubsw` kernel
    /// [`crate::formats::mxfp4::rows16_dot`] runs.
    pub fn interleaves_mxfp4(self) -> bool {
        matches!(
            self,
            Self::Avx2 | Self::Avx512Bw | Self::AvxVnni | Self::Avx512Vnni
        )
    }

    /// Whether Q4_K and Q5_K weights are interleaved sixteen rows deep at load for this
    /// instruction set ([`crate::interleave_q4_k`]): where [`crate::formats::q4_k::rows16_dot`]
    /// and its Q5_K twin have a kernel of their own (AVX-512 VNNI and AVX-VNNI with
    /// `vpdpbusd`; AVX2 with `vpmaddubsw`).
    pub fn interleaves_q4_k(self) -> bool {
        matches!(self, Self::Avx2 | Self::AvxVnni | Self::Avx512Vnni)
    }

    /// Whether Q6_K weights are interleaved sixteen rows deep at load for this instruction set
    /// ([`crate::interleave_q6_k`]): where [`crate::formats::q6_k::rows16_dot`] has a kernel
    /// of its own (AVX-512 VNNI and AVX-VNNI with `vpdpbusd`; AVX2 with `vpmaddubsw`).
    pub fn interleaves_q6_k(self) -> bool {
        matches!(self, Self::Avx2 | Self::AvxVnni | Self::Avx512Vnni)
    }

    /// Whether TQ1_0 weights are rewritten as TQ2_0 at load for this instruction set
    /// ([`crate::tq1_0_as_tq2_0`]): every x86 one, whose TQ1_0 kernels are bound by their
    /// arithmetic where TQ2_0's stream at the memory's speed.
    pub fn rewrites_tq1_0(self) -> bool {
        matches!(
            self,
            Self::Avx2 | Self::Avx512Bw | Self::AvxVnni | Self::Avx512Vnni
        )
    }

    /// Whether F16 weights are interleaved sixteen rows deep at load for this instruction set
    /// ([`crate::interleave_f16`]): where [`crate::formats::float::f16_rows16_dot`] has a
    /// kernel of its own (every x86 variant: AVX-512's registers or AVX2's).
    pub fn interleaves_f16(self) -> bool {
        matches!(
            self,
            Self::Avx2 | Self::Avx512Bw | Self::AvxVnni | Self::Avx512Vnni
        )
    }

    /// Attention scores: `out[j] = q · k[j·stride ..][..q.len()]`.
    #[inline]
    pub fn scores(self, q: &[f32], k: &[f32], stride: usize, out: &mut [f32]) {
        assert!(out.is_empty() || k.len() >= (out.len() - 1) * stride + q.len());
        match self {
            #[cfg(target_arch = "x86_64")]
            #[cfg(target_arch = "x86_64")]
            // SAFETY: both AVX-512 variants have AVX-512 F and FMA; the assert above bounds
            // every key.
            Self::Avx512Bw | Self::Avx512Vnni => unsafe { avx512::scores(q, k, stride, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: every x86 variant has AVX2 and FMA; the assert above bounds every key.
            Self::Avx2 | Self::AvxVnni => unsafe { avx2::scores(q, k, stride, out) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon | Self::NeonDot => neon::scores(q, k, stride, out),
            _ => scalar::scores(q, k, stride, out),
        }
    }

    /// [`Isa::scores`] of four queries that read the same keys (query heads sharing a kv
    /// head): each equals its own `scores`.
    #[inline]
    pub fn scores_x4(self, q: [&[f32]; 4], k: &[f32], stride: usize, out: [&mut [f32]; 4]) {
        let (hd, keys) = (q[0].len(), out[0].len());
        assert!(q.iter().all(|q| q.len() == hd) && out.iter().all(|o| o.len() == keys));
        assert!(keys == 0 || k.len() >= (keys - 1) * stride + hd);
        match self {
            #[cfg(target_arch = "x86_64")]
            #[cfg(target_arch = "x86_64")]
            // SAFETY: both AVX-512 variants have AVX-512 F, AVX2 and FMA; the asserts above
            // bound every key.
            Self::Avx512Bw | Self::Avx512Vnni => unsafe { avx512::scores_x4(q, k, stride, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: every x86 variant has AVX2 and FMA; the asserts above bound every key.
            Self::Avx2 | Self::AvxVnni => unsafe { avx2::scores_x4(q, k, stride, out) },
            _ => {
                for (q, o) in q.into_iter().zip(out) {
                    self.scores(q, k, stride, o);
                }
            }
        }
    }

    /// [`Isa::weighted_sum`] of four probability rows over the same values: each equals its
    /// own `weighted_sum`.
    #[inline]
    pub fn weighted_sum_x4(self, p: [&[f32]; 4], v: &[f32], stride: usize, out: [&mut [f32]; 4]) {
        let (len, hd) = (p[0].len(), out[0].len());
        assert!(p.iter().all(|p| p.len() == len) && out.iter().all(|o| o.len() == hd));
        assert!(len == 0 || v.len() >= (len - 1) * stride + hd);
        match self {
            #[cfg(target_arch = "x86_64")]
            #[cfg(target_arch = "x86_64")]
            // SAFETY: both AVX-512 variants have AVX-512 F, AVX2 and FMA; the asserts above
            // bound every value.
            Self::Avx512Bw | Self::Avx512Vnni => unsafe {
                avx512::weighted_sum_x4(p, v, stride, out)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: every x86 variant has AVX2 and FMA; the asserts above bound every value.
            Self::Avx2 | Self::AvxVnni => unsafe { avx2::weighted_sum_x4(p, v, stride, out) },
            _ => {
                for (p, o) in p.into_iter().zip(out) {
                    self.weighted_sum(p, v, stride, o);
                }
            }
        }
    }

    /// RMSNorm of one row (see [`scalar::rms_norm_row`]); `w` and `y` as long as `x`.
    #[inline]
    pub fn rms_norm_row(self, x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
        assert!(w.len() == x.len() && y.len() == x.len());
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: every x86 variant has AVX2; the lengths are checked above.
            x86!() => unsafe { avx2::rms_norm_row(x, w, eps, y) },
            _ => scalar::rms_norm_row(x, w, eps, y),
        }
    }

    /// Scaled attention scores to probabilities in place (see [`scalar::softmax`]).
    #[inline]
    pub fn softmax(self, scores: &mut [f32], scale: f32) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: every x86 variant has AVX2 and FMA.
            x86!() => unsafe { avx2::softmax(scores, scale) },
            _ => scalar::softmax(scores, scale),
        }
    }

    /// Attention's weighted sum: `out = Σ_j p[j] · v[j·stride ..][..out.len()]`.
    #[inline]
    pub fn weighted_sum(self, p: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
        assert!(p.is_empty() || v.len() >= (p.len() - 1) * stride + out.len());
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: every x86 variant has AVX2 and FMA; the assert above bounds every value.
            x86!() => unsafe { avx2::weighted_sum(p, v, stride, out) },
            #[cfg(target_arch = "aarch64")]
            Self::Neon | Self::NeonDot => neon::weighted_sum(p, v, stride, out),
            _ => scalar::weighted_sum(p, v, stride, out),
        }
    }
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
