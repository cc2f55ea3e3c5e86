//! A mixture of experts routed on the GPU, its router never read back: each row's experts are
//! chosen from its router logits (`moe_route`, the definition of
//! `hesper_engine::config::Experts::route`); then either the step's (row, choice) pairs are
//! grouped by expert into tiles (`moe_group`) for the tiled kernels' `_id` instances, or the
//! indirect grids of each expert's launches are zeroed where no row chose it (`gate_grids`: its
//! matrices are never read) and each row's expert outputs are weighed and added in the order
//! chosen (`moe_combine_routed`).

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

/// The most experts a layer may have for [`moe_group`] to group its pairs (one thread an
/// expert, one workgroup): DeepSeek-V3's 256.
pub const GROUPED_EXPERTS: u32 = 256;

/// Groups a step's `pairs` (row, choice) pairs by expert, from the router's ids (`ids[p]`, `p =
/// row·n_used + rank`), into `slots` slots whose runs of one expert fill whole tiles of `tile`
/// slots: each expert's pairs in order, then its run padded to a whole tile with its last pair
/// again, the runs expert by expert, and the slots past the last run given expert `n_expert`
/// (no expert: a tiled kernel computes nothing there). The tables follow the ids in the same
/// buffer: `order` (the pair of each slot) from `pairs`, `gid` (the expert of each slot) from
/// `pairs + slots`, `pos` (the slot of each pair) from `pairs + 2·slots`. A tile of the tiled
/// kernels' `_id` instances (`matvec_kq_gemm_id`, `matvec_q8_0_gemm_id`) reads one expert's
/// weights, `gid` at its first slot; `slots` must be at least `Σ_e ⌈count_e / tile⌉·tile`
/// (`tile·(⌈pairs / tile⌉ + min(pairs, n_expert))` always is). One workgroup; thread `e` takes
/// expert `e` (`n_expert` ≤ [`GROUPED_EXPERTS`]).
#[kernel(workgroup = 256)]
pub fn moe_group(
    ids: &mut [u32],
    #[uniform] n_expert: u32,
    #[uniform] pairs: u32,
    #[uniform] slots: u32,
    #[uniform] tile: u32,
    #[shared] start: &mut [u32; 257],
) {
    let e = lid();
    let mut count = 0u32;
    if e < n_expert {
        for p in 0u32..pairs {
            if ids[p] == e {
                count += 1u32;
            }
        }
    }
    start[e] = (count + tile - 1u32) / tile * tile;
    barrier();
    // Each run's first slot: the padded runs before it, added by the first thread.
    if e == 0u32 {
        let mut at = 0u32;
        for x in 0u32..256u32 {
            let len = start[x];
            start[x] = at;
            at += len;
        }
        start[256] = at;
    }
    barrier();
    let order_at = pairs;
    let gid_at = pairs + slots;
    let pos_at = pairs + 2u32 * slots;
    if e < n_expert {
        let first = start[e];
        let mut k = 0u32;
        let mut last = 0u32;
        for p in 0u32..pairs {
            if ids[p] == e {
                ids[order_at + first + k] = p;
                ids[gid_at + first + k] = e;
                ids[pos_at + p] = first + k;
                k += 1u32;
                last = p;
            }
        }
        for j in count..(count + tile - 1u32) / tile * tile {
            ids[order_at + first + j] = last;
            ids[gid_at + first + j] = e;
        }
    }
    // The slots past the last run.
    let total = start[256];
    for z in (total + e..slots).step_by(256u32) {
        ids[order_at + z] = 0u32;
        ids[gid_at + z] = n_expert;
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
/// of rows of `width` (`e = ids[ids_at + i / width]`, `c = i % width`: the router's ids from 0,
/// or [`moe_group`]'s `gid` where the rows are slots): each row's gate and up plus the
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
    #[uniform] ids_at: u32,
    #[uniform] n: u32,
) {
    let i = gid();
    if i < n {
        let b = ids[ids_at + i / width] * width + i % width;
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
