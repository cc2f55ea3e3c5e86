//! Tiled products on matrix cores (`features(cooperative_matrix)`: Vulkan's
//! `VK_KHR_cooperative_matrix`, NVIDIA's tensor cores, AMD's WMMA): each subgroup multiplies
//! 16×16 tiles of halves into f32 accumulators in one instruction, where the portable tiled
//! kernels (`gemm.rs`) do every product on the shader cores.
//!
//! Only sums that are exact integers can go there and keep their bits: an I2_S row's
//! `Σcode·q` (codes 0–2 and int8 activations, both exact as halves, every product exact and
//! every partial sum an integer below 2²⁴ for rows under 32 768 weights, so the f32 sum is the
//! same in any order and any rounding), and a Q8_0 block's (32 int8 products, below 2²⁴ in
//! magnitude), whose float step then follows on the shader cores in the matrix-vector kernel's
//! order — so every output is that of [`bitlinear_i2s_dp4`](crate::bitlinear_i2s_dp4) or
//! [`matvec_q8_0_dp4`](crate::matvec_q8_0_dp4), whichever kernel a step runs. A float layout
//! (F16, BF16) would be summed in the matrix core's order and lose that promise.
//!
//! Each kernel has a stand-in (`<name>_stand_in`, the same body with each matrix operation
//! written out over workgroup memory) that runs where matrix cores do not, lavapipe included:
//! the tests run it, so a mistake in a tile walk fails without a GPU.

use hesper_dsl::kernel;

use crate::k_quants::{kq_min, kq_scale};
use crate::reduce::lane_order_block;
use crate::tile::store_rows;

