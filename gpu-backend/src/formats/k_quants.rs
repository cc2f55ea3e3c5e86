//! The upload every K-quant layout shares (`Kind::Kq`, `matvec_kq`): each row's codes as their
//! low four bits (nibbles, eight to a word, element `8i + b` in bits `4b..4b + 4` of word `i`)
//! and then their bits above those (none for Q4_K, one for Q5_K, two for Q6_K, packed from the
//! lowest bit up), then two bytes per sub-block, two sub-blocks to a word (the earlier in the
//! low half): its integer scale (the low byte, signed) and minimum (the high byte); `d` and
//! `dmin` of every block as f32. One kernel reads all three types. The codes and scales take
//! the file's bits (Q4_K's and Q5_K's six-bit scales and minimums a byte each): with the f32
//! `d` and `dmin` beside them, Q4_K and Q5_K rows are 1.06 and 1.05 times their file size,
//! Q6_K's 1.10.

use std::borrow::Cow;

use hesper_engine::formats::Layout;

/// How a K-quant layout's block reads, for [`repack`].
pub(super) struct KBlock {
    /// Values per sub-block.
    pub sub: usize,
    /// A code's bits above its nibble: 0, 1 or 2.
    pub high: usize,
    /// The bits of element `e`'s code (what multiplies the sub-block's scale is these less the
    /// route's `offset`).
    pub code: fn(&[u8], usize) -> u8,
    /// The integer scale and minimum of every sub-block (`256 / sub` of them).
    pub scales_mins: fn(&[u8]) -> Vec<(i8, u8)>,
    /// `d` and `dmin`.
    pub d_dmin: fn(&[u8]) -> (f32, f32),
}

/// Whole rows `src` (of `cols` values) of layout `L`, read as `k` says, in the upload layout.
pub(super) fn repack<L: Layout>(
    src: &[u8],
    cols: usize,
    k: &KBlock,
) -> (Cow<'static, [u8]>, Option<Vec<f32>>) {
    let blocks = cols / L::BLOCK;
    let subs = L::BLOCK / k.sub;
    let rows = src.len() / L::row_bytes(cols);
    let mut bytes = Vec::with_capacity(rows * (cols / 2 + cols * k.high / 8 + 2 * blocks * subs));
    let mut scales = Vec::with_capacity(2 * rows * blocks);
    for row in src.chunks_exact(L::row_bytes(cols)) {
        let codes: Vec<u8> = row
            .chunks_exact(L::BLOCK_BYTES)
            .flat_map(|blk| (0..L::BLOCK).map(move |e| (k.code)(blk, e)))
            .collect();
        // Two nibbles a byte, the earlier low; then the high bits, 8 / high a byte, the
        // earliest lowest.
        bytes.extend(
            codes
                .chunks_exact(2)
                .map(|p| (p[0] & 15) | ((p[1] & 15) << 4)),
        );
        if let Some(per_byte) = 8usize.checked_div(k.high) {
            bytes.extend(codes.chunks_exact(per_byte).map(|group| {
                group
                    .iter()
                    .enumerate()
                    .fold(0u8, |b, (i, &c)| b | ((c >> 4) << (k.high * i)))
            }));
        }
        for blk in row.chunks_exact(L::BLOCK_BYTES) {
            for (scale, min) in (k.scales_mins)(blk) {
                bytes.extend([scale as u8, min]);
            }
            let (d, dmin) = (k.d_dmin)(blk);
            scales.extend([d, dmin]);
        }
    }
    (Cow::Owned(bytes), Some(scales))
}

#[cfg(test)]
mod tests {
    use hesper_engine::formats::{Q4K, Q5K, Q6K};

    use super::super::GpuLayout;

    /// Every value the upload layout gives (`d·scale·code − dmin·min`, in that order) equals the
    /// layout's own decoder bit for bit, for every type and every byte pattern tried.
    #[test]
    fn the_upload_decodes_as_the_file() {
        fn check<L: GpuLayout>(layout: L, sub: usize, high: usize, offset: i32) {
            let cols = 512;
            let bytes: Vec<u8> = (0..2 * L::row_bytes(cols))
                .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u8)
                .collect();
            let mut src = bytes.clone();
            // Small finite d and dmin (random bytes may make NaN).
            for blk in src.chunks_exact_mut(L::BLOCK_BYTES) {
                let at = if L::NAME == "Q6_K" {
                    L::BLOCK_BYTES - 2
                } else {
                    0
                };
                blk[at..at + 2].copy_from_slice(&half::f16::from_f32(0.013).to_le_bytes());
                if L::NAME != "Q6_K" {
                    blk[2..4].copy_from_slice(&half::f16::from_f32(-0.002).to_le_bytes());
                }
            }
            let (up, scales) = L::repack(&src, cols);
            let scales = scales.expect("block scales");
            let subs = 256 / sub;
            let code_bytes = cols / 2 + cols * high / 8;
            let row_len = code_bytes + 2 * (cols / 256) * subs;
            let mut want = vec![0.0f32; cols];
            for (r, row) in src.chunks_exact(L::row_bytes(cols)).enumerate() {
                layout.decode_row(row, &mut want);
                let up = &up[r * row_len..(r + 1) * row_len];
                for (e, &w) in want.iter().enumerate() {
                    let (b, s) = (e / 256, (e % 256) / sub);
                    let at = code_bytes + 2 * (b * subs + s);
                    let (scale, min) = (f32::from(up[at] as i8), f32::from(up[at + 1]));
                    let (d, dmin) = (scales[2 * (r * 2 + b)], scales[2 * (r * 2 + b) + 1]);
                    let nibble = (up[e / 2] >> (4 * (e % 2))) & 15;
                    let bits = match high {
                        0 => nibble,
                        _ => {
                            let per = 8 / high;
                            let h =
                                (up[cols / 2 + e / per] >> (high * (e % per))) & ((1 << high) - 1);
                            nibble | (h << 4)
                        }
                    };
                    let code = i32::from(bits) - offset;
                    let got = (d * scale) * code as f32 - dmin * min;
                    assert_eq!(
                        got.to_bits(),
                        w.to_bits(),
                        "{} row {r} element {e}",
                        L::NAME
                    );
                }
            }
        }
        check(Q4K, 32, 0, 0);
        check(Q5K, 32, 1, 0);
        check(Q6K, 16, 2, 32);
    }
}
