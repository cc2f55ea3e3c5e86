//! Q4_K and Q5_K weights interleaved sixteen rows deep, the layout the AVX-512 VNNI kernel
//! ([`crate::kernels::interleaved_q4_k`]) reads: per block of 256 columns, the sixteen rows'
//! `d`, `dmin`, sub-block scales and minimums side by side, then their codes in 64-byte tiles
//! that feed one `vpdpbusd` per activation dword for sixteen rows, with no horizontal sums.
//!
//! For a block of sixteen rows and Q4_K block `b`, the copy holds [`block_bytes`] (2 368)
//! bytes, 148 a row where the file has 144: the sixteen f16 `d` (32 bytes), the sixteen f16
//! `dmin` (32), the six-bit scales of sub-block `s` of the sixteen rows (16 bytes each, 8
//! sub-blocks), their minimums likewise, then 32 tiles: tile `4s + k` holds, in 32-bit lane `l`
//! (row `l`), columns `32s + 8k .. 32s + 8k + 4` of the row as low nibbles and columns
//! `32s + 8k + 4 .. 32s + 8k + 8` as high nibbles, byte by byte (the low four bits of the codes).
//! A Q5_K copy (`FIVE`) adds eight tiles of fifth bits at [`HIGH`], 180 bytes a row where the
//! file has 176: tile `s`, lane `l`, byte `k` holds in bit `j` the fifth bit of column
//! `32s + 4j + k`.

use hesper_engine::formats::q4_k::{
    k_pack_scales_mins, k_scales_mins, q4_k_code, K_SCALES, Q4_K_BLOCK_BYTES, Q4_K_QS, QK_K,
};
use hesper_engine::formats::q5_k::{q5_k_code, Q5_K_BLOCK_BYTES, Q5_K_QH, Q5_K_QS};

use crate::interleave::ROWS;

/// Bytes of one interleaved block of sixteen rows × 256 columns (of Q5_K with `five`).
pub const fn block_bytes(five: bool) -> usize {
    ROWS * row_block_bytes(five)
}

/// Bytes each row takes in an interleaved block: the file's 144 (Q5_K: 176), and four for its
/// scales and minimums as whole bytes.
pub const fn row_block_bytes(five: bool) -> usize {
    file_block_bytes(five) + 4
}

/// Bytes of a file block of Q4_K (Q5_K with `five`).
const fn file_block_bytes(five: bool) -> usize {
    if five {
        Q5_K_BLOCK_BYTES
    } else {
        Q4_K_BLOCK_BYTES
    }
}

/// Offset of the sixteen `dmin`.
pub const DMIN: usize = 2 * ROWS;
/// Offset of the scales, sub-block by sub-block.
pub const SCALES: usize = 4 * ROWS;
/// Offset of the minimums, sub-block by sub-block.
pub const MINS: usize = SCALES + 8 * ROWS;
/// Offset of the 32 code tiles.
pub const TILES: usize = MINS + 8 * ROWS;
/// Offset of a Q5_K copy's eight tiles of fifth bits.
pub const HIGH: usize = TILES + 32 * 4 * ROWS;

/// Bytes of an interleaved row of `cols` values (of Q5_K with `five`).
pub fn interleaved_row_bytes(cols: usize, five: bool) -> usize {
    cols / QK_K * row_block_bytes(five)
}

/// Whether a `rows × cols` Q4_K or Q5_K matrix can be interleaved: whole blocks of sixteen rows.
pub fn fits(rows: usize, cols: usize) -> bool {
    crate::interleave::fits_blocks(rows, cols, QK_K)
}

