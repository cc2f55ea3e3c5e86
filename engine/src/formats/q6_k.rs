//! ggml's Q6_K layout: 256-element blocks of 6-bit values with one int8 scale per 16 elements
//! and an f16 scale per block (6.5625 bits per weight). Used for LM heads and embeddings by
//! llama.cpp's quantizer, and by `--lm-head q6_k`.
//!
//! Block bytes: `ql[128]` (low 4 bits), `qh[64]` (high 2 bits), `scales[16]` (i8), `d` (f16).
//! Element `e` lies in half `h = e / 128`; within it, quadrant `k = (e % 128) / 32` and lane
//! `l = e % 32`: low bits from `ql[64h + l + 32(k & 1)]` (low nibble for `k < 2`, high
//! otherwise), high bits from `qh[32h + l] >> 2k`, scale `scales[8h + l / 16 + 2k]`, and the
//! value is `d · scale · (q − 32)`.

use half::f16;

use super::{nearest_int, signed_absmax, Encode, Layout};

/// Elements per Q6_K block.
pub const Q6_K_BLOCK: usize = 256;
/// Bytes per Q6_K block.
pub const Q6_K_BLOCK_BYTES: usize = 210;
/// Offset of `qh` in a block.
pub const Q6_K_QH: usize = 128;
/// Offset of the sixteen int8 sub-block scales in a block.
pub const Q6_K_SCALES: usize = 192;
/// Offset of the f16 block scale.
pub const Q6_K_D: usize = 208;

/// The Q6_K layout.
#[derive(Debug, Clone, Copy)]
pub struct Q6K;

impl Layout for Q6K {
    const NAME: &'static str = "Q6_K";
    const BLOCK: usize = Q6_K_BLOCK;
    const BLOCK_BYTES: usize = Q6_K_BLOCK_BYTES;
    const SCALES: &'static [usize] = &[Q6_K_D];

    fn decode_block(&self, block: &[u8], out: &mut [f32]) {
        decode_q6_k_block(block, out);
    }
}

impl Encode for Q6K {
    fn encode_block(values: &[f32], out: &mut [u8]) {
        out.copy_from_slice(&q6_k_block(values));
    }
}

/// The f16 block scale `d` of a Q6_K block.
pub fn q6_k_d(block: &[u8]) -> f32 {
    f16::from_le_bytes([block[Q6_K_D], block[Q6_K_D + 1]]).to_f32()
}

/// Index of the sub-block scale that element `e` (0..256) uses.
pub fn q6_k_scale_index(e: usize) -> usize {
    let (h, j) = (e / 128, e % 128);
    8 * h + (j % 32) / 16 + 2 * (j / 32)
}

/// The 6-bit value (0..64; subtract 32 for the signed weight) of element `e` of a block.
pub fn q6_k_code(block: &[u8], e: usize) -> u8 {
    let (h, j) = (e / 128, e % 128);
    let (k, l) = (j / 32, j % 32);
    let low = block[64 * h + l + 32 * (k & 1)];
    let low = if k < 2 { low & 0xF } else { low >> 4 };
    let high = (block[Q6_K_QH + 32 * h + l] >> (2 * k)) & 3;
    low | (high << 4)
}

/// Decodes one Q6_K block into 256 values.
pub fn decode_q6_k_block(block: &[u8], out: &mut [f32]) {
    let d = q6_k_d(block);
    for (e, v) in out.iter_mut().enumerate().take(Q6_K_BLOCK) {
        let sc = f32::from(block[Q6_K_SCALES + q6_k_scale_index(e)] as i8);
        *v = d * sc * f32::from(i16::from(q6_k_code(block, e)) - 32);
    }
}

