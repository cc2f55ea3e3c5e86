//! Float and Q8_0 weight matrices times activations, with the launch geometry of
//! `bitlinear.rs`: `lanes` threads per output row, `64 / lanes` rows per workgroup, a tile of up
//! to 4 tokens per weight pass.

use hesper_dsl::kernel;

use crate::reduce::row_sums;

/// F32 weights (held as raw words).
#[kernel(workgroup = 64, uses(row_sums))]
pub fn matvec_f32(
    w: &[u32],
    x: &[f32],
    out: &mut [f32],
    #[uniform] cols: u32,
    #[uniform] rows: u32,
    #[uniform] row0: u32,
    #[uniform] window_rows: u32,
    #[uniform] n: u32,
    #[comptime] lanes: u32,
    #[uniform] out_scale: f32,
    #[shared] acc: &mut [f32; 256],
) {
    let t = lid();
    let lane = t % lanes;
    let r = wid() * (64u32 / lanes) + t / lanes;
    let live = r < window_rows;
    let t0 = wid_y() * 4u32;
    let mut f0: f32 = 0.0;
    let mut f1: f32 = 0.0;
    let mut f2: f32 = 0.0;
    let mut f3: f32 = 0.0;
    for i in (lane..cols).step_by(lanes) {
        if !live {
            break;
        }
        let wv = f32_from_bits(w[r * cols + i]);
        let a = t0 * cols + i;
        f0 += wv * x[a];
        if t0 + 1u32 < n {
            f1 += wv * x[a + cols];
        }
        if t0 + 2u32 < n {
            f2 += wv * x[a + 2u32 * cols];
        }
        if t0 + 3u32 < n {
            f3 += wv * x[a + 3u32 * cols];
        }
    }
    acc[t] = f0;
    acc[64u32 + t] = f1;
    acc[128u32 + t] = f2;
    acc[192u32 + t] = f3;
    barrier();
    row_sums(acc, t, lane, lanes);
    if lane == 0u32 && live {
        for j in 0..4u32 {
            if t0 + j < n {
                out[(t0 + j) * rows + row0 + r] = acc[64u32 * j + t] * out_scale;
            }
        }
    }
}

/// F16 weights (two per word, the lower first; `cols` even); the activations are rounded
/// through f16 first, as ggml does for F16 matrices.
#[kernel(workgroup = 64, uses(row_sums))]
pub fn matvec_f16(
    w: &[u32],
    x: &[f32],
    out: &mut [f32],
    #[uniform] cols: u32,
    #[uniform] rows: u32,
    #[uniform] row0: u32,
    #[uniform] window_rows: u32,
    #[uniform] n: u32,
    #[comptime] lanes: u32,
    #[uniform] out_scale: f32,
    #[shared] acc: &mut [f32; 256],
) {
    let t = lid();
    let lane = t % lanes;
    let r = wid() * (64u32 / lanes) + t / lanes;
    let live = r < window_rows;
    let t0 = wid_y() * 4u32;
    let half = cols / 2u32;
    let mut f0: f32 = 0.0;
    let mut f1: f32 = 0.0;
    let mut f2: f32 = 0.0;
    let mut f3: f32 = 0.0;
    for j in (lane..half).step_by(lanes) {
        if !live {
            break;
        }
        let word = w[r * half + j];
        let lo = unpack_f16_lo(word);
        let hi = unpack_f16_hi(word);
        let a = t0 * cols + 2u32 * j;
        f0 += lo * round_to_f16(x[a]) + hi * round_to_f16(x[a + 1u32]);
        if t0 + 1u32 < n {
            let a1 = a + cols;
            f1 += lo * round_to_f16(x[a1]) + hi * round_to_f16(x[a1 + 1u32]);
        }
        if t0 + 2u32 < n {
            let a2 = a + 2u32 * cols;
            f2 += lo * round_to_f16(x[a2]) + hi * round_to_f16(x[a2 + 1u32]);
        }
        if t0 + 3u32 < n {
            let a3 = a + 3u32 * cols;
            f3 += lo * round_to_f16(x[a3]) + hi * round_to_f16(x[a3 + 1u32]);
        }
    }
    acc[t] = f0;
    acc[64u32 + t] = f1;
    acc[128u32 + t] = f2;
    acc[192u32 + t] = f3;
    barrier();
    row_sums(acc, t, lane, lanes);
    if lane == 0u32 && live {
        for j in 0..4u32 {
            if t0 + j < n {
                out[(t0 + j) * rows + row0 + r] = acc[64u32 * j + t] * out_scale;
            }
        }
    }
}

