//! Launch geometry of the kernels whose grid is not one thread per invocation (those have
//! `grid_for` from the DSL): the matrix kernels, attention, and the kernels that give each row
//! or block a workgroup. The backend, the kernel tests and the benchmarks call these, so the
//! shape of a launch is written once, next to the kernels.

use crate::{
    bitlinear_i2s, bitlinear_i2s_coop, bitlinear_i2s_coop_stand_in, bitlinear_i2s_dp4,
    bitlinear_i2s_dp4_wide, bitlinear_i2s_gemm, bitlinear_i2s_wide, bitlinear_tq,
    bitlinear_tq_coop, bitlinear_tq_coop_stand_in, bitlinear_tq_gemm, bitlinear_tq_wide,
    landmark_update, matvec_bf16, matvec_bf16_gemm, matvec_bf16_gemm_id, matvec_bf16_wide,
    matvec_f16, matvec_f16_gemm, matvec_f16_gemm_id, matvec_f16_wide, matvec_f32, matvec_f32_gemm,
    matvec_f32_wide, matvec_kq, matvec_kq_coop, matvec_kq_coop_stand_in, matvec_kq_gemm,
    matvec_kq_gemm_id, matvec_kq_wide, matvec_q8_0, matvec_q8_0_coop, matvec_q8_0_coop_stand_in,
    matvec_q8_0_gemm, matvec_q8_0_gemm_id, matvec_q8_0_wide, quantize_q8_0,
};

/// Tokens one workgroup of the matrix kernels' decode instances multiplies at once (the second
/// grid dimension is `ceil(n / TOKEN_TILE)`); each weight word is read once per tile. It is the
/// kernels' own compile-time constant `TILE` (`consts(TILE = ..)`), the same in all eight; their
/// wide-step instances (`*_wide`, [`WIDE_STEP`]) take larger tiles and several rows a thread.
pub const TOKEN_TILE: u32 = bitlinear_i2s::TILE;

/// Threads per workgroup of the matrix kernels (`bitlinear_*`, `matvec_*`); each output row
/// takes `lanes` of them, so a workgroup covers `ROWS · MATRIX_WORKGROUP / lanes` rows.
pub const MATRIX_WORKGROUP: u32 = 64;

/// Rows of a step from which the backend runs the matrix kernels' wide-step instances: each
/// sums every output in the same order as its decode instance (the same expressions per
/// token and row, only more tokens and rows a thread), so which one ran a row never changes
/// its bits, and a step of more rows than one decode tile reads each weight fewer times.
pub const WIDE_STEP: u32 = TOKEN_TILE + 1;

const _: () = assert!(
    WIDE_STEP <= 5,
    "rope_attention keeps the norm scales of a step's keys in four floats"
);

const _: () = {
    // (workgroup size, TILE, ROWS) of every decode instance, then of every wide instance.
    let decode = [
        (
            bitlinear_i2s::WORKGROUP_SIZE,
            bitlinear_i2s::TILE,
            bitlinear_i2s::ROWS,
        ),
        (
            bitlinear_i2s_dp4::WORKGROUP_SIZE,
            bitlinear_i2s_dp4::TILE,
            bitlinear_i2s_dp4::ROWS,
        ),
        (
            bitlinear_tq::WORKGROUP_SIZE,
            bitlinear_tq::TILE,
            bitlinear_tq::ROWS,
        ),
        (
            matvec_f32::WORKGROUP_SIZE,
            matvec_f32::TILE,
            matvec_f32::ROWS,
        ),
        (
            matvec_f16::WORKGROUP_SIZE,
            matvec_f16::TILE,
            matvec_f16::ROWS,
        ),
        (
            matvec_bf16::WORKGROUP_SIZE,
            matvec_bf16::TILE,
            matvec_bf16::ROWS,
        ),
        (
            matvec_q8_0::WORKGROUP_SIZE,
            matvec_q8_0::TILE,
            matvec_q8_0::ROWS,
        ),
        (matvec_kq::WORKGROUP_SIZE, matvec_kq::TILE, matvec_kq::ROWS),
    ];
    let wide = [
        bitlinear_i2s_wide::WORKGROUP_SIZE,
        bitlinear_i2s_dp4_wide::WORKGROUP_SIZE,
        bitlinear_tq_wide::WORKGROUP_SIZE,
        matvec_f32_wide::WORKGROUP_SIZE,
        matvec_f16_wide::WORKGROUP_SIZE,
        matvec_bf16_wide::WORKGROUP_SIZE,
        matvec_q8_0_wide::WORKGROUP_SIZE,
        matvec_kq_wide::WORKGROUP_SIZE,
    ];
    let mut i = 0;
    while i < decode.len() {
        assert!(
            decode[i].0 == MATRIX_WORKGROUP && wide[i] == MATRIX_WORKGROUP,
            "a matrix kernel's workgroup is not MATRIX_WORKGROUP"
        );
        assert!(
            decode[i].1 == TOKEN_TILE,
            "the matrix kernels' TILE differs"
        );
        assert!(decode[i].2 == 1, "a decode instance takes one row a thread");
        i += 1;
    }
};

