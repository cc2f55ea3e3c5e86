//! F16 weights interleaved sixteen rows deep, the layout the AVX-512 kernel
//! ([`crate::kernels::interleaved_f16`]) reads: column by column, the sixteen rows' halves side
//! by side (32 bytes), so one conversion feeds one FMA per token for sixteen rows, each lane a
//! row summing its products in column order, with no horizontal sums.
//!
//! The copy is as large as the matrix; the file's pages are given back once it is made.

use rayon::prelude::*;

use crate::interleave::ROWS;

/// Whether a `rows × cols` F16 matrix can be interleaved: whole blocks of sixteen rows.
pub fn fits(rows: usize, cols: usize) -> bool {
    rows.is_multiple_of(ROWS) && rows > 0 && cols > 0
}

/// The interleaved copy of an F16 matrix whose rows are `row_bytes` long (`data` holds whole
/// blocks of sixteen rows; see [`fits`]), row blocks split between the threads.
pub fn interleave(data: &[u8], row_bytes: usize) -> Vec<u8> {
    debug_assert!(data.len().is_multiple_of(ROWS * row_bytes));
    let mut out = vec![0u8; data.len()];
    data.par_chunks_exact(ROWS * row_bytes)
        .zip(out.par_chunks_exact_mut(ROWS * row_bytes))
        .for_each(|(src, dst)| {
            for (k, column) in dst.chunks_exact_mut(2 * ROWS).enumerate() {
                for (l, half) in column.chunks_exact_mut(2).enumerate() {
                    half.copy_from_slice(&src[l * row_bytes + 2 * k..][..2]);
                }
            }
        });
    out
}

/// Row `r` of an interleaved matrix whose rows are `row_bytes` long, in the F16 layout.
pub fn row(tiles: &[u8], row_bytes: usize, r: usize, out: &mut [u8]) {
    let block = &tiles[r / ROWS * ROWS * row_bytes..][..ROWS * row_bytes];
    let l = r % ROWS;
    for (half, column) in out[..row_bytes]
        .chunks_exact_mut(2)
        .zip(block.chunks_exact(2 * ROWS))
    {
        half.copy_from_slice(&column[2 * l..2 * l + 2]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_comes_back_out_of_the_copy() {
        let (rows, cols) = (32, 40);
        let data: Vec<u8> = (0..rows * cols * 2)
            .map(|i| (i * 131 % 251) as u8)
            .collect();
        assert!(fits(rows, cols) && !fits(8, cols));
        let tiles = interleave(&data, 2 * cols);
        assert_eq!(tiles.len(), data.len());
        assert_ne!(tiles, data);
        let mut back = vec![0u8; 2 * cols];
        for r in 0..rows {
            row(&tiles, 2 * cols, r, &mut back);
            assert_eq!(back, data[r * 2 * cols..][..2 * cols], "row {r}");
        }
    }
}
