//! Causal attention over the KV cache, dense or sparse ([`SparsePattern`]), over an f32 or f16
//! cache ([`KvType`]). Dense attention over an f32 cache reads the cache in place; the other
//! modes first gather each task's keys and values as f32 rows, then run the same score,
//! softmax and weighted-sum kernels over them.

use half::f16;
use half::slice::HalfFloatSliceExt;
use hesper_engine::attention::{AttentionConfig, Key, KvType, SparsePattern};
use hesper_engine::backend::{AttentionShape, RopeShape};
use rayon::prelude::*;

use crate::kernels::Isa;

/// One of K or V for every layer: `[layer][position][kv_dim]`.
enum Store {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Store {
    fn new(kv_type: KvType, len: usize) -> Self {
        match kv_type {
            KvType::F32 => Self::F32(vec![0.0; len]),
            KvType::F16 => Self::F16(vec![f16::ZERO; len]),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Self::F32(v) => v.len() * 4,
            Self::F16(v) => v.len() * 2,
        }
    }

    /// Stores `src` at `at` (rounded to nearest even for f16).
    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Self::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            Self::F16(v) => v[at..at + src.len()].convert_from_f32_slice(src),
        }
    }

    /// The `out.len()` values at `at`, as f32.
    fn read(&self, at: usize, out: &mut [f32]) {
        match self {
            Self::F32(v) => out.copy_from_slice(&v[at..at + out.len()]),
            Self::F16(v) => v[at..at + out.len()].convert_to_f32_slice(out),
        }
    }
}

/// Landmarks of a sparse cache: the running means of each whole block's keys and values,
/// `[layer][block][kv_dim]`, updated as positions are appended.
struct Landmarks {
    n_block: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// The KV cache of every layer, with how attention reads it. Layer `l` holds `slots[l]`
/// positions from value `base[l]` on, position `p` in slot `p % slots[l]`.
pub struct KvCache {
    k: Store,
    v: Store,
    slots: Vec<usize>,
    base: Vec<usize>,
    kv_dim: usize,
    sparse: Option<SparsePattern>,
    landmarks: Option<Landmarks>,
}

impl KvCache {
    /// A zeroed dense f32 cache of `n_layer` layers of `n_ctx` positions (pages are only
    /// touched as positions fill).
    pub fn new(n_layer: usize, n_ctx: usize, kv_dim: usize) -> Self {
        Self::with_config(&vec![n_ctx; n_layer], kv_dim, &AttentionConfig::default())
    }

    /// A zeroed cache of `slots[l]` positions in layer `l`, stored and read as `config` says.
    pub fn with_config(slots: &[usize], kv_dim: usize, config: &AttentionConfig) -> Self {
        let n_layer = slots.len();
        let base: Vec<usize> = slots
            .iter()
            .scan(0, |at, &n| {
                let b = *at;
                *at += n * kv_dim;
                Some(b)
            })
            .collect();
        let len = slots.iter().sum::<usize>() * kv_dim;
        let landmarks = config.sparse.as_ref().filter(|p| p.landmarks).map(|p| {
            let n_block = slots.iter().max().copied().unwrap_or(0) / p.block.max(1);
            Landmarks {
                n_block,
                k: vec![0.0; n_layer * n_block * kv_dim],
                v: vec![0.0; n_layer * n_block * kv_dim],
            }
        });
        Self {
            k: Store::new(config.kv_type, len),
            v: Store::new(config.kv_type, len),
            slots: slots.to_vec(),
            base,
            kv_dim,
            sparse: config.sparse.clone(),
            landmarks,
        }
    }

    /// Bytes held (landmarks included).
    pub fn bytes(&self) -> usize {
        let marks = self
            .landmarks
            .as_ref()
            .map_or(0, |l| (l.k.len() + l.v.len()) * 4);
        self.k.bytes() + self.v.bytes() + marks
    }