/// Q8_0 weights (repacked: the 32 int8 of each block as 8 words, the f16 block scales as f32
/// in `wd[row·blocks + block]`) times Q8_0 activations from [`crate::quantize_q8_0`]: per
/// block the exact integer dot, then `acc += sumi · (d_weight · d_act)` as ggml does.
#[kernel(workgroup = 64, uses(row_sums))]
pub fn matvec_q8_0(
    wq: &[u32],
    wd: &[f32],
    q: &[i32],
    d: &[f32],
    out: &mut [f32],
    #[uniform] cols: u32,
    #[uniform] rows: u32,
    #[uniform] row0: u32,
    #[uniform] window_rows: u32,
    #[uniform] n: u32,
    #[comptime] lanes: u32,
    #[uniform] out_scale: f32,
    #[shared] acc: &mut [f32; 256],
) {
    let t = lid();
    let lane = t % lanes;
    let r = wid() * (64u32 / lanes) + t / lanes;
    let live = r < window_rows;
    let t0 = wid_y() * 4u32;
    let blocks = cols / 32u32;
    let mut f0: f32 = 0.0;
    let mut f1: f32 = 0.0;
    let mut f2: f32 = 0.0;
    let mut f3: f32 = 0.0;
    for blk in (lane..blocks).step_by(lanes) {
        if !live {
            break;
        }
        let mut s0: i32 = 0;
        let mut s1: i32 = 0;
        let mut s2: i32 = 0;
        let mut s3: i32 = 0;
        for j in 0..8u32 {
            let word = wq[(r * blocks + blk) * 8u32 + j];
            for b in 0..4u32 {
                let wv = (((word >> (8u32 * b)) & 255u32) ^ 128u32) as i32 - 128;
                let a = t0 * cols + blk * 32u32 + j * 4u32 + b;
                s0 += wv * q[a];
                if t0 + 1u32 < n {
                    s1 += wv * q[a + cols];
                }
                if t0 + 2u32 < n {
                    s2 += wv * q[a + 2u32 * cols];
                }
                if t0 + 3u32 < n {
                    s3 += wv * q[a + 3u32 * cols];
                }
            }
        }
        let ws = wd[r * blocks + blk];
        f0 += (s0 as f32) * (ws * d[t0 * blocks + blk]);
        if t0 + 1u32 < n {
            f1 += (s1 as f32) * (ws * d[(t0 + 1u32) * blocks + blk]);
        }
        if t0 + 2u32 < n {
            f2 += (s2 as f32) * (ws * d[(t0 + 2u32) * blocks + blk]);
        }
        if t0 + 3u32 < n {
            f3 += (s3 as f32) * (ws * d[(t0 + 3u32) * blocks + blk]);
        }
    }
    acc[t] = f0;
    acc[64u32 + t] = f1;
    acc[128u32 + t] = f2;
    acc[192u32 + t] = f3;
    barrier();
    row_sums(acc, t, lane, lanes);
    if lane == 0u32 && live {
        for j in 0..4u32 {
            if t0 + j < n {
                out[(t0 + j) * rows + row0 + r] = acc[64u32 * j + t] * out_scale;
            }
        }
    }
}
