//! TQ1_0 and TQ2_0 rows: dotted with Q8_K activations. The two share every SIMD kernel
//! (generic over the block size, which says how to unpack the codes); each has its own
//! scalar reference.

use hesper_engine::formats::{Tq1_0, Tq2_0};
#[cfg(target_arch = "x86_64")]
use hesper_engine::formats::{TQ1_0_BLOCK_BYTES, TQ2_0_BLOCK_BYTES};

use super::{each_of_four_rows, ActivationKind, CpuLayout};
#[cfg(target_arch = "x86_64")]
use crate::kernels::avx2;
#[cfg(target_arch = "aarch64")]
use crate::kernels::neon;
use crate::kernels::{scalar, Isa};
use crate::quant::{quantize_q8_k, Q8KBlock};

/// The [`CpuLayout`] of a ternary layout: its type, block bytes and the names of its
/// scalar and NEON kernels.
macro_rules! ternary {
    ($layout:ty, $bytes:ident, $dot:ident, $rows4:ident, $x4:ident) => {
        impl CpuLayout for $layout {
            type Act = Vec<Q8KBlock>;
            const ACT: ActivationKind = ActivationKind::Q8K;

            fn quantize(x: &[f32]) -> Vec<Q8KBlock> {
                quantize_q8_k(x)
            }

            #[inline]
            fn dot(self, isa: Isa, row: &[u8], act: &Vec<Q8KBlock>) -> f32 {
                by_isa!(isa,
                    x86: avx2::ternary_dot::<$bytes>(row, act),
                    neon: $dot(row, act),
                    scalar: scalar::$dot(row, act),
                )
            }

            #[inline]
            fn dot_x4(self, isa: Isa, row: &[u8], act: [&Vec<Q8KBlock>; 4]) -> Option<[f32; 4]> {
                let act = act.map(Vec::as_slice);
                Some(match isa {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: see `dot`; `Avx512Vnni` has AVX-512 F/VL/VNNI besides AVX2 and
                    // F16C.
                    Isa::Avx512Vnni => unsafe { avx2::ternary_dot_x4_vnni::<$bytes>(row, act) },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as above; `AvxVnni` has AVX-VNNI besides AVX2 and F16C.
                    Isa::AvxVnni => unsafe { avx2::ternary_dot_x4_avxvnni::<$bytes>(row, act) },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as above.
                    Isa::Avx2 | Isa::Avx512Bw => unsafe {
                        avx2::ternary_dot_x4_avx2::<$bytes>(row, act)
                    },
                    #[cfg(target_arch = "aarch64")]
                    Isa::Neon => neon::plain::$x4(row, act),
                    #[cfg(target_arch = "aarch64")]
                    // SAFETY: as for `dot`.
                    Isa::NeonDot => unsafe { neon::dotprod::$x4(row, act) },
                    _ => act.map(|a| scalar::$dot(row, a)),
                })
            }

            #[inline]
            fn dot_rows4(self, isa: Isa, rows: &[u8], act: &Vec<Q8KBlock>) -> Option<[f32; 4]> {
                Some(match isa {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as for `dot_x4`; `rows` holds four whole rows.
                    Isa::Avx512Vnni => unsafe { avx2::ternary_dot_rows4_vnni::<$bytes>(rows, act) },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as above.
                    Isa::AvxVnni => unsafe { avx2::ternary_dot_rows4_avxvnni::<$bytes>(rows, act) },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as above.
                    Isa::Avx2 | Isa::Avx512Bw => unsafe {
                        avx2::ternary_dot_rows4_avx2::<$bytes>(rows, act)
                    },
                    #[cfg(target_arch = "aarch64")]
                    Isa::Neon => neon::plain::$rows4(rows, act),
                    #[cfg(target_arch = "aarch64")]
                    // SAFETY: as for `dot`.
                    Isa::NeonDot => unsafe { neon::dotprod::$rows4(rows, act) },
                    _ => each_of_four_rows(rows, |row| scalar::$dot(row, act)),
                })
            }
        }
    };
}

ternary!(
    Tq2_0,
    TQ2_0_BLOCK_BYTES,
    tq2_0_dot,
    tq2_0_dot_rows4,
    tq2_0_dot_x4
);
ternary!(
    Tq1_0,
    TQ1_0_BLOCK_BYTES,
    tq1_0_dot,
    tq1_0_dot_rows4,
    tq1_0_dot_x4
);
