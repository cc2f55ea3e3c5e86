//! The KV-cache write and the landmarks of a sparse cache.
//!
//! A cache word holds one f32 (its bits) or two f16 ([`f16_bits`](crate::half::f16_bits), the lower position in the
//! low half), as the session's `--kv-type` says; attention reads both.

use hesper_dsl::kernel;

use crate::half::f16_bits;
use crate::rope::rope_neox_value;

/// Writes the keys and values of `n` new tokens (`[n][kv_dim]` each, `len` values) into one
/// layer's caches at value offset `at`, both in one dispatch, wrapping round the `ring`
/// values the layer holds (a sliding window's cache; a whole context's never wraps). f32
/// (`f16 == 0`): thread `i` stores value `i`. f16: thread `i` packs values `2i, 2i+1` into
/// word `at/2 + i` (`len`, `at` and `ring` are even).
#[kernel(workgroup = 256, uses(f16_bits))]
pub fn kv_write(
    k: &[f32],
    v: &[f32],
    k_cache: &mut [u32],
    v_cache: &mut [u32],
    #[uniform] len: u32,
    #[uniform] at: u32,
    #[uniform] ring: u32,
    #[uniform] f16: u32,
) {
    let i = gid();
    if f16 == 0u32 {
        if i < len {
            let w = (at + i) % ring;
            k_cache[w] = f32_to_bits(k[i]);
            v_cache[w] = f32_to_bits(v[i]);
        }
    } else if 2u32 * i < len {
        let a = 2u32 * i;
        let w = (at / 2u32 + i) % (ring / 2u32);
        k_cache[w] = f16_bits(k[a]) | (f16_bits(k[a + 1u32]) << 16u32);
        v_cache[w] = f16_bits(v[a]) | (f16_bits(v[a + 1u32]) << 16u32);
    }
}

/// Folds the keys and values of positions `pos0..pos0+n` (`[n][kv_dim]`) into the landmarks of
/// their blocks (`[n_block][kv_dim]`, the running mean of each block's rows: Welford, restarted
/// at a block's first position). Thread `i`: element `i % kv_dim` of the `i / kv_dim`-th block
/// the new positions touch, visiting them in order; grid `kv_dim × blocks touched`.
#[kernel(workgroup = 64)]
pub fn landmark_update(
    k: &[f32],
    v: &[f32],
    lk: &mut [f32],
    lv: &mut [f32],
    #[uniform] kv_dim: u32,
    #[uniform] pos0: u32,
    #[uniform] n: u32,
    #[uniform] block: u32,
    #[uniform] n_block: u32,
) {
    let i = gid();
    let b = pos0 / block + i / kv_dim;
    let e = i % kv_dim;
    let end = pos0 + n;
    if b < n_block && b * block < end {
        let at = b * kv_dim + e;
        let mut mk = lk[at];
        let mut mv = lv[at];
        for p in pos0.max(b * block)..end.min(b * block + block) {
            let j = p % block;
            let x = k[(p - pos0) * kv_dim + e];
            let y = v[(p - pos0) * kv_dim + e];
            if j == 0u32 {
                mk = x;
                mv = y;
            } else {
                mk = mk + (x - mk) / ((j + 1u32) as f32);
                mv = mv + (y - mv) / ((j + 1u32) as f32);
            }
        }
        lk[at] = mk;
        lv[at] = mv;
    }
}

