//! Argmax over a logit vector in two stages (greedy sampling reads back 4 bytes).
//!
//! A NaN or infinite logit (told apart by its bits, which no fast-math assumption can fold
//! away) counts as the largest finite value, and its index carries [`NON_FINITE`]: the stages
//! find the first non-finite logit when there is one, so greedy decoding refuses the row
//! instead of picking a token from it. (Only a logit of exactly `f32::MAX` would outrank it; an
//! infinity cannot be the key itself: WGSL refuses a constant expression that makes one.)

use hesper_dsl::kernel;

use crate::reduce::tree_argmax;

/// Bit 31 of an index the argmax stages found: the logit there is NaN or infinite (vocabularies
/// are far below 2^31 entries).
pub const NON_FINITE: u32 = 1 << 31;

/// First stage: each workgroup reduces 256 × `per_thread` logits to its largest value and the
/// first index holding it, written to `best[wid]` / `best_index[wid]` (non-finite: `f32::MAX`
/// and the index with [`NON_FINITE`]).
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
        if i < n {
            let x = logits[i];
            let finite = (f32_to_bits(x) & 2139095040u32) != 2139095040u32;
            let key = select(3.4028235e38, x, finite);
            if key > v {
                v = key;
                k = select(i | 2147483648u32, i, finite);
            }
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
/// maximum, written to `index[0]` (with [`NON_FINITE`] where that logit is NaN or infinite).
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
/// one. Ties go to the lower id, as the CPU sampler's sort orders them. A non-finite logit comes
/// out first, its value as it is, for the host to refuse.
#[kernel(workgroup = 1)]
pub fn take_top(
    index: &[u32],
    logits: &mut [f32],
    top: &mut [f32],
    #[uniform] slot: u32,
    #[uniform] k: u32,
) {
    let i = index[0] & 2147483647u32;
    top[slot] = i as f32;
    top[k + slot] = logits[i];
    logits[i] = -3.4028235e38;
}
