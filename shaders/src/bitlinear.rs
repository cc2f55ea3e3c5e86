//! BitLinear: ternary weights (2-bit codes 0, 1, 2 meaning −1, 0, +1) times int8 activations.
//!
//! Both kernels read codes in bitnet.cpp's I2_S layout — 128-element groups of 32 bytes, byte
//! `j` holding elements `j, j+32, j+64, j+96` from its high bits down, read here as
//! little-endian u32 words — so I2_S files upload as they are and TQ1_0/TQ2_0 are repacked
//! into it (still 2 bits a weight) with their block scales beside.
//!
//! Shared launch geometry of the matrix kernels (here and in `matvec.rs`): `lanes` threads (a
//! power of two ≤ 64) cooperate on one output row and each thread takes `ROWS` rows
//! `64 / lanes` apart, so a workgroup of 64 covers `ROWS · 64 / lanes` rows of this window
//! (grid [`crate::matrix_grid`]); each workgroup takes a tile of up to `TILE` tokens and reads
//! each weight word once for all of them, each activation once for all its rows. Every kernel
//! has a wide-step instance (`*_wide`: more tokens and rows a thread, for steps of many rows)
//! that sums every output in the same order as the decode instance, so a row's bits do not
//! depend on which instance ran it. `rows` is the output width,
//! `row0` where this window of `window_rows` rows starts. Each kernel keeps only its decode
//! step: the tile's accumulators are a local array over the unrolled `TILE` and `ROWS` loops,
//! the row reduction is [`row_sums`] (TQ: [`row_fold`], the lanes' sums in lane order, which its
//! tiled kernel follows) and the output stage [`store_rows`], once per row a thread (`mode`,
//! `out_scale`, `out_scale_odd`: see `tile.rs`).

use hesper_dsl::kernel;

use crate::reduce::{row_fold, row_sums};
use crate::tile::store_rows;

/// I2_S × per-token int8: exact integer sums over the whole row, then bitnet.cpp's epilogue
/// `Σ(c−1)·q / s · beta · out_scale` with `s` from [`crate::quantize_i8`] (`out_scale` is
/// `beta` times the matrix's scale).
#[kernel(
    workgroup = 64,
    uses(row_sums, store_rows),
    consts(TILE = 4, ROWS = 1),
    also(bitlinear_i2s_wide(TILE = 16, ROWS = 4))
)]
pub fn bitlinear_i2s<const TILE: u32, const ROWS: u32>(
    codes: &[u32],
    q: &[i32],
    scale: &[f32],
    out: &mut [f32],
    out_k: &mut [f32],
    out_v: &mut [f32],
    #[uniform] cols: u32,
    #[uniform] rows: u32,
    #[uniform] row0: u32,
    #[uniform] window_rows: u32,
    #[uniform] n: u32,
    #[comptime] lanes: u32,
    #[uniform] mode: u32,
    #[uniform] out_scale: f32,
    #[uniform] out_scale_odd: f32,
    #[uniform] split_k: u32,
    #[uniform] split_v: u32,
    #[uniform] out_scale_v: f32,
    #[shared] acc: &mut [i32; 64 * TILE],
    #[shared] res: &mut [f32; 64 * TILE],
) {
    let t = lid();
    let lane = t % lanes;
    let group = 64u32 / lanes;
    let r0 = wid() * group * ROWS + t / lanes;
    let mut rr = [0u32; ROWS];
    for m in 0..ROWS {
        rr[m] = (r0 + m * group).min(window_rows - 1u32);
    }
    let t0 = wid_y() * TILE;
    let words = cols / 16u32;
    let mut s = [0i32; TILE * ROWS];
    for w in (lane..words).step_by(lanes) {
        if r0 >= window_rows {
            break;
        }
        let mut packed = [0u32; ROWS];
        for m in 0..ROWS {
            packed[m] = codes[rr[m] * words + w];
        }
        for b in 0..4u32 {
            let at = w * 4u32 + b;
            let k = (at / 32u32) * 128u32 + at % 32u32;
            let mut c0 = [0i32; ROWS];
            let mut c1 = [0i32; ROWS];
            let mut c2 = [0i32; ROWS];
            let mut c3 = [0i32; ROWS];
            for m in 0..ROWS {
                let bits = (packed[m] >> (8u32 * b)) & 255u32;
                c0[m] = (bits >> 6u32) as i32 - 1;
                c1[m] = ((bits >> 4u32) & 3u32) as i32 - 1;
                c2[m] = ((bits >> 2u32) & 3u32) as i32 - 1;
                c3[m] = (bits & 3u32) as i32 - 1;
            }
            for j in 0..TILE {
                if t0 + j < n {
                    let a = (t0 + j) * cols + k;
                    let q0 = q[a];
                    let q1 = q[a + 32u32];
                    let q2 = q[a + 64u32];
                    let q3 = q[a + 96u32];
                    for m in 0..ROWS {
                        s[m * TILE + j] += c0[m] * q0 + c1[m] * q1 + c2[m] * q2 + c3[m] * q3;
                    }
                }
            }
        }
    }
    for m in 0..ROWS {
        for j in 0..TILE {
            acc[64u32 * j + t] = s[m * TILE + j];
        }
        barrier();
        row_sums(acc, t, lane, lanes, TILE);
        for j in 0..TILE {
            if t0 + j < n {
                res[64u32 * j + t] = (acc[64u32 * j + t] as f32) / scale[t0 + j];
            }
        }
        store_rows(
            res,
            out,
            out_k,
            out_v,
            t,
            lane,
            lanes,
            r0 + m * group,
            window_rows,
            row0,
            rows,
            t0,
            n,
            TILE,
            mode,
            out_scale,
            out_scale_odd,
            split_k,
            split_v,
            out_scale_v,
        );
        barrier();
    }
}