/// Output rows of one workgroup of the tiled kernels (`gemm.rs`): the tile's rows are handed to
/// [`store_rows`](crate::store_rows) one a thread, as a decode workgroup's 64 threads hand theirs.
pub const GEMM_ROWS: u32 = bitlinear_i2s_gemm::BM;

/// Tokens of one workgroup of the tiled kernels: each weight is read once per this many.
pub const GEMM_TOKENS: u32 = bitlinear_i2s_gemm::BN;

/// Rows of a step from which the backend runs a tiled kernel where the layout has one (a
/// full tile of tokens; below it the wide-step instances read each weight once per 16 tokens
/// and spread a step over more workgroups). A tiled kernel gives every output its
/// matrix-vector kernel's bits, so the choice never changes a row.
pub const GEMM_STEP: u32 = GEMM_TOKENS;

/// Checks at compile time that each tiled kernel has the shape the output stage and
/// [`gemm_grid`] assume: 256 threads as 16 × 16, thread `t` taking rows `t / 16 + 16·m`
/// (m < TM) and tokens `t % 16 + 16·j` (j < TN) of a [`GEMM_ROWS`] × [`GEMM_TOKENS`] tile.
macro_rules! tiled_shape {
    ($($kernel:ident),*) => {
        const _: () = {
            $(
                assert!($kernel::WORKGROUP_SIZE == 256);
                assert!($kernel::BM == GEMM_ROWS && $kernel::BN == GEMM_TOKENS);
                assert!($kernel::BM == 16 * $kernel::TM && $kernel::BN == 16 * $kernel::TN);
            )*
        };
    };
}

tiled_shape!(
    bitlinear_i2s_gemm,
    bitlinear_tq_gemm,
    matvec_kq_gemm,
    matvec_kq_gemm_id,
    matvec_q8_0_gemm,
    matvec_q8_0_gemm_id,
    matvec_f16_gemm,
    matvec_f16_gemm_id,
    matvec_f32_gemm,
    matvec_bf16_gemm,
    matvec_bf16_gemm_id
);

// The I2_S matrix-core kernel and its stand-in cover the tiled kernels' tile, in their grid;
// the Q8_0, K-quant and TQ ones cover half its tokens ([`narrow_gemm_grid`]), each of their 256
// threads finishing `PER` of the tile's outputs.
const _: () = {
    assert!(bitlinear_i2s_coop::WORKGROUP_SIZE == 256);
    assert!(bitlinear_i2s_coop::BM == GEMM_ROWS && bitlinear_i2s_coop::BN == GEMM_TOKENS);
    assert!(bitlinear_i2s_coop_stand_in::BM == GEMM_ROWS);
    assert!(matvec_q8_0_coop::WORKGROUP_SIZE == 256);
    assert!(matvec_q8_0_coop::BM == GEMM_ROWS && matvec_q8_0_coop::BN == NARROW_GEMM_TOKENS);
    assert!(matvec_q8_0_coop::BM * matvec_q8_0_coop::BN == 256 * matvec_q8_0_coop::PER);
    assert!(matvec_q8_0_coop_stand_in::BN == NARROW_GEMM_TOKENS);
    assert!(matvec_kq_coop::WORKGROUP_SIZE == 256);
    assert!(matvec_kq_coop::BM == GEMM_ROWS && matvec_kq_coop::BN == NARROW_GEMM_TOKENS);
    assert!(matvec_kq_coop::BM * matvec_kq_coop::BN == 256 * matvec_kq_coop::PER);
    assert!(matvec_kq_coop_stand_in::BN == NARROW_GEMM_TOKENS);
    assert!(bitlinear_tq_coop::WORKGROUP_SIZE == 256);
    assert!(bitlinear_tq_coop::BM == GEMM_ROWS && bitlinear_tq_coop::BN == NARROW_GEMM_TOKENS);
    assert!(bitlinear_tq_coop::BM * bitlinear_tq_coop::BN == 256 * bitlinear_tq_coop::PER);
    assert!(bitlinear_tq_coop_stand_in::BN == NARROW_GEMM_TOKENS);
};

