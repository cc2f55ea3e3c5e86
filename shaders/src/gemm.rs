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
//! not depend on its batch-mates): the same terms added in the same order, the same epilogue
//! expression for expression and the same output stage, [`store_rows`] (one row a thread).
//! I2_S's row sums are exact integers, so any order gives them; F16's and Q8_0's
//! matrix-vector kernels sum contiguous chunks of a row (words, blocks) and add them in order
//! (`row_fold` of `reduce.rs`), which a thread walking the row from its start can follow with
//! two sums an output.

use hesper_dsl::kernel;

use crate::reduce::chunk_of;
use crate::tile::store_rows;

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

/// [`matvec_f16`](crate::matvec_f16) as a tiled product: F16 weights times activations rounded
/// to halves, each output summed in that kernel's order — the row's words walked from its
/// start, `p += w_lo·x_lo + w_hi·x_hi` a word, each of the `lanes` contiguous chunks' sums
/// ([`chunk_of`]) added to the total `((0 + p₀) + p₁) + …` as the walk reaches the chunk's
/// end — so every output has that kernel's bits. `lanes` is the count the matrix-vector kernel
/// runs the matrix with. A K-step is `KW` words (`2·KW` columns) of the tile's 64 rows and 64
/// tokens, staged in workgroup memory (the tokens' rows padded to `KW + 1` words, so the 16
/// tokens a warp reads fall in distinct banks); thread `t` takes rows `t / 16 + 16·m` and tokens
/// `t % 16 + 16·j`, with a running sum and a chunk sum for each.
#[kernel(
    workgroup = 256,
    uses(chunk_of, store_rows),
    consts(BM = 64, BN = 64, TM = 4, TN = 4, KW = 8)
)]
pub fn matvec_f16_gemm<
    const BM: u32,
    const BN: u32,
    const TM: u32,
    const TN: u32,
    const KW: u32,
>(
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
    #[uniform] lanes: u32,
    #[uniform] mode: u32,
    #[uniform] out_scale: f32,
    #[uniform] out_scale_odd: f32,
    #[uniform] split_k: u32,
    #[uniform] split_v: u32,
    #[uniform] out_scale_v: f32,
    #[shared] wt: &mut [u32; BM * KW],
    #[shared] xt: &mut [u32; BN * (KW + 1)],
    #[shared] res: &mut [f32; BM * 16],
) {
    let t = lid();
    let tr = t / 16u32;
    let tc = t % 16u32;
    let r_base = wid() * BM;
    let t_base = wid_y() * BN;
    let half = cols / 2u32;
    let chunk = chunk_of(half, lanes);
    let mut total = [0.0f32; TM * TN];
    let mut part = [0.0f32; TM * TN];
    for k0 in (0u32..half).step_by(KW) {
        // The step's words of the tile's rows and tokens (past the row's end: zero, never
        // added; rows past the window and tokens past the step read the last ones).
        for i in 0u32..BM * KW / 256u32 {
            let e = t + 256u32 * i;
            let row = (r_base + e / KW).min(window_rows - 1u32);
            let k = k0 + e % KW;
            wt[e] = select(0u32, w[row * half + k.min(half - 1u32)], k < half);
        }
        for i in 0u32..BN * KW / 256u32 {
            let e = t + 256u32 * i;
            let tok = (t_base + e / KW).min(n - 1u32);
            let k = k0 + e % KW;
            xt[(e / KW) * (KW + 1u32) + e % KW] = xh[tok * half + k.min(half - 1u32)];
        }
        barrier();
        for kw in 0..KW {
            let u = k0 + kw;
            if u < half {
                let mut lo = [0.0f32; TM];
                let mut hi = [0.0f32; TM];
                for m in 0..TM {
                    let word = wt[(tr + 16u32 * m) * KW + kw];
                    lo[m] = unpack_f16_lo(word);
                    hi[m] = unpack_f16_hi(word);
                }
                for j in 0..TN {
                    let a = xt[(tc + 16u32 * j) * (KW + 1u32) + kw];
                    let alo = unpack_f16_lo(a);
                    let ahi = unpack_f16_hi(a);
                    for m in 0..TM {
                        part[m * TN + j] += lo[m] * alo + hi[m] * ahi;
                    }
                }
                if (u + 1u32) % chunk == 0u32 || u + 1u32 == half {
                    for o in 0..TM * TN {
                        total[o] = total[o] + part[o];
                        part[o] = 0.0;
                    }
                }
            }
        }
        barrier();
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

/// [`matvec_q8_0`](crate::matvec_q8_0) as a tiled product: Q8_0 weights (and Q4_0 and MXFP4,
/// widened to them) times Q8_0 activations four codes to a word, each output summed in that
/// kernel's order — per block the exact integer dot, then `p += Σ · (d_w · d_x)`; each of the
/// `lanes` contiguous chunks of blocks ([`chunk_of`]) added to the total as the walk reaches its
/// end — so every output has that kernel's bits (`DP4 = 1`, `matvec_q8_0_gemm_dp4`:
/// `dot4I8Packed`, the same integers). A K-step is `KB` blocks of the tile's 64 rows (codes and
/// scales) and 64 tokens (codes, padded to `8·KB + 1` words a token, and scales).
#[kernel(
    workgroup = 256,
    uses(chunk_of, store_rows),
    consts(BM = 64, BN = 64, TM = 4, TN = 4, KB = 2, DP4 = 0),
    also(matvec_q8_0_gemm_dp4(DP4 = 1))
)]
pub fn matvec_q8_0_gemm<
    const BM: u32,
    const BN: u32,
    const TM: u32,
    const TN: u32,
    const KB: u32,
    const DP4: u32,
