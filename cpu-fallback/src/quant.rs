//! Activation quantizers, exactly as the reference implementations define them.

use half::{bf16, f16, slice::HalfFloatSliceExt};
pub use hesper_engine::formats::nearest_int;
use hesper_engine::formats::signed_absmax;

/// Elements per ggml Q8_K block.
pub const QK_K: usize = 256;

/// One token's activations quantized per token to int8 (bitnet.cpp `quantize_row_i8_s`, the
/// BitNet b1.58 A8 rule): `s = 127 / max(max|x|, 1e-5)`, `q = clamp(rne(x·s), −128, 127)`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct I8Row {
    /// Quantized values.
    pub q: Vec<i8>,
    /// The scale `s` (x ≈ q / s).
    pub scale: f32,
    /// Σ q, used to turn code sums (codes 0..2) into ternary sums.
    pub sum: i32,
}

/// Quantizes `x` per token (see [`I8Row`]).
pub fn quantize_i8_row(x: &[f32]) -> I8Row {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU reported AVX2.
        return unsafe { quantize_i8_row_avx2(x) };
    }
    quantize_i8_row_body(x)
}

/// [`quantize_i8_row`] compiled for AVX2: the same code, eight lanes wide (a measurable share
/// of prefill at SSE2's four).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_i8_row_avx2(x: &[f32]) -> I8Row {
    quantize_i8_row_body(x)
}

/// The quantizer's one definition, inlined into each compiled form.
#[inline(always)]
fn quantize_i8_row_body(x: &[f32]) -> I8Row {
    let max = x.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    let s = (127.0 / f64::from(max).max(1e-5)) as f32;
    let q: Vec<i8> = x
        .iter()
        .map(|&v| nearest_int(v * s).clamp(-128, 127) as i8)
        .collect();
    let sum = q.iter().map(|&v| i32::from(v)).sum();
    I8Row { q, scale: s, sum }
}

/// One ggml Q8_K block: `x ≈ d · q`.
#[derive(Debug, Clone, PartialEq)]
pub struct Q8KBlock {
    /// Scale; negative when the block's extreme value is positive (ggml's `-127/max` rule).
    pub d: f32,
    /// Quantized values.
    pub qs: [i8; QK_K],
    /// Σ qs.
    pub sum: i32,
    /// Σ qs of each 16 values (ggml's `bsums`; Q6_K subtracts its offset of 32 with them).
    pub bsums: [i16; QK_K / 16],
}

/// Quantizes `x` (a multiple of 256 long) into Q8_K blocks like ggml's
/// `quantize_row_q8_K_ref`: the signed value with the largest magnitude (first on ties)
/// gives `iscale = −127/max`, `q = min(127, rne(iscale·x))`, `d = 1/iscale`.
pub fn quantize_q8_k(x: &[f32]) -> Vec<Q8KBlock> {
    x.chunks_exact(QK_K)
        .map(|xb| {
            let max = signed_absmax(xb);
            let mut blk = Q8KBlock {
                d: 0.0,
                qs: [0; QK_K],
                sum: 0,
                bsums: [0; QK_K / 16],
            };
            if max != 0.0 {
                let iscale = -127.0 / max;
                for (q, &v) in blk.qs.iter_mut().zip(xb) {
                    *q = nearest_int(iscale * v).min(127) as i8;
                }
                for (b, q) in blk.bsums.iter_mut().zip(blk.qs.chunks_exact(16)) {
                    *b = q.iter().map(|&q| i16::from(q)).sum();
                }
                blk.sum = blk.bsums.iter().map(|&b| i32::from(b)).sum();
                blk.d = 1.0 / iscale;
            }
            blk
        })
        .collect()
}

/// One ggml Q8_0 block of activations: `x ≈ d · q`, `d` stored as f16.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Q8_0Block {
    /// Scale (already rounded through f16).
    pub d: f32,
    /// Quantized values.
    pub qs: [i8; 32],
}

/// Quantizes activations `x` into Q8_0 blocks as llama.cpp's CPU backend does on x86
/// (`quantize_row_q8_0`, the AVX path): `d = amax/127` (stored as f16),
/// `q = x · (127/amax)` rounded half to even. (Weights are quantized by the reference
/// `q8_0_block`: `1/d`, half away from zero; on activations the two differ in a code now and then.)
pub fn quantize_q8_0(x: &[f32]) -> Vec<Q8_0Block> {
    x.chunks_exact(32)
        .map(|xb| {
            let amax = xb.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mut qs = [0i8; 32];
            for (q, &v) in qs.iter_mut().zip(xb) {
                *q = (v * id).round_ties_even() as i8;
            }
            Q8_0Block {
                d: f16::from_f32(amax / 127.0).to_f32(),
                qs,
            }
        })
        .collect()
}

