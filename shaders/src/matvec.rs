//! Float (F32, F16, BF16) and Q8_0 weight matrices times activations, with the launch geometry and output stage
//! of `bitlinear.rs`: `lanes` threads per output row, `64 / lanes` rows per workgroup, a tile of
//! up to `TILE` tokens per weight pass, [`row_sums`] then [`store_rows`].

use hesper_dsl::kernel;

use crate::reduce::row_sums;
use crate::tile::store_rows;

/// F32 weights (held as raw words).
#[kernel(workgroup = 64, uses(row_sums, store_rows), consts(TILE = 4))]
pub fn matvec_f32<const TILE: u32>(
    w: &[u32],
    x: &[f32],
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
    let r = wid() * (64u32 / lanes) + t / lanes;
    let t0 = wid_y() * TILE;
    let mut f = [0.0f32; TILE];
    for i in (lane..cols).step_by(lanes) {
        if r >= window_rows {
            break;
        }
        let wv = f32_from_bits(w[r * cols + i]);
        for j in 0..TILE {
            if t0 + j < n {
                f[j] += wv * x[(t0 + j) * cols + i];
            }
        }
    }
    for j in 0..TILE {
        acc[64u32 * j + t] = f[j];
    }
    barrier();
    row_sums(acc, t, lane, lanes, TILE);
    store_rows(
        acc,
        out,
        out_k,
        out_v,
        t,
        lane,
        lanes,
        r,
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
}

/// F16 weights (two per word, the lower first; `cols` even) times activations rounded to f16
/// as ggml does for F16 matrices, packed the same way by [`crate::pack_f16`] (`xh`: `cols / 2`
/// words a token).
#[kernel(workgroup = 64, uses(row_sums, store_rows), consts(TILE = 4))]
pub fn matvec_f16<const TILE: u32>(
    w: &[u32],
    xh: &[u32],
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
    let r = wid() * (64u32 / lanes) + t / lanes;
    let t0 = wid_y() * TILE;
    let half = cols / 2u32;
    let mut f = [0.0f32; TILE];
    for i in (lane..half).step_by(lanes) {
        if r >= window_rows {
            break;
        }
        let word = w[r * half + i];
        let lo = unpack_f16_lo(word);
        let hi = unpack_f16_hi(word);
        for j in 0..TILE {
            if t0 + j < n {
                let a = xh[(t0 + j) * half + i];
                f[j] += lo * unpack_f16_lo(a) + hi * unpack_f16_hi(a);
            }
        }
    }
    for j in 0..TILE {
        acc[64u32 * j + t] = f[j];
    }
    barrier();
    row_sums(acc, t, lane, lanes, TILE);
    store_rows(
        acc,
        out,
        out_k,
        out_v,
        t,
        lane,
        lanes,
        r,
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
}

/// BF16 weights (two per word, the lower first; `cols` even); the activations are rounded
/// through bf16 first (to nearest, ties to even), as ggml does for BF16 matrices.
#[kernel(workgroup = 64, uses(row_sums, store_rows), consts(TILE = 4))]
pub fn matvec_bf16<const TILE: u32>(
    w: &[u32],
    x: &[f32],
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
    let r = wid() * (64u32 / lanes) + t / lanes;
    let t0 = wid_y() * TILE;
    let half = cols / 2u32;
    let mut f = [0.0f32; TILE];
    for i in (lane..half).step_by(lanes) {
        if r >= window_rows {
            break;
        }
        let word = w[r * half + i];
        let lo = f32_from_bits(word << 16u32);
        let hi = f32_from_bits(word & 4294901760u32);
        for j in 0..TILE {
            if t0 + j < n {
                let a = (t0 + j) * cols + 2u32 * i;
                let xa = f32_to_bits(x[a]);
                let xb = f32_to_bits(x[a + 1u32]);
                let ra = f32_from_bits((xa + 32767u32 + ((xa >> 16u32) & 1u32)) & 4294901760u32);
                let rb = f32_from_bits((xb + 32767u32 + ((xb >> 16u32) & 1u32)) & 4294901760u32);
                f[j] += lo * ra + hi * rb;
            }
        }
    }
    for j in 0..TILE {
        acc[64u32 * j + t] = f[j];
    }
    barrier();
    row_sums(acc, t, lane, lanes, TILE);
    store_rows(
        acc,
        out,
        out_k,
        out_v,
        t,
        lane,
        lanes,
        r,
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
}

/// Q8_0 weights (repacked: the 32 int8 of each block as 8 words, the f16 block scales as f32
/// in `wd[row·blocks + block]`) times Q8_0 activations from [`crate::quantize_q8_0`]: per
/// block the exact integer dot, then `acc += sumi · (d_weight · d_act)` as ggml does.
#[kernel(workgroup = 64, uses(row_sums, store_rows), consts(TILE = 4))]
pub fn matvec_q8_0<const TILE: u32>(
    wq: &[u32],
    wd: &[f32],
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
    let r = wid() * (64u32 / lanes) + t / lanes;
    let t0 = wid_y() * TILE;
    let blocks = cols / 32u32;
    let mut f = [0.0f32; TILE];
    for blk in (lane..blocks).step_by(lanes) {
        if r >= window_rows {
            break;
        }
        let mut s = [0i32; TILE];
        for i in 0..8u32 {
            let word = wq[(r * blocks + blk) * 8u32 + i];
            for b in 0..4u32 {
                let wv = (((word >> (8u32 * b)) & 255u32) ^ 128u32) as i32 - 128;
                for j in 0..TILE {
                    if t0 + j < n {
                        s[j] += wv * q[(t0 + j) * cols + blk * 32u32 + i * 4u32 + b];
                    }
                }
            }
        }
        let ws = wd[r * blocks + blk];
        for j in 0..TILE {
            if t0 + j < n {
                f[j] += (s[j] as f32) * (ws * d[(t0 + j) * blocks + blk]);
            }
        }
    }
    for j in 0..TILE {
        acc[64u32 * j + t] = f[j];
    }
    barrier();
    row_sums(acc, t, lane, lanes, TILE);
    store_rows(
        acc,
        out,
        out_k,
        out_v,
        t,
        lane,
        lanes,
        r,
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
}
