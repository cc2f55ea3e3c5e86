//! A mixture of experts routed on the GPU, its router never read back: each row's experts are
//! chosen from its router logits (`moe_route`, the definition of
//! `hesper_engine::config::Experts::route`), the indirect grids of each expert's launches are
//! zeroed where no row chose it (`gate_grids`: its matrices are never read), and each row's
//! expert outputs are weighed and added in the order chosen (`moe_combine_routed`).

use hesper_dsl::kernel;

/// Each of `n` rows' `n_used` experts among its `n_expert` router logits, most probable first
/// (of equal probabilities the lower id), into `ids` (`n_used` a row), with their weights into
/// `w`: the softmax's probabilities, divided by their sum over the chosen where `normalize` is
/// 1 (a sum of at least 2⁻¹⁴), times `scale`. One thread a row; choice `r` is the most probable
/// expert after choice `r − 1` in that order, so no list of the chosen is kept.
#[kernel(workgroup = 64)]
pub fn moe_route(
    logits: &[f32],
    ids: &mut [u32],
    w: &mut [f32],
    #[uniform] n_expert: u32,
    #[uniform] n_used: u32,
    #[uniform] normalize: u32,
    #[uniform] scale: f32,
    #[uniform] n: u32,
) {
    let t = gid();
    if t < n {
        let base = t * n_expert;
        let mut top: f32 = -3.4028235e38;
        for e in 0u32..n_expert {
            top = top.max(logits[base + e]);
        }
        let mut sum: f32 = 0.0;
        for e in 0u32..n_expert {
            sum = sum + (logits[base + e] - top).exp();
        }
        let inv = 1.0 / sum;
        // Probabilities are at most 1: every expert comes after this one.
        let mut prev_p: f32 = 2.0;
        let mut prev_e: u32 = 0u32;
        let mut total: f32 = 0.0;
        for r in 0u32..n_used {
            let mut best_p: f32 = -1.0;
            let mut best_e: u32 = 0u32;
            for e in 0u32..n_expert {
                let p = (logits[base + e] - top).exp();
                let after = p < prev_p || (p == prev_p && e > prev_e);
                if after && p > best_p {
                    best_p = p;
                    best_e = e;
                }
            }
            let weight = best_p * inv;
            ids[t * n_used + r] = best_e;
            w[t * n_used + r] = weight;
            total = total + weight;
            prev_p = best_p;
            prev_e = best_e;
        }
        let div = select(1.0, total.max(6.1035156e-5), normalize == 1u32);
        for r in 0u32..n_used {
            w[t * n_used + r] = w[t * n_used + r] / div * scale;
        }
    }
}

/// `args[i]` = `grids[i]` where expert `i / per_expert` is among the `n_ids` chosen `ids`, else
/// 0, over the `n` words of `args`: expert `e`'s launches take their grids from words
/// `e · per_expert ..` ([`hesper_gpu::Batch::open_gate`]), so an expert no row chose launches
/// nothing.
#[kernel(workgroup = 256)]
pub fn gate_grids(
    grids: &[u32],
    ids: &[u32],
    args: &mut [u32],
    #[uniform] per_expert: u32,
    #[uniform] n_ids: u32,
    #[uniform] n: u32,
) {
    let i = gid();
    if i < n {
        let e = i / per_expert;
        let mut g: u32 = 0u32;
        for j in 0u32..n_ids {
            if ids[j] == e {
                g = grids[i];
            }
        }
        args[i] = g;
    }
}

/// `out[t][c] = Σ_r w[t·n_used + r] · ys[ids[t·n_used + r]][t][c]` over the `n` values of
/// `out` (rows of `width`), `ys` holding each expert's outputs for every one of the step's
/// `rows` rows: each row's chosen outputs weighted and added in the order chosen, as
/// `moe_combine` adds them (into `out` where `add` is 1).
#[kernel(workgroup = 256)]
pub fn moe_combine_routed(
    ys: &[f32],
    ids: &[u32],
    w: &[f32],
    out: &mut [f32],
    #[uniform] width: u32,
    #[uniform] n_used: u32,
    #[uniform] rows: u32,
    #[uniform] add: u32,
    #[uniform] n: u32,
) {
    let i = gid();
    if i < n {
        let t = i / width;
        let c = i % width;
        let mut acc: f32 = 0.0;
        for r in 0u32..n_used {
            let k = t * n_used + r;
            acc = acc + ys[(ids[k] * rows + t) * width + c] * w[k];
        }
        if add == 1u32 {
            out[i] = out[i] + acc;
        } else {
            out[i] = acc;
        }
    }
}

/// `x[i] += b[ids[i / width] · width + i % width]` over the `n` values of `x` (rows of
/// `width`): each row's bias from the stacked biases of the expert its row chose (as
/// [`crate::add_bias`] adds one expert's).
#[kernel(workgroup = 256)]
pub fn add_bias_by_id(
    x: &mut [f32],
    b: &[f32],
    ids: &[u32],
    #[uniform] width: u32,
    #[uniform] n: u32,
) {
    let i = gid();
    if i < n {
        x[i] = x[i] + b[ids[i / width] * width + i % width];
    }
}
