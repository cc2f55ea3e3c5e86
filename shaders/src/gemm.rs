//! Tiled matrix products for steps of many tokens (prompts, wide server steps): a workgroup of
//! 256 threads computes a tile of [`GEMM_ROWS`](crate::GEMM_ROWS) output rows ×
//! [`GEMM_TOKENS`](crate::GEMM_TOKENS) tokens, staging each slice of the weights and of the
//! activations in workgroup memory once (coalesced loads) and reading it from there for every
//! row and token of the tile; each thread holds `TM` rows × `TN` tokens of sums in registers.
//! The matrix-vector kernels (`bitlinear.rs`, `matvec.rs`) read each weight once per 4 (decode)
//! or 16 (wide) tokens and each activation once per 1–4 rows; here each weight is read from
//! memory once per 64 tokens and each activation once per 64 rows.
//!
//! A tiled kernel must give each output the bits its matrix-vector kernel gives it, so that
//! which one ran a step never changes a row (the server's promise that a request's tokens do
//! not depend on its batch-mates). A layout whose sums are exact integers over the whole row
//! (I2_S: ternary codes times int8 activations) can be summed in any order; its epilogue is the
//! matrix-vector kernel's, expression for expression. A layout with a float step per block (TQ,
//! the K-quants, Q8_0) has its matrix-vector kernel add its lanes' sums (lane `l`: blocks `l, l +
//! lanes, …`) in lane order (`row_fold`); a tiled thread walks the blocks lane by lane
//! ([`lane_order_block`]) and follows that order with two sums an output. The output stage is
//! the same [`store_rows`].

use hesper_dsl::kernel;

use crate::k_quants::{kq_min, kq_scale};
use crate::reduce::lane_order_block;
use crate::tile::{expert_base, expert_rows, slot_input_row, store_rows};

