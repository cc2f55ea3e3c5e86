//! BitLinear: ternary weights (2-bit codes 0, 1, 2 meaning −1, 0, +1) times int8 activations.
//!
//! Both kernels read codes in bitnet.cpp's I2_S layout — 128-element groups of 32 bytes, byte
//! `j` holding elements `j, j+32, j+64, j+96` from its high bits down, read here as
//! little-endian u32 words — so I2_S files upload as they are and TQ1_0/TQ2_0 are repacked
//! into it (still 2 bits a weight) with their block scales beside.
//!
//! Shared launch geometry of the matrix kernels (here and in `matvec.rs`): `lanes` threads (a
//! power of two ≤ 64) cooperate on one output row, so a workgroup of 64 covers `64 / lanes`
//! rows of this window (grid `[ceil(window_rows · lanes / 64), ceil(n / 4)]`); each workgroup
//! takes a tile of up to 4 tokens and reads each weight word once for all of them. `rows` is
//! the output width, `row0` where this window of `window_rows` rows starts.

use hesper_dsl::kernel;

use crate::reduce::{row_sums, row_sums_i32};

/// I2_S × per-token int8: exact integer sums over the whole row, then bitnet.cpp's epilogue
/// `Σ(c−1)·q / s · beta · out_scale` with `s` from [`crate::quantize_i8`].
#[kernel(workgroup = 64, uses(row_sums_i32))]
pub fn bitlinear_i2s(
    codes: &[u32],
    q: &[i32],
    scale: &[f32],
    out: &mut [f32],
    #[uniform] cols: u32,
    #[uniform] rows: u32,
    #[uniform] row0: u32,
    #[uniform] window_rows: u32,
    #[uniform] n: u32,
    #[comptime] lanes: u32,
    #[uniform] beta: f32,
    #[shared] acc: &mut [i32; 256],
) {
    let t = lid();
    let lane = t % lanes;
    let r = wid() * (64u32 / lanes) + t / lanes;
    let live = r < window_rows;
    let t0 = wid_y() * 4u32;
    let words = cols / 16u32;
    let mut s0: i32 = 0;
    let mut s1: i32 = 0;
    let mut s2: i32 = 0;
    let mut s3: i32 = 0;
    for w in (lane..words).step_by(lanes) {
        if !live {
            break;
        }
        let packed = codes[r * words + w];
        for b in 0..4u32 {
            let at = w * 4u32 + b;
            let k = (at / 32u32) * 128u32 + at % 32u32;
            let bits = (packed >> (8u32 * b)) & 255u32;
            let c0 = (bits >> 6u32) as i32 - 1;
            let c1 = ((bits >> 4u32) & 3u32) as i32 - 1;
            let c2 = ((bits >> 2u32) & 3u32) as i32 - 1;
            let c3 = (bits & 3u32) as i32 - 1;
            let a = t0 * cols + k;
            s0 += c0 * q[a] + c1 * q[a + 32u32] + c2 * q[a + 64u32] + c3 * q[a + 96u32];
            if t0 + 1u32 < n {
                let a1 = a + cols;
                s1 += c0 * q[a1] + c1 * q[a1 + 32u32] + c2 * q[a1 + 64u32] + c3 * q[a1 + 96u32];
            }
            if t0 + 2u32 < n {
                let a2 = a + 2u32 * cols;
                s2 += c0 * q[a2] + c1 * q[a2 + 32u32] + c2 * q[a2 + 64u32] + c3 * q[a2 + 96u32];
            }
            if t0 + 3u32 < n {
                let a3 = a + 3u32 * cols;
                s3 += c0 * q[a3] + c1 * q[a3 + 32u32] + c2 * q[a3 + 64u32] + c3 * q[a3 + 96u32];
            }
        }
    }
    acc[t] = s0;
    acc[64u32 + t] = s1;
    acc[128u32 + t] = s2;
    acc[192u32 + t] = s3;
    barrier();
    row_sums_i32(acc, t, lane, lanes);
    if lane == 0u32 && live {
        for j in 0..4u32 {
            if t0 + j < n {
                out[(t0 + j) * rows + row0 + r] =
                    (acc[64u32 * j + t] as f32) / scale[t0 + j] * beta;
            }
        }
    }
}

