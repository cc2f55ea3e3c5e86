//! Launch geometry of the kernels whose grid is not one thread per invocation (those have
//! `grid_for` from the DSL): the matrix kernels, attention, and the kernels that give each row
//! or block a workgroup. The backend, the kernel tests and the benchmarks call these, so the
//! shape of a launch is written once, next to the kernels.

use crate::{
    bitlinear_i2s, bitlinear_i2s_dp4, bitlinear_tq, landmark_update, matvec_f16, matvec_f32,
    matvec_q8_0, quantize_q8_0,
};

/// Tokens one workgroup of the matrix kernels multiplies at once (the second grid dimension is
/// `ceil(n / TOKEN_TILE)`); each weight word is read once per tile. It is the kernels' own
/// compile-time constant `TILE` (`consts(TILE = ..)`), the same in all six.
pub const TOKEN_TILE: u32 = bitlinear_i2s::TILE;

/// Threads per workgroup of the matrix kernels (`bitlinear_*`, `matvec_*`); each output row
/// takes `lanes` of them, so a workgroup covers `MATRIX_WORKGROUP / lanes` rows.
pub const MATRIX_WORKGROUP: u32 = 64;

const _: () = {
    let sizes = [
        bitlinear_i2s::WORKGROUP_SIZE,
        bitlinear_i2s_dp4::WORKGROUP_SIZE,
        bitlinear_tq::WORKGROUP_SIZE,
        matvec_f32::WORKGROUP_SIZE,
        matvec_f16::WORKGROUP_SIZE,
        matvec_q8_0::WORKGROUP_SIZE,
    ];
    let tiles = [
        bitlinear_i2s::TILE,
        bitlinear_i2s_dp4::TILE,
        bitlinear_tq::TILE,
        matvec_f32::TILE,
        matvec_f16::TILE,
        matvec_q8_0::TILE,
    ];
    let mut i = 0;
    while i < sizes.len() {
        assert!(
            sizes[i] == MATRIX_WORKGROUP,
            "a matrix kernel's workgroup is not MATRIX_WORKGROUP"
        );
        assert!(tiles[i] == TOKEN_TILE, "the matrix kernels' TILE differs");
        i += 1;
    }
};

/// Threads per output row for a matrix kernel whose rows hold `units` work items (words,
/// blocks or elements): at least two items a thread, at most 32 threads (a GPU wave/warp), a
/// power of two. Small rows share a workgroup instead of idling most of its 64 threads.
pub fn lanes_per_row(units: usize) -> u32 {
    let want = (units / 2).clamp(1, 32);
    1 << want.ilog2()
}

/// The grid of a matrix kernel: `rows` output rows at `lanes` threads each along x, `tokens`
/// activation rows in tiles of [`TOKEN_TILE`] along y (at least one workgroup each way).
pub const fn matrix_grid(rows: u32, lanes: u32, tokens: u32) -> [u32; 3] {
    let x = rows.div_ceil(MATRIX_WORKGROUP / lanes);
    let y = tokens.div_ceil(TOKEN_TILE);
    [if x == 0 { 1 } else { x }, if y == 0 { 1 } else { y }, 1]
}

/// The grid of [`attention`](crate::attention): one workgroup per (query head, token).
pub const fn attention_grid(n_head: u32, tokens: u32) -> [u32; 3] {
    [n_head, tokens, 1]
}

/// The grid of [`landmark_update`](crate::landmark_update): `kv_dim` threads for each block of
/// `block` positions that positions `pos0..pos0+n` touch.
pub const fn landmark_grid(kv_dim: u32, pos0: u32, n: u32, block: u32) -> [u32; 3] {
    let blocks = if n == 0 {
        0
    } else {
        (pos0 + n - 1) / block - pos0 / block + 1
    };
    landmark_update::grid_for(blocks * kv_dim)
}

/// One workgroup per row or block: `rms_norm`, `rms_norm_sg`, `quantize_i8`,
/// `quantize_i8_packed` (a row each) and `quantize_q8k` (a 256-value block each).
pub const fn row_grid(rows: u32) -> [u32; 3] {
    [if rows == 0 { 1 } else { rows }, 1, 1]
}

/// Q8_0 blocks of 32 values quantized per workgroup of [`quantize_q8_0`](crate::quantize_q8_0).
pub const Q8_0_BLOCKS_PER_WORKGROUP: u32 = quantize_q8_0::WORKGROUP_SIZE / 32;

/// The grid of [`quantize_q8_0`](crate::quantize_q8_0) for `blocks` blocks.
pub const fn q8_0_grid(blocks: u32) -> [u32; 3] {
    let x = blocks.div_ceil(Q8_0_BLOCKS_PER_WORKGROUP);
    [if x == 0 { 1 } else { x }, 1, 1]
}
