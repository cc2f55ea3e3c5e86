//! Argmax over a logit vector in two stages (greedy sampling reads back 4 bytes).

use hesper_dsl::kernel;

use crate::reduce::tree_argmax;

/// First stage: each workgroup reduces 256 × `per_thread` logits to its largest value and the
/// first index holding it, written to `best[wid]` / `best_index[wid]`.
#[kernel(workgroup = 256, uses(tree_argmax))]
pub fn argmax_partial(
    logits: &[f32],
    best: &mut [f32],
    best_index: &mut [u32],
    #[uniform] n: u32,
    #[uniform] per_thread: u32,
    #[shared] vals: &mut [f32; 256],
    #[shared] idxs: &mut [u32; 256],
) {
    let t = lid();
    let start = wid() * 256u32 * per_thread;
    let mut v: f32 = -3.4028235e38;
    let mut k: u32 = 0u32;
    for j in 0..per_thread {
        let i = start + j * 256u32 + t;
        if i < n && logits[i] > v {
            v = logits[i];
            k = i;
        }
    }
    vals[t] = v;
    idxs[t] = k;
    barrier();
    tree_argmax(vals, idxs, t);
    if t == 0 {
        best[wid()] = vals[0];
        best_index[wid()] = idxs[0];
    }
}

/// Second stage: one workgroup reduces the `n` partial results to the index of the first
/// maximum, written to `index[0]`.
#[kernel(workgroup = 256, uses(tree_argmax))]
pub fn argmax_final(
    best: &[f32],
    best_index: &[u32],
    index: &mut [u32],
    #[uniform] n: u32,
    #[shared] vals: &mut [f32; 256],
    #[shared] idxs: &mut [u32; 256],
) {
    let t = lid();
    let mut v: f32 = -3.4028235e38;
    let mut k: u32 = 4294967295u32;
    for i in (t..n).step_by(256) {
        if best[i] > v || (best[i] == v && best_index[i] < k) {
            v = best[i];
            k = best_index[i];
        }
    }
    vals[t] = v;
    idxs[t] = k;
    barrier();
    tree_argmax(vals, idxs, t);
    if t == 0 {
        index[0] = idxs[0];
    }
}

/// Top-k by repeated argmax: takes the maximum `index[0]` found by the two stages above into
/// slot `slot` of `top` (its id at `top[slot]`, as f32 — exact for ids below 2^24 — and its
/// value at `top[k + slot]`), then removes it from `logits` so the next round finds the next
/// one. Ties go to the lower id, as the CPU sampler's sort orders them.
#[kernel(workgroup = 1)]
pub fn take_top(
    index: &[u32],
    logits: &mut [f32],
    top: &mut [f32],
    #[uniform] slot: u32,
    #[uniform] k: u32,
) {
    let i = index[0];
    top[slot] = i as f32;
    top[k + slot] = logits[i];
    logits[i] = -3.4028235e38;
}
