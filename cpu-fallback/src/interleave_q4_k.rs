//! Q4_K weights interleaved sixteen rows deep, the layout the AVX-512 VNNI kernel
//! ([`crate::kernels::interleaved_q4_k`]) reads: per block of 256 columns, the sixteen rows'
//! `d`, `dmin`, sub-block scales and minimums side by side, then their codes in 64-byte tiles
//! that feed one `vpdpbusd` per activation dword for sixteen rows, with no horizontal sums.
//!
//! For a block of sixteen rows and Q4_K block `b`, the copy holds [`BLOCK_BYTES`] (2 368)
//! bytes, 148 a row where the file has 144: the sixteen f16 `d` (32 bytes), the sixteen f16
//! `dmin` (32), the six-bit scales of sub-block `s` of the sixteen rows (16 bytes each, 8
//! sub-blocks), their minimums likewise, then 32 tiles: tile `4s + k` holds, in 32-bit lane `l`
//! (row `l`), columns `32s + 8k .. 32s + 8k + 4` of the row as low nibbles and columns
//! `32s + 8k + 4 .. 32s + 8k + 8` as high nibbles, byte by byte.

use hesper_engine::formats::q4_k::{
    k_pack_scales_mins, k_scales_mins, q4_k_code, K_SCALES, Q4_K_BLOCK_BYTES, Q4_K_QS, QK_K,
};

use crate::interleave::ROWS;

/// Bytes of one interleaved block of sixteen rows × 256 columns.
pub const BLOCK_BYTES: usize = ROWS * ROW_BLOCK_BYTES;

/// Bytes each row takes in an interleaved block (the file's 144, and four for its scales and
/// minimums as whole bytes).
pub const ROW_BLOCK_BYTES: usize = Q4_K_BLOCK_BYTES + 4;

/// Offset of the sixteen `dmin`.
pub const DMIN: usize = 2 * ROWS;
/// Offset of the scales, sub-block by sub-block.
pub const SCALES: usize = 4 * ROWS;
/// Offset of the minimums, sub-block by sub-block.
pub const MINS: usize = SCALES + 8 * ROWS;
/// Offset of the 32 code tiles.
pub const TILES: usize = MINS + 8 * ROWS;

/// Bytes of an interleaved row of `cols` values.
pub fn interleaved_row_bytes(cols: usize) -> usize {
    cols / QK_K * ROW_BLOCK_BYTES
}

/// Whether a `rows × cols` Q4_K matrix can be interleaved: whole blocks of sixteen rows.
pub fn fits(rows: usize, cols: usize) -> bool {
    rows.is_multiple_of(ROWS) && cols.is_multiple_of(QK_K) && rows > 0 && cols > 0
}

/// The interleaved copy of a Q4_K matrix whose rows are `row_bytes` long (`data` holds whole
/// blocks of sixteen rows; see [`fits`]), row blocks split between the threads.
pub fn interleave(data: &[u8], row_bytes: usize) -> Vec<u8> {
    crate::interleave::by_blocks(
        data,
        row_bytes,
        Q4_K_BLOCK_BYTES,
        BLOCK_BYTES,
        |blk, l, copy| {
            copy[2 * l..2 * l + 2].copy_from_slice(&blk[..2]);
            copy[DMIN + 2 * l..DMIN + 2 * l + 2].copy_from_slice(&blk[2..4]);
            let (scales, mins) = k_scales_mins(blk);
            for s in 0..8 {
                copy[SCALES + ROWS * s + l] = scales[s];
                copy[MINS + ROWS * s + l] = mins[s];
            }
            for (t, tile) in copy[TILES..].chunks_exact_mut(4 * ROWS).enumerate() {
                for (k, byte) in tile[4 * l..4 * l + 4].iter_mut().enumerate() {
                    *byte = q4_k_code(blk, 8 * t + k) | (q4_k_code(blk, 8 * t + 4 + k) << 4);
                }
            }
        },
    )
}

/// Row `r` of an interleaved matrix of `cols` columns, in the Q4_K layout (`out` holds a row).
pub fn row(tiles: &[u8], cols: usize, r: usize, out: &mut [u8]) {
    let row_bytes = cols / QK_K * Q4_K_BLOCK_BYTES;
    let sizes = (Q4_K_BLOCK_BYTES, BLOCK_BYTES);
    crate::interleave::row_by_blocks(tiles, sizes, r, &mut out[..row_bytes], |copy, l, blk| {
        blk[..2].copy_from_slice(&copy[2 * l..2 * l + 2]);
        blk[2..4].copy_from_slice(&copy[DMIN + 2 * l..DMIN + 2 * l + 2]);
        let scales = std::array::from_fn(|s| copy[SCALES + ROWS * s + l]);
        let mins = std::array::from_fn(|s| copy[MINS + ROWS * s + l]);
        blk[K_SCALES..K_SCALES + 12].copy_from_slice(&k_pack_scales_mins(&scales, &mins));
        let mut codes = [0u8; QK_K];
        for (t, tile) in copy[TILES..].chunks_exact(4 * ROWS).enumerate() {
            for k in 0..4 {
                let byte = tile[4 * l + k];
                codes[8 * t + k] = byte & 0xF;
                codes[8 * t + 4 + k] = byte >> 4;
            }
        }
        for j in 0..4 {
            for i in 0..32 {
                blk[Q4_K_QS + 32 * j + i] = codes[64 * j + i] | (codes[64 * j + 32 + i] << 4);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_comes_back_out_of_the_copy() {
        let (rows, cols) = (32, 512);
        let row_bytes = cols / QK_K * Q4_K_BLOCK_BYTES;
        // Any bytes: the twelve scale bytes hold sixteen six-bit numbers, every bit once.
        let data: Vec<u8> = (0..rows * row_bytes)
            .map(|i| (i * 131 % 251) as u8)
            .collect();
        assert!(fits(rows, cols) && !fits(8, cols) && !fits(rows, 320));
        let tiles = interleave(&data, row_bytes);
        assert_eq!(tiles.len(), rows * interleaved_row_bytes(cols));
        let mut back = vec![0u8; row_bytes];
        for r in 0..rows {
            row(&tiles, cols, r, &mut back);
            assert_eq!(back, data[r * row_bytes..][..row_bytes], "row {r}");
        }
    }
}
