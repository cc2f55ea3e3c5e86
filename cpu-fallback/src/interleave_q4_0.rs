//! Q4_0 weights interleaved sixteen rows deep, the layout the AVX-512 VNNI kernel
//! ([`crate::kernels::interleaved_q4_0`]) reads: per block of 32 columns, one load of sixteen
//! f16 scales and four 64-byte tiles feed two `vpdpbusd` each (low and high nibbles) for sixteen
//! rows, with no horizontal sums.
//!
//! For a block of sixteen rows and Q4_0 block `b`, the copy holds 288 bytes, as many as the
//! sixteen rows' blocks in the file: the sixteen f16 scales side by side (32 bytes), then four
//! tiles, tile `k` holding bytes `4k..4k + 4` of the sixteen rows' nibbles in its 32-bit lanes
//! (lane `l` = row `l`): columns `4k..4k + 4` in the low nibbles, `16 + 4k..20 + 4k` in the
//! high ones, the codes unsigned (the kernel subtracts `8 · Σq` of the activation block).

use hesper_engine::formats::Q4_0_BLOCK_BYTES;

use crate::interleave::ROWS;

/// Columns of a Q4_0 block.
pub const BLOCK_COLS: usize = 32;

/// Bytes of one interleaved block of sixteen rows × 32 columns.
pub const BLOCK_BYTES: usize = ROWS * Q4_0_BLOCK_BYTES;

/// Bytes of the sixteen scales that open an interleaved block.
pub const SCALE_BYTES: usize = 2 * ROWS;

/// Whether a `rows × cols` Q4_0 matrix can be interleaved: whole blocks of sixteen rows.
pub fn fits(rows: usize, cols: usize) -> bool {
    crate::interleave::fits_blocks(rows, cols, BLOCK_COLS)
}

/// The interleaved copy of a Q4_0 matrix whose rows are `row_bytes` long (`data` holds whole
/// blocks of sixteen rows; see [`fits`]), row blocks split between the threads.
pub fn interleave(data: &[u8], row_bytes: usize) -> Vec<u8> {
    crate::interleave::by_blocks(
        data,
        row_bytes,
        Q4_0_BLOCK_BYTES,
        BLOCK_BYTES,
        |blk, l, copy| {
            copy[2 * l..2 * l + 2].copy_from_slice(&blk[..2]);
            for (k, tile) in copy[SCALE_BYTES..].chunks_exact_mut(4 * ROWS).enumerate() {
                tile[4 * l..4 * l + 4].copy_from_slice(&blk[2 + 4 * k..6 + 4 * k]);
            }
        },
    )
}

/// Row `r` of an interleaved matrix whose rows are `row_bytes` long, in the Q4_0 layout.
pub fn row(tiles: &[u8], row_bytes: usize, r: usize, out: &mut [u8]) {
    let sizes = (Q4_0_BLOCK_BYTES, BLOCK_BYTES);
    crate::interleave::row_by_blocks(tiles, sizes, r, &mut out[..row_bytes], |copy, l, blk| {
        blk[..2].copy_from_slice(&copy[2 * l..2 * l + 2]);
        for (k, tile) in copy[SCALE_BYTES..].chunks_exact(4 * ROWS).enumerate() {
            blk[2 + 4 * k..6 + 4 * k].copy_from_slice(&tile[4 * l..4 * l + 4]);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_comes_back_out_of_the_copy() {
        let (rows, cols) = (32, 96);
        let row_bytes = cols / BLOCK_COLS * Q4_0_BLOCK_BYTES;
        let data: Vec<u8> = (0..rows * row_bytes)
            .map(|i| (i * 131 % 251) as u8)
            .collect();
        assert!(fits(rows, cols) && !fits(8, cols) && !fits(rows, 40));
        let tiles = interleave(&data, row_bytes);
        assert_eq!(tiles.len(), data.len());
        assert_ne!(tiles, data);
        let mut back = vec![0u8; row_bytes];
        for r in 0..rows {
            row(&tiles, row_bytes, r, &mut back);
            assert_eq!(back, data[r * row_bytes..][..row_bytes], "row {r}");
        }
    }
}