>(
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
    let blocks = cols / 32u32;
    let chunk = chunk_of(blocks, lanes);
    let xw = KB * 8u32 + 1u32;
    let mut total = [0.0f32; TM * TN];
    let mut part = [0.0f32; TM * TN];
    for k0 in (0u32..blocks).step_by(KB) {
        // The step's blocks of the tile's rows and tokens (past the row's end: the last block,
        // never added; rows past the window and tokens past the step read the last ones).
        for i in 0u32..BM * KB * 8u32 / 256u32 {
            let e = t + 256u32 * i;
            let row = (r_base + e / (KB * 8u32)).min(window_rows - 1u32);
            let blk = (k0 + (e % (KB * 8u32)) / 8u32).min(blocks - 1u32);
            wt[e] = wq[(row * blocks + blk) * 8u32 + e % 8u32];
        }
        for i in 0u32..BN * KB * 8u32 / 256u32 {
            let e = t + 256u32 * i;
            let tok = (t_base + e / (KB * 8u32)).min(n - 1u32);
            let blk = (k0 + (e % (KB * 8u32)) / 8u32).min(blocks - 1u32);
            xt[(e / (KB * 8u32)) * xw + e % (KB * 8u32)] =
                q[tok * (cols / 4u32) + blk * 8u32 + e % 8u32];
        }
        if t < BM * KB {
            let row = (r_base + t / KB).min(window_rows - 1u32);
            ws[t] = wd[row * blocks + (k0 + t % KB).min(blocks - 1u32)];
            let tok = (t_base + t / KB).min(n - 1u32);
            xd[t] = d[tok * blocks + (k0 + t % KB).min(blocks - 1u32)];
        }
        barrier();
        for b in 0..KB {
            let blk = k0 + b;
            if blk < blocks {
                let mut s = [0i32; TM * TN];
                for i in 0u32..8u32 {
                    let mut word = [0u32; TM];
                    for m in 0..TM {
                        word[m] = wt[(tr + 16u32 * m) * KB * 8u32 + b * 8u32 + i];
                    }
                    for j in 0..TN {
                        let qw = xt[(tc + 16u32 * j) * xw + b * 8u32 + i];
                        if DP4 == 1u32 {
                            for m in 0..TM {
                                s[m * TN + j] += dot4_i8_packed(word[m], qw);
                            }
                        } else {
                            for c in 0..4u32 {
                                let qv = (((qw >> (8u32 * c)) & 255u32) ^ 128u32) as i32 - 128;
                                for m in 0..TM {
                                    let wv =
                                        (((word[m] >> (8u32 * c)) & 255u32) ^ 128u32) as i32 - 128;
                                    s[m * TN + j] += wv * qv;
                                }
                            }
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
                if (blk + 1u32) % chunk == 0u32 || blk + 1u32 == blocks {
                    for o in 0..TM * TN {
                        total[o] = total[o] + part[o];
                        part[o] = 0.0;
                    }
                }
            }
        }
        barrier();
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