/// Tokens of one workgroup of the tiled kernels that keep a whole tile's sums in workgroup
/// memory ([`matvec_q8_0_coop`](crate::matvec_q8_0_coop),
/// [`matvec_kq_coop`](crate::matvec_kq_coop), [`bitlinear_tq_coop`](crate::bitlinear_tq_coop)):
/// half of [`GEMM_TOKENS`].
pub const NARROW_GEMM_TOKENS: u32 = GEMM_TOKENS / 2;

const _: () = assert!(
    GEMM_ROWS == MATRIX_WORKGROUP,
    "store_rows indexes its array as 64·token + row"
);

/// The grid of a tiled kernel (`gemm.rs`): `rows` output rows in tiles of [`GEMM_ROWS`] along
/// x, `tokens` activation rows in tiles of [`GEMM_TOKENS`] along y (at least one each way).
pub const fn gemm_grid(rows: u32, tokens: u32) -> [u32; 3] {
    tile_grid(rows, tokens, GEMM_TOKENS)
}

/// The grid of a tiled kernel of [`GEMM_ROWS`] rows × [`NARROW_GEMM_TOKENS`] tokens, as
/// [`gemm_grid`] lays out the full tiles.
pub const fn narrow_gemm_grid(rows: u32, tokens: u32) -> [u32; 3] {
    tile_grid(rows, tokens, NARROW_GEMM_TOKENS)
}

/// Tiles of [`GEMM_ROWS`] rows along x and of `tile` tokens along y (at least one each way).
const fn tile_grid(rows: u32, tokens: u32, tile: u32) -> [u32; 3] {
    let x = rows.div_ceil(GEMM_ROWS);
    let y = tokens.div_ceil(tile);
    [if x == 0 { 1 } else { x }, if y == 0 { 1 } else { y }, 1]
}

/// Threads per output row for a matrix kernel whose rows hold `units` work items (words,
/// blocks or elements): at least two items a thread, at most 32 threads (a GPU wave/warp), a
/// power of two. Small rows share a workgroup instead of idling most of its 64 threads.
pub fn lanes_per_row(units: usize) -> u32 {
    let want = (units / 2).clamp(1, 32);
    1 << want.ilog2()
}

/// The grid of a matrix kernel whose `TILE` is `tile` and `ROWS` is `per_thread`: `rows`
/// output rows at `lanes` threads and `per_thread` rows each along x, `tokens` activation rows
/// in tiles of `tile` along y (at least one workgroup each way).
pub const fn matrix_grid(
    rows: u32,
    lanes: u32,
    tokens: u32,
    tile: u32,
    per_thread: u32,
) -> [u32; 3] {
    let x = rows.div_ceil(MATRIX_WORKGROUP / lanes * per_thread);
    let y = tokens.div_ceil(tile);
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

/// The grid of the norms fused with a block quantizer (`rms_norm_quantize_q8_0_sg`,
/// `rms_norm_quantize_q8k_sg`): a workgroup for each 256 values of a `width`-wide row along x,
/// the rows along y (at least one workgroup each way).
pub const fn span_grid(width: u32, rows: u32) -> [u32; 3] {
    let x = width.div_ceil(256);
    [
        if x == 0 { 1 } else { x },
        if rows == 0 { 1 } else { rows },
        1,
    ]
}

/// Q8_0 blocks of 32 values quantized per workgroup of [`quantize_q8_0`](crate::quantize_q8_0).
pub const Q8_0_BLOCKS_PER_WORKGROUP: u32 = quantize_q8_0::WORKGROUP_SIZE / 32;

/// The grid of [`quantize_q8_0`](crate::quantize_q8_0) for `blocks` blocks.
pub const fn q8_0_grid(blocks: u32) -> [u32; 3] {
    let x = blocks.div_ceil(Q8_0_BLOCKS_PER_WORKGROUP);
    [if x == 0 { 1 } else { x }, 1, 1]
}
