//! Halves rounded the same way on every WebGPU implementation. WGSL leaves the rounding of
//! `quantizeToF16` and `pack2x16float` to the implementation (either neighbour of a value
//! between two halves is allowed, and a subnormal half may be flushed to zero, as lavapipe's
//! `quantizeToF16` does), while the CPU backend and ggml round to nearest, ties to even: the
//! f16 KV cache, an F16 product's activations and a Q8_0 block's scale go through [`f16_bits`].

use hesper_dsl::{kernel, kernel_fn};

/// The bits of the IEEE half nearest `x`, ties to even (the CPU's `half::f16::from_f32`;
/// NaN payloads aside), in integer operations.
#[kernel_fn]
pub fn f16_bits(x: f32) -> u32 {
    let b = f32_to_bits(x);
    let sign = (b >> 16u32) & 32768u32;
    let e = (b >> 23u32) & 255u32;
    let m = b & 8388607u32;
    let mut h = 0u32;
    if e == 255u32 {
        // ∞, or NaN (kept quiet).
        h = 31744u32 | select(0u32, 512u32, m != 0u32);
    } else if e > 142u32 {
        // Past the largest half: ∞.
        h = 31744u32;
    } else if e > 112u32 {
        // A normal half: exponent e − 112, the top ten mantissa bits, then rounding (a carry
        // out of the mantissa steps the exponent, up to ∞, as it should).
        h = ((e - 112u32) << 10u32) | (m >> 13u32);
        let rest = m & 8191u32;
        if rest > 4096u32 || (rest == 4096u32 && (h & 1u32) == 1u32) {
            h += 1u32;
        }
    } else if e > 101u32 {
        // A subnormal half: units of 2^−24.
        let full = m | 8388608u32;
        let shift = 126u32 - e;
        h = full >> shift;
        let rest = full & ((1u32 << shift) - 1u32);
        let tie = 1u32 << (shift - 1u32);
        if rest > tie || (rest == tie && (h & 1u32) == 1u32) {
            h += 1u32;
        }
    }
    sign | h
}

/// Rounds `len` values of `x` (`len` even) to halves packed two to a word, the lower first:
/// the activations an F16 product multiplies (ggml rounds them to f16 for an F16 matrix).
/// Rounded once here, not once per weight row in the product; thread `i` packs values `2i`
/// and `2i + 1`.
#[kernel(workgroup = 256, uses(f16_bits))]
pub fn pack_f16(x: &[f32], h: &mut [u32], #[uniform] len: u32) {
    let i = gid();
    if 2u32 * i < len {
        let a = 2u32 * i;
        h[i] = f16_bits(x[a]) | (f16_bits(x[a + 1u32]) << 16u32);
    }
}
