//! NEON kernels for AArch64 in two variants, chosen at run time (see [`super::Isa::detect`]):
//! [`plain`] runs on every AArch64 core (Cortex-A53/A72 of a Raspberry Pi 3/4), [`dotprod`]
//! needs `SDOT` (Armv8.2 `dotprod`: Apple M-series, Graviton 2+, Cortex-A55/A76 and later).
//! Both are the same generic kernels instantiated with a different exact int8
//! multiply-accumulate ([`Dot`]: `SMLAL`/`SMLAL2` into i16 lanes, or `SDOT` into i32 lanes).
//!
//! * `ternary` — I2_S, TQ2_0 and TQ1_0 rows against int8 and Q8_K activations;
//! * `blocks` — Q8_0 and Q6_K rows;
//! * `k_quants` — Q4_0, Q4_K and Q5_K rows;
//! * `float` — F32 and F16 rows, and the attention's dot products and weighted sums (no
//!   integer products, so both variants run the same code).
//!
//! Written with the stable `core::arch::aarch64` intrinsics plus three instructions through
//! `asm!`, whose intrinsics are not stable at the crate's minimum Rust version (1.85):
//! `SDOT` (`vdotq_s32` is still unstable), `FCVTL` and scalar `FCVT` (f16 → f32, base Armv8:
//! no `fp16` extension needed; `vcvt_f32_f16` became stable only after 1.85). There is no
//! software prefetch: `core::arch::aarch64::_prefetch` is unstable, so the kernels rely on the
//! hardware prefetchers, and stream four rows at a time for decode as the AVX2 kernels do.

mod blocks;
mod float;
mod k_quants;
mod ternary;

pub use float::{f16_dot, f32_dot, scores, weighted_sum};

use std::arch::aarch64::*;
use std::arch::asm;

use hesper_engine::formats::{TQ1_0_BLOCK_BYTES, TQ2_0_BLOCK_BYTES};

use crate::quant::{Q8KBlock, Q8_0Block};

/// An exact int8 multiply-accumulate: the one thing the two variants do differently.
///
/// Every method is `unsafe`: the CPU must have the instructions of the implementation.
trait Dot {
    /// Partial sums of [`Dot::mac`], spread over lanes.
    type Acc: Copy;

    /// Partial sums of nothing.
    unsafe fn zero() -> Self::Acc;

    /// `acc` plus the 16 products `a[i]·b[i]`. Exact while no lane leaves its type: the
    /// narrowest ([`Smlal`]) adds two products to each i16 lane per call, so it takes 32 calls
    /// of products up to 256 in magnitude (ternary codes 0..=2 × any int8) or one call of
    /// products up to 8064 (Q6_K codes 0..=63 × any int8) before [`Dot::accumulate`].
    unsafe fn mac(acc: Self::Acc, a: int8x16_t, b: int8x16_t) -> Self::Acc;

    /// `codes` unchanged, as far as the code generator can tell, where knowing their range
    /// would make it pick slower instructions for [`Dot::mac`].
    unsafe fn opaque(codes: int8x16_t) -> int8x16_t;

    /// Lane-wise sum of two partial sums (exact within the bound of [`Dot::mac`]).
    unsafe fn add(a: Self::Acc, b: Self::Acc) -> Self::Acc;

    /// `acc32` plus the partial sums, widened to four i32 lanes (same total).
    unsafe fn accumulate(acc32: int32x4_t, acc: Self::Acc) -> int32x4_t;

    /// `acc32` plus the 16 products `a[i]·b[i]` in i32 lanes, for products up to 128·127 in
    /// magnitude (int8 weights × activations that never hold −128).
    unsafe fn mac_wide(acc32: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;

    /// The total of the partial sums.
    unsafe fn total(acc: Self::Acc) -> i32;
}

/// Plain NEON: `SMULL`/`SMLAL2` into eight i16 lanes, widened with `SADALP`.
struct Smlal;

impl Dot for Smlal {
    type Acc = int16x8_t;

    #[inline(always)]
    unsafe fn zero() -> int16x8_t {
        vdupq_n_s16(0)
    }

    #[inline(always)]
    unsafe fn mac(acc: int16x8_t, a: int8x16_t, b: int8x16_t) -> int16x8_t {
        vmlal_high_s8(vmlal_s8(acc, vget_low_s8(a), vget_low_s8(b)), a, b)
    }

    #[inline(always)]
    unsafe fn opaque(mut codes: int8x16_t) -> int8x16_t {
        // SAFETY: an empty template: only hides the codes from LLVM, which otherwise sees that
        // they are small and non-negative and widens both operands for 16-bit `MLA`s (six
        // instructions per 16 products instead of `SMLAL` + `SMLAL2`).
        unsafe {
            asm!("/* {0:v} */", inout(vreg) codes, options(pure, nomem, nostack, preserves_flags));
        }
        codes
    }