/// The scale of 16 values in 6-bit levels −32..=31 that minimises Σ x²·(x − s·l)², searched
/// over 19 candidate steps around `max/−32` (ggml's `make_qx_quants` with x² weights). Written
/// over fixed arrays with per-lane products so that the compiler vectorises it (a 2B4T head is
/// 20 M sub-blocks).
fn sub_block_scale(x: &[f32; 16]) -> f32 {
    let max = signed_absmax(x);
    if max.abs() < 1e-15 {
        return 0.0;
    }
    let w = x.map(|v| v * v);
    let fit = |iscale: f32| {
        let mut lx = [0.0f32; 16];
        let mut l2 = [0.0f32; 16];
        for i in 0..16 {
            let l = nearest_int(iscale * x[i]).clamp(-32, 31) as f32;
            lx[i] = w[i] * x[i] * l;
            l2[i] = w[i] * l * l;
        }
        (lx.iter().sum::<f32>(), l2.iter().sum::<f32>())
    };
    let (sumlx, suml2) = fit(-32.0 / max);
    let mut scale = if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for step in (-9..=9).filter(|&s| s != 0) {
        let (sumlx, suml2) = fit(-(32.0 + 0.1 * step as f32) / max);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Quantizes 256 values into one Q6_K block: a least-squares scale per 16 values, those
/// scales quantized to int8 against the block's largest one, then every value rounded to the
/// nearest level of its quantized scale.
pub fn q6_k_block(x: &[f32]) -> [u8; Q6_K_BLOCK_BYTES] {
    let mut scales = [0.0f32; 16];
    for (s, sub) in scales.iter_mut().zip(x.chunks_exact(16)) {
        let mut values = [0.0f32; 16];
        values.copy_from_slice(sub);
        *s = sub_block_scale(&values);
    }
    let max = signed_absmax(&scales);
    if max.abs() < 1e-15 {
        // All zero: every code 32 (value 0), scales and d 0.
        return pack(&[32; Q6_K_BLOCK], [0; 16], f16::ZERO);
    }
    let iscale = -128.0 / max;
    let d = f16::from_f32(1.0 / iscale);
    let sc = scales.map(|s| nearest_int(iscale * s).min(127) as i8);
    let mut codes = [0u8; Q6_K_BLOCK];
    // Sub-block `sb` holds elements 16·sb.. and uses scale `sb` (see `q6_k_scale_index`).
    for ((c, v), &s) in codes.chunks_exact_mut(16).zip(x.chunks_exact(16)).zip(&sc) {
        let step = d.to_f32() * f32::from(s);
        for (c, &v) in c.iter_mut().zip(v) {
            let l = if step == 0.0 {
                0
            } else {
                nearest_int(v / step).clamp(-32, 31)
            };
            *c = (l + 32) as u8;
        }
    }
    pack(&codes, sc, d)
}

/// Lays out 256 six-bit codes, the sub-block scales and `d` as a Q6_K block (the inverse of
/// [`q6_k_code`] and friends).
fn pack(codes: &[u8; Q6_K_BLOCK], scales: [i8; 16], d: f16) -> [u8; Q6_K_BLOCK_BYTES] {
    let mut block = [0u8; Q6_K_BLOCK_BYTES];
    for h in 0..2 {
        for l in 0..32 {
            let q = [0, 1, 2, 3].map(|k| codes[128 * h + 32 * k + l]);
            block[64 * h + l] = (q[0] & 0xF) | ((q[2] & 0xF) << 4);
            block[64 * h + 32 + l] = (q[1] & 0xF) | ((q[3] & 0xF) << 4);
            block[Q6_K_QH + 32 * h + l] =
                (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
        }
    }
    for (b, s) in block[Q6_K_SCALES..Q6_K_D].iter_mut().zip(scales) {
        *b = s as u8;
    }
    block[Q6_K_D..].copy_from_slice(&d.to_le_bytes());
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_the_bit_layout() {
        let codes: [u8; Q6_K_BLOCK] = std::array::from_fn(|e| ((e * 37 + 11) % 64) as u8);
        let scales: [i8; 16] = std::array::from_fn(|i| (i as i32 * 17 - 128) as i8);
        let block = pack(&codes, scales, f16::from_f32(0.25));
        for (e, &c) in codes.iter().enumerate() {
            assert_eq!(q6_k_code(&block, e), c, "element {e}");
        }
        for (i, &s) in scales.iter().enumerate() {
            assert_eq!(block[Q6_K_SCALES + i] as i8, s);
        }
        assert_eq!(q6_k_d(&block), 0.25);
    }

    #[test]
    fn scale_index_follows_quadrants() {
        assert_eq!(q6_k_scale_index(0), 0);
        assert_eq!(q6_k_scale_index(16), 1);
        assert_eq!(q6_k_scale_index(32), 2);
        assert_eq!(q6_k_scale_index(127), 7);
        assert_eq!(q6_k_scale_index(128), 8);
        assert_eq!(q6_k_scale_index(255), 15);
    }

    #[test]
    fn quantization_error_is_within_half_a_step() {
        let x: Vec<f32> = (0..Q6_K_BLOCK)
            .map(|i| ((i as f32 * 0.731).sin() * 0.3) * if i % 16 == 3 { 4.0 } else { 1.0 })
            .collect();
        let block = q6_k_block(&x);
        let mut y = [0.0f32; Q6_K_BLOCK];
        decode_q6_k_block(&block, &mut y);
        let d = q6_k_d(&block);
        for e in 0..Q6_K_BLOCK {
            let step = (d * f32::from(block[Q6_K_SCALES + q6_k_scale_index(e)] as i8)).abs();
            // Half a step from rounding, plus the int8 rounding of the sub-block scale.
            assert!(
                (x[e] - y[e]).abs() <= step * 1.01,
                "element {e}: {} vs {}",
                x[e],
                y[e]
            );
        }
        let zero = q6_k_block(&[0.0; Q6_K_BLOCK]);
        decode_q6_k_block(&zero, &mut y);
        assert!(y.iter().all(|&v| v == 0.0));
    }
}