/// TQ1_0/TQ2_0 (repacked) × Q8_K blocks: per 256-element block the exact integer
/// `Σ(c−1)·q`, then `acc += sumi · (d_act · d_weight)` as ggml does; `wscale` holds the
/// weight scale of every (row, block) of this window, `d` the activation scale of every
/// (token, block) from [`crate::quantize_q8k`].
#[kernel(workgroup = 64, uses(row_sums))]
pub fn bitlinear_tq(
    codes: &[u32],
    wscale: &[f32],
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
    let words = cols / 16u32;
    let blocks = cols / 256u32;
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
        for w in blk * 16u32..blk * 16u32 + 16u32 {
            let packed = codes[r * words + w];
            for b in 0..4u32 {
                let at = w * 4u32 + b;
                let k = (at / 32u32) * 128u32 + at % 32u32;
                let bits = (packed >> (8u32 * b)) & 255u32;
                let c0 = (bits >> 6u32) as i32 - 1;
                let c1 = ((bits >> 4u32) & 3u32) as i32 - 1;
                let c2 = ((bits >> 2u32) & 3u32) as i32 - 1;
                let c3 = (bits & 3u32) as i32 - 1;
                let a = t0 * cols + k;
                s0 += c0 * q[a] + c1 * q[a + 32u32] + c2 * q[a + 64u32] + c3 * q[a + 96u32];
                if t0 + 1u32 < n {
                    let a1 = a + cols;
                    s1 += c0 * q[a1] + c1 * q[a1 + 32u32] + c2 * q[a1 + 64u32] + c3 * q[a1 + 96u32];
                }
                if t0 + 2u32 < n {
                    let a2 = a + 2u32 * cols;
                    s2 += c0 * q[a2] + c1 * q[a2 + 32u32] + c2 * q[a2 + 64u32] + c3 * q[a2 + 96u32];
                }
                if t0 + 3u32 < n {
                    let a3 = a + 3u32 * cols;
                    s3 += c0 * q[a3] + c1 * q[a3 + 32u32] + c2 * q[a3 + 64u32] + c3 * q[a3 + 96u32];
                }
            }
        }
        let ws = wscale[r * blocks + blk];
        f0 += (s0 as f32) * (d[t0 * blocks + blk] * ws);
        if t0 + 1u32 < n {
            f1 += (s1 as f32) * (d[(t0 + 1u32) * blocks + blk] * ws);
        }
        if t0 + 2u32 < n {
            f2 += (s2 as f32) * (d[(t0 + 2u32) * blocks + blk] * ws);
        }
        if t0 + 3u32 < n {
            f3 += (s3 as f32) * (d[(t0 + 3u32) * blocks + blk] * ws);
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

/// [`bitlinear_i2s`] with `dot4I8Packed` (WGSL's `packed_4x8_integer_dot_product`; one
/// instruction per four products where the GPU has it): the four crumbs of each code byte
/// belong to elements 32 apart, so masking one crumb position across a word's four bytes gives
/// four consecutive elements, matched by one word of the activations packed by
/// [`crate::quantize_i8_packed`]. `Σcode·q − Σq` is the same exact integer as the plain path.
#[kernel(workgroup = 64, uses(row_sums_i32))]
pub fn bitlinear_i2s_dp4(
    codes: &[u32],
    q: &[u32],
    scale: &[f32],
    sum: &[i32],
    out: &mut [f32],
    #[uniform] cols: u32,
    #[uniform] rows: u32,
    #[uniform] row0: u32,
    #[uniform] window_rows: u32,
    #[uniform] n: u32,
    #[comptime] lanes: u32,
    #[uniform] beta: f32,
    #[shared] acc: &mut [i32; 256],
) {
    let t = lid();
    let lane = t % lanes;
    let r = wid() * (64u32 / lanes) + t / lanes;
    let live = r < window_rows;
    let t0 = wid_y() * 4u32;
    let words = cols / 16u32;
    let qwords = cols / 4u32;
    let mask = 50529027u32;
    let mut s0: i32 = 0;
    let mut s1: i32 = 0;
    let mut s2: i32 = 0;
    let mut s3: i32 = 0;
    for w in (lane..words).step_by(lanes) {
        if !live {
            break;
        }
        let packed = codes[r * words + w];
        let c0 = (packed >> 6u32) & mask;
        let c1 = (packed >> 4u32) & mask;
        let c2 = (packed >> 2u32) & mask;
        let c3 = packed & mask;
        let at = w * 4u32;
        let b = (at / 32u32) * 32u32 + (at % 32u32) / 4u32;
        let a = t0 * qwords + b;
        s0 += dot4_i8_packed(c0, q[a])
            + dot4_i8_packed(c1, q[a + 8u32])
            + dot4_i8_packed(c2, q[a + 16u32])
            + dot4_i8_packed(c3, q[a + 24u32]);
        if t0 + 1u32 < n {
            let a1 = a + qwords;
            s1 += dot4_i8_packed(c0, q[a1])
                + dot4_i8_packed(c1, q[a1 + 8u32])
                + dot4_i8_packed(c2, q[a1 + 16u32])
                + dot4_i8_packed(c3, q[a1 + 24u32]);
        }
        if t0 + 2u32 < n {
            let a2 = a + 2u32 * qwords;
            s2 += dot4_i8_packed(c0, q[a2])
                + dot4_i8_packed(c1, q[a2 + 8u32])
                + dot4_i8_packed(c2, q[a2 + 16u32])
                + dot4_i8_packed(c3, q[a2 + 24u32]);
        }
        if t0 + 3u32 < n {
            let a3 = a + 3u32 * qwords;
            s3 += dot4_i8_packed(c0, q[a3])
                + dot4_i8_packed(c1, q[a3 + 8u32])
                + dot4_i8_packed(c2, q[a3 + 16u32])
                + dot4_i8_packed(c3, q[a3 + 24u32]);
        }
    }
    acc[t] = s0;
    acc[64u32 + t] = s1;
    acc[128u32 + t] = s2;
    acc[192u32 + t] = s3;
    barrier();
    row_sums_i32(acc, t, lane, lanes);
    if lane == 0u32 && live {
        for j in 0..4u32 {
            if t0 + j < n {
                out[(t0 + j) * rows + row0 + r] =
                    ((acc[64u32 * j + t] - sum[t0 + j]) as f32) / scale[t0 + j] * beta;
            }
        }
    }
}