    #[inline(always)]
    unsafe fn add(a: int16x8_t, b: int16x8_t) -> int16x8_t {
        vaddq_s16(a, b)
    }

    #[inline(always)]
    unsafe fn accumulate(acc32: int32x4_t, acc: int16x8_t) -> int32x4_t {
        vpadalq_s16(acc32, acc)
    }

    #[inline(always)]
    unsafe fn mac_wide(acc32: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // Two products of at most 128·127 per i16 lane: at most 32 512, inside i16.
        let pairs = vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b);
        vpadalq_s16(acc32, pairs)
    }

    #[inline(always)]
    unsafe fn total(acc: int16x8_t) -> i32 {
        vaddlvq_s16(acc)
    }
}

/// NEON with the `dotprod` extension: `SDOT` adds four products to each of four i32 lanes.
struct Sdot;

impl Sdot {
    /// `acc + Σ` of each lane's four products (`SDOT`).
    #[inline(always)]
    unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: `SDOT` only reads and writes these registers; the caller (a `dotprod`
        // function this inlines into) guarantees the CPU has it.
        unsafe {
            asm!(
                "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                acc = inout(vreg) acc,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        acc
    }
}

impl Dot for Sdot {
    type Acc = int32x4_t;

    #[inline(always)]
    unsafe fn zero() -> int32x4_t {
        vdupq_n_s32(0)
    }

    #[inline(always)]
    unsafe fn mac(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        Self::sdot(acc, a, b)
    }

    #[inline(always)]
    unsafe fn opaque(codes: int8x16_t) -> int8x16_t {
        codes
    }

    #[inline(always)]
    unsafe fn add(a: int32x4_t, b: int32x4_t) -> int32x4_t {
        vaddq_s32(a, b)
    }

    #[inline(always)]
    unsafe fn accumulate(acc32: int32x4_t, acc: int32x4_t) -> int32x4_t {
        vaddq_s32(acc32, acc)
    }

    #[inline(always)]
    unsafe fn mac_wide(acc32: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        Self::sdot(acc32, a, b)
    }

    #[inline(always)]
    unsafe fn total(acc: int32x4_t) -> i32 {
        vaddvq_s32(acc)
    }
}

/// The totals of four vectors of four i32 lanes, as one vector `[Σv0, Σv1, Σv2, Σv3]`.
#[inline(always)]
unsafe fn totals4(v: [int32x4_t; 4]) -> int32x4_t {
    vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]))
}

