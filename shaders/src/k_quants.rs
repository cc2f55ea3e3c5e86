//! K-quant weight matrices (Q4_K, Q5_K, Q6_K) times Q8_K activations, with the launch geometry
//! and output stage of `bitlinear.rs`: `lanes` threads per output row, `ROWS` rows a thread
//! (`ROWS · 64 / lanes` per workgroup), a tile of up to `TILE` tokens per weight pass,
//! [`row_fold`] (the lanes' sums in lane order) then [`store_rows`] for each of the thread's
//! rows; `matvec_kq_wide` is the wide-step instance, summing every output in the same order,
//! and [`crate::matvec_kq_gemm`] the tiled kernel, which follows it too.

use hesper_dsl::{kernel, kernel_fn};

use crate::reduce::row_fold;
use crate::tile::{expert_base, expert_rows, input_row, store_rows};

/// The integer scale of sub-block `s` from the word holding its pair of sub-blocks (the low
/// byte of its half, signed).
#[kernel_fn]
pub fn kq_scale(word: u32, s: u32) -> i32 {
    let half = (word >> (16u32 * (s % 2u32))) & 65535u32;
    ((half & 255u32) ^ 128u32) as i32 - 128
}

/// The minimum of sub-block `s` from the word holding its pair of sub-blocks (the high byte
/// of its half).
#[kernel_fn]
pub fn kq_min(word: u32, s: u32) -> i32 {
    ((word >> (16u32 * (s % 2u32) + 8u32)) & 255u32) as i32
}

/// K-quant weights, repacked at upload into one layout for the three types: each row its
/// codes' low four bits as nibbles, eight to a word (element `8i + b` of a row in bits
/// `4b..4b + 4` of word `i`: `cols / 8` words), then their `high` bits above those (none for
/// Q4_K, one for Q5_K, two for Q6_K), `32 / high` to a word, element `e` in bits
/// `high·(e % (32 / high))..` of word `e / (32 / high)` (`cols·high / 32` words), then two bytes
/// per sub-block, two sub-blocks to a word (the earlier in the low half), holding the
/// sub-block's integer scale (the low byte, signed) and minimum (the high byte)
/// ([`kq_scale`], [`kq_min`]); `wd` holds `d` and `dmin` of every (row, block). A code is its bits less
/// `offset` (Q6_K's 32). The upload is the file's bits but for `d`, `dmin` (f32).
/// `sub` is the sub-block length: 32 (Q4_K, Q5_K) or 16 (Q6_K, whose minimums are 0). Q8_K
/// activations from [`crate::quantize_q8k`]. Per block the exact integers
/// `sumi = Σ_s scale_s · Σ code·q` and `summ = Σ_s min_s · Σ q`, then
/// `acc += (d·d_act)·sumi − (dmin·d_act)·summ`, as the CPU's scalar kernels do. Lane `l` sums
/// blocks `l, l + lanes, …` and the lanes' sums are added in lane order ([`row_fold`]), the
/// order the tiled kernel follows. The activations' scales are read from element `d_at` of `d`
/// on: 0 where a quantizer wrote them apart, past the codes where a decoded token's attention
/// wrote both into the codes' buffer ([`crate::OUT_Q8_K`]), bound again as `d`.
#[kernel(
    workgroup = 64,
    uses(
        row_fold,
        store_rows,
        kq_scale,
        kq_min,
        expert_base,
        expert_rows,
        input_row
    ),
    consts(TILE = 4, ROWS = 1, IDS = 0),
    also(matvec_kq_wide(TILE = 8, ROWS = 2), matvec_kq_id(TILE = 1, IDS = 1))
)]
pub fn matvec_kq<const TILE: u32, const ROWS: u32, const IDS: u32>(
    w: &[u32],
    wd: &[f32],
    q: &[i32],
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
    #[comptime] high: u32,
    #[uniform] mode: u32,
    #[uniform] out_scale: f32,
    #[uniform] out_scale_odd: f32,
    #[uniform] split_k: u32,
    #[uniform] split_v: u32,
    #[uniform] out_scale_v: f32,
    #[uniform] sub: u32,
    #[uniform] offset: u32,
    #[uniform] per_input: u32,
    #[uniform] expert0: u32,
    #[uniform] experts: u32,
    #[uniform] d_at: u32,
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
    // Words of nibbles and of high bits a row holds; codes per word of high bits (`max` keeps
    // the division defined where there are none).
    let nibble_words = cols / 8u32;
    let high_words = cols * high / 32u32;
    let per_high = 32u32 / high.max(1u32);
    let high_mask = (1u32 << high) - 1u32;
    let words = nibble_words + high_words;
    let blocks = cols / 256u32;
    let subs = 256u32 / sub;
    let stride = words + blocks * subs / 2u32;
    let mut f = [0.0f32; TILE * ROWS];
    for blk in (lane..blocks).step_by(lanes) {
        if r0 >= live {
            break;
        }
        let mut si = [0i32; TILE * ROWS];
        let mut sm = [0i32; TILE * ROWS];
        for s in 0..subs {
            let mut scale = [0i32; ROWS];
            let mut mins = [0i32; ROWS];
            for m in 0..ROWS {
                let packed = w[rr[m] * stride + words + (blk * subs + s) / 2u32];
                scale[m] = kq_scale(packed, s);
                mins[m] = kq_min(packed, s);
            }
            let e0 = blk * 256u32 + s * sub;
            let mut sd = [0i32; TILE * ROWS];
            // Σq of the sub-block, the same for every row.
            let mut sq = [0i32; TILE];
            for i in 0..sub / 8u32 {
                let e = e0 + 8u32 * i;
                let mut nibbles = [0u32; ROWS];
                // The eight codes' high bits, from one word (8 divides `per_high`).
                let mut highs = [0u32; ROWS];
                for m in 0..ROWS {
                    nibbles[m] = w[rr[m] * stride + e / 8u32];
                    if high > 0u32 {
                        highs[m] = w[rr[m] * stride + nibble_words + e / per_high]
                            >> (high * (e % per_high));
                    }
                }
                for b in 0..8u32 {
                    let mut wv = [0i32; ROWS];
                    for m in 0..ROWS {
                        let code = ((nibbles[m] >> (4u32 * b)) & 15u32)
                            | (((highs[m] >> (high * b)) & high_mask) << 4u32);
                        wv[m] = code as i32 - offset as i32;
                    }
                    for j in 0..TILE {
                        if t0 + j < n {
                            let qv = q[(a0 + j) * cols + e + b];
                            for m in 0..ROWS {
                                sd[m * TILE + j] += wv[m] * qv;
                            }
                            sq[j] += qv;
                        }
                    }
                }
            }
            for m in 0..ROWS {
                for j in 0..TILE {
                    si[m * TILE + j] += scale[m] * sd[m * TILE + j];
                    sm[m * TILE + j] += mins[m] * sq[j];
                }
            }
        }
        for m in 0..ROWS {
            let dw = wd[2u32 * (rr[m] * blocks + blk)];
            let dm = wd[2u32 * (rr[m] * blocks + blk) + 1u32];
            for j in 0..TILE {
                if t0 + j < n {
                    let da = d[d_at + (a0 + j) * blocks + blk];
                    f[m * TILE + j] += (dw * da) * (si[m * TILE + j] as f32)
                        - (dm * da) * (sm[m * TILE + j] as f32);
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