/// TQ1_0/TQ2_0 (repacked) × Q8_K blocks: per 256-element block the exact integer
/// `Σ(c−1)·q`, then `acc += sumi · (d_act · d_weight)` as ggml does; `wscale` holds the
/// weight scale of every (row, block) of this window, `d` the activation scale of every
/// (token, block) from [`crate::quantize_q8k`]. Lane `l` sums blocks `l, l + lanes, …` and the
/// lanes' sums are added in lane order ([`row_fold`]), so that the tiled kernel
/// [`crate::bitlinear_tq_gemm`], walking each row's blocks lane by lane, adds the same terms in
/// the same order and gives every output the same bits.
#[kernel(
    workgroup = 64,
    uses(row_fold, store_rows),
    consts(TILE = 4, ROWS = 1),
    also(bitlinear_tq_wide(TILE = 8, ROWS = 4))
)]
pub fn bitlinear_tq<const TILE: u32, const ROWS: u32>(
    codes: &[u32],
    wscale: &[f32],
    q: &[i32],
    d: &[f32],
    out: &mut [f32],
    out_k: &mut [f32],
    out_v: &mut [f32],
    #[uniform] cols: u32,
    #[uniform] rows: u32,
    #[uniform] row0: u32,
    #[uniform] window_rows: u32,
    #[uniform] n: u32,
    #[comptime] lanes: u32,
    #[uniform] mode: u32,
    #[uniform] out_scale: f32,
    #[uniform] out_scale_odd: f32,
    #[uniform] split_k: u32,
    #[uniform] split_v: u32,
    #[uniform] out_scale_v: f32,
    #[shared] acc: &mut [f32; 64 * TILE],
) {
    let t = lid();
    let lane = t % lanes;
    let group = 64u32 / lanes;
    let r0 = wid() * group * ROWS + t / lanes;
    let mut rr = [0u32; ROWS];
    for m in 0..ROWS {
        rr[m] = (r0 + m * group).min(window_rows - 1u32);
    }
    let t0 = wid_y() * TILE;
    let words = cols / 16u32;
    let blocks = cols / 256u32;
    let mut f = [0.0f32; TILE * ROWS];
    for blk in (lane..blocks).step_by(lanes) {
        if r0 >= window_rows {
            break;
        }
        let mut s = [0i32; TILE * ROWS];
        for w in blk * 16u32..blk * 16u32 + 16u32 {
            let mut packed = [0u32; ROWS];
            for m in 0..ROWS {
                packed[m] = codes[rr[m] * words + w];
            }
            for b in 0..4u32 {
                let at = w * 4u32 + b;
                let k = (at / 32u32) * 128u32 + at % 32u32;
                let mut c0 = [0i32; ROWS];
                let mut c1 = [0i32; ROWS];
                let mut c2 = [0i32; ROWS];
                let mut c3 = [0i32; ROWS];
                for m in 0..ROWS {
                    let bits = (packed[m] >> (8u32 * b)) & 255u32;
                    c0[m] = (bits >> 6u32) as i32 - 1;
                    c1[m] = ((bits >> 4u32) & 3u32) as i32 - 1;
                    c2[m] = ((bits >> 2u32) & 3u32) as i32 - 1;
                    c3[m] = (bits & 3u32) as i32 - 1;
                }
                for j in 0..TILE {
                    if t0 + j < n {
                        let a = (t0 + j) * cols + k;
                        let q0 = q[a];
                        let q1 = q[a + 32u32];
                        let q2 = q[a + 64u32];
                        let q3 = q[a + 96u32];
                        for m in 0..ROWS {
                            s[m * TILE + j] += c0[m] * q0 + c1[m] * q1 + c2[m] * q2 + c3[m] * q3;
                        }
                    }
                }
            }
        }
        for m in 0..ROWS {
            let ws = wscale[rr[m] * blocks + blk];
            for j in 0..TILE {
                if t0 + j < n {
                    f[m * TILE + j] += (s[m * TILE + j] as f32) * (d[(t0 + j) * blocks + blk] * ws);
                }
            }
        }
    }
    for m in 0..ROWS {
        for j in 0..TILE {
            acc[64u32 * j + t] = f[m * TILE + j];
        }
        barrier();
        row_fold(acc, t, lane, lanes, TILE);
        store_rows(
            acc,
            out,
            out_k,
            out_v,
            t,
            lane,
            lanes,
            r0 + m * group,
            window_rows,
            row0,
            rows,
            t0,
            n,
            TILE,
            mode,
            out_scale,
            out_scale_odd,
            split_k,
            split_v,
            out_scale_v,
        );
        barrier();
    }
}