/// [`bitlinear_i2s_dp4`](crate::bitlinear_i2s_dp4) as a tiled product: the same exact integer
/// `Σcode·q − Σq` of every row and token (four products an instruction with `dot4I8Packed`),
/// the same epilogue `(Σ − Σq) / s` and output stage, so every output has that kernel's bits.
/// A K-step is one 128-weight group of the I2_S layout: 8 code words of each of the tile's 64
/// rows and the 32 activation words of each of its 64 tokens (padded to 33 so that the 16
/// tokens a warp reads fall in distinct banks). Thread `t` takes rows `t / 16 + 16·m` and
/// tokens `t % 16 + 16·j` of the tile; the epilogue hands [`store_rows`] 16 tokens at a time,
/// one row a thread for the tile's first 64 threads (`lanes` = 1).
#[kernel(
    workgroup = 256,
    uses(store_rows),
    consts(BM = 64, BN = 64, TM = 4, TN = 4)
)]
pub fn bitlinear_i2s_gemm<const BM: u32, const BN: u32, const TM: u32, const TN: u32>(
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
    #[uniform] mode: u32,
    #[uniform] out_scale: f32,
    #[uniform] out_scale_odd: f32,
    #[uniform] split_k: u32,
    #[uniform] split_v: u32,
    #[uniform] out_scale_v: f32,
    #[shared] wt: &mut [u32; BM * 8],
    #[shared] xt: &mut [u32; BN * 33],
    #[shared] res: &mut [f32; BM * 16],
) {
    let t = lid();
    let tr = t / 16u32;
    let tc = t % 16u32;
    let r_base = wid() * BM;
    let t_base = wid_y() * BN;
    let words = cols / 16u32;
    let qwords = cols / 4u32;
    let mask = 50529027u32;
    let mut s = [0i32; TM * TN];
    for g in 0u32..cols / 128u32 {
        // The group's code words of the tile's rows (rows past the window read its last row)
        // and activation words of its tokens (tokens past the step read its last token).
        for i in 0u32..BM * 8u32 / 256u32 {
            let e = t + 256u32 * i;
            let row = (r_base + e / 8u32).min(window_rows - 1u32);
            wt[e] = codes[row * words + g * 8u32 + e % 8u32];
        }
        for i in 0u32..BN * 32u32 / 256u32 {
            let e = t + 256u32 * i;
            let tok = (t_base + e / 32u32).min(n - 1u32);
            xt[(e / 32u32) * 33u32 + e % 32u32] = q[tok * qwords + g * 32u32 + e % 32u32];
        }
        barrier();
        for w in 0u32..8u32 {
            // Crumb position p of a code word's four bytes: four consecutive weights 32·p
            // apart from the word's first, matched by activation word `w + 8·p`.
            let mut c0 = [0u32; TM];
            let mut c1 = [0u32; TM];
            let mut c2 = [0u32; TM];
            let mut c3 = [0u32; TM];
            for m in 0..TM {
                let packed = wt[(tr + 16u32 * m) * 8u32 + w];
                c0[m] = (packed >> 6u32) & mask;
                c1[m] = (packed >> 4u32) & mask;
                c2[m] = (packed >> 2u32) & mask;
                c3[m] = packed & mask;
            }
            for j in 0..TN {
                let a = (tc + 16u32 * j) * 33u32 + w;
                let q0 = xt[a];
                let q1 = xt[a + 8u32];
                let q2 = xt[a + 16u32];
                let q3 = xt[a + 24u32];
                for m in 0..TM {
                    s[m * TN + j] += dot4_i8_packed(c0[m], q0)
                        + dot4_i8_packed(c1[m], q1)
                        + dot4_i8_packed(c2[m], q2)
                        + dot4_i8_packed(c3[m], q3);
                }
            }
        }
        barrier();
    }
    // Row `t` of the tile (the first BM threads) stores; the others only fill `res`.
    let r = select(window_rows, r_base + t, t < BM);
    for j in 0..TN {
        let tok = (t_base + tc + 16u32 * j).min(n - 1u32);
        for m in 0..TM {
            res[BM * tc + tr + 16u32 * m] = ((s[m * TN + j] - sum[tok]) as f32) / scale[tok];
        }
        store_rows(
            res,
            out,
            out_k,
            out_v,
            t,
            0u32,
            1u32,
            r,
            window_rows,
            row0,
            rows,
            t_base + 16u32 * j,
            n,
            16u32,
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

/// [`bitlinear_tq`](crate::bitlinear_tq) as a tiled product: per 256-weight block the same
/// exact integer `Σ(c−1)·q` of every row and token (here `Σc·q − Σq`, four products an
/// instruction with `dot4I8Packed`), the same float step `sumi · (d_act · d_weight)`; the blocks
/// walked lane by lane ([`lane_order_block`]), each lane's terms into its own sum and that sum
/// into the total `((0 + p₀) + p₁) + …` at the lane's last block — the matrix-vector kernel's
/// order, so every output has its bits. `lanes` is the count the matrix-vector kernel runs the
/// matrix with. A K-step is one 128-weight half of a block: 8 code words of each of the tile's
/// 64 rows (TQ is repacked into I2_S's layout) and the 128 Q8_K codes of each of its 64
/// tokens, packed four to a word as they are staged (rows padded to 33 words, so the 16 tokens
/// a warp reads fall in distinct banks), with each staging thread's share of the token's `Σq`.
/// Thread `t` takes rows `t / 16 + 16·m` and tokens `t % 16 + 16·j`, as
/// [`bitlinear_i2s_gemm`] does.
#[kernel(
    workgroup = 256,
    uses(lane_order_block, store_rows),
    consts(BM = 64, BN = 64, TM = 4, TN = 4)
)]
pub fn bitlinear_tq_gemm<const BM: u32, const BN: u32, const TM: u32, const TN: u32>(
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
    #[uniform] lanes: u32,
    #[uniform] mode: u32,
    #[uniform] out_scale: f32,
    #[uniform] out_scale_odd: f32,
    #[uniform] split_k: u32,
    #[uniform] split_v: u32,
    #[uniform] out_scale_v: f32,
    #[shared] wt: &mut [u32; BM * 8],
    #[shared] xt: &mut [u32; BN * 33],
    #[shared] qsum: &mut [i32; 256],
    #[shared] res: &mut [f32; BM * 16],
) {
    let t = lid();
    let tr = t / 16u32;
    let tc = t % 16u32;
    let r_base = wid() * BM;
    let t_base = wid_y() * BN;
    let words = cols / 16u32;
    let blocks = cols / 256u32;
    let mask = 50529027u32;
    // The token whose codes this thread stages: words `t % 4 + 4·i` of token `t / 4`.
    let staged = t / 4u32;
    let staged_tok = (t_base + staged).min(n - 1u32);
    let mut s = [0i32; TM * TN];
    let mut qs = [0i32; TN];
    let mut part = [0.0f32; TM * TN];
    let mut total = [0.0f32; TM * TN];
    for g in 0u32..cols / 128u32 {
        // Half `g % 2` of the block the walk is at: its code words of the tile's rows (rows
        // past the window read its last row) and codes of its tokens (tokens past the step
        // read its last token).
        let blk = lane_order_block(g / 2u32, blocks, lanes);
        let k0 = blk * 256u32 + (g % 2u32) * 128u32;
        for i in 0u32..BM * 8u32 / 256u32 {
            let e = t + 256u32 * i;
            let row = (r_base + e / 8u32).min(window_rows - 1u32);
            wt[e] = codes[row * words + k0 / 16u32 + e % 8u32];
        }
        let mut staged_sum: i32 = 0;
        for i in 0u32..8u32 {
            let w = t % 4u32 + 4u32 * i;
            let a = staged_tok * cols + k0 + 4u32 * w;
            let mut packed: u32 = 0u32;
            for b in 0u32..4u32 {
                let v = q[a + b];
                staged_sum += v;
                packed = packed | (((v as u32) & 255u32) << (8u32 * b));
            }
            xt[staged * 33u32 + w] = packed;
        }
        qsum[t] = staged_sum;
        barrier();
        for w in 0u32..8u32 {
            // Crumb position p of a code word's four bytes: four consecutive weights 32·p
            // apart from the word's first, matched by activation word `w + 8·p`.
            let mut c0 = [0u32; TM];
            let mut c1 = [0u32; TM];
            let mut c2 = [0u32; TM];
            let mut c3 = [0u32; TM];
            for m in 0..TM {
                let packed = wt[(tr + 16u32 * m) * 8u32 + w];
                c0[m] = (packed >> 6u32) & mask;
                c1[m] = (packed >> 4u32) & mask;
                c2[m] = (packed >> 2u32) & mask;
                c3[m] = packed & mask;
            }
            for j in 0..TN {
                let a = (tc + 16u32 * j) * 33u32 + w;
                let q0 = xt[a];
                let q1 = xt[a + 8u32];
                let q2 = xt[a + 16u32];
                let q3 = xt[a + 24u32];
                for m in 0..TM {
                    s[m * TN + j] += dot4_i8_packed(c0[m], q0)
                        + dot4_i8_packed(c1[m], q1)
                        + dot4_i8_packed(c2[m], q2)
                        + dot4_i8_packed(c3[m], q3);
                }
            }
        }
        for j in 0..TN {
            let a = (tc + 16u32 * j) * 4u32;
            qs[j] += qsum[a] + qsum[a + 1u32] + qsum[a + 2u32] + qsum[a + 3u32];
        }
        // Every second half ends a block: its float step into the lane's sum, and at the
        // lane's last block that sum into the total.
        if g % 2u32 == 1u32 {
            let mut ws = [0.0f32; TM];
            for m in 0..TM {
                let row = (r_base + tr + 16u32 * m).min(window_rows - 1u32);
                ws[m] = wscale[row * blocks + blk];
            }
            for j in 0..TN {
                let tok = (t_base + tc + 16u32 * j).min(n - 1u32);
                let da = d[tok * blocks + blk];
                for m in 0..TM {
                    part[m * TN + j] += ((s[m * TN + j] - qs[j]) as f32) * (da * ws[m]);
                    s[m * TN + j] = 0;
                }
                qs[j] = 0;
            }
            if blk + lanes >= blocks {
                for o in 0..TM * TN {
                    total[o] = total[o] + part[o];
                    part[o] = 0.0;
                }
            }
        }
        barrier();
    }
    // Lanes without a block (more lanes than blocks; `lanes_per_row` never gives that, but the
    // kernels take any count) add their 0.0 in `row_fold`: once is the same as many.
    if lanes > blocks {
        for o in 0..TM * TN {
            total[o] = total[o] + 0.0;
        }
    }
    // Row `t` of the tile (the first BM threads) stores; the others only fill `res`.
    let r = select(window_rows, r_base + t, t < BM);
    for j in 0..TN {
        for m in 0..TM {
            res[BM * tc + tr + 16u32 * m] = total[m * TN + j];
        }
        store_rows(
            res,
            out,
            out_k,
            out_v,
            t,
            0u32,
            1u32,
            r,
            window_rows,
            row0,
            rows,
            t_base + 16u32 * j,
            n,
            16u32,
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

/// [`matvec_kq`](crate::matvec_kq) as a tiled product: Q4_K, Q5_K and Q6_K in that kernel's
/// layout times Q8_K codes, with per sub-block the same exact integers (here `Σcode·q` four
/// products an instruction with `dot4I8Packed`, less `offset·Σq`), per block the same float step
/// `(d·d_act)·sumi − (dmin·d_act)·summ`; the blocks walked lane by lane ([`lane_order_block`]),
/// each lane's terms into its own sum and that sum into the total at the lane's last block —
/// that kernel's order, so every output has its bits. A K-step is 64 columns (two sub-blocks of
/// 32 or four of 16): for each of the tile's 64 rows 16 staged words (8 of nibbles, `2·high` of
/// high bits, then the word or two of the step's sub-blocks' scales), and for each of its 64 tokens 16 words of
/// codes, the even elements of each eight packed into one word and the odd ones into the next
/// (the two nibbles of a weight byte), padded to 17 so that the 16 tokens a warp reads fall in
/// distinct banks, with each staging thread's `Σq` of 16 codes. Thread `t` takes rows
/// `t / 16 + 16·m` and tokens `t % 16 + 16·j`. The `_id` instance multiplies slots grouped by
/// expert ([`moe_group`](crate::moe_group)).
#[kernel(
    workgroup = 256,
    uses(
        lane_order_block,
        store_rows,
        kq_scale,
        kq_min,
        expert_base,
        expert_rows,
        slot_input_row
    ),
    consts(BM = 64, BN = 64, TM = 4, TN = 4, IDS = 0),
    also(matvec_kq_gemm_id(IDS = 1))
)]
pub fn matvec_kq_gemm<
    const BM: u32,
    const BN: u32,
    const TM: u32,
    const TN: u32,
    const IDS: u32,
>(
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
    #[uniform] lanes: u32,
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
    #[uniform] gid_at: u32,
    #[uniform] order_at: u32,
    #[uniform] gathered: u32,
    #[shared] wt: &mut [u32; BM * 16],
    #[shared] xt: &mut [u32; BN * 17],
    #[shared] qsum: &mut [i32; 256],
    #[shared] res: &mut [f32; BM * 16],
) {
    let t = lid();
    let tr = t / 16u32;
    let tc = t % 16u32;
    let r_base = wid() * BM;
    let t_base = wid_y() * BN;
    // The `_id` instance: the rows of the tile's expert, none where it lies in another window
    // (or the tile is past the step's slots); each slot's activation row from the tables.
    let ebase = expert_base(ids, gid_at + t_base, window_rows, expert0, IDS);
    let live = expert_rows(ids, gid_at + t_base, window_rows, expert0, experts, IDS) > 0u32;
    let mut toks = [0u32; TN];
    for j in 0..TN {
        let z = (t_base + tc + 16u32 * j).min(n - 1u32);
        toks[j] = slot_input_row(ids, z, order_at, per_input, gathered, IDS);
    }
    // The row layout of `matvec_kq`.
    let nibble_words = cols / 8u32;
    let high_words = cols * high / 32u32;
    let per_high = 32u32 / high.max(1u32);
    let high_mask = (1u32 << high) - 1u32;
    let words = nibble_words + high_words;
    let blocks = cols / 256u32;
    let subs = 256u32 / sub;
    let stride = words + blocks * subs / 2u32;
    let step_subs = 64u32 / sub;
    let low = 252645135u32;
    // The token whose codes this thread stages: its 16 codes from `16·(t % 4)` of the step.
    let staged = t / 4u32;
    let staged_slot = (t_base + staged).min(n - 1u32);
    let staged_tok = slot_input_row(ids, staged_slot, order_at, per_input, gathered, IDS);
    let mut sd = [0i32; TM * TN];
    let mut si = [0i32; TM * TN];
    let mut sm = [0i32; TM * TN];
    let mut part = [0.0f32; TM * TN];
    let mut total = [0.0f32; TM * TN];
    for g in 0u32..cols / 64u32 {
        // Quarter `g % 4` of the block the walk is at (sub-blocks `(g % 4)·step_subs ..`).
        let blk = lane_order_block(g / 4u32, blocks, lanes);
        let k0 = blk * 256u32 + (g % 4u32) * 64u32;
        // The step's words of the tile's rows (rows past the window read its last row): word
        // `x` of a row is nibbles for x < 8, high bits for 8 ≤ x < 8 + 2·high, and the scale
        // word of the step's sub-blocks `2·(x − 12)` and `2·(x − 12) + 1` from 12.
        for i in 0u32..BM * 16u32 / 256u32 {
            if live {
                let e = t + 256u32 * i;
                let x = e % 16u32;
                let base = (ebase + (r_base + e / 16u32).min(window_rows - 1u32)) * stride;
                let mut v: u32 = 0u32;
                if x < 8u32 {
                    v = w[base + k0 / 8u32 + x];
                } else if x < 8u32 + 2u32 * high {
                    v = w[base + nibble_words + k0 * high / 32u32 + x - 8u32];
                } else if x >= 12u32 && x < 12u32 + step_subs / 2u32 {
                    v = w[base + words + (blk * subs + (g % 4u32) * step_subs) / 2u32 + x - 12u32];
                }
                wt[e] = v;
            }
        }
        // The codes of the tile's tokens (tokens past the step read its last token).
        let a = staged_tok * cols + k0 + 16u32 * (t % 4u32);
        let mut staged_sum: i32 = 0;
        for h in 0u32..2u32 {
            if !live {
                break;
            }
            let mut even: u32 = 0u32;
            let mut odd: u32 = 0u32;
            for b in 0u32..4u32 {
                let ve = q[a + 8u32 * h + 2u32 * b];
                let vo = q[a + 8u32 * h + 2u32 * b + 1u32];
                staged_sum += ve + vo;
                even = even | (((ve as u32) & 255u32) << (8u32 * b));
                odd = odd | (((vo as u32) & 255u32) << (8u32 * b));
            }
            let at = staged * 17u32 + 4u32 * (t % 4u32) + 2u32 * h;
            xt[at] = even;
            xt[at + 1u32] = odd;
        }
        qsum[t] = staged_sum;
        barrier();
        for i in 0u32..8u32 {
            if !live {
                break;
            }
            // Eight weights: the even ones' codes in one word, the odd ones' in another.
            let mut ce = [0u32; TM];
            let mut co = [0u32; TM];
            for m in 0..TM {
                let base = (tr + 16u32 * m) * 16u32;
                let nibbles = wt[base + i];
                ce[m] = nibbles & low;
                co[m] = (nibbles >> 4u32) & low;
                if high > 0u32 {
                    let bits =
                        wt[base + 8u32 + 8u32 * i / per_high] >> (high * (8u32 * i % per_high));
                    for k in 0u32..4u32 {
                        ce[m] = ce[m]
                            | (((bits >> (2u32 * high * k)) & high_mask) << (8u32 * k + 4u32));
                        co[m] = co[m]
                            | (((bits >> (2u32 * high * k + high)) & high_mask)
                                << (8u32 * k + 4u32));
                    }
                }
            }
            for j in 0..TN {
                let at = (tc + 16u32 * j) * 17u32 + 2u32 * i;
                let xe = xt[at];
                let xo = xt[at + 1u32];
                for m in 0..TM {
                    sd[m * TN + j] += dot4_i8_packed(ce[m], xe) + dot4_i8_packed(co[m], xo);
                }
            }
            // A sub-block ends: its scale and minimum, as `matvec_kq` applies them.
            if (8u32 * i + 8u32) % sub == 0u32 {
                let s = 8u32 * i / sub;
                let mut sq = [0i32; TN];
                for j in 0..TN {
                    for u in 0u32..sub / 16u32 {
                        sq[j] += qsum[4u32 * (tc + 16u32 * j) + s * (sub / 16u32) + u];
                    }
                }
                for m in 0..TM {
                    let packed = wt[(tr + 16u32 * m) * 16u32 + 12u32 + s / 2u32];
                    let scale = kq_scale(packed, s);
                    let mins = kq_min(packed, s);
                    for j in 0..TN {
                        si[m * TN + j] += scale * (sd[m * TN + j] - (offset as i32) * sq[j]);
                        sm[m * TN + j] += mins * sq[j];
                        sd[m * TN + j] = 0;
                    }
                }
            }
        }
        // Every fourth step ends a block: its float step into the lane's sum, and at the lane's
        // last block that sum into the total.
        if g % 4u32 == 3u32 && live {
            for m in 0..TM {
                let row = ebase + (r_base + tr + 16u32 * m).min(window_rows - 1u32);
                let dw = wd[2u32 * (row * blocks + blk)];
                let dm = wd[2u32 * (row * blocks + blk) + 1u32];
                for j in 0..TN {
                    let da = d[toks[j] * blocks + blk];
                    part[m * TN + j] +=
                        (dw * da) * (si[m * TN + j] as f32) - (dm * da) * (sm[m * TN + j] as f32);
                    si[m * TN + j] = 0;
                    sm[m * TN + j] = 0;
                }
            }
            if blk + lanes >= blocks {
                for o in 0..TM * TN {
                    total[o] = total[o] + part[o];
                    part[o] = 0.0;
                }
            }
        }
        barrier();
    }
    // Lanes without a block (more lanes than blocks; `lanes_per_row` never gives that, but the
    // kernels take any count) add their 0.0 in `row_fold`: once is the same as many.
    if lanes > blocks {
        for o in 0..TM * TN {
            total[o] = total[o] + 0.0;
        }
    }
    // Row `t` of the tile (the first BM threads) stores; the others only fill `res`.
    let r = select(window_rows, r_base + t, t < BM && live);
    for j in 0..TN {
        for m in 0..TM {
            res[BM * tc + tr + 16u32 * m] = total[m * TN + j];
        }
        store_rows(
            res,
            out,
            out_k,
            out_v,
            t,
            0u32,
            1u32,
            r,
            window_rows,
            row0,
            rows,
            t_base + 16u32 * j,
            n,
            16u32,
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

/// [`matvec_q8_0_dp4`](crate::matvec_q8_0_dp4) as a tiled product: Q8_0 weights (and Q4_0 and
/// MXFP4, widened to them) times Q8_0 activations four codes to a word, per block the same
/// exact integer dot (`dot4I8Packed`) and the same float step `Σ · (d_w · d_x)`; the blocks
/// walked lane by lane ([`lane_order_block`]), each lane's terms into its own sum and that sum
/// into the total at the lane's last block — that kernel's order, so every output has its bits.
/// A K-step is `KB` blocks of the walk: their codes and scales for the tile's 64 rows and 64
/// tokens (the tokens' codes padded to `8·KB + 1` words, so the 16 tokens a warp reads fall in
/// distinct banks). Thread `t` takes rows `t / 16 + 16·m` and tokens `t % 16 + 16·j`. The `_id`
/// instance multiplies slots grouped by expert ([`moe_group`](crate::moe_group)).
#[kernel(
    workgroup = 256,
    uses(lane_order_block, store_rows, expert_base, expert_rows, slot_input_row),
    consts(BM = 64, BN = 64, TM = 4, TN = 4, KB = 2, IDS = 0),
    also(matvec_q8_0_gemm_id(IDS = 1))
)]
pub fn matvec_q8_0_gemm<
    const BM: u32,
    const BN: u32,
    const TM: u32,
    const TN: u32,
    const KB: u32,
    const IDS: u32,
>(
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
    #[uniform] lanes: u32,
    #[uniform] mode: u32,
    #[uniform] out_scale: f32,
    #[uniform] out_scale_odd: f32,
    #[uniform] split_k: u32,
    #[uniform] split_v: u32,
    #[uniform] out_scale_v: f32,
    #[uniform] per_input: u32,
    #[uniform] expert0: u32,
    #[uniform] experts: u32,
    #[uniform] gid_at: u32,
    #[uniform] order_at: u32,
    #[uniform] gathered: u32,
    #[shared] wt: &mut [u32; BM * KB * 8],
    #[shared] ws: &mut [f32; BM * KB],
    #[shared] xt: &mut [u32; BN * (KB * 8 + 1)],
    #[shared] xd: &mut [f32; BN * KB],
    #[shared] res: &mut [f32; BM * 16],
) {
    let t = lid();
    let tr = t / 16u32;
    let tc = t % 16u32;
    let r_base = wid() * BM;
    let t_base = wid_y() * BN;
    // The `_id` instance: the rows of the tile's expert, none where it lies in another window
    // (or the tile is past the step's slots); each slot's activation row from the tables.
    let ebase = expert_base(ids, gid_at + t_base, window_rows, expert0, IDS);
    let live = expert_rows(ids, gid_at + t_base, window_rows, expert0, experts, IDS) > 0u32;
    let blocks = cols / 32u32;
    let xw = KB * 8u32 + 1u32;
    let mut total = [0.0f32; TM * TN];
    let mut part = [0.0f32; TM * TN];
    for k0 in (0u32..blocks).step_by(KB) {
        // The step's blocks of the walk (past the walk's end: the last block again, never
        // added), found once a step.
        let mut step = [0u32; KB];
        for b in 0..KB {
            step[b] = lane_order_block((k0 + b).min(blocks - 1u32), blocks, lanes);
        }
        // Their codes for the tile's rows and tokens (rows past the window and tokens past the
        // step read the last ones).
        for i in 0u32..BM * KB * 8u32 / 256u32 {
            if live {
                let e = t + 256u32 * i;
                let row = ebase + (r_base + e / (KB * 8u32)).min(window_rows - 1u32);
                let blk = step[(e % (KB * 8u32)) / 8u32];
                wt[e] = wq[(row * blocks + blk) * 8u32 + e % 8u32];
            }
        }
        for i in 0u32..BN * KB * 8u32 / 256u32 {
            if live {
                let e = t + 256u32 * i;
                let z = (t_base + e / (KB * 8u32)).min(n - 1u32);
                let tok = slot_input_row(ids, z, order_at, per_input, gathered, IDS);
                let blk = step[(e % (KB * 8u32)) / 8u32];
                xt[(e / (KB * 8u32)) * xw + e % (KB * 8u32)] =
                    q[tok * (cols / 4u32) + blk * 8u32 + e % 8u32];
            }
        }
        if t < BM * KB && live {
            let blk = step[t % KB];
            let row = ebase + (r_base + t / KB).min(window_rows - 1u32);
            ws[t] = wd[row * blocks + blk];
            let z = (t_base + t / KB).min(n - 1u32);
            let tok = slot_input_row(ids, z, order_at, per_input, gathered, IDS);
            xd[t] = d[tok * blocks + blk];
        }
        barrier();
        for b in 0..KB {
            if k0 + b < blocks && live {
                let blk = step[b];
                let mut s = [0i32; TM * TN];
                for i in 0u32..8u32 {
                    let mut word = [0u32; TM];
                    for m in 0..TM {
                        word[m] = wt[(tr + 16u32 * m) * KB * 8u32 + b * 8u32 + i];
                    }
                    for j in 0..TN {
                        let qw = xt[(tc + 16u32 * j) * xw + b * 8u32 + i];
                        for m in 0..TM {
                            s[m * TN + j] += dot4_i8_packed(word[m], qw);
                        }
                    }
                }
                for m in 0..TM {
                    let w_scale = ws[(tr + 16u32 * m) * KB + b];
                    for j in 0..TN {
                        part[m * TN + j] +=
                            (s[m * TN + j] as f32) * (w_scale * xd[(tc + 16u32 * j) * KB + b]);
                    }
                }
                if blk + lanes >= blocks {
                    for o in 0..TM * TN {
                        total[o] = total[o] + part[o];
                        part[o] = 0.0;
                    }
                }
            }
        }
        barrier();
    }
    // Lanes without a block (more lanes than blocks; `lanes_per_row` never gives that, but the
    // kernels take any count) add their 0.0 in `row_fold`: once is the same as many.
    if lanes > blocks {
        for o in 0..TM * TN {
            total[o] = total[o] + 0.0;
        }
    }
    // Row `t` of the tile (the first BM threads) stores; the others only fill `res`.
    let r = select(window_rows, r_base + t, t < BM && live);
    for j in 0..TN {
        for m in 0..TM {
            res[BM * tc + tr + 16u32 * m] = total[m * TN + j];
        }
        store_rows(
            res,
            out,
            out_k,
            out_v,
            t,
            0u32,
            1u32,
            r,
            window_rows,
            row0,
            rows,
            t_base + 16u32 * j,
            n,
            16u32,
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

/// [`matvec_f16`](crate::matvec_f16) as a tiled product: F16 weights (two to a word) times the
/// activations [`crate::pack_f16`] rounded to halves, each word's `lo·a_lo + hi·a_hi` (both
/// products exact in f32) added into its lane's sum; the row's words walked lane by lane
/// ([`lane_order_block`]: lane `l` sums words `l, l + lanes, …`), each lane's sum added into the
/// total at the lane's last word — that kernel's order ([`crate::reduce::row_fold`]), so every
/// output has its bits. A K-step is `KW` words of the walk: those words of the tile's 64 rows
/// and 64 tokens (a lane's words are `lanes` apart in memory, so these loads are strided; each
/// weight is still read from memory once per 64 tokens), the tokens' padded to `KW + 1` words
/// so that the 16 tokens a warp reads fall in distinct banks. Thread `t` takes rows
/// `t / 16 + 16·m` and tokens `t % 16 + 16·j`. The `_id` instance multiplies slots grouped by
/// expert ([`moe_group`](crate::moe_group)).
#[kernel(
    workgroup = 256,
    uses(lane_order_block, store_rows, expert_base, expert_rows, slot_input_row),
    consts(BM = 64, BN = 64, TM = 4, TN = 4, KW = 8, IDS = 0),
    also(matvec_f16_gemm_id(IDS = 1))
)]
pub fn matvec_f16_gemm<
    const BM: u32,
    const BN: u32,
    const TM: u32,
    const TN: u32,
    const KW: u32,
    const IDS: u32,
>(
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
    #[uniform] lanes: u32,
    #[uniform] mode: u32,
    #[uniform] out_scale: f32,
    #[uniform] out_scale_odd: f32,
    #[uniform] split_k: u32,
    #[uniform] split_v: u32,
    #[uniform] out_scale_v: f32,
    #[uniform] per_input: u32,
    #[uniform] expert0: u32,
    #[uniform] experts: u32,
    #[uniform] gid_at: u32,
    #[uniform] order_at: u32,
    #[uniform] gathered: u32,
    #[shared] wt: &mut [u32; BM * KW],
    #[shared] xt: &mut [u32; BN * (KW + 1)],
    #[shared] res: &mut [f32; BM * 16],
) {
    let t = lid();
    let tr = t / 16u32;
    let tc = t % 16u32;
    let r_base = wid() * BM;
    let t_base = wid_y() * BN;
    // The `_id` instance: the rows of the tile's expert, none where it lies in another window
    // (or the tile is past the step's slots); each slot's activation row from the tables.
    let ebase = expert_base(ids, gid_at + t_base, window_rows, expert0, IDS);
    let live = expert_rows(ids, gid_at + t_base, window_rows, expert0, experts, IDS) > 0u32;
    let half = cols / 2u32;
    let xw = KW + 1u32;
    let mut total = [0.0f32; TM * TN];
    let mut part = [0.0f32; TM * TN];
    for k0 in (0u32..half).step_by(KW) {
        // The step's words of the walk (past the walk's end: the last word again, never
        // added), found once a step.
        let mut step = [0u32; KW];
        for b in 0..KW {
            step[b] = lane_order_block((k0 + b).min(half - 1u32), half, lanes);
        }
        // Those words of the tile's rows and tokens (rows past the window and tokens past the
        // step read the last ones).
        for i in 0u32..BM * KW / 256u32 {
            if live {
                let e = t + 256u32 * i;
                let row = ebase + (r_base + e / KW).min(window_rows - 1u32);
                wt[e] = w[row * half + step[e % KW]];
            }
        }
        for i in 0u32..BN * KW / 256u32 {
            if live {
                let e = t + 256u32 * i;
                let z = (t_base + e / KW).min(n - 1u32);
                let tok = slot_input_row(ids, z, order_at, per_input, gathered, IDS);
                xt[(e / KW) * xw + e % KW] = xh[tok * half + step[e % KW]];
            }
        }
        barrier();
        for b in 0..KW {
            if k0 + b < half && live {
                let mut lo = [0.0f32; TM];
                let mut hi = [0.0f32; TM];
                for m in 0..TM {
                    let word = wt[(tr + 16u32 * m) * KW + b];
                    lo[m] = unpack_f16_lo(word);
                    hi[m] = unpack_f16_hi(word);
                }
                for j in 0..TN {
                    let a = xt[(tc + 16u32 * j) * xw + b];
                    let alo = unpack_f16_lo(a);
                    let ahi = unpack_f16_hi(a);
                    for m in 0..TM {
                        part[m * TN + j] += lo[m] * alo + hi[m] * ahi;
                    }
                }
                if step[b] + lanes >= half {
                    for o in 0..TM * TN {
                        total[o] = total[o] + part[o];
                        part[o] = 0.0;
                    }
                }
            }
        }
        barrier();
    }
    // Lanes without a word (more lanes than words) add their 0.0 in `row_fold`: once is the
    // same as many.
    if lanes > half {
        for o in 0..TM * TN {
            total[o] = total[o] + 0.0;
        }
    }
    // Row `t` of the tile (the first BM threads) stores; the others only fill `res`.
    let r = select(window_rows, r_base + t, t < BM && live);
    for j in 0..TN {
        for m in 0..TM {
            res[BM * tc + tr + 16u32 * m] = total[m * TN + j];
        }
        store_rows(
            res,
            out,
            out_k,
            out_v,
            t,
            0u32,
            1u32,
            r,
            window_rows,
            row0,
            rows,
            t_base + 16u32 * j,
            n,
            16u32,
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

/// [`matvec_f32`](crate::matvec_f32) as a tiled product (`BF16 = 1`, `matvec_bf16_gemm`:
/// [`matvec_bf16`](crate::matvec_bf16)): F32 weights times activations, each `w·x` added into
/// its lane's sum (BF16: two weights a word times the activations rounded through bf16, each
/// word's `lo·a_lo + hi·a_hi` — both products exact in f32); the row's words walked lane by lane
/// ([`lane_order_block`]), each lane's sum added into the total at the lane's last word — the
/// matrix-vector kernel's order ([`crate::reduce::row_fold`]), so every output has its bits. A
/// K-step is `KW` words of the walk, staged as [`matvec_f16_gemm`] stages them (strided loads;
/// BF16's activations rounded and packed two to a word as they are staged). The BF16 `_id`
/// instance multiplies slots grouped by expert ([`moe_group`](crate::moe_group)).
#[kernel(
    workgroup = 256,
    uses(lane_order_block, store_rows, expert_base, expert_rows, slot_input_row),
    consts(BM = 64, BN = 64, TM = 4, TN = 4, KW = 8, BF16 = 0, IDS = 0),
    also(matvec_bf16_gemm(BF16 = 1), matvec_bf16_gemm_id(BF16 = 1, IDS = 1))
)]
pub fn matvec_f32_gemm<
    const BM: u32,
    const BN: u32,
    const TM: u32,
    const TN: u32,
    const KW: u32,
    const BF16: u32,
    const IDS: u32,
>(
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
    #[uniform] lanes: u32,
    #[uniform] mode: u32,
    #[uniform] out_scale: f32,
    #[uniform] out_scale_odd: f32,
    #[uniform] split_k: u32,
    #[uniform] split_v: u32,
    #[uniform] out_scale_v: f32,
    #[uniform] per_input: u32,
    #[uniform] expert0: u32,
    #[uniform] experts: u32,
    #[uniform] gid_at: u32,
    #[uniform] order_at: u32,
    #[uniform] gathered: u32,
    #[shared] wt: &mut [u32; BM * KW],
    #[shared] xt: &mut [u32; BN * (KW + 1)],
    #[shared] res: &mut [f32; BM * 16],
) {
    let t = lid();
    let tr = t / 16u32;
    let tc = t % 16u32;
    let r_base = wid() * BM;
    let t_base = wid_y() * BN;
    // The `_id` instance: the rows of the tile's expert, none where it lies in another window
    // (or the tile is past the step's slots); each slot's activation row from the tables.
    let ebase = expert_base(ids, gid_at + t_base, window_rows, expert0, IDS);
    let live = expert_rows(ids, gid_at + t_base, window_rows, expert0, experts, IDS) > 0u32;
    let words = cols / (1u32 + BF16);
    let xw = KW + 1u32;
    let mut total = [0.0f32; TM * TN];
    let mut part = [0.0f32; TM * TN];
    for k0 in (0u32..words).step_by(KW) {
        // The step's words of the walk (past the walk's end: the last word again, never
        // added), found once a step.
        let mut step = [0u32; KW];
        for b in 0..KW {
            step[b] = lane_order_block((k0 + b).min(words - 1u32), words, lanes);
        }
        // Those words of the tile's rows and tokens (rows past the window and tokens past the
        // step read the last ones); BF16's two activations of a word rounded to nearest even
        // and packed as the weights are.
        for i in 0u32..BM * KW / 256u32 {
            if live {
                let e = t + 256u32 * i;
                let row = ebase + (r_base + e / KW).min(window_rows - 1u32);
                wt[e] = w[row * words + step[e % KW]];
            }
        }
        for i in 0u32..BN * KW / 256u32 {
            if live {
                let e = t + 256u32 * i;
                let z = (t_base + e / KW).min(n - 1u32);
                let tok = slot_input_row(ids, z, order_at, per_input, gathered, IDS);
                let a = tok * cols + (1u32 + BF16) * step[e % KW];
                let mut word = f32_to_bits(x[a]);
                if BF16 == 1u32 {
                    let xb = f32_to_bits(x[a + 1u32]);
                    let ra = (word + 32767u32 + ((word >> 16u32) & 1u32)) & 4294901760u32;
                    let rb = (xb + 32767u32 + ((xb >> 16u32) & 1u32)) & 4294901760u32;
                    word = (ra >> 16u32) | rb;
                }
                xt[(e / KW) * xw + e % KW] = word;
            }
        }
        barrier();
        for b in 0..KW {
            if k0 + b < words && live {
                let mut wv = [0u32; TM];
                for m in 0..TM {
                    wv[m] = wt[(tr + 16u32 * m) * KW + b];
                }
                for j in 0..TN {
                    let a = xt[(tc + 16u32 * j) * xw + b];
                    if BF16 == 1u32 {
                        let alo = f32_from_bits(a << 16u32);
                        let ahi = f32_from_bits(a & 4294901760u32);
                        for m in 0..TM {
                            let lo = f32_from_bits(wv[m] << 16u32);
                            let hi = f32_from_bits(wv[m] & 4294901760u32);
                            part[m * TN + j] += lo * alo + hi * ahi;
                        }
                    } else {
                        let xv = f32_from_bits(a);
                        for m in 0..TM {
                            part[m * TN + j] += f32_from_bits(wv[m]) * xv;
                        }
                    }
                }
                if step[b] + lanes >= words {
                    for o in 0..TM * TN {
                        total[o] = total[o] + part[o];
                        part[o] = 0.0;
                    }
                }
            }
        }
        barrier();
    }
    // Lanes without a word (more lanes than words) add their 0.0 in `row_fold`: once is the
    // same as many.
    if lanes > words {
        for o in 0..TM * TN {
            total[o] = total[o] + 0.0;
        }
    }
    // Row `t` of the tile (the first BM threads) stores; the others only fill `res`.
    let r = select(window_rows, r_base + t, t < BM && live);
    for j in 0..TN {
        for m in 0..TM {
            res[BM * tc + tr + 16u32 * m] = total[m * TN + j];
        }
        store_rows(
            res,
            out,
            out_k,
            out_v,
            t,
            0u32,
            1u32,
            r,
            window_rows,
            row0,
            rows,
            t_base + 16u32 * j,
            n,
            16u32,
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
