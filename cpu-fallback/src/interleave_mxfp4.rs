//! MXFP4 weights interleaved sixteen rows deep, the layout the AVX2 kernel
//! ([`crate::kernels::interleaved_mxfp4`]) reads: per block of 32 columns, the sixteen rows'
//! exponent bytes side by side (16 bytes), then four tiles as Q4_0's
//! ([`crate::interleave_q4_0`]): tile `k` holds bytes `4k..4k + 4` of the sixteen rows' nibbles
//! in its 32-bit lanes (lane `l` = row `l`), as many bytes as the sixteen rows' blocks in the
//! file.

use hesper_engine::formats::MXFP4_BLOCK_BYTES;

use crate::interleave::ROWS;

/// Columns of an MXFP4 block.
pub const BLOCK_COLS: usize = 32;

/// Bytes of one interleaved block of sixteen rows × 32 columns.
pub const BLOCK_BYTES: usize = ROWS * MXFP4_BLOCK_BYTES;

/// Bytes of the sixteen exponents that open an interleaved block.
pub const SCALE_BYTES: usize = ROWS;

/// Whether a `rows × cols` MXFP4 matrix can be interleaved: whole blocks of sixteen rows.
pub fn fits(rows: usize, cols: usize) -> bool {
    crate::interleave::fits_blocks(rows, cols, BLOCK_COLS)
}

/// The interleaved copy of an MXFP4 matrix whose rows are `row_bytes` long (`data` holds whole
/// blocks of sixteen rows; see [`fits`]), row blocks split between the threads.
pub fn interleave(data: &[u8], row_bytes: usize) -> Vec<u8> {
    crate::interleave::by_blocks(
        data,
        row_bytes,
        MXFP4_BLOCK_BYTES,
        BLOCK_BYTES,
        |blk, l, copy| {
            copy[l] = blk[0];
            for (k, tile) in copy[SCALE_BYTES..].chunks_exact_mut(4 * ROWS).enumerate() {
                tile[4 * l..4 * l + 4].copy_from_slice(&blk[1 + 4 * k..5 + 4 * k]);
            }
        },
    )
}

/// Row `r` of an interleaved matrix whose rows are `row_bytes` long, in the MXFP4 layout.
pub fn row(tiles: &[u8], row_bytes: usize, r: usize, out: &mut [u8]) {
    let sizes = (MXFP4_BLOCK_BYTES, BLOCK_BYTES);
    crate::interleave::row_by_blocks(tiles, sizes, r, &mut out[..row_bytes], |copy, l, blk| {
        blk[0] = copy[l];
        for (k, tile) in copy[SCALE_BYTES..].chunks_exact(4 * ROWS).enumerate() {
            blk[1 + 4 * k..5 + 4 * k].copy_from_slice(&tile[4 * l..4 * l + 4]);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_comes_back_out_of_the_copy() {
        let (rows, cols) = (32, 96);
        let row_bytes = cols / BLOCK_COLS * MXFP4_BLOCK_BYTES;
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