/// Four f16 values (as bits) widened to f32, exactly (`FCVTL`).
#[inline(always)]
unsafe fn f16x4_to_f32(bits: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: `FCVTL` (half → single) is base Armv8 SIMD; it only touches these registers.
    unsafe {
        asm!(
            "fcvtl {out:v}.4s, {bits:v}.4h",
            out = lateout(vreg) out,
            bits = in(vreg) bits,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// Eight f16 values (as bits) widened to f32, exactly (`FCVTL`, `FCVTL2`).
#[inline(always)]
unsafe fn f16x8_to_f32(bits: uint16x8_t) -> [float32x4_t; 2] {
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: as for `f16x4_to_f32`.
    unsafe {
        asm!(
            "fcvtl {lo:v}.4s, {bits:v}.4h",
            "fcvtl2 {hi:v}.4s, {bits:v}.8h",
            lo = out(vreg) lo,
            hi = lateout(vreg) hi,
            bits = in(vreg) bits,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    [lo, hi]
}

/// One f16 value (as bits) widened to f32, exactly (scalar `FCVT`).
#[inline(always)]
unsafe fn f16_to_f32(bits: u16) -> f32 {
    let out: f32;
    // SAFETY: scalar `FCVT` (half → single) is base Armv8 floating point; registers only.
    unsafe {
        asm!(
            "fcvt {out:s}, {bits:h}",
            out = lateout(vreg) out,
            bits = in(vreg) bits,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// The f16 at `p` (little-endian, any alignment) widened to f32.
///
/// # Safety
/// Two bytes must be readable at `p`.
#[inline(always)]
unsafe fn load_f16(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees two readable bytes.
    unsafe { f16_to_f32(u16::from_le_bytes(p.cast::<[u8; 2]>().read())) }
}

/// Declares every integer kernel once per variant: `plain::name` instantiates the generic body
/// with [`Smlal`] (safe: NEON is part of every AArch64 target), `dotprod::name` with [`Sdot`]
/// in a function compiled for `dotprod`. Each body asserts the shapes it reads.
macro_rules! variants {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
            = $module:ident::$body:ident$([$($extra:expr),*])?;
    )*) => {
        /// The plain NEON variant (every AArch64 core).
        pub mod plain {
            use super::*;
            $(
                $(#[doc = $doc])*
                pub fn $name($($arg: $ty),*) -> $ret {
                    // SAFETY: `Smlal` needs nothing beyond NEON, which every AArch64 target
                    // has; the body asserts the shapes before it reads.
                    unsafe { $module::$body::<Smlal $($(, { $extra })*)?>($($arg),*) }
                }
            )*
        }

        /// The `dotprod` variant (`SDOT`).
        pub mod dotprod {
            use super::*;
            $(
                $(#[doc = $doc])*
                ///
                /// # Safety
                /// The CPU must support the `dotprod` extension.
                #[target_feature(enable = "dotprod")]
                pub unsafe fn $name($($arg: $ty),*) -> $ret {
                    // SAFETY: this function's contract gives `SDOT`; the body asserts the
                    // shapes before it reads.
                    unsafe { $module::$body::<Sdot $($(, { $extra })*)?>($($arg),*) }
                }
            )*
        }
    };
}

variants! {
    /// Σ code·q over an I2_S row (see [`crate::kernels::scalar::i2s_code_dot`]).
    fn i2s_code_dot(row: &[u8], q: &[i8]) -> i32 = ternary::i2s_code_dot;
    /// [`i2s_code_dot`](plain::i2s_code_dot) of four consecutive rows (`rows` holds all four)
    /// against one token row.
    fn i2s_code_dot_rows4(rows: &[u8], q: &[i8]) -> [i32; 4] = ternary::i2s_code_dot_rows4;
    /// [`i2s_code_dot`](plain::i2s_code_dot) of one row against four token rows.
    fn i2s_code_dot_x4(row: &[u8], q: [&[i8]; 4]) -> [i32; 4] = ternary::i2s_code_dot_x4;
    /// TQ2_0 row · Q8_K activations, bit-identical to [`crate::kernels::scalar::tq2_0_dot`].
    fn tq2_0_dot(row: &[u8], act: &[Q8KBlock]) -> f32
        = ternary::ternary_dot[TQ2_0_BLOCK_BYTES];
    /// Four consecutive TQ2_0 rows (`rows` holds all four) · Q8_K activations.
    fn tq2_0_dot_rows4(rows: &[u8], act: &[Q8KBlock]) -> [f32; 4]
        = ternary::ternary_dot_rows4[TQ2_0_BLOCK_BYTES];
    /// TQ2_0 row · Q8_K activations of four tokens.
    fn tq2_0_dot_x4(row: &[u8], act: [&[Q8KBlock]; 4]) -> [f32; 4]
        = ternary::ternary_dot_x4[TQ2_0_BLOCK_BYTES];
    /// TQ1_0 row · Q8_K activations, bit-identical to [`crate::kernels::scalar::tq1_0_dot`].
    fn tq1_0_dot(row: &[u8], act: &[Q8KBlock]) -> f32
        = ternary::ternary_dot[TQ1_0_BLOCK_BYTES];
    /// Four consecutive TQ1_0 rows (`rows` holds all four) · Q8_K activations.
    fn tq1_0_dot_rows4(rows: &[u8], act: &[Q8KBlock]) -> [f32; 4]
        = ternary::ternary_dot_rows4[TQ1_0_BLOCK_BYTES];
    /// TQ1_0 row · Q8_K activations of four tokens.
    fn tq1_0_dot_x4(row: &[u8], act: [&[Q8KBlock]; 4]) -> [f32; 4]
        = ternary::ternary_dot_x4[TQ1_0_BLOCK_BYTES];
    /// Q8_0 row · Q8_0 activations (equal to the scalar path up to float summation order).
    fn q8_0_dot(row: &[u8], act: &[Q8_0Block]) -> f32 = blocks::q8_0_dot;
    /// Q6_K row · Q8_K activations, bit-identical to [`crate::kernels::scalar::q6_k_dot`].
    fn q6_k_dot(row: &[u8], act: &[Q8KBlock]) -> f32 = blocks::q6_k_dot;
    /// Q4_0 row · Q8_0 activations, bit-identical to [`crate::kernels::scalar::q4_0_dot`].
    fn q4_0_dot(row: &[u8], act: &[Q8_0Block]) -> f32 = k_quants::q4_0_dot;
    /// MXFP4 row · Q8_0 activations, bit-identical to [`crate::kernels::scalar::mxfp4_dot`].
    fn mxfp4_dot(row: &[u8], act: &[Q8_0Block]) -> f32 = k_quants::mxfp4_dot;
    /// Q4_K row · Q8_K activations, bit-identical to [`crate::kernels::scalar::q4_k_dot`].
    fn q4_k_dot(row: &[u8], act: &[Q8KBlock]) -> f32 = k_quants::q4_k_dot;
    /// Q5_K row · Q8_K activations, bit-identical to [`crate::kernels::scalar::q5_k_dot`].
    fn q5_k_dot(row: &[u8], act: &[Q8KBlock]) -> f32 = k_quants::q5_k_dot;
}