    /// Stores `n` rows of keys and values at `pos0..` in `layer` and folds them into their
    /// blocks' landmarks ([`attention`] does this first; a benchmark fills a cache with it).
    /// `n` is at most the layer's slots.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32], n: usize, pos0: usize) {
        let kv_dim = self.kv_dim;
        // Up to the last slot, then on from the first.
        let first = n.min(self.slots[layer] - pos0 % self.slots[layer]);
        for (rows, pos) in [(0..first, pos0), (first..n, 0)] {
            let at = self.row(layer, pos);
            let rows = rows.start * kv_dim..rows.end * kv_dim;
            self.k.write(at, &k[rows.clone()]);
            self.v.write(at, &v[rows]);
        }
        let (Some(marks), Some(p)) = (&mut self.landmarks, &self.sparse) else {
            return;
        };
        for (t, (kr, vr)) in k
            .chunks_exact(kv_dim)
            .zip(v.chunks_exact(kv_dim))
            .take(n)
            .enumerate()
        {
            let pos = pos0 + t;
            let block = pos / p.block;
            if block >= marks.n_block {
                continue;
            }
            // Welford: the mean of the block's first j + 1 keys; restarting at j = 0 keeps
            // it right after a session is truncated into the block.
            let j = (pos % p.block) as f32;
            let at = (layer * marks.n_block + block) * kv_dim;
            for (m, x) in [(&mut marks.k, kr), (&mut marks.v, vr)] {
                for (m, &x) in m[at..at + kv_dim].iter_mut().zip(x) {
                    *m = if j == 0.0 {
                        x
                    } else {
                        *m + (x - *m) / (j + 1.0)
                    };
                }
            }
        }
    }

    /// [`hesper_engine::backend::Backend::shift_cache`] on every layer: rows move down in
    /// ascending order (each lands below every row still to be read), keys rotated by
    /// `rope.shift_angles(discard)` and stored again (rounded again when f16).
    /// A layer of fewer slots than `used` moves the latest positions it holds, all read
    /// before any is stored (a row's new slot may be a later row's old one).
    pub fn shift(&mut self, keep: usize, discard: usize, used: usize, rope: &RopeShape) {
        let kv_dim = self.kv_dim;
        let cs = rope.shift_angles(discard);
        let mut row = vec![0.0; kv_dim];
        for layer in 0..self.slots.len() {
            let slots = self.slots[layer];
            let moved = (keep + discard).max(used.saturating_sub(slots))..used;
            if used <= slots {
                for p in moved {
                    let (from, to) = (self.row(layer, p), self.row(layer, p - discard));
                    self.k.read(from, &mut row);
                    rope.rotate_row(&mut row, &cs);
                    self.k.write(to, &row);
                    self.v.read(from, &mut row);
                    self.v.write(to, &row);
                }
                continue;
            }
            let mut k = vec![0.0; moved.len() * kv_dim];
            let mut v = vec![0.0; moved.len() * kv_dim];
            let rows = k.chunks_exact_mut(kv_dim).zip(v.chunks_exact_mut(kv_dim));
            for (p, (kr, vr)) in moved.clone().zip(rows) {
                self.k.read(self.row(layer, p), kr);
                rope.rotate_row(kr, &cs);
                self.v.read(self.row(layer, p), vr);
            }
            let rows = k.chunks_exact(kv_dim).zip(v.chunks_exact(kv_dim));
            for (p, (kr, vr)) in moved.zip(rows) {
                let to = self.row(layer, p - discard);
                self.k.write(to, kr);
                self.v.write(to, vr);
            }
        }
    }

    /// The value offset of position `pos`'s row in `layer`.
    fn row(&self, layer: usize, pos: usize) -> usize {
        self.base[layer] + pos % self.slots[layer] * self.kv_dim
    }

    /// Copies the rows of `keys` (of kv head offset `off`, `out.len() / keys.len()` wide) from
    /// the K (`values` false) or V cache of `layer`, or from its landmarks, into `out`.
    fn gather(&self, layer: usize, keys: &[Key], off: usize, values: bool, out: &mut [f32]) {
        let hd = out.len() / keys.len().max(1);
        let store = if values { &self.v } else { &self.k };
        for (key, row) in keys.iter().zip(out.chunks_exact_mut(hd)) {
            match *key {
                Key::Position(p) => store.read(self.row(layer, p) + off, row),
                Key::Landmark(b) => {
                    let marks = self.landmarks.as_ref().expect("landmarks are kept");
                    let src = if values { &marks.v } else { &marks.k };
                    let at = (layer * marks.n_block + b) * self.kv_dim + off;
                    row.copy_from_slice(&src[at..at + hd]);
                }
            }
        }
    }