/// [`bitlinear_i2s`] with `dot4I8Packed` (WGSL's `packed_4x8_integer_dot_product`; one
/// instruction per four products where the GPU has it): the four crumbs of each code byte
/// belong to elements 32 apart, so masking one crumb position across a word's four bytes gives
/// four consecutive elements, matched by one word of the activations packed by
/// [`crate::quantize_i8_packed`]. `Σcode·q − Σq` is the same exact integer as the plain path.
#[kernel(
    workgroup = 64,
    uses(row_sums, store_rows),
    consts(TILE = 4, ROWS = 1),
    also(bitlinear_i2s_dp4_wide(TILE = 16, ROWS = 4))
)]
pub fn bitlinear_i2s_dp4<const TILE: u32, const ROWS: u32>(
    codes: &[u32],
    q: &[u32],
    scale: &[f32],
    sum: &[i32],
    out: &mut [f32],
    out_k: &mut [f32],
    out_v: &mut [f32],
    #[uniform] cols: u32,
    #[uniform] rows: u32,
    #[uniform] row0: u32,
    #[uniform] window_rows: u32,
    #[uniform] n: u32,
    #[comptime] lanes: u32,
    #[uniform] mode: u32,
    #[uniform] out_scale: f32,
    #[uniform] out_scale_odd: f32,
    #[uniform] split_k: u32,
    #[uniform] split_v: u32,
    #[uniform] out_scale_v: f32,
    #[shared] acc: &mut [i32; 64 * TILE],
    #[shared] res: &mut [f32; 64 * TILE],
) {
    let t = lid();
    let lane = t % lanes;
    let group = 64u32 / lanes;
    let r0 = wid() * group * ROWS + t / lanes;
    let mut rr = [0u32; ROWS];
    for m in 0..ROWS {
        rr[m] = (r0 + m * group).min(window_rows - 1u32);
    }
    let t0 = wid_y() * TILE;
    let words = cols / 16u32;
    let qwords = cols / 4u32;
    let mask = 50529027u32;
    let mut s = [0i32; TILE * ROWS];
    for w in (lane..words).step_by(lanes) {
        if r0 >= window_rows {
            break;
        }
        let mut c0 = [0u32; ROWS];
        let mut c1 = [0u32; ROWS];
        let mut c2 = [0u32; ROWS];
        let mut c3 = [0u32; ROWS];
        for m in 0..ROWS {
            let packed = codes[rr[m] * words + w];
            c0[m] = (packed >> 6u32) & mask;
            c1[m] = (packed >> 4u32) & mask;
            c2[m] = (packed >> 2u32) & mask;
            c3[m] = packed & mask;
        }
        let at = w * 4u32;
        let b = (at / 32u32) * 32u32 + (at % 32u32) / 4u32;
        for j in 0..TILE {
            if t0 + j < n {
                let a = (t0 + j) * qwords + b;
                let q0 = q[a];
                let q1 = q[a + 8u32];
                let q2 = q[a + 16u32];
                let q3 = q[a + 24u32];
                for m in 0..ROWS {
                    s[m * TILE + j] += dot4_i8_packed(c0[m], q0)
                        + dot4_i8_packed(c1[m], q1)
                        + dot4_i8_packed(c2[m], q2)
                        + dot4_i8_packed(c3[m], q3);
                }
            }
        }
    }
    for m in 0..ROWS {
        for j in 0..TILE {
            acc[64u32 * j + t] = s[m * TILE + j];
        }
        barrier();
        row_sums(acc, t, lane, lanes, TILE);
        for j in 0..TILE {
            if t0 + j < n {
                res[64u32 * j + t] = ((acc[64u32 * j + t] - sum[t0 + j]) as f32) / scale[t0 + j];
            }
        }
        store_rows(
            res,
            out,
            out_k,
            out_v,
            t,
            lane,
            lanes,
            r0 + m * group,
            window_rows,
            row0,
            rows,
            t0,
            n,
            TILE,
            mode,
            out_scale,
            out_scale_odd,
            split_k,
            split_v,
            out_scale_v,
        );
        barrier();
    }
}
