//! Embedding row fetch: `out[t] = table[ids[t]]` as f32. A table may be split into row
//! windows (one binding each); a launch over the window holding rows `row0..row0+rows` fills
//! the tokens whose id falls inside it.

use hesper_dsl::kernel;

/// Rows of an F32 table (held as raw words).
#[kernel(workgroup = 256)]
pub fn embed_f32(
    table: &[u32],
    ids: &[u32],
    out: &mut [f32],
    #[uniform] cols: u32,
    #[uniform] n: u32,
    #[uniform] row0: u32,
    #[uniform] rows: u32,
) {
    let i = gid();
    if i < n * cols {
        let id = ids[i / cols];
        if id >= row0 && id < row0 + rows {
            out[i] = f32_from_bits(table[(id - row0) * cols + i % cols]);
        }
    }
}

/// Rows of an F16 table (two halves per word, the lower first; `cols` is even).
#[kernel(workgroup = 256)]
pub fn embed_f16(
    table: &[u32],
    ids: &[u32],
    out: &mut [f32],
    #[uniform] cols: u32,
    #[uniform] n: u32,
    #[uniform] row0: u32,
    #[uniform] rows: u32,
) {
    let i = gid();
    let half = cols / 2u32;
    if i < n * half {
        let t = i / half;
        let j = i % half;
        let id = ids[t];
        if id >= row0 && id < row0 + rows {
            let w = table[(id - row0) * half + j];
            out[t * cols + 2u32 * j] = unpack_f16_lo(w);
            out[t * cols + 2u32 * j + 1u32] = unpack_f16_hi(w);
        }
    }
}