    /// The keys the query at `pos` attends (a dense cache: from `start` on).
    fn keys(&self, pos: usize, start: usize) -> Vec<Key> {
        match &self.sparse {
            Some(p) => p.keys(pos),
            None => (start..=pos).map(Key::Position).collect(),
        }
    }
}

/// Stores `k`, `v` of `n` tokens at `pos0..` in `layer`, then causal attention of `q` (dot
/// products and weighted sums on `isa`) as the cache's configuration says.
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
    cache.append(layer, k, v, n, pos0);
    let cache = &*cache;
    let hd = s.head_dim;
    let group = s.n_head / s.n_head_kv;
    let scale = 1.0 / (hd as f32).sqrt();
    let width = s.n_head * hd;
    // The first position the query at `pos` attends (its sliding window's start).
    let start = |pos: usize| s.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let in_place = match (&cache.k, &cache.sparse) {
        (Store::F32(kc), None) => {
            let (Store::F32(vc), base) = (&cache.v, cache.base[layer]) else {
                unreachable!("K and V are stored alike")
            };
            Some((&kc[base..], &vc[base..]))
        }
        _ => None,
    };
    let slots = cache.slots[layer];
    // The keys and values of token `t`'s kv head `kv_head` read in place (rows `stride`
    // apart), where the cache is dense f32 and its window does not wrap round the slots.
    let read_in_place = |t: usize, kv_head: usize| {
        let (kc, vc) = in_place?;
        let (pos, kv) = (pos0 + t, cache.kv_dim);
        let first = start(pos) % slots;
        let len = pos + 1 - start(pos);
        (first + len <= slots).then(|| {
            let off = first * kv + kv_head * hd;
            (&kc[off..], &vc[off..], len, kv)
        })
    };
    // The keys and values of one task gathered as rows `hd` apart (f16, sparse, or wrapped).
    let rows = |t: usize, h: usize| -> (Vec<f32>, Vec<f32>, usize, usize) {
        let off = (h / group) * hd;
        let keys = cache.keys(pos0 + t, start(pos0 + t));
        let mut kr = vec![0.0; keys.len() * hd];
        let mut vr = vec![0.0; keys.len() * hd];
        cache.gather(layer, &keys, off, false, &mut kr);
        cache.gather(layer, &keys, off, true, &mut vr);
        (kr, vr, keys.len(), hd)
    };
    if (n > 1 || in_place.is_none()) && group.is_multiple_of(4) {
        // A batch, or keys gathered from an f16 or sparse cache: one task per (token, four
        // query heads of one kv head), whose keys and values are read (and gathered) once for
        // the four.
        out[..n * width]
            .par_chunks_mut(4 * hd)
            .enumerate()
            .for_each(|(idx, o)| {
                let (t, h) = (idx / (s.n_head / 4), idx % (s.n_head / 4) * 4);
                let gathered;
                let (kh, vh, len, stride) = match read_in_place(t, h / group) {
                    Some(rows) => rows,
                    None => {
                        gathered = rows(t, h);
                        (&gathered.0[..], &gathered.1[..], gathered.2, gathered.3)
                    }
                };
                let q4: [&[f32]; 4] = std::array::from_fn(|g| &q[t * width + (h + g) * hd..][..hd]);
                let mut scores = vec![0.0f32; 4 * len];
                isa.scores_x4(q4, kh, stride, four(scores.chunks_exact_mut(len)));
                scores
                    .chunks_exact_mut(len)
                    .enumerate()
                    .for_each(|(g, row)| softmax(isa, row, scale, s, h + g));
                let p4 = four(scores.chunks_exact(len));
                isa.weighted_sum_x4(p4, vh, stride, four(o.chunks_exact_mut(hd)));
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
            let gathered;
            let (kh, vh, len, stride) = match read_in_place(t, h / group) {
                Some(rows) => rows,
                None => {
                    gathered = rows(t, h);
                    (&gathered.0[..], &gathered.1[..], gathered.2, gathered.3)
                }
            };
            let mut scores = vec![0.0f32; len];
            isa.scores(qh, kh, stride, &mut scores);
            softmax(isa, &mut scores, scale, s, h);
            isa.weighted_sum(&scores, vh, stride, o);
        });
}