/// The interleaved copy of a Q4_K matrix (Q5_K with `FIVE`) whose rows are `row_bytes` long
/// (`data` holds whole blocks of sixteen rows; see [`fits`]), row blocks split between the
/// threads.
pub fn interleave<const FIVE: bool>(data: &[u8], row_bytes: usize) -> Vec<u8> {
    let sizes = (file_block_bytes(FIVE), block_bytes(FIVE));
    crate::interleave::by_blocks(data, row_bytes, sizes.0, sizes.1, |blk, l, copy| {
        let code = |e: usize| {
            if FIVE {
                q5_k_code(blk, e)
            } else {
                q4_k_code(blk, e)
            }
        };
        copy[2 * l..2 * l + 2].copy_from_slice(&blk[..2]);
        copy[DMIN + 2 * l..DMIN + 2 * l + 2].copy_from_slice(&blk[2..4]);
        let (scales, mins) = k_scales_mins(blk);
        for s in 0..8 {
            copy[SCALES + ROWS * s + l] = scales[s];
            copy[MINS + ROWS * s + l] = mins[s];
        }
        for (t, tile) in copy[TILES..HIGH].chunks_exact_mut(4 * ROWS).enumerate() {
            for (k, byte) in tile[4 * l..4 * l + 4].iter_mut().enumerate() {
                *byte = (code(8 * t + k) & 0xF) | ((code(8 * t + 4 + k) & 0xF) << 4);
            }
        }
        if FIVE {
            for (s, tile) in copy[HIGH..].chunks_exact_mut(4 * ROWS).enumerate() {
                for (k, byte) in tile[4 * l..4 * l + 4].iter_mut().enumerate() {
                    *byte = (0..8).fold(0, |b, j| b | ((code(32 * s + 4 * j + k) >> 4) << j));
                }
            }
        }
    })
}

/// Row `r` of an interleaved matrix of `cols` columns, in the Q4_K layout (Q5_K with `FIVE`;
/// `out` holds a row).
pub fn row<const FIVE: bool>(tiles: &[u8], cols: usize, r: usize, out: &mut [u8]) {
    let row_bytes = cols / QK_K * file_block_bytes(FIVE);
    let sizes = (file_block_bytes(FIVE), block_bytes(FIVE));
    crate::interleave::row_by_blocks(tiles, sizes, r, &mut out[..row_bytes], |copy, l, blk| {
        blk[..2].copy_from_slice(&copy[2 * l..2 * l + 2]);
        blk[2..4].copy_from_slice(&copy[DMIN + 2 * l..DMIN + 2 * l + 2]);
        let scales = std::array::from_fn(|s| copy[SCALES + ROWS * s + l]);
        let mins = std::array::from_fn(|s| copy[MINS + ROWS * s + l]);
        blk[K_SCALES..K_SCALES + 12].copy_from_slice(&k_pack_scales_mins(&scales, &mins));
        let mut codes = [0u8; QK_K];
        for (t, tile) in copy[TILES..HIGH].chunks_exact(4 * ROWS).enumerate() {
            for k in 0..4 {
                let byte = tile[4 * l + k];
                codes[8 * t + k] = byte & 0xF;
                codes[8 * t + 4 + k] = byte >> 4;
            }
        }
        let qs = if FIVE { Q5_K_QS } else { Q4_K_QS };
        for j in 0..4 {
            for i in 0..32 {
                blk[qs + 32 * j + i] = codes[64 * j + i] | (codes[64 * j + 32 + i] << 4);
            }
        }
        if FIVE {
            // Bit s of qh[i] is the fifth bit of element 32s + i.
            for i in 0..32 {
                blk[Q5_K_QH + i] = (0..8).fold(0, |b, s| {
                    let tile = &copy[HIGH + 4 * ROWS * s..];
                    let bit = (tile[4 * l + i % 4] >> (i / 4)) & 1;
                    b | (bit << s)
                });
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_comes_back_out_of_the_copy() {
        check::<false>();
        check::<true>();
    }

    fn check<const FIVE: bool>() {
        let (rows, cols) = (32, 512);
        let row_bytes = cols / QK_K * file_block_bytes(FIVE);
        // Any bytes: the twelve scale bytes hold sixteen six-bit numbers, every bit once.
        let data: Vec<u8> = (0..rows * row_bytes)
            .map(|i| (i * 131 % 251) as u8)
            .collect();
        assert!(fits(rows, cols) && !fits(8, cols) && !fits(rows, 320));
        let tiles = interleave::<FIVE>(&data, row_bytes);
        assert_eq!(tiles.len(), rows * interleaved_row_bytes(cols, FIVE));
        let mut back = vec![0u8; row_bytes];
        for r in 0..rows {
            row::<FIVE>(&tiles, cols, r, &mut back);
            assert_eq!(
                back,
                data[r * row_bytes..][..row_bytes],
                "five {FIVE}, row {r}"
            );
        }
    }
}