/// Moves `rows` cached positions of one layer, from position `src` on (in slot `p % slots`), to
/// the front of `k_out` and `v_out` (the backend copies them back to their new slots: a
/// context shift), rotating each key
/// by the table `cs` (`[rope_dim/2][2]`: cos and sin of the shift, applied with the forward
/// NeoX formula, pair `i` with `i + rope_dim/2` of each head); values are copied unchanged.
/// Thread `i`: word `i` (`words` per row; f16 words hold two values, which needs
/// `rope_dim % 4 == 0`).
#[kernel(workgroup = 256, uses(f16_bits))]
pub fn kv_shift(
    k_cache: &[u32],
    v_cache: &[u32],
    cs: &[f32],
    k_out: &mut [u32],
    v_out: &mut [u32],
    #[uniform] words: u32,
    #[uniform] rows: u32,
    #[uniform] src: u32,
    #[uniform] slots: u32,
    #[uniform] head_dim: u32,
    #[uniform] rope_dim: u32,
    #[uniform] f16: u32,
) {
    let i = gid();
    if i < rows * words {
        let w = i % words;
        let row0 = ((src + i / words) % slots) * words;
        v_out[i] = v_cache[row0 + w];
        let per = select(1u32, 2u32, f16 != 0u32);
        let d = (w * per) % head_dim;
        let half = rope_dim / 2u32;
        if d >= rope_dim {
            k_out[i] = k_cache[row0 + w];
        } else {
            // The word holding the other value of each pair, the first half's and the second's.
            let low = d < half;
            let j = select(d - half, d, low);
            let partner = select(w - half / per, w + half / per, low);
            let first = k_cache[row0 + select(partner, w, low)];
            let second = k_cache[row0 + select(w, partner, low)];
            if f16 == 0u32 {
                let a = f32_from_bits(first);
                let b = f32_from_bits(second);
                let c = cs[2u32 * j];
                let s = cs[2u32 * j + 1u32];
                k_out[i] = f32_to_bits(select(a * s + b * c, a * c - b * s, low));
            } else {
                let a0 = unpack_f16_lo(first);
                let b0 = unpack_f16_lo(second);
                let a1 = unpack_f16_hi(first);
                let b1 = unpack_f16_hi(second);
                let c0 = cs[2u32 * j];
                let s0 = cs[2u32 * j + 1u32];
                let c1 = cs[2u32 * j + 2u32];
                let s1 = cs[2u32 * j + 3u32];
                let o0 = select(a0 * s0 + b0 * c0, a0 * c0 - b0 * s0, low);
                let o1 = select(a1 * s1 + b1 * c1, a1 * c1 - b1 * s1, low);
                k_out[i] = f16_bits(o0) | (f16_bits(o1) << 16u32);
            }
        }
    }
}

/// NeoX RoPE of the queries in place and of the new keys into the cache, with the values, in
/// one dispatch: [`rope_neox`](crate::rope_neox) of `q` (`n_head` heads) and of `k`
/// (`n_head_kv` heads), then [`kv_write`] of the rotated keys and of `v` at value offset `at`
/// (wrapping round `ring` values), with the same operations in the same order (the same bits), except that `k` itself is left
/// as it was. Threads `0..n_tokens·n_head·rope_dim/2` rotate a query pair each; each of the next
/// `n_tokens·kv_dim/2` writes two adjacent key and value elements (one f16 word or two f32
/// words each), a rotated key element computed from its own pair. `rope_dim` is even.
#[kernel(workgroup = 256, uses(f16_bits, rope_neox_value))]
pub fn rope_neox_kv_write(
    q: &mut [f32],
    k: &[f32],
    v: &[f32],
    cs: &[f32],
    k_cache: &mut [u32],
    v_cache: &mut [u32],
    #[uniform] n_tokens: u32,
    #[uniform] n_head: u32,
    #[uniform] n_head_kv: u32,
    #[uniform] head_dim: u32,
    #[uniform] rope_dim: u32,
    #[uniform] pos0: u32,
    #[uniform] at: u32,
    #[uniform] ring: u32,
    #[uniform] f16: u32,
) {
    let half = rope_dim / 2u32;
    let kv_dim = n_head_kv * head_dim;
    let q_pairs = n_tokens * n_head * half;
    let idx = gid();
    if idx < q_pairs {
        let i = idx % half;
        let head = (idx / half) % n_head;
        let t = idx / (half * n_head);
        let base = (t * n_head + head) * head_dim;
        let angle = 2u32 * ((pos0 + t) * half + i);
        let c = cs[angle];
        let s = cs[angle + 1u32];
        let a = q[base + i];
        let b = q[base + i + half];
        q[base + i] = a * c - b * s;
        q[base + i + half] = a * s + b * c;
    } else if idx < q_pairs + n_tokens * kv_dim / 2u32 {
        let j = idx - q_pairs;
        let mut k0: f32 = 0.0;
        let mut k1: f32 = 0.0;
        for u in 0..2u32 {
            let e = 2u32 * j + u;
            let d = (e % kv_dim) % head_dim;
            let mut value = k[e];
            if d < rope_dim {
                // The pair this element belongs to, rotated as rope_neox does.
                value = rope_neox_value(k, cs, e - d, d, half, pos0 + e / kv_dim);
            }
            if u == 0u32 {
                k0 = value;
            } else {
                k1 = value;
            }
        }
        let e0 = 2u32 * j;
        if f16 == 0u32 {
            let w0 = (at + e0) % ring;
            let w1 = (at + e0 + 1u32) % ring;
            k_cache[w0] = f32_to_bits(k0);
            k_cache[w1] = f32_to_bits(k1);
            v_cache[w0] = f32_to_bits(v[e0]);
            v_cache[w1] = f32_to_bits(v[e0 + 1u32]);
        } else {
            let w = (at / 2u32 + j) % (ring / 2u32);
            k_cache[w] = f16_bits(k0) | (f16_bits(k1) << 16u32);
            v_cache[w] = f16_bits(v[e0]) | (f16_bits(v[e0 + 1u32]) << 16u32);
        }
    }
}
