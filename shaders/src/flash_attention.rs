//! Causal attention over the KV cache, flash-style: keys are visited in tiles of 128 positions
//! with an online softmax (running max `m`, running sum `l`), so no score row is ever stored
//! whole and prefill and decode are the same kernel.

use hesper_dsl::kernel;

use crate::reduce::tree_max;

/// One workgroup per (query head, token): grid `[n_head, n]`. Token `i` sits at position
/// `pos0 + i` and attends positions `0..=pos0 + i`; query head `h` reads kv head
/// `h / (n_head / n_head_kv)` straight from the cache (GQA without repeating K/V). Thread `t`
/// scores position `tile + t` and owns output dimension `t`, so `head_dim ≤ 128`.
#[kernel(workgroup = 128, uses(tree_max))]
pub fn attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    out: &mut [f32],
    #[uniform] n_head: u32,
    #[uniform] n_head_kv: u32,
    #[uniform] head_dim: u32,
    #[uniform] pos0: u32,
    #[uniform] scale: f32,
    #[shared] qs: &mut [f32; 128],
    #[shared] ps: &mut [f32; 128],
    #[shared] acc: &mut [f32; 256],
) {
    let h = wid();
    let i = wid_y();
    let t = lid();
    let kv_dim = n_head_kv * head_dim;
    let kv_off = (h / (n_head / n_head_kv)) * head_dim;
    let q_off = (i * n_head + h) * head_dim;
    if t < head_dim {
        qs[t] = q[q_off + t];
    } else {
        qs[t] = 0.0;
    }
    barrier();
    let len = pos0 + i + 1u32;
    let mut m: f32 = -3.4028235e38;
    let mut l: f32 = 0.0;
    let mut o: f32 = 0.0;
    for tile in (0u32..len).step_by(128) {
        let p = tile + t;
        let mut s: f32 = -3.4028235e38;
        if p < len {
            let kb = p * kv_dim + kv_off;
            let mut dot: f32 = 0.0;
            for e in 0u32..head_dim {
                dot += qs[e] * k_cache[kb + e];
            }
            s = dot * scale;
        }
        acc[t] = s;
        barrier();
        tree_max(acc, t, 128u32);
        let m_new = m.max(acc[0]);
        let correction = (m - m_new).exp();
        if p < len {
            ps[t] = (s - m_new).exp();
        } else {
            ps[t] = 0.0;
        }
        barrier();
        let count = (len - tile).min(128u32);
        let mut tile_sum: f32 = 0.0;
        let mut tile_o: f32 = 0.0;
        for j in 0u32..count {
            let w = ps[j];
            tile_sum += w;
            if t < head_dim {
                tile_o += w * v_cache[(tile + j) * kv_dim + kv_off + t];
            }
        }
        l = l * correction + tile_sum;
        o = o * correction + tile_o;
        m = m_new;
        barrier();
    }
    if t < head_dim {
        out[q_off + t] = o / l;
    }
}