/// [`bitlinear_i2s_gemm`](crate::bitlinear_i2s_gemm) on matrix cores: the same tile of 64 rows
/// × 64 tokens, the same exact `Σcode·q` (here by 16×16×16 multiply-adds of halves into f32),
/// the same epilogue `(Σ − Σq) / s` and output stage, so every output has
/// [`bitlinear_i2s_dp4`](crate::bitlinear_i2s_dp4)'s bits. A K-step is one crumb position `p`
/// of an I2_S group (32 weights: `32·p + 4·w + b` is the crumb of byte `b` of the group's code
/// word `w`), staged as halves: the tile's rows row by row (`wa`), its tokens' activation bytes
/// token by token (`xb`). The work is eight units, each a 16-row strip of the tile times half
/// its tokens (two accumulators); subgroup `s` takes unit `s` of each sweep of the whole K walk
/// (one sweep with eight or more subgroups: 32-wide ones, or lavapipe's; two with four
/// 64-wide ones). A sweep ends with its sums in `res` (64 rows × 32 tokens, 16 of each half
/// at a time), where the threads of the rows it computed finish them and hand them to
/// [`store_rows`]. Every tile's offset and stride is a multiple of 16 bytes, as Vulkan asks of
/// cooperative-matrix loads and stores.
#[kernel(
    workgroup = 256,
    uses(store_rows),
    features(cooperative_matrix),
    consts(BM = 64, BN = 64)
)]
pub fn bitlinear_i2s_coop<const BM: u32, const BN: u32>(
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
    #[shared] wa: &mut [f16; BM * 32],
    #[shared] xb: &mut [f16; BN * 32],
    #[shared] res: &mut [f32; BM * 32],
) {
    let t = lid();
    let r_base = wid() * BM;
    let t_base = wid_y() * BN;
    let words = cols / 16u32;
    let qwords = cols / 4u32;
    let mask = 50529027u32;
    let units = BM / 8u32;
    let groups = subgroup_count();
    let sweeps = (units + groups - 1u32) / groups;
    for sweep in 0u32..sweeps {
        // Matrix operations must run in uniform control flow: a subgroup past the last unit
        // repeats it (and stores the same values where its owner does).
        let unit = (subgroup_index() + sweep * groups).min(units - 1u32);
        let strip = unit % (BM / 16u32);
        let half_tile = unit / (BM / 16u32);
        let mut c0 = coop_zero();
        let mut c1 = coop_zero();
        for g in 0u32..cols / 128u32 {
            for p in 0u32..4u32 {
                // Crumb position p of the group's code words of the tile's rows (rows past the
                // window read its last row), and activation words `8·p + w` of its tokens
                // (tokens past the step read its last token), one byte a half.
                for i in 0u32..BM * 8u32 / 256u32 {
                    let e = t + 256u32 * i;
                    let row = (r_base + e / 8u32).min(window_rows - 1u32);
                    let w = e % 8u32;
                    let crumbs = (codes[row * words + g * 8u32 + w] >> (6u32 - 2u32 * p)) & mask;
                    for b in 0u32..4u32 {
                        wa[(e / 8u32) * 32u32 + 4u32 * w + b] =
                            to_f16((crumbs >> (8u32 * b)) & 3u32);
                    }
                }
                for i in 0u32..BN * 8u32 / 256u32 {
                    let e = t + 256u32 * i;
                    let tok = (t_base + e / 8u32).min(n - 1u32);
                    let w = e % 8u32;
                    let word = q[tok * qwords + g * 32u32 + 8u32 * p + w];
                    for b in 0u32..4u32 {
                        xb[(e / 8u32) * 32u32 + 4u32 * w + b] =
                            to_f16(((word << (24u32 - 8u32 * b)) as i32) >> 24u32);
                    }
                }
                barrier();
                for h in 0u32..2u32 {
                    let a = coop_load_a_rows(wa, strip * 16u32 * 32u32 + 16u32 * h, 32u32);
                    let first = half_tile * 32u32;
                    let b0 = coop_load_b_columns(xb, first * 32u32 + 16u32 * h, 32u32);
                    let b1 = coop_load_b_columns(xb, (first + 16u32) * 32u32 + 16u32 * h, 32u32);
                    c0 = coop_multiply_add(a, b0, c0);
                    c1 = coop_multiply_add(a, b1, c1);
                }
                barrier();
            }
        }
        // Each half of the tile's tokens in two sets of 16 (`jj`): every strip stores its sums
        // of tokens `32·half + 16·jj + c` at `res[64·(16·half + c) + row]`; thread `t < 128`
        // takes row `t % 64` of half `t / 64` where this sweep computed it, finishes its 16
        // sums and hands them to the output stage (whose `t` is where the row's sums start).
        let first_unit = sweep * groups;
        let row = t % BM;
        let half_of = t / BM;
        let row_unit = row / 16u32 + (BM / 16u32) * half_of;
        let mine = t < 2u32 * BM && row_unit >= first_unit && row_unit < first_unit + groups;
        for jj in 0u32..2u32 {
            let at = half_tile * 16u32 * BM + strip * 16u32;
            if jj == 0u32 {
                coop_store_columns(c0, res, at, BM);
            } else {
                coop_store_columns(c1, res, at, BM);
            }
            barrier();
            let t0 = t_base + 32u32 * half_of + 16u32 * jj;
            if mine {
                for c in 0u32..16u32 {
                    let tok = (t0 + c).min(n - 1u32);
                    let e = BM * (16u32 * half_of + c) + row;
                    res[e] = ((res[e] as i32 - sum[tok]) as f32) / scale[tok];
                }
            }
            store_rows(
                res,
                out,
                out_k,
                out_v,
                16u32 * BM * half_of + row,
                0u32,
                1u32,
                select(window_rows, r_base + row, mine),
                window_rows,
                row0,
                rows,
                t0,
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
}

/// [`matvec_q8_0_gemm`](crate::matvec_q8_0_gemm) on matrix cores: Q8_0 weights (and Q4_0 and
/// MXFP4, widened to them) times Q8_0 activations, each block's exact integer dot by two
/// 16×16×16 multiply-adds of halves into f32 (int8 codes are exact as halves and a block's sum,
/// at most 32·128² < 2²⁴ in magnitude, is exact in f32 in any order), then that kernel's
/// float step `Σ · (d_w · d_x)` into the lane's sum and the lane's sum into the total at its
/// last block, the blocks walked lane by lane ([`lane_order_block`]) — so every output has
/// [`matvec_q8_0_dp4`](crate::matvec_q8_0_dp4)'s bits, whichever kernel a step runs. A tile is
/// 64 rows × 32 tokens (each block's sums leave the accumulators for the float step: 64 × 32
/// of them, beside the staged codes, fill WebGPU's 16 KiB of workgroup memory). A K-step is one
/// block: its codes staged as halves (`wa`, row by row; `xb`, token by token) and its scales
/// (`ws`, `xd`, alternating between two halves so the next block's can be written while this
/// one's are read); the eight units (a 16-row strip × 16 tokens) are spread over the subgroups
/// in sweeps (a subgroup past the last unit repeats it), each storing its sums into `res`,
/// where thread `t` takes row `t % 64` and tokens `8·(t / 64)` to `8·(t / 64) + 7`. Offsets and
/// strides are multiples of 16 bytes, as Vulkan asks.
#[kernel(
    workgroup = 256,
    uses(lane_order_block, store_rows),
    features(cooperative_matrix),
    consts(BM = 64, BN = 32, PER = 8)
)]
pub fn matvec_q8_0_coop<const BM: u32, const BN: u32, const PER: u32>(
    wq: &[u32],
    wd: &[f32],
    q: &[u32],
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
    #[shared] wa: &mut [f16; BM * 32],
    #[shared] xb: &mut [f16; BN * 32],
    #[shared] ws: &mut [f32; 2 * BM],
    #[shared] xd: &mut [f32; 2 * BN],
    #[shared] res: &mut [f32; BM * BN],
) {
    let t = lid();
    let r_base = wid() * BM;
    let t_base = wid_y() * BN;
    let blocks = cols / 32u32;
    let units = (BM / 16u32) * (BN / 16u32);
    let groups = subgroup_count();
    let sweeps = (units + groups - 1u32) / groups;
    let row = t % BM;
    let first_token = (t / BM) * PER;
    let mut total = [0.0f32; PER];
    let mut part = [0.0f32; PER];
    for k in 0u32..blocks {
        let blk = lane_order_block(k, blocks, lanes);
        let slot = k % 2u32;
        // The block's codes of the tile's rows (rows past the window read its last row) and of
        // its tokens (tokens past the step read its last token), one code a half.
        for i in 0u32..BM * 8u32 / 256u32 {
            let e = t + 256u32 * i;
            let r = (r_base + e / 8u32).min(window_rows - 1u32);
            let word = wq[(r * blocks + blk) * 8u32 + e % 8u32];
            for b in 0u32..4u32 {
                wa[(e / 8u32) * 32u32 + 4u32 * (e % 8u32) + b] =
                    to_f16(((word << (24u32 - 8u32 * b)) as i32) >> 24u32);
            }
        }
        for i in 0u32..BN * 8u32 / 256u32 {
            let e = t + 256u32 * i;
            let tok = (t_base + e / 8u32).min(n - 1u32);
            let word = q[tok * (cols / 4u32) + blk * 8u32 + e % 8u32];
            for b in 0u32..4u32 {
                xb[(e / 8u32) * 32u32 + 4u32 * (e % 8u32) + b] =
                    to_f16(((word << (24u32 - 8u32 * b)) as i32) >> 24u32);
            }
        }
        if t < BM {
            let r = (r_base + t).min(window_rows - 1u32);
            ws[BM * slot + t] = wd[r * blocks + blk];
        } else if t < BM + BN {
            let tok = (t_base + t - BM).min(n - 1u32);
            xd[BN * slot + t - BM] = d[tok * blocks + blk];
        }
        barrier();
        // Matrix operations run in uniform control flow: every subgroup runs every sweep.
        for sweep in 0u32..sweeps {
            let unit = (subgroup_index() + sweep * groups).min(units - 1u32);
            let strip = unit % (BM / 16u32);
            let tokens = unit / (BM / 16u32);
            let mut c = coop_zero();
            for h in 0u32..2u32 {
                let a = coop_load_a_rows(wa, strip * 16u32 * 32u32 + 16u32 * h, 32u32);
                let b = coop_load_b_columns(xb, tokens * 16u32 * 32u32 + 16u32 * h, 32u32);
                c = coop_multiply_add(a, b, c);
            }
            coop_store_columns(c, res, tokens * 16u32 * BM + strip * 16u32, BM);
        }
        barrier();
        let w_scale = ws[BM * slot + row];
        for c in 0..PER {
            let j = first_token + c;
            part[c] += res[BM * j + row] * (w_scale * xd[BN * slot + j]);
        }
        if blk + lanes >= blocks {
            for c in 0..PER {
                total[c] = total[c] + part[c];
                part[c] = 0.0;
            }
        }
    }
    // Lanes without a block add their 0.0, as in the tiled kernel.
    if lanes > blocks {
        for c in 0..PER {
            total[c] = total[c] + 0.0;
        }
    }
    // Every thread has read the last block's sums; the totals take their place, and the tile's
    // first 64 threads hand their rows to the output stage.
    barrier();
    for c in 0..PER {
        res[BM * (first_token + c) + row] = total[c];
    }
    store_rows(
        res,
        out,
        out_k,
        out_v,
        row,
        0u32,
        1u32,
        select(window_rows, r_base + t, t < BM),
        window_rows,
        row0,
        rows,
        t_base,
        n,
        BN,
        mode,
        out_scale,
        out_scale_odd,
        split_k,
        split_v,
        out_scale_v,
    );
}

/// [`matvec_kq_gemm`](crate::matvec_kq_gemm) on matrix cores: Q4_K, Q5_K and Q6_K in
/// [`matvec_kq`](crate::matvec_kq)'s layout times Q8_K codes. A K-step is one sub-block (`sub`:
/// 32 or 16 columns): its codes (0–63, exact as halves) and its tokens' int8 codes staged as
/// halves, its `Σcode·q` by one or two 16×16×16 multiply-adds into f32 (at most 32·63·128 in
/// magnitude: exact), then on the shader cores that kernel's integer step
/// `sumi += scale·(Σcode·q − offset·Σq)`, `summ += min·Σq` and, at a block's last sub-block,
/// its float step `(d·d_act)·sumi − (dmin·d_act)·summ` into the lane's sum, the blocks walked
/// lane by lane ([`lane_order_block`]) — so every output has that kernel's bits. The tile,
/// units and output stage are [`matvec_q8_0_coop`]'s (64 rows × 32 tokens); each staging
/// thread's `Σq` of four codes goes to `qpart`, which 32 threads add up per token while the
/// subgroups multiply.
#[kernel(
    workgroup = 256,
    uses(lane_order_block, store_rows, kq_scale, kq_min),
    features(cooperative_matrix),
    consts(BM = 64, BN = 32, PER = 8)
)]
pub fn matvec_kq_coop<const BM: u32, const BN: u32, const PER: u32>(
    w: &[u32],
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
    #[shared] wa: &mut [f16; BM * 32],
    #[shared] xb: &mut [f16; BN * 32],
    #[shared] ws: &mut [u32; 2 * BM],
    #[shared] qpart: &mut [i32; 256],
    #[shared] qs: &mut [i32; BN],
    #[shared] res: &mut [f32; BM * BN],
) {
    let t = lid();
    let r_base = wid() * BM;
    let t_base = wid_y() * BN;
    // The row layout of `matvec_kq`.
    let nibble_words = cols / 8u32;
    let high_words = cols * high / 32u32;
    let per_high = 32u32 / high.max(1u32);
    let high_mask = (1u32 << high) - 1u32;
    let words = nibble_words + high_words;
    let blocks = cols / 256u32;
    let subs = 256u32 / sub;
    let stride = words + blocks * subs / 2u32;
    let units = (BM / 16u32) * (BN / 16u32);
    let groups = subgroup_count();
    let sweeps = (units + groups - 1u32) / groups;
    let row = t % BM;
    let first_token = (t / BM) * PER;
    let mut si = [0i32; PER];
    let mut sm = [0i32; PER];
    let mut part = [0.0f32; PER];
    let mut total = [0.0f32; PER];
    for k in 0u32..blocks * subs {
        let blk = lane_order_block(k / subs, blocks, lanes);
        let s = k % subs;
        let slot = k % 2u32;
        let e0 = blk * 256u32 + s * sub;
        // The sub-block's codes of the tile's rows, eight (one word of nibbles) a task (rows
        // past the window read its last row), and the word holding their scale and minimum.
        if t < BM * sub / 8u32 {
            let r = t / (sub / 8u32);
            let x = t % (sub / 8u32);
            let base = (r_base + r).min(window_rows - 1u32) * stride;
            let e = e0 + 8u32 * x;
            let nibbles = w[base + e / 8u32];
            let mut bits = 0u32;
            if high > 0u32 {
                bits = w[base + nibble_words + e / per_high] >> (high * (e % per_high));
            }
            for b in 0u32..8u32 {
                let code = ((nibbles >> (4u32 * b)) & 15u32)
                    | (((bits >> (high * b)) & high_mask) << 4u32);
                wa[r * 32u32 + 8u32 * x + b] = to_f16(code);
            }
        }
        if t < BM {
            let base = (r_base + t).min(window_rows - 1u32) * stride;
            ws[BM * slot + t] = w[base + words + (blk * subs + s) / 2u32];
        }
        // Its tokens' codes, four a task (tokens past the step read its last token), each
        // task's Σq in `qpart`.
        if t < BN * sub / 4u32 {
            let tok = t / (sub / 4u32);
            let x = t % (sub / 4u32);
            let at = (t_base + tok).min(n - 1u32) * cols + e0 + 4u32 * x;
            let mut sum: i32 = 0;
            for b in 0u32..4u32 {
                let v = q[at + b];
                sum += v;
                xb[tok * 32u32 + 4u32 * x + b] = to_f16(v);
            }
            qpart[t] = sum;
        }
        barrier();
        // Matrix operations run in uniform control flow: every subgroup runs every sweep.
        for sweep in 0u32..sweeps {
            let unit = (subgroup_index() + sweep * groups).min(units - 1u32);
            let strip = unit % (BM / 16u32);
            let tokens = unit / (BM / 16u32);
            let mut c = coop_zero();
            for h in 0u32..sub / 16u32 {
                let a = coop_load_a_rows(wa, strip * 16u32 * 32u32 + 16u32 * h, 32u32);
                let b = coop_load_b_columns(xb, tokens * 16u32 * 32u32 + 16u32 * h, 32u32);
                c = coop_multiply_add(a, b, c);
            }
            coop_store_columns(c, res, tokens * 16u32 * BM + strip * 16u32, BM);
        }
        if t < BN {
            let mut sum: i32 = 0;
            for u in 0u32..sub / 4u32 {
                sum += qpart[t * (sub / 4u32) + u];
            }
            qs[t] = sum;
        }
        barrier();
        let packed = ws[BM * slot + row];
        let scale = kq_scale(packed, s);
        let mins = kq_min(packed, s);
        for c in 0..PER {
            let j = first_token + c;
            let sq = qs[j];
            si[c] += scale * (res[BM * j + row] as i32 - (offset as i32) * sq);
            sm[c] += mins * sq;
        }
        // A block's last sub-block: its float step into the lane's sum, and at the lane's
        // last block that sum into the total.
        if s == subs - 1u32 {
            let r = (r_base + row).min(window_rows - 1u32);
            let dw = wd[2u32 * (r * blocks + blk)];
            let dm = wd[2u32 * (r * blocks + blk) + 1u32];
            for c in 0..PER {
                let tok = (t_base + first_token + c).min(n - 1u32);
                let da = d[tok * blocks + blk];
                part[c] += (dw * da) * (si[c] as f32) - (dm * da) * (sm[c] as f32);
                si[c] = 0;
                sm[c] = 0;
            }
            if blk + lanes >= blocks {
                for c in 0..PER {
                    total[c] = total[c] + part[c];
                    part[c] = 0.0;
                }
            }
        }
    }
    // Lanes without a block add their 0.0, as in the tiled kernel.
    if lanes > blocks {
        for c in 0..PER {
            total[c] = total[c] + 0.0;
        }
    }
    // Every thread has read the last sub-block's sums; the totals take their place, and the
    // tile's first 64 threads hand their rows to the output stage.
    barrier();
    for c in 0..PER {
        res[BM * (first_token + c) + row] = total[c];
    }
    store_rows(
        res,
        out,
        out_k,
        out_v,
        row,
        0u32,
        1u32,
        select(window_rows, r_base + t, t < BM),
        window_rows,
        row0,
        rows,
        t_base,
        n,
        BN,
        mode,
        out_scale,
        out_scale_odd,
        split_k,
        split_v,
        out_scale_v,
    );
}

