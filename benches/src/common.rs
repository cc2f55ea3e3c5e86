//! Helpers the CPU kernel benchmarks share.

use hesper_engine::weights::{Format, MatrixDesc};

/// A `rows` × `cols` matrix of `format` whose bytes start at offset 0.
pub fn desc(format: Format, rows: usize, cols: usize) -> MatrixDesc {
    let mut d = MatrixDesc {
        name: "bench".into(),
        rows,
        cols,
        format,
        range: 0..0,
    };
    d.range = 0..rows * d.row_bytes();
    d
}

/// `n` pseudo-random bytes (xorshift; the kernels' speed does not depend on the values).
pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.extend_from_slice(&s.to_le_bytes());
    }
    v.truncate(n);
    v
}