/// Rounds every value through f16 (what ggml does to activations multiplied with F16 weights),
/// a slice at a time (`half`'s slice conversions use the CPU's F16C where it has one: the same
/// round-to-nearest-even as one value at a time, eight values an instruction).
pub fn round_f16(x: &[f32]) -> Vec<f32> {
    let mut halves = vec![f16::ZERO; x.len()];
    halves.convert_from_f32_slice(x);
    let mut out = vec![0.0; x.len()];
    halves.convert_to_f32_slice(&mut out);
    out
}

/// Rounds every value through bf16 (activations multiplied with BF16 weights), a slice at a
/// time as [`round_f16`] does.
pub fn round_bf16(x: &[f32]) -> Vec<f32> {
    let mut halves = vec![bf16::ZERO; x.len()];
    halves.convert_from_f32_slice(x);
    let mut out = vec![0.0; x.len()];
    halves.convert_to_f32_slice(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_rounding_equals_one_value_at_a_time() {
        // Ties (1 + 2^-11 lies halfway between two halves), subnormal halves, values past the
        // largest half, signed zeros and infinities; 37 values, so the slice has a remainder
        // past its runs of eight.
        let mut x = vec![
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            3.0e-7,
            -6.0e-8,
        ];
        x.extend([65520.0, -70000.0, -0.0, f32::INFINITY, 1.0e-30, 0.1]);
        x.extend((0..27).map(|i| (i as f32 - 13.0) * 0.377_1));
        let one_by_one: Vec<u32> = x
            .iter()
            .map(|&v| f16::from_f32(v).to_f32().to_bits())
            .collect();
        let sliced: Vec<u32> = round_f16(&x).iter().map(|v| v.to_bits()).collect();
        assert_eq!(sliced, one_by_one);
        let one_by_one: Vec<u32> = x
            .iter()
            .map(|&v| bf16::from_f32(v).to_f32().to_bits())
            .collect();
        let sliced: Vec<u32> = round_bf16(&x).iter().map(|v| v.to_bits()).collect();
        assert_eq!(sliced, one_by_one);
    }

    #[test]
    fn i8_rounds_half_to_even_and_scales_by_max() {
        let x = [1.0f32, -0.5, 0.25, 2.5 / 127.0];
        let r = quantize_i8_row(&x);
        assert_eq!(r.scale, 127.0);
        assert_eq!(r.q, vec![127, -64, 32, 2]); // -63.5 -> -64, 31.75 -> 32, 2.5 -> 2
        assert_eq!(r.sum, 127 - 64 + 32 + 2);
        let r = quantize_i8_row(&[0.0; 4]);
        assert_eq!(r.q, vec![0; 4]);
        assert_eq!(r.scale, (127.0f64 / 1e-5) as f32);
    }

    #[test]
    fn q8_k_uses_negative_scale_for_positive_extreme() {
        let mut x = vec![0.0f32; 256];
        x[0] = 2.0;
        x[1] = -1.0;
        x[2] = 1.0 / 127.0 * 2.0 * 0.5;
        let out = quantize_q8_k(&x);
        let b = &out[0];
        assert!(b.d < 0.0);
        assert_eq!(b.qs[0], -127);
        assert_eq!(b.qs[1], 64); // 63.5 rounds to even
        assert_eq!(b.qs[2], 0); // -0.5 rounds to even (0)
        assert_eq!(b.sum, -127 + 64);
        let out = quantize_q8_k(&[0.0; 256]);
        assert_eq!(out[0].d, 0.0);
    }

    #[test]
    fn nearest_int_is_round_half_even() {
        for v in [
            -3.5f32, -2.5, -0.5, 0.5, 1.5, 2.5, 126.5, -127.5, 0.49999997, 3.2, -7.8,
        ] {
            assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
        }
    }

    #[test]
    fn q8_0_activations_round_ties_to_even_as_llama_cpp_does_on_x86() {
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 0.5;
        x[2] = -2.5;
        x[3] = 1.5;
        let out = quantize_q8_0(&x);
        assert_eq!(&out[0].qs[..4], &[127, 0, -2, 2]);
        assert_eq!(out[0].d, 1.0);
    }
}
