//! Float (F32, F16, BF16) and Q8_0 weight matrices times activations, with the launch geometry
//! and output stage of `bitlinear.rs`: `lanes` threads per output row, `ROWS` rows a thread and
//! so `ROWS · 64 / lanes` rows per workgroup, a tile of up to `TILE` tokens per weight pass,
//! [`row_fold`] (the lanes' sums in lane order, which their tiled kernels follow) then
//! [`store_rows`] for each of the thread's rows. Each kernel has a wide-step
//! instance (`*_wide`, more tokens and rows a thread) summing every output in the same order.

use hesper_dsl::kernel;

use crate::reduce::row_fold;
use crate::tile::{expert_base, expert_rows, input_row, store_rows};

/// F32 weights (held as raw words). Lane `l` sums columns `l, l + lanes, …` and the lanes'
/// sums are added in lane order ([`row_fold`]), the order the tiled kernel
/// [`crate::matvec_f32_gemm`] follows.
#[kernel(
    workgroup = 64,
    uses(row_fold, store_rows),
    consts(TILE = 4, ROWS = 1),
    also(matvec_f32_wide(TILE = 16, ROWS = 4))
)]
pub fn matvec_f32<const TILE: u32, const ROWS: u32>(
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
    let group = 64u32 / lanes;
    let r0 = wid() * group * ROWS + t / lanes;
    let mut rr = [0u32; ROWS];
    for m in 0..ROWS {
        rr[m] = (r0 + m * group).min(window_rows - 1u32);
    }
    let t0 = wid_y() * TILE;
    let mut f = [0.0f32; TILE * ROWS];
    for i in (lane..cols).step_by(lanes) {
        if r0 >= window_rows {
            break;
        }
        let mut wv = [0.0f32; ROWS];
        for m in 0..ROWS {
            wv[m] = f32_from_bits(w[rr[m] * cols + i]);
        }
        for j in 0..TILE {
            if t0 + j < n {
                let xv = x[(t0 + j) * cols + i];
                for m in 0..ROWS {
                    f[m * TILE + j] += wv[m] * xv;
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

/// F16 weights (two per word, the lower first; `cols` even) times activations rounded to f16
/// as ggml does for F16 matrices, packed the same way by [`crate::pack_f16`] (`xh`: `cols / 2`
/// words a token). Lane `l` sums words `l, l + lanes, …` and the lanes' sums are added in lane
/// order ([`row_fold`]), the order the tiled kernel [`crate::matvec_f16_gemm`] follows.
#[kernel(
    workgroup = 64,
    uses(row_fold, store_rows, expert_base, expert_rows, input_row),
    consts(TILE = 4, ROWS = 1, IDS = 0),
    also(matvec_f16_wide(TILE = 16, ROWS = 4), matvec_f16_id(TILE = 1, IDS = 1))
)]
pub fn matvec_f16<const TILE: u32, const ROWS: u32, const IDS: u32>(
    w: &[u32],
    xh: &[u32],
    ids: &[u32],
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
    #[uniform] per_input: u32,
    #[uniform] expert0: u32,
    #[uniform] experts: u32,
    #[shared] acc: &mut [f32; 64 * TILE],
) {
    let t = lid();
    let lane = t % lanes;
    let group = 64u32 / lanes;
    let r0 = wid() * group * ROWS + t / lanes;
    let t0 = wid_y() * TILE;
    // The `_id` instances (one row of activations a workgroup row): the rows of expert
    // `ids[t0]` of a stacked matrix, over activation row `t0 / per_input`; none where the
    // expert lies in another window of experts.
    let base = expert_base(ids, t0, window_rows, expert0, IDS);
    let live = expert_rows(ids, t0, window_rows, expert0, experts, IDS);
    let a0 = input_row(t0, per_input, IDS);
    let mut rr = [0u32; ROWS];
    for m in 0..ROWS {
        rr[m] = base + (r0 + m * group).min(window_rows - 1u32);
    }
    let half = cols / 2u32;
    let mut f = [0.0f32; TILE * ROWS];
    for i in (lane..half).step_by(lanes) {
        if r0 >= live {
            break;
        }
        let mut lo = [0.0f32; ROWS];
        let mut hi = [0.0f32; ROWS];
        for m in 0..ROWS {
            let word = w[rr[m] * half + i];
            lo[m] = unpack_f16_lo(word);
            hi[m] = unpack_f16_hi(word);
        }
        for j in 0..TILE {
            if t0 + j < n {
                let a = xh[(a0 + j) * half + i];
                let alo = unpack_f16_lo(a);
                let ahi = unpack_f16_hi(a);
                for m in 0..ROWS {
                    f[m * TILE + j] += lo[m] * alo + hi[m] * ahi;
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
            live,
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

/// BF16 weights (two per word, the lower first; `cols` even); the activations are rounded
/// through bf16 first (to nearest, ties to even), as ggml does for BF16 matrices. Lane `l` sums
/// words `l, l + lanes, …` and the lanes' sums are added in lane order ([`row_fold`]), the
/// order the tiled kernel [`crate::matvec_bf16_gemm`] follows.
#[kernel(
    workgroup = 64,
    uses(row_fold, store_rows, expert_base, expert_rows, input_row),
    consts(TILE = 4, ROWS = 1, IDS = 0),
    also(
        matvec_bf16_wide(TILE = 16, ROWS = 4),
        matvec_bf16_id(TILE = 1, IDS = 1)
    )
)]
pub fn matvec_bf16<const TILE: u32, const ROWS: u32, const IDS: u32>(
    w: &[u32],
    x: &[f32],
    ids: &[u32],
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
    #[uniform] per_input: u32,
    #[uniform] expert0: u32,
    #[uniform] experts: u32,
    #[shared] acc: &mut [f32; 64 * TILE],
) {
    let t = lid();
    let lane = t % lanes;
    let group = 64u32 / lanes;
    let r0 = wid() * group * ROWS + t / lanes;
    let t0 = wid_y() * TILE;
    // The `_id` instances (one row of activations a workgroup row): the rows of expert
    // `ids[t0]` of a stacked matrix, over activation row `t0 / per_input`; none where the
    // expert lies in another window of experts.
    let base = expert_base(ids, t0, window_rows, expert0, IDS);
    let live = expert_rows(ids, t0, window_rows, expert0, experts, IDS);
    let a0 = input_row(t0, per_input, IDS);
    let mut rr = [0u32; ROWS];
    for m in 0..ROWS {
        rr[m] = base + (r0 + m * group).min(window_rows - 1u32);
    }
    let half = cols / 2u32;
    let mut f = [0.0f32; TILE * ROWS];
    for i in (lane..half).step_by(lanes) {
        if r0 >= live {
            break;
        }
        let mut lo = [0.0f32; ROWS];
        let mut hi = [0.0f32; ROWS];
        for m in 0..ROWS {
            let word = w[rr[m] * half + i];
            lo[m] = f32_from_bits(word << 16u32);
            hi[m] = f32_from_bits(word & 4294901760u32);
        }
        for j in 0..TILE {
            if t0 + j < n {
                let a = (a0 + j) * cols + 2u32 * i;
                let xa = f32_to_bits(x[a]);
                let xb = f32_to_bits(x[a + 1u32]);
                let ra = f32_from_bits((xa + 32767u32 + ((xa >> 16u32) & 1u32)) & 4294901760u32);
                let rb = f32_from_bits((xb + 32767u32 + ((xb >> 16u32) & 1u32)) & 4294901760u32);
                for m in 0..ROWS {
                    f[m * TILE + j] += lo[m] * ra + hi[m] * rb;
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
            live,
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

/// Q8_0 weights (repacked: the 32 int8 of each block as 8 words, the f16 block scales as f32
/// in `wd[row·blocks + block]`) times Q8_0 activations from [`crate::quantize_q8_0`] (four
/// codes a word): per block the exact integer dot, then `acc += sumi · (d_weight · d_act)` as
/// ggml does. `DP4 = 1` (the `_dp4` instances) multiplies four codes at once with
/// `dot4I8Packed` where the WGSL implementation has it; the integer sums, and so every bit,
/// are the same. Lane `l` sums blocks `l, l + lanes, …` and the lanes' sums are added in lane
/// order ([`row_fold`]), the order the tiled kernel [`crate::matvec_q8_0_gemm`] follows.
/// The activations' scales are read from element `d_at` of `d` on: 0 where a quantizer wrote
/// them apart, past the codes where [`crate::rope_attention`] wrote both into one buffer
/// (bound as `q` and as `d`).
#[kernel(
    workgroup = 64,
    uses(row_fold, store_rows, expert_base, expert_rows, input_row),
    consts(TILE = 4, ROWS = 1, DP4 = 0, IDS = 0),
    also(
        matvec_q8_0_wide(TILE = 8, ROWS = 4),
        matvec_q8_0_dp4(DP4 = 1),
        matvec_q8_0_dp4_wide(TILE = 8, ROWS = 4, DP4 = 1),
        matvec_q8_0_id(TILE = 1, IDS = 1),
        matvec_q8_0_dp4_id(TILE = 1, DP4 = 1, IDS = 1)
    )
)]
pub fn matvec_q8_0<const TILE: u32, const ROWS: u32, const DP4: u32, const IDS: u32>(
    wq: &[u32],
    wd: &[f32],
    q: &[u32],
    d: &[f32],
    ids: &[u32],
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
    #[uniform] d_at: u32,
    #[uniform] per_input: u32,
    #[uniform] expert0: u32,
    #[uniform] experts: u32,
    #[shared] acc: &mut [f32; 64 * TILE],
) {
    let t = lid();
    let lane = t % lanes;
    let group = 64u32 / lanes;
    let r0 = wid() * group * ROWS + t / lanes;
    let t0 = wid_y() * TILE;
    // The `_id` instances (one row of activations a workgroup row): the rows of expert
    // `ids[t0]` of a stacked matrix, over activation row `t0 / per_input`; none where the
    // expert lies in another window of experts.
    let base = expert_base(ids, t0, window_rows, expert0, IDS);
    let live = expert_rows(ids, t0, window_rows, expert0, experts, IDS);
    let a0 = input_row(t0, per_input, IDS);
    let mut rr = [0u32; ROWS];
    for m in 0..ROWS {
        rr[m] = base + (r0 + m * group).min(window_rows - 1u32);
    }
    let blocks = cols / 32u32;
    let mut f = [0.0f32; TILE * ROWS];
    for blk in (lane..blocks).step_by(lanes) {
        if r0 >= live {
            break;
        }
        let mut s = [0i32; TILE * ROWS];
        for i in 0..8u32 {
            let mut word = [0u32; ROWS];
            for m in 0..ROWS {
                word[m] = wq[(rr[m] * blocks + blk) * 8u32 + i];
            }
            for j in 0..TILE {
                if t0 + j < n {
                    let qw = q[(a0 + j) * (cols / 4u32) + blk * 8u32 + i];
                    if DP4 == 1u32 {
                        for m in 0..ROWS {
                            s[m * TILE + j] += dot4_i8_packed(word[m], qw);
                        }
                    } else {
                        for b in 0..4u32 {
                            let qv = (((qw >> (8u32 * b)) & 255u32) ^ 128u32) as i32 - 128;
                            for m in 0..ROWS {
                                let wv = (((word[m] >> (8u32 * b)) & 255u32) ^ 128u32) as i32 - 128;
                                s[m * TILE + j] += wv * qv;
                            }
                        }
                    }
                }
            }
        }
        for m in 0..ROWS {
            let ws = wd[rr[m] * blocks + blk];
            for j in 0..TILE {
                if t0 + j < n {
                    f[m * TILE + j] +=
                        (s[m * TILE + j] as f32) * (ws * d[d_at + (a0 + j) * blocks + blk]);
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
            live,
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
