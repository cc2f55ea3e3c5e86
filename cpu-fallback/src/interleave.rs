//! I2_S weights interleaved sixteen rows deep, the layout the AVX-512 and AVX-VNNI prefill
//! kernels read: one 64-byte load feeds one `vpdpbusd` per activation dword for sixteen rows.
//!
//! An I2_S row is groups of 32 bytes, each holding 128 codes: byte `m` of group `g` carries,
//! from its high bits down, the codes of columns `128g + m`, `+32`, `+64` and `+96`. The
//! interleaved copy keeps every byte as it is and only moves whole 4-byte words: for a block of
//! sixteen rows, group `g` and word `w` (bytes `4w..4w + 4` of the group), the sixteen rows'
//! words lie side by side in one 64-byte *tile*, so 32-bit lane `l` of a tile holds row `l`'s
//! four bytes. The 2-bit plane `s` (bits `6 − 2s`) of that lane is then row `l`'s codes of
//! columns `128g + 32s + 4w ..+4`, dotted with one broadcast dword of activations.
//!
//! The copy is as large as the matrix (2 bits a weight); the file's pages are given back once
//! it is made, so the resident size stays the same.

use hesper_engine::formats::I2S_GROUP;
use rayon::prelude::*;

/// Rows in one interleaved block (the 32-bit lanes of a 512-bit register).
pub const ROWS: usize = 16;

/// Bytes of one tile: one 4-byte word of each of the sixteen rows.
pub const TILE_BYTES: usize = 4 * ROWS;

/// Code bytes of a group (128 codes).
const GROUP_BYTES: usize = I2S_GROUP / 4;

/// Whether a `rows × cols` I2_S matrix can be interleaved: whole blocks of sixteen rows.
pub fn fits(rows: usize, cols: usize) -> bool {
    rows.is_multiple_of(ROWS) && cols.is_multiple_of(I2S_GROUP) && rows > 0
}

/// The interleaved copy of an I2_S matrix whose rows are `row_bytes` long (`data` holds
/// whole blocks of sixteen rows; see [`fits`]), blocks split between the threads.
pub fn interleave(data: &[u8], row_bytes: usize) -> Vec<u8> {
    debug_assert!(
        row_bytes.is_multiple_of(GROUP_BYTES) && data.len().is_multiple_of(ROWS * row_bytes)
    );
    let mut out = vec![0u8; data.len()];
    data.par_chunks_exact(ROWS * row_bytes)
        .zip(out.par_chunks_exact_mut(ROWS * row_bytes))
        .for_each(|(src, dst)| {
            // Word `j` of every row (j = 8g + w) becomes tile `j`.
            for (j, tile) in dst.chunks_exact_mut(TILE_BYTES).enumerate() {
                for (l, word) in tile.chunks_exact_mut(4).enumerate() {
                    word.copy_from_slice(&src[l * row_bytes + 4 * j..][..4]);
                }
            }
        });
    out
}

/// Row `r` of an interleaved matrix whose rows are `row_bytes` long, in the I2_S layout.
pub fn row(tiles: &[u8], row_bytes: usize, r: usize, out: &mut [u8]) {
    let block = &tiles[r / ROWS * ROWS * row_bytes..][..ROWS * row_bytes];
    let l = r % ROWS;
    for (j, word) in out[..row_bytes].chunks_exact_mut(4).enumerate() {
        word.copy_from_slice(&block[j * TILE_BYTES + 4 * l..][..4]);
    }
}

/// Whether a `rows × cols` matrix of blocks of `block_cols` values can be interleaved by
/// [`by_blocks`]: whole blocks of sixteen rows, whole blocks in a row.
pub fn fits_blocks(rows: usize, cols: usize, block_cols: usize) -> bool {
    rows.is_multiple_of(ROWS) && cols.is_multiple_of(block_cols) && rows > 0 && cols > 0
}

/// The interleaved copy of a matrix of block-quantized rows (`data`: whole blocks of sixteen
/// rows of `row_bytes`, each row's blocks `src_block` bytes), made block by block: for each
/// block of sixteen rows and each block column `b`, `put(block b of row l, l, copy)` writes row
/// `l`'s part of the `dst_block` bytes the copy gives those sixteen blocks. Blocks of rows are
/// split between the threads.
pub fn by_blocks(
    data: &[u8],
    row_bytes: usize,
    src_block: usize,
    dst_block: usize,
    put: impl Fn(&[u8], usize, &mut [u8]) + Sync,
) -> Vec<u8> {
    debug_assert!(
        row_bytes.is_multiple_of(src_block) && data.len().is_multiple_of(ROWS * row_bytes)
    );
    let blocks = row_bytes / src_block;
    let mut out = vec![0u8; data.len() / (ROWS * row_bytes) * blocks * dst_block];
    data.par_chunks_exact(ROWS * row_bytes)
        .zip(out.par_chunks_exact_mut(blocks * dst_block))
        .for_each(|(src, dst)| {
            for (b, copy) in dst.chunks_exact_mut(dst_block).enumerate() {
                for l in 0..ROWS {
                    put(&src[l * row_bytes + b * src_block..][..src_block], l, copy);
                }
            }
        });
    out
}

/// Row `r` of a copy made by [`by_blocks`] with blocks of `src_block` bytes in `dst_block`:
/// `take(copy, l, block)` writes row `l`'s block from its part of the copy's block; `out` holds
/// the row (`blocks` blocks).
pub fn row_by_blocks(
    tiles: &[u8],
    (src_block, dst_block): (usize, usize),
    r: usize,
    out: &mut [u8],
    take: impl Fn(&[u8], usize, &mut [u8]),
) {
    let blocks = out.len() / src_block;
    let copy = &tiles[r / ROWS * blocks * dst_block..][..blocks * dst_block];
    for (src, blk) in copy
        .chunks_exact(dst_block)
        .zip(out.chunks_exact_mut(src_block))
    {
        take(src, r % ROWS, blk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaving_moves_words_and_row_reads_them_back() {
        let (rows, row_bytes) = (32, 64);
        let data: Vec<u8> = (0..rows * row_bytes)
            .map(|i| (i * 7 + i / 5) as u8)
            .collect();
        let tiles = interleave(&data, row_bytes);
        // Tile 1 of block 0 starts with row 0's bytes 4..8, then row 1's.
        assert_eq!(&tiles[64..68], &data[4..8]);
        assert_eq!(&tiles[68..72], &data[row_bytes + 4..row_bytes + 8]);
        let mut back = vec![0u8; row_bytes];
        for r in 0..rows {
            row(&tiles, row_bytes, r, &mut back);
            assert_eq!(back, data[r * row_bytes..(r + 1) * row_bytes], "row {r}");
        }
        assert!(fits(48, 256) && !fits(40, 256) && !fits(48, 200) && !fits(0, 128));
    }
}