/// [`bitlinear_tq_gemm`](crate::bitlinear_tq_gemm) on matrix cores: TQ1_0/TQ2_0 weights
/// (repacked into I2_S's layout, a code `c` meaning `c − 1`) times Q8_K codes. Each block's
/// `Σ(c−1)·q` (the ternary weights −1, 0, 1 and int8 codes exact as halves, the sum at most
/// 256·128 in magnitude: exact) by 16×16×16 multiply-adds into one accumulator over the
/// block's eight K-steps of 32 weights (crumb position `p` of a 128-weight group, as in
/// [`bitlinear_i2s_coop`]), then that kernel's float step `Σ · (d_act · d_weight)` into the
/// lane's sum, the blocks walked lane by lane ([`lane_order_block`]) — so every output has
/// [`bitlinear_tq`](crate::bitlinear_tq)'s bits. The tile, units and output stage are
/// [`matvec_q8_0_coop`]'s (64 rows × 32 tokens); a subgroup's unit holds its accumulator
/// through a block, so where a sweep is not enough (four 64-wide subgroups) the block is
/// staged once per sweep.
#[kernel(
    workgroup = 256,
    uses(lane_order_block, store_rows),
    features(cooperative_matrix),
    consts(BM = 64, BN = 32, PER = 8)
)]
pub fn bitlinear_tq_coop<const BM: u32, const BN: u32, const PER: u32>(
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
    #[shared] wa: &mut [f16; BM * 32],
    #[shared] xb: &mut [f16; BN * 32],
    #[shared] res: &mut [f32; BM * BN],
) {
    let t = lid();
    let r_base = wid() * BM;
    let t_base = wid_y() * BN;
    let words = cols / 16u32;
    let blocks = cols / 256u32;
    let mask = 50529027u32;
    let units = (BM / 16u32) * (BN / 16u32);
    let groups = subgroup_count();
    let sweeps = (units + groups - 1u32) / groups;
    let row = t % BM;
    let first_token = (t / BM) * PER;
    let mut part = [0.0f32; PER];
    let mut total = [0.0f32; PER];
    for kb in 0u32..blocks {
        let blk = lane_order_block(kb, blocks, lanes);
        // Matrix operations run in uniform control flow: every subgroup runs every sweep.
        for sweep in 0u32..sweeps {
            let unit = (subgroup_index() + sweep * groups).min(units - 1u32);
            let strip = unit % (BM / 16u32);
            let tokens = unit / (BM / 16u32);
            let mut c = coop_zero();
            for step in 0u32..8u32 {
                // Crumb position p of half h of the block: its weights of the tile's rows as
                // −1, 0, 1 (rows past the window read its last row) and the codes of its
                // tokens (tokens past the step read its last token), one a half.
                let g = 2u32 * blk + step / 4u32;
                let p = step % 4u32;
                for i in 0u32..BM * 8u32 / 256u32 {
                    let e = t + 256u32 * i;
                    let r = (r_base + e / 8u32).min(window_rows - 1u32);
                    let w = e % 8u32;
                    let crumbs = (codes[r * words + g * 8u32 + w] >> (6u32 - 2u32 * p)) & mask;
                    for b in 0u32..4u32 {
                        wa[(e / 8u32) * 32u32 + 4u32 * w + b] =
                            to_f16(((crumbs >> (8u32 * b)) & 3u32) as i32 - 1);
                    }
                }
                let tok = t / 8u32;
                let x = t % 8u32;
                let at = (t_base + tok).min(n - 1u32) * cols + g * 128u32 + 32u32 * p + 4u32 * x;
                for b in 0u32..4u32 {
                    xb[tok * 32u32 + 4u32 * x + b] = to_f16(q[at + b]);
                }
                barrier();
                for h in 0u32..2u32 {
                    let a = coop_load_a_rows(wa, strip * 16u32 * 32u32 + 16u32 * h, 32u32);
                    let b = coop_load_b_columns(xb, tokens * 16u32 * 32u32 + 16u32 * h, 32u32);
                    c = coop_multiply_add(a, b, c);
                }
                barrier();
            }
            coop_store_columns(c, res, tokens * 16u32 * BM + strip * 16u32, BM);
        }
        barrier();
        // The block's float step into the lane's sum, and at the lane's last block that sum
        // into the total.
        let ws = wscale[(r_base + row).min(window_rows - 1u32) * blocks + blk];
        for c in 0..PER {
            let j = first_token + c;
            let da = d[(t_base + j).min(n - 1u32) * blocks + blk];
            part[c] += res[BM * j + row] * (da * ws);
        }
        if blk + lanes >= blocks {
            for c in 0..PER {
                total[c] = total[c] + part[c];
                part[c] = 0.0;
            }
        }
        // Every thread has read the block's sums before the next block's are stored.
        barrier();
    }
    // Lanes without a block add their 0.0, as in the tiled kernel.
    if lanes > blocks {
        for c in 0..PER {
            total[c] = total[c] + 0.0;
        }
    }
    for c in 0..PER {
        res[BM * (first_token + c) + row] = total[c];
    }
    store_rows(
        res,
        out,
        out_k,
        out_v,
        row,
        0u32,
        1u32,
        select(window_rows, r_base + t, t < BM),
        window_rows,
        row0,
        rows,
        t_base,
        n,
        BN,
        mode,
        out_scale,
        out_scale_odd,
        split_k,
        split_v,
        out_scale_v,
    );
}