/// The softmax of query head `head`'s scores `row` times `scale`, soft-capped first where `s`
/// caps them, with the head's sink in the denominator where `s` has sinks.
fn softmax(isa: Isa, row: &mut [f32], scale: f32, s: &AttentionShape, head: usize) {
    match (s.softcap, s.sinks) {
        (cap, Some(sinks)) => softmax_with_sink(row, scale, cap, sinks[head]),
        (Some(cap), None) => {
            crate::ops::softcap(row, scale, cap);
            isa.softmax(row, 1.0);
        }
        (None, None) => isa.softmax(row, scale),
    }
}

/// The softmax of the scaled (and capped) scores `row` with `sink` as one more logit that
/// weighs no value: its maximum includes the sink and its sum `exp(sink − max)`, summed in f64
/// as ggml's `soft_max` sums.
fn softmax_with_sink(row: &mut [f32], scale: f32, cap: Option<f32>, sink: f32) {
    match cap {
        Some(cap) => crate::ops::softcap(row, scale, cap),
        None => row.iter_mut().for_each(|v| *v *= scale),
    }
    let max = row.iter().copied().fold(sink, f32::max);
    let mut sum = f64::from((sink - max).exp());
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// The first four items of `it` (which holds four).
fn four<T: Default>(mut it: impl Iterator<Item = T>) -> [T; 4] {
    std::array::from_fn(|_| it.next().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One position's attention at `pos` (its key and value appended to layer 0 of `cache`).
    fn attend(
        s: &AttentionShape,
        cache: &mut KvCache,
        q: &[f32],
        kv: [&[f32]; 2],
        pos: usize,
    ) -> Vec<f32> {
        let mut out = vec![0.0; q.len()];
        let [k, v] = kv;
        attention(Isa::Scalar, cache, 0, q, k, v, 1, pos, s, &mut out);
        out
    }

    /// Two heads of 2 over one kv head, with `sinks`.
    fn two_heads(sinks: Option<&[f32]>) -> AttentionShape<'_> {
        AttentionShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 2,
            window: None,
            softcap: None,
            sinks,
        }
    }

    #[test]
    fn attention_of_one_position_returns_its_value() {
        let s = two_heads(None);
        let mut cache = KvCache::new(1, 4, 2);
        let q = [1.0, 0.0, 0.0, 1.0];
        let out = attend(&s, &mut cache, &q, [&[0.5, 0.5], &[3.0, -1.0]], 0);
        assert_eq!(out, vec![3.0, -1.0, 3.0, -1.0]);
        // A second position with a key aligned to head 0's query gets more weight there.
        let q = [10.0, 0.0, 0.0, 10.0];
        let out = attend(&s, &mut cache, &q, [&[1.0, 0.0], &[1.0, 1.0]], 1);
        assert!(out[0] < 3.0 && out[0] > 1.0 && out[1] > -1.0);
        assert!(out[0] < out[2], "head 1 attends less to the new key");
    }

    #[test]
    fn a_window_in_fewer_slots_attends_as_it_does_in_a_full_cache() {
        // A window of 3 in 4 slots (steps of up to 2 tokens): from position 4 on the keys wrap
        // round the slots; every query still reads its three latest keys, whether they lie in
        // place or wrap (f32), or are gathered (f16): the same bits as a full cache. A shift
        // moves what the slots hold as it moves a full cache's rows.
        let shape = AttentionShape {
            window: Some(3),
            ..two_heads(None)
        };
        let rope = RopeShape {
            n_head: 1,
            head_dim: 2,
            rope_dim: 2,
            base: 10000.0,
            scale: 1.0,
            freq_factors: None,
            attn_factor: 1.0,
            yarn: None,
        };
        let x = |i: usize| ((i * 7919) % 23) as f32 / 5.0 - 2.0;
        for kv_type in [KvType::F32, KvType::F16] {
            let config = AttentionConfig {
                kv_type,
                ..AttentionConfig::default()
            };
            let mut full = KvCache::with_config(&[32], 2, &config);
            let mut ring = KvCache::with_config(&[4], 2, &config);
            let mut pos = 0;
            for (step, n) in [1, 2, 1, 2, 2, 1, 1, 2, 1].into_iter().enumerate() {
                if step == 6 {
                    full.shift(1, 3, pos, &rope);
                    ring.shift(1, 3, pos, &rope);
                    pos -= 3;
                }
                let v: Vec<f32> = (0..4 * n).map(|i| x(i + 4 * (pos + step))).collect();
                let (q, kv) = (&v[..], &v[..2 * n]);
                let [mut a, mut b] = [vec![0.0; 4 * n], vec![0.0; 4 * n]];
                attention(Isa::Scalar, &mut full, 0, q, kv, kv, n, pos, &shape, &mut a);
                attention(Isa::Scalar, &mut ring, 0, q, kv, kv, n, pos, &shape, &mut b);
                assert_eq!(a, b, "{kv_type} at {pos}");
                pos += n;
            }
        }
        assert_eq!(
            KvCache::with_config(&[4], 2, &AttentionConfig::default()).bytes(),
            64
        );
    }

    #[test]
    fn a_sink_takes_its_share_of_the_softmax_and_weighs_no_value() {
        // One position: its score q·k/√2 = 0 and head 0's sink 0 split the weight in half;
        // head 1's sink of ln 3 takes three quarters. Neither scales the sink.
        let sinks = [0.0, 3f32.ln()];
        let s = two_heads(Some(&sinks));
        let mut cache = KvCache::new(1, 4, 2);
        let out = attend(&s, &mut cache, &[0.0; 4], [&[1.0, 1.0], &[4.0, -8.0]], 0);
        let want = [2.0, -4.0, 1.0, -2.0];
        assert!(
            out.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{out:?}"
        );
    }

    #[test]
    fn landmarks_are_block_means_and_survive_truncation() {
        let config = AttentionConfig {
            swa_full: false,
            kv_type: KvType::F32,
            sparse: Some(SparsePattern {
                block: 2,
                ..SparsePattern::default()
            }),
        };
        let mut c = KvCache::with_config(&[4], 1, &config);
        c.append(0, &[1.0, 3.0, 8.0], &[2.0, 4.0, 0.0], 3, 0);
        let marks = c.landmarks.as_ref().unwrap();
        assert_eq!((marks.k[0], marks.v[0], marks.k[1]), (2.0, 3.0, 8.0));
        // Position 3 completes block 1 after position 2 was rewritten.
        c.append(0, &[4.0, 6.0], &[0.0, 0.0], 2, 2);
        assert_eq!(c.landmarks.as_ref().unwrap().k[1], 5.0);
    }

    #[test]
    fn an_f16_cache_rounds_to_nearest_even_and_takes_half_the_bytes() {
        let f16 = AttentionConfig {
            swa_full: false,
            kv_type: KvType::F16,
            sparse: None,
        };
        let mut c = KvCache::with_config(&[8, 8], 4, &f16);
        assert_eq!(c.bytes() * 2, KvCache::new(2, 8, 4).bytes());
        // 1 + 2^-11 lies halfway between two halves: even rounds it down to 1.
        let x = [1.0 + 2f32.powi(-11), 0.1, -3.0, 65504.0];
        c.append(1, &x, &x, 1, 0);
        let mut got = [0.0; 4];
        c.gather(1, &[Key::Position(0)], 0, false, &mut got);
        assert_eq!(got, [1.0, f16::from_f32(0.1).to_f32(), -3.0, 65504.0]);
    }
}
