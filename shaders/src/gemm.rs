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
//! not depend on its batch-mates). Only layouts whose sums are exact integers over the whole
//! row (I2_S: ternary codes times int8 activations) can be summed in any order and so have a
//! tiled kernel here; their epilogue is the matrix-vector kernel's, expression for expression,
//! and the output stage is the same [`store_rows`].

use hesper_dsl::kernel;

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
