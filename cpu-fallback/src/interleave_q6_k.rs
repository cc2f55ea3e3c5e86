//! Q6_K weights interleaved sixteen rows deep, the layout the AVX-512 VNNI kernel
//! ([`crate::kernels::interleaved_q6_k`]) reads: per block of 256 columns, the sixteen rows'
//! `d` and sub-block scales side by side, then their codes' low four bits in 64-byte nibble
//! tiles and their high two bits in 64-byte crumb tiles, which together feed one `vpdpbusd` per
//! activation dword for sixteen rows, with no horizontal sums.
//!
//! For a block of sixteen rows and Q6_K block `b`, the copy holds 3 360 bytes, as many as the
//! sixteen rows' blocks in the file: the sixteen f16 `d` (32 bytes), the int8 scales of
//! sub-block `s` (columns `16s..16s + 16`) of the sixteen rows (16 bytes each, 16 sub-blocks),
//! then 32 nibble tiles — tile `z` holds, in 32-bit lane `l` (row `l`), the low four bits of
//! columns `8z..8z + 4` as low nibbles and of `8z + 4..8z + 8` as high nibbles, byte by byte —
//! then 16 crumb tiles: tile `s`, lane `l`, byte `k` holds the high two bits of column
//! `16s + 4j + k` in its bits `2j, 2j + 1` (`j` in 0..4). Codes stay unsigned (0..64); the
//! kernel takes off their offset of 32 with `Σq`.

use hesper_engine::formats::q6_k::{q6_k_code, Q6_K_BLOCK_BYTES, Q6_K_D, Q6_K_SCALES};
use hesper_engine::formats::q6_k::{Q6_K_BLOCK, Q6_K_QH};

use crate::interleave::ROWS;

/// Bytes of one interleaved block of sixteen rows × 256 columns.
pub const BLOCK_BYTES: usize = ROWS * Q6_K_BLOCK_BYTES;
/// Offset of the scales, sub-block by sub-block.
pub const SCALES: usize = 2 * ROWS;
/// Offset of the 32 nibble tiles.
pub const NIBBLES: usize = SCALES + 16 * ROWS;
/// Offset of the 16 crumb tiles.
pub const CRUMBS: usize = NIBBLES + 32 * 4 * ROWS;

/// Whether a `rows × cols` Q6_K matrix can be interleaved: whole blocks of sixteen rows.
pub fn fits(rows: usize, cols: usize) -> bool {
    crate::interleave::fits_blocks(rows, cols, Q6_K_BLOCK)
}

/// The interleaved copy of a Q6_K matrix whose rows are `row_bytes` long (`data` holds whole
/// blocks of sixteen rows; see [`fits`]), row blocks split between the threads.
pub fn interleave(data: &[u8], row_bytes: usize) -> Vec<u8> {
    crate::interleave::by_blocks(
        data,
        row_bytes,
        Q6_K_BLOCK_BYTES,
        BLOCK_BYTES,
        |blk, l, copy| {
            copy[2 * l..2 * l + 2].copy_from_slice(&blk[Q6_K_D..Q6_K_D + 2]);
            for s in 0..16 {
                copy[SCALES + ROWS * s + l] = blk[Q6_K_SCALES + s];
            }
            let code = |c: usize| q6_k_code(blk, c);
            for (z, tile) in copy[NIBBLES..CRUMBS].chunks_exact_mut(4 * ROWS).enumerate() {
                for (k, byte) in tile[4 * l..4 * l + 4].iter_mut().enumerate() {
                    *byte = (code(8 * z + k) & 0xF) | ((code(8 * z + 4 + k) & 0xF) << 4);
                }
            }
            for (s, tile) in copy[CRUMBS..].chunks_exact_mut(4 * ROWS).enumerate() {
                for (k, byte) in tile[4 * l..4 * l + 4].iter_mut().enumerate() {
                    *byte = (0..4).fold(0, |b, j| b | ((code(16 * s + 4 * j + k) >> 4) << (2 * j)));
                }
            }
        },
    )
}

/// Row `r` of an interleaved matrix whose rows are `row_bytes` long, in the Q6_K layout.
pub fn row(tiles: &[u8], row_bytes: usize, r: usize, out: &mut [u8]) {
    let sizes = (Q6_K_BLOCK_BYTES, BLOCK_BYTES);
    crate::interleave::row_by_blocks(tiles, sizes, r, &mut out[..row_bytes], |copy, l, blk| {
        blk[Q6_K_D..Q6_K_D + 2].copy_from_slice(&copy[2 * l..2 * l + 2]);
        for s in 0..16 {
            blk[Q6_K_SCALES + s] = copy[SCALES + ROWS * s + l];
        }
        let code = |c: usize| {
            let nibbles = copy[NIBBLES + 64 * (c / 8) + 4 * l + c % 4];
            let low = if c % 8 < 4 {
                nibbles & 0xF
            } else {
                nibbles >> 4
            };
            let crumbs = copy[CRUMBS + 64 * (c / 16) + 4 * l + c % 4];
            low | (((crumbs >> (2 * ((c % 16) / 4))) & 3) << 4)
        };
        // The file's layout (`q6_k_code`): element e of half h, quadrant k, lane i.
        for h in 0..2 {
            for i in 0..32 {
                let q = [0, 1, 2, 3].map(|k| code(128 * h + 32 * k + i));
                blk[64 * h + i] = (q[0] & 0xF) | ((q[2] & 0xF) << 4);
                blk[64 * h + 32 + i] = (q[1] & 0xF) | ((q[3] & 0xF) << 4);
                blk[Q6_K_QH + 32 * h + i] =
                    (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
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
        let row_bytes = cols / Q6_K_BLOCK * Q6_K_BLOCK_BYTES;
        // Any bytes: every bit of a Q6_K block is a code bit, a scale or d.
        let data: Vec<u8> = (0..rows * row_bytes)
            .map(|i| (i * 131 % 251) as u8)
            .collect();
        assert!(fits(rows, cols) && !fits(8, cols) && !fits(rows, 320));
        let tiles = interleave(&data, row_bytes);
        assert_eq!(tiles.len(), data.len());
        let mut back = vec![0u8; row_bytes];
        for r in 0..rows {
            row(&tiles, row_bytes, r, &mut back);
            assert_eq!(back, data[r * row_bytes..][..row_bytes], "row {r}");
        }
    }
}
