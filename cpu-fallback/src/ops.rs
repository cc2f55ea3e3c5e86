//! Element-wise and attention operations, with ggml's arithmetic.

use hesper_engine::backend::{AttentionShape, RopeShape};
use hesper_engine::config::Activation;
use rayon::prelude::*;

use crate::kernels::Isa;

/// RMSNorm of each `w.len()`-wide row ([`crate::kernels::scalar::rms_norm_row`]'s
/// arithmetic on `isa`); rows are split between the threads.
pub fn rms_norm(isa: Isa, x: &[f32], w: &[f32], n: usize, eps: f32, out: &mut [f32]) {
    let d = w.len();
    x[..n * d]
        .par_chunks_exact(d)
        .zip(out[..n * d].par_chunks_exact_mut(d))
        .for_each(|(xr, yr)| isa.rms_norm_row(xr, w, eps, yr));
}

/// NeoX RoPE in place: per head, pair `i` with `i + rope_dim/2`, rotated by the angles of
/// [`RopeShape::angles`].
pub fn rope(x: &mut [f32], n: usize, pos0: usize, s: &RopeShape) {
    let half = s.rope_dim / 2;
    let angles = s.angles(pos0, n);
    for (row, cs) in x
        .chunks_exact_mut(s.n_head * s.head_dim)
        .take(n)
        .zip(angles.chunks_exact(2 * half))
    {
        for head in row.chunks_exact_mut(s.head_dim) {
            for (i, c) in cs.chunks_exact(2).enumerate() {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c[0] - b * c[1];
                head[i + half] = a * c[1] + b * c[0];
            }
        }
    }
}

/// An f32 KV cache for every layer: `[layer][position][kv_dim]` for K and for V.
pub struct KvCache {
    k: Vec<f32>,
    v: Vec<f32>,
    n_ctx: usize,
    kv_dim: usize,
}

impl KvCache {
    /// A zeroed cache (pages are only touched as positions fill).
    pub fn new(n_layer: usize, n_ctx: usize, kv_dim: usize) -> Self {
        let len = n_layer * n_ctx * kv_dim;
        Self {
            k: vec![0.0; len],
            v: vec![0.0; len],
            n_ctx,
            kv_dim,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 4
    }
}

/// Stores `k`, `v` of `n` tokens at `pos0..` in `layer`, then causal attention of `q` (dot
/// products and weighted sums on `isa`).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    isa: Isa,
    cache: &mut KvCache,
    layer: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    pos0: usize,
    s: &AttentionShape,
    out: &mut [f32],
) {
    let kv_dim = cache.kv_dim;
    let base = layer * cache.n_ctx * kv_dim;
    let at = base + pos0 * kv_dim;
    cache.k[at..at + n * kv_dim].copy_from_slice(&k[..n * kv_dim]);
    cache.v[at..at + n * kv_dim].copy_from_slice(&v[..n * kv_dim]);
    let (kc, vc) = (&cache.k[base..], &cache.v[base..]);
    let hd = s.head_dim;
    let group = s.n_head / s.n_head_kv;
    let scale = 1.0 / (hd as f32).sqrt();
    let width = s.n_head * hd;
    if n > 1 && group.is_multiple_of(4) {
        // A batch: one task per (token, four query heads of one kv head), whose keys and
        // values are read once for the four.
        out[..n * width]
            .par_chunks_mut(4 * hd)
            .enumerate()
            .for_each(|(idx, o)| {
                let (t, h) = (idx / (s.n_head / 4), idx % (s.n_head / 4) * 4);
                let len = pos0 + t + 1;
                let (kh, vh) = (&kc[(h / group) * hd..], &vc[(h / group) * hd..]);
                let q4: [&[f32]; 4] = std::array::from_fn(|g| &q[t * width + (h + g) * hd..][..hd]);
                let mut scores = vec![0.0f32; 4 * len];
                isa.scores_x4(q4, kh, kv_dim, four(scores.chunks_exact_mut(len)));
                scores
                    .chunks_exact_mut(len)
                    .for_each(|row| isa.softmax(row, scale));
                let p4 = four(scores.chunks_exact(len));
                isa.weighted_sum_x4(p4, vh, kv_dim, four(o.chunks_exact_mut(hd)));
            });
        return;
    }
    // One task per (token, query head): a single token still has n_head tasks to share
    // between the threads (one per kv head left them unevenly loaded: 5 tasks on 2 threads).
    out[..n * width]
        .par_chunks_mut(hd)
        .enumerate()
        .for_each(|(idx, o)| {
            let (t, h) = (idx / s.n_head, idx % s.n_head);
            let qh = &q[t * width + h * hd..][..hd];
            let len = pos0 + t + 1;
            let (kh, vh) = (&kc[(h / group) * hd..], &vc[(h / group) * hd..]);
            let mut scores = vec![0.0f32; len];
            isa.scores(qh, kh, kv_dim, &mut scores);
            isa.softmax(&mut scores, scale);
            isa.weighted_sum(&scores, vh, kv_dim, o);
        });
}

/// The first four items of `it` (which holds four).
fn four<T: Default>(mut it: impl Iterator<Item = T>) -> [T; 4] {
    std::array::from_fn(|_| it.next().unwrap_or_default())
}

/// `out = act(gate) · up`.
pub fn glu(gate: &[f32], up: &[f32], len: usize, act: Activation, out: &mut [f32]) {
    let it = out[..len].iter_mut().zip(&gate[..len]).zip(&up[..len]);
    match act {
        Activation::Silu => it.for_each(|((o, &g), &u)| *o = g / (1.0 + (-g).exp()) * u),
        Activation::Relu2 => it.for_each(|((o, &g), &u)| {
            let r = g.max(0.0);
            *o = r * r * u;
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rotates_pairs_half_apart() {
        let s = RopeShape {
            n_head: 1,
            head_dim: 4,
            rope_dim: 4,
            base: 10000.0,
        };
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        rope(&mut x, 1, 1, &s);
        // Pair (0, 2) rotates by angle 1.
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[2] - 1f32.sin()).abs() < 1e-6);
        let mut y = vec![1.0, 2.0, 3.0, 4.0];
        rope(&mut y, 1, 0, &s);
        assert_eq!(y, vec![1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn attention_of_one_position_returns_its_value() {
        let s = AttentionShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 2,
        };
        let mut cache = KvCache::new(1, 4, 2);
        let mut out = vec![0.0; 4];
        attention(
            Isa::Scalar,
            &mut cache,
            0,
            &[1.0, 0.0, 0.0, 1.0],
            &[0.5, 0.5],
            &[3.0, -1.0],
            1,
            0,
            &s,
            &mut out,
        );
        assert_eq!(out, vec![3.0, -1.0, 3.0, -1.0]);
        // A second position with a key aligned to head 0's query gets more weight there.
        attention(
            Isa::Scalar,
            &mut cache,
            0,
            &[10.0, 0.0, 0.0, 10.0],
            &[1.0, 0.0],
            &[1.0, 1.0],
            1,
            1,
            &s,
            &mut out,
        );
        assert!(out[0] < 3.0 && out[0] > 1.0 && out[1] > -1.0);
        assert!(out[0] < out[2], "head 1 attends less to the new key");
    }

    #[test]
    fn rms_norm_normalises() {
        let mut y = vec![0.0; 4];
        rms_norm(
            Isa::Scalar,
            &[2.0, 2.0, 2.0, 2.0],
            &[1.0, 2.0, 1.0, 1.0],
            1,
            0.0,
            &mut y,
        );
        assert_eq!(y, vec![1.0, 2.0, 1.0, 1.0]);
    }
}
