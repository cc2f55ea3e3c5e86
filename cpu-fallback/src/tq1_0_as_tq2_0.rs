//! TQ1_0 matrices rewritten as TQ2_0 at load. Both are ggml's ternary layouts with one f16
//! scale per 256 weights; TQ1_0 packs five base-3 digits a byte (1.69 bits a weight), which the
//! kernels unpack with about six vector operations per 32 weights, where TQ2_0's 2-bit codes
//! take one. The rewrite keeps every code and scale, so a product is the very float the TQ1_0
//! kernels compute (the two share one scalar accumulation), from 22 % more bytes that its
//! kernels read at the memory's speed: TQ1_0's are bound by their arithmetic.

use hesper_engine::formats::{tq1_0_code, TQ1_0_BLOCK_BYTES, TQ2_0_BLOCK_BYTES};
use rayon::prelude::*;

/// The TQ2_0 blocks of `data`'s TQ1_0 blocks, in the same order (so a matrix's rows stay
/// rows), split between the threads.
pub fn rewrite(data: &[u8]) -> Vec<u8> {
    debug_assert!(data.len().is_multiple_of(TQ1_0_BLOCK_BYTES));
    let blocks = data.len() / TQ1_0_BLOCK_BYTES;
    let mut out = vec![0u8; blocks * TQ2_0_BLOCK_BYTES];
    data.par_chunks_exact(TQ1_0_BLOCK_BYTES)
        .zip(out.par_chunks_exact_mut(TQ2_0_BLOCK_BYTES))
        .with_min_len(1024)
        .for_each(|(src, dst)| rewrite_block(src, dst));
    out
}

/// [`rewrite_block`] with AVX2 where the CPU has it (the kernels' own unpacking, about twenty
/// times faster), else the scalar one.
fn rewrite_block(src: &[u8], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        assert!(src.len() >= TQ1_0_BLOCK_BYTES && dst.len() >= TQ2_0_BLOCK_BYTES);
        // SAFETY: AVX2 was detected just above; both blocks are whole (asserted).
        unsafe { crate::kernels::avx2::tq1_0_as_tq2_0_block(src.as_ptr(), dst.as_mut_ptr()) };
        return;
    }
    rewrite_block_scalar(src, dst);
}

/// One block: element `e`'s code (weight + 1, [`tq1_0_code`]) in bits `2·((e % 128) / 32)` of
/// byte `32·(e / 128) + e % 32` (TQ2_0's order), then the scale as it was. `dst` starts zeroed.
fn rewrite_block_scalar(src: &[u8], dst: &mut [u8]) {
    for e in 0..256 {
        dst[(e / 128) * 32 + e % 32] |= tq1_0_code(src, e) << (2 * ((e % 128) / 32));
    }
    dst[TQ2_0_BLOCK_BYTES - 2..].copy_from_slice(&src[TQ1_0_BLOCK_BYTES - 2..]);
}

#[cfg(test)]
mod tests {
    use hesper_engine::formats::{tq2_0_code, Encode, Layout, Tq1_0, Tq2_0};

    use super::*;

    /// Weights per block of either layout.
    const BLOCK: usize = 256;

    #[test]
    fn every_code_and_scale_survives_the_rewrite() {
        // Two blocks of values in every ternary state, with different scales.
        let values: Vec<f32> = (0..2 * BLOCK)
            .map(|i| [0.0, 1.0, -1.0][(i * 7 + i / 5) % 3] * if i < BLOCK { 0.5 } else { 3.0 })
            .collect();
        let mut tq1 = vec![0u8; 2 * TQ1_0_BLOCK_BYTES];
        for (v, b) in values
            .chunks_exact(BLOCK)
            .zip(tq1.chunks_exact_mut(TQ1_0_BLOCK_BYTES))
        {
            Tq1_0::encode_block(v, b);
        }
        let tq2 = rewrite(&tq1);
        assert_eq!(tq2.len(), 2 * TQ2_0_BLOCK_BYTES);
        for (b1, b2) in tq1
            .chunks_exact(TQ1_0_BLOCK_BYTES)
            .zip(tq2.chunks_exact(TQ2_0_BLOCK_BYTES))
        {
            for e in 0..BLOCK {
                assert_eq!(tq2_0_code(b2, e), tq1_0_code(b1, e), "element {e}");
            }
        }
        let (mut from1, mut from2) = (vec![0.0; 2 * BLOCK], vec![0.0; 2 * BLOCK]);
        Tq1_0.decode_row(&tq1, &mut from1);
        Tq2_0.decode_row(&tq2, &mut from2);
        assert_eq!(from1, from2);
        assert_eq!(from1, values);
    }

    #[test]
    fn the_simd_rewrite_equals_the_scalar_one_on_any_bytes() {
        // Every byte value in every position (a byte ggml's quantizer would not write too):
        // both read the digit `(3·(q·3ⁿ mod 256)) >> 8`.
        let mut s = 5u64;
        let src: Vec<u8> = (0..64 * TQ1_0_BLOCK_BYTES)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 56) as u8
            })
            .collect();
        let mut want = vec![0u8; 64 * TQ2_0_BLOCK_BYTES];
        for (a, b) in src
            .chunks_exact(TQ1_0_BLOCK_BYTES)
            .zip(want.chunks_exact_mut(TQ2_0_BLOCK_BYTES))
        {
            rewrite_block_scalar(a, b);
        }
        assert_eq!(rewrite(&src), want);
    }
}
