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

/// `out[i] = act(gate[i] + bg[e·width + c]) · (up[i] + bu[e·width + c])` over the `n` values
/// of rows of `width` (`e = ids[i / width]`, `c = i % width`): each row's gate and up plus the
/// biases of the expert its row chose, then the gated activation `mode` names
/// ([`crate::GLU_RELU2`], [`crate::GLU_SILU`], [`crate::GLU_GELU`], [`crate::GLU_CLAMPED`]),
/// as `add_bias` of each expert's biases then `relu2_mul`, `silu_mul`, `gelu_mul` or
/// `swiglu_clamped_mul` compute it.
#[kernel(workgroup = 256)]
pub fn biased_glu_by_id(
    gate: &[f32],
    up: &[f32],
    bg: &[f32],
    bu: &[f32],
    ids: &[u32],
    out: &mut [f32],
    #[uniform] width: u32,
    #[uniform] mode: u32,
    #[uniform] n: u32,
) {
    let i = gid();
    if i < n {
        let b = ids[i / width] * width + i % width;
        let g = gate[i] + bg[b];
        let u = up[i] + bu[b];
        if mode == 2u32 {
            let r = g.max(0.0);
            out[i] = r * r * u;
        } else if mode == 5u32 {
            let a = 0.7978846 * g * (1.0 + 0.044715 * g * g);
            out[i] = g / (1.0 + (-2.0 * a).exp()) * u;
        } else if mode == 6u32 {
            let c = g.min(7.0);
            out[i] = c / (1.0 + (-1.702 * c).exp()) * (u.max(-7.0).min(7.0) + 1.0);
        } else {
            out[i] = g / (1.0 + (-g).exp()) * u;
        }
    }
}
