//! Row dot-product kernels and the run-time choice between them.

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "x86_64")]
pub mod interleaved;
#[cfg(target_arch = "aarch64")]
pub mod neon;
pub mod scalar;

#[cfg(target_arch = "x86_64")]
use hesper_engine::weights::{TQ1_0_BLOCK_BYTES, TQ2_0_BLOCK_BYTES};

use crate::quant::{Q8KBlock, Q8_0Block};

/// Every x86_64 variant: each has AVX2, FMA and F16C and runs the AVX2 kernels wherever it has
/// none of its own.
#[cfg(target_arch = "x86_64")]
macro_rules! x86 {
    () => {
        Isa::Avx2 | Isa::Avx512Bw | Isa::AvxVnni | Isa::Avx512Vnni
    };
}

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
    /// AVX2 kernels, and I2_S interleaved sixteen rows deep with 256-bit VEX `vpdpbusd`
    /// (AVX-VNNI without AVX-512: Intel Alder Lake and later client cores).
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
    /// set ([`crate::interleave`]): only where [`Isa::i2s_rows16_dot`] has a kernel of its own.
    /// Not for AVX2: measured with the same 256-bit `vpmaddubsw` body, prefill gains 8 % but
    /// decode loses 5 % against the file layout's four-row kernel (BENCHMARKS.md).
    pub fn interleaves_i2s(self) -> bool {
        matches!(self, Self::Avx512Bw | Self::AvxVnni | Self::Avx512Vnni)
    }

    /// Σ code·q of sixteen I2_S rows interleaved into one block (`tiles`, see
    /// [`crate::interleave`]) against `T` token rows: `out[t][l]` is row `l`'s sum for token
    /// `t`. Every `q[t]` is as long as a row has columns, a multiple of 128.
    #[inline]
    pub fn i2s_rows16_dot<const T: usize>(self, tiles: &[u8], q: [&[i8]; T]) -> [[i32; 16]; T] {
        // Independent chains per token: one token alone keeps four tiles in flight, two to
        // four tokens two; eight tokens take two tiles at a time where the registers hold them
        // (sixteen 512-bit accumulators: 5 % faster than one tile), one with 256-bit ones.
        #[cfg(target_arch = "x86_64")]
        macro_rules! variant {
            ($kernel:ident, $many:literal) => {
                match T {
                    1 => interleaved::$kernel::<T, 4>(tiles, q),
                    2..=4 => interleaved::$kernel::<T, 2>(tiles, q),
                    _ => interleaved::$kernel::<T, $many>(tiles, q),
                }
            };
        }
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: each variant is constructed only when the CPU reports its features
            // (`detect`; `CpuBackend::with_isa` refuses it otherwise); `sweep` asserts the
            // shapes before reading.
            Self::Avx512Vnni => unsafe { variant!(i2s_rows16_vnni512, 2) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Self::Avx512Bw => unsafe { variant!(i2s_rows16_bw512, 2) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Self::AvxVnni => unsafe { variant!(i2s_rows16_avxvnni, 1) },
            _ => {
                // The reference: each row taken back out of the block.
                let row_bytes = tiles.len() / 16;
                let mut row = vec![0u8; row_bytes];
                let mut out = [[0i32; 16]; T];
                for l in 0..16 {
                    crate::interleave::row(tiles, row_bytes, l, &mut row);
                    for (o, q) in out.iter_mut().zip(q) {
                        o[l] = scalar::i2s_code_dot(&row, q);
                    }
                }
                out
            }
        }
    }

    /// Σ code·q over an I2_S row.
    #[inline]
    pub fn i2s_code_dot(self, row: &[u8], q: &[i8]) -> i32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: an x86 variant is only constructed after the CPU reported AVX2; lengths are
            // checked by the matmul driver (rows of whole 128-element groups).
            x86!() => unsafe { avx2::i2s_code_dot(row, q) },
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
            x86!() => unsafe { avx2::i2s_code_dot_rows4(rows, q) },
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
            // SAFETY: as for `i2s_code_dot`, for each of the four rows; `Avx512Vnni` has
            // AVX-512 F/VL/VNNI and `AvxVnni` AVX-VNNI besides AVX2 and F16C.
            Self::Avx512Vnni => unsafe { avx2::i2s_code_dot_x4_vnni(row, q) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Self::AvxVnni => unsafe { avx2::i2s_code_dot_x4_avxvnni(row, q) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Self::Avx2 | Self::Avx512Bw => unsafe { avx2::i2s_code_dot_x4_avx2(row, q) },
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
            // SAFETY: every x86 variant has AVX2 and F16C; the row holds one block per activation block.
            x86!() => unsafe { avx2::ternary_dot::<TQ2_0_BLOCK_BYTES>(row, act) },
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
            // SAFETY: every x86 variant has AVX2 and F16C; the matmul driver passes four whole rows.
            x86!() => unsafe { avx2::ternary_dot_rows4::<TQ2_0_BLOCK_BYTES>(rows, act) },
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
            // SAFETY: see `tq2_0_dot`; `Avx512Vnni` has AVX-512 F/VL/VNNI besides AVX2 and F16C.
            Self::Avx512Vnni => unsafe { avx2::ternary_dot_x4_vnni::<TQ2_0_BLOCK_BYTES>(row, act) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above; `AvxVnni` has AVX-VNNI besides AVX2 and F16C.
            Self::AvxVnni => unsafe { avx2::ternary_dot_x4_avxvnni::<TQ2_0_BLOCK_BYTES>(row, act) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Self::Avx2 | Self::Avx512Bw => unsafe {
                avx2::ternary_dot_x4_avx2::<TQ2_0_BLOCK_BYTES>(row, act)
            },
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
            // SAFETY: every x86 variant has AVX2 and F16C; the row holds one block per activation block.
            x86!() => unsafe { avx2::ternary_dot::<TQ1_0_BLOCK_BYTES>(row, act) },
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
            // SAFETY: see `tq1_0_dot`; `Avx512Vnni` has AVX-512 F/VL/VNNI besides AVX2 and F16C.
            Self::Avx512Vnni => unsafe { avx2::ternary_dot_x4_vnni::<TQ1_0_BLOCK_BYTES>(row, act) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above; `AvxVnni` has AVX-VNNI besides AVX2 and F16C.
            Self::AvxVnni => unsafe { avx2::ternary_dot_x4_avxvnni::<TQ1_0_BLOCK_BYTES>(row, act) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Self::Avx2 | Self::Avx512Bw => unsafe {
                avx2::ternary_dot_x4_avx2::<TQ1_0_BLOCK_BYTES>(row, act)
            },
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
            // SAFETY: every x86 variant has AVX2 and F16C; the matmul driver passes four whole rows.
            x86!() => unsafe { avx2::ternary_dot_rows4::<TQ1_0_BLOCK_BYTES>(rows, act) },
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
            // SAFETY: every x86 variant has AVX2 and F16C; the row holds one block per activation block.
            x86!() => unsafe { avx2::q6_k_dot(row, act) },
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
            // SAFETY: every x86 variant has AVX2, FMA and F16C; the row holds one block per activation block.
            x86!() => unsafe { avx2::q8_0_dot(row, act) },
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
            // SAFETY: every x86 variant has AVX2 and FMA; the row holds x.len() floats.
            x86!() => unsafe { avx2::f32_dot(row, x) },
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

    /// F16 row · x.
    #[inline]
    pub fn f16_dot(self, row: &[u8], x: &[f32]) -> f32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: every x86 variant has AVX2, FMA and F16C; the row holds x.len() halves.
            x86!() => unsafe { avx2::f16_dot(row, x) },
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
