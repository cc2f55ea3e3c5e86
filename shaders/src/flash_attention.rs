//! Causal attention over the KV cache, flash-style: keys are visited in tiles of 128 with an
//! online softmax (running max `m`, running sum `l`), so no score row is ever stored whole and
//! prefill and decode are the same kernel. Dense, it visits positions `0..=i`; sparse
//! (`hesper_engine::attention::SparsePattern`), the window's positions ascending, then one tile
//! of scattered positions (globals and log-stride positions outside the window), then the
//! landmarks of the whole blocks before the window.

use hesper_dsl::{kernel, kernel_fn};

use crate::half::f16_bits;
use crate::norm::head_squares;
use crate::quantize::{q8_0_code, q8k_code, q8k_scale};
use crate::reduce::tree_max;

/// [`rope_attention`]'s `form`: the outputs as f32 bits.
pub const OUT_F32: u32 = 0;
/// [`rope_attention`]'s `form`: the outputs rounded to halves, two to a word.
pub const OUT_HALVES: u32 = 1;
/// [`rope_attention`]'s `form`: the outputs as ggml Q8_0 blocks, codes then scales.
pub const OUT_Q8_0: u32 = 2;
/// [`rope_attention`]'s `form`: the outputs as ggml Q8_K blocks (heads of 256), codes then
/// scales.
pub const OUT_Q8_K: u32 = 3;

/// The dot product of the query in `qs` with the cached key at word offset `kb` of `k_cache`
/// (f32 bits, or two f16 a word where `f16` is set), dimensions in order: how both attention
/// kernels score a cached position.
#[kernel_fn]
pub fn cached_key_dot(qs: &mut [f32; _], k_cache: &[u32], kb: u32, head_dim: u32, f16: u32) -> f32 {
    let mut dot: f32 = 0.0;
    if f16 != 0u32 {
        for e in 0u32..head_dim / 2u32 {
            let w = k_cache[kb / 2u32 + e];
            dot += qs[2u32 * e] * unpack_f16_lo(w) + qs[2u32 * e + 1u32] * unpack_f16_hi(w);
        }
    } else {
        for e in 0u32..head_dim {
            dot += qs[e] * f32_from_bits(k_cache[kb + e]);
        }
    }
    dot
}

/// The cached value at element offset `at` of `v_cache` (f32 bits, or two f16 a word where
/// `f16` is set): how both attention kernels read a cached position's value.
#[kernel_fn]
pub fn cached_value(v_cache: &[u32], at: u32, f16: u32) -> f32 {
    let mut x: f32 = 0.0;
    if f16 != 0u32 {
        let word = v_cache[at / 2u32];
        x = select(
            unpack_f16_lo(word),
            unpack_f16_hi(word),
            (at & 1u32) == 1u32,
        );
    } else {
        x = f32_from_bits(v_cache[at]);
    }
    x
}

/// One workgroup per (query head, token): grid `[n_head, n]`. Token `i` sits at position
/// `pos0 + i`; query head `h` reads kv head `h / (n_head / n_head_kv)` straight from the cache
/// (GQA without repeating K/V). In a tile thread `t` scores key `t`, and owns output dimensions
/// `t` and `t + 128`, so `head_dim ≤ 256`.
///
/// Cache words hold f32 bits, or two f16 when `f16` is set (see `kv_write`); position `p` sits
/// in slot `p % slots` (a sliding window's cache holds fewer slots than the context, and the
/// window never reaches past them). `window == 0`
/// means dense; otherwise the first `n_global` entries of `globals` (distinct, at most 96) and,
/// with `log_stride` set, positions `i − 2^k` are attended outside the window, and with
/// `landmarks` set the means `lk`/`lv` (`[block][kv_dim]`) of whole blocks of `block`
/// positions before it. With `softcap > 0` each scaled score `s` becomes
/// `softcap · tanh(s / softcap)` (Gemma 2). With `sinks` set, head `h`'s softmax has one more
/// logit, `sink[h]`, in its denominator that weighs no value (gpt-oss's attention sinks): the
/// running max starts at it and the running sum at its `exp(0) = 1`.
#[kernel(workgroup = 128, uses(tree_max, cached_key_dot, cached_value))]
pub fn attention(
    q: &[f32],
    k_cache: &[u32],
    v_cache: &[u32],
    lk: &[f32],
    lv: &[f32],
    globals: &[u32],
    sink: &[f32],
    out: &mut [f32],
    #[uniform] n_head: u32,
    #[uniform] n_head_kv: u32,
    #[uniform] head_dim: u32,
    #[uniform] pos0: u32,
    #[uniform] scale: f32,
    #[uniform] f16: u32,
    #[uniform] slots: u32,
    #[uniform] window: u32,
    #[uniform] n_global: u32,
    #[uniform] log_stride: u32,
    #[uniform] landmarks: u32,
    #[uniform] block: u32,
    #[uniform] softcap: f32,
    #[uniform] sinks: u32,
    #[shared] qs: &mut [f32; 256],
    #[shared] ps: &mut [f32; 128],
    #[shared] rows: &mut [u32; 128],
    #[shared] acc: &mut [f32; 256],
) {
    let h = wid();
    let i = wid_y();
    let t = lid();
    let kv_dim = n_head_kv * head_dim;
    let kv_off = (h / (n_head / n_head_kv)) * head_dim;
    let q_off = (i * n_head + h) * head_dim;
    for part in 0u32..2u32 {
        let dim = t + part * 128u32;
        if dim < head_dim {
            qs[dim] = q[q_off + dim];
        } else {
            qs[dim] = 0.0;
        }
    }
    barrier();
    let pos = pos0 + i;
    let len = pos + 1u32;
    let mut start = 0u32;
    if window > 0u32 && len > window {
        start = len - window;
    }
    let mut n_mark = 0u32;
    if landmarks != 0u32 {
        n_mark = start / block;
    }
    let window_tiles = (len - start + 127u32) / 128u32;
    let mut scattered_tiles = 0u32;
    if window > 0u32 {
        scattered_tiles = 1u32;
    }
    let mut tiles = window_tiles + scattered_tiles;
    if n_mark > 0u32 {
        tiles += 1u32;
    }
    let mut m: f32 = -3.4028235e38;
    let mut l: f32 = 0.0;
    if sinks != 0u32 {
        m = sink[h];
        l = 1.0;
    }
    let mut o: f32 = 0.0;
    let mut o_hi: f32 = 0.0;
    for tile in 0u32..tiles {
        // The key thread `t` scores: a cached position, or (`mark`) a landmark's block; an
        // invalid slot reads row 0 and weighs 0.
        let mut row = 0u32;
        let mut valid = false;
        let mut mark = false;
        let mut count = 128u32;
        if tile < window_tiles {
            let first = start + tile * 128u32;
            row = first + t;
            valid = row < len;
            count = (len - first).min(128u32);
        } else if tile < window_tiles + scattered_tiles {
            if t < n_global {
                row = globals[t];
                valid = row < start;
            } else if log_stride != 0u32 && t < n_global + 32u32 {
                let step = 1u32 << (t - n_global);
                if step <= pos {
                    row = pos - step;
                    valid = row < start;
                    for g in 0u32..n_global {
                        if globals[g] == row {
                            valid = false;
                        }
                    }
                }
            }
        } else if n_mark > 0u32 {
            // Block p = n_mark − 1, then p − 2^k (only p − 1 without log-stride).
            mark = true;
            let p = n_mark - 1u32;
            if t == 0u32 {
                row = p;
                valid = true;
            } else if t < 33u32 && (log_stride != 0u32 || t == 1u32) {
                let step = 1u32 << (t - 1u32);
                valid = step <= p;
                row = p - step;
            }
        }
        if !valid {
            row = 0u32;
        } else if !mark {
            row = row % slots;
        }
        let mut s: f32 = -3.4028235e38;
        if valid {
            let mut dot: f32 = 0.0;
            let kb = row * kv_dim + kv_off;
            if mark {
                for e in 0u32..head_dim {
                    dot += qs[e] * lk[kb + e];
                }
            } else {
                dot = cached_key_dot(qs, k_cache, kb, head_dim, f16);
            }
            s = dot * scale;
            if softcap > 0.0 {
                s = softcap * (s / softcap).tanh();
            }
        }
        acc[t] = s;
        rows[t] = row;
        barrier();
        tree_max(acc, t, 128u32);
        let m_new = m.max(acc[0]);
        let correction = (m - m_new).exp();
        if valid {
            ps[t] = (s - m_new).exp();
        } else {
            ps[t] = 0.0;
        }
        barrier();
        let mut tile_sum: f32 = 0.0;
        let mut tile_o: f32 = 0.0;
        let mut tile_o_hi: f32 = 0.0;
        for j in 0u32..count {
            let w = ps[j];
            tile_sum += w;
            for part in 0u32..2u32 {
                let dim = t + part * 128u32;
                if dim < head_dim {
                    let at = rows[j] * kv_dim + kv_off + dim;
                    let mut x: f32 = 0.0;
                    if mark {
                        x = lv[at];
                    } else {
                        x = cached_value(v_cache, at, f16);
                    }
                    if part == 0u32 {
                        tile_o += w * x;
                    } else {
                        tile_o_hi += w * x;
                    }
                }
            }
        }
        l = l * correction + tile_sum;
        o = o * correction + tile_o;
        o_hi = o_hi * correction + tile_o_hi;
        m = m_new;
        barrier();
    }
    if t < head_dim {
        out[q_off + t] = o / l;
    }
    if t + 128u32 < head_dim {
        out[q_off + t + 128u32] = o_hi / l;
    }
}

/// [`attention`] over a dense cache (or a sliding window of one) with what
/// [`rope_neox_kv_write`](crate::rope_neox_kv_write) does before it folded in: one dispatch
/// for a decode step's RoPE, cache write and attention. Grid `[n_head, n]` as `attention`'s;
/// a step has at most 4 rows here.
///
/// Each workgroup first prepares, in workgroup memory, its query head (row `i`, head `h`) and
/// the step's keys and values of its kv head (rows `0..=i`), as the launches it replaces
/// leave them: the biases added (`biased`: Qwen2's and gpt-oss's, as `add_qkv_bias`), the
/// query times `query_scale` (Gemma 2's, as `scale`; 1 elsewhere), each query and key head
/// normalized (`norm`: Qwen3's and Gemma 3's head norms, its squares summed by
/// [`head_squares`](crate::norm::head_squares) as [`rms_norm_heads`](crate::rms_norm_heads)
/// sums them, each value `x · scale · gain` as there), then rotated (NeoX, the first
/// `rope_dim` dimensions, angles from `cs`, [`rope_neox`](crate::rope_neox)'s expressions).
/// The rotated query is written back to `q`. The step's own positions (`pos0..pos0+n`) are
/// not read from the cache, which this dispatch is writing: their keys and values come from
/// workgroup memory, rounded as the cache holds them (f32 bits, or the f16 word), so every
/// score and weighted value has the bits `attention` gives after the cache write. The first
/// query head of each kv head writes its token's key and value into the cache, in slot
/// `pos % slots`. Earlier positions are read from the cache as `attention` reads them; the
/// tiles and their order are `attention`'s dense ones (the sparse pattern's scattered tile,
/// which a dense cache leaves empty, is skipped: it changes no bit).
///
/// `out` takes the outputs as `form` says, for the product that reads them next: f32 bits
/// ([`OUT_F32`]); rounded to halves two to a word as [`pack_f16`](crate::pack_f16) rounds them
/// for an F16 product ([`OUT_HALVES`]); or ([`OUT_Q8_0`], `head_dim` a multiple of 32, so a
/// head holds whole blocks) as [`quantize_q8_0`](crate::quantize_q8_0) leaves them for a Q8_0
/// product — four codes a word from word 0, each block's scale as f32 bits from word
/// `scales_at`; or ([`OUT_Q8_K`], heads of 256, each one block) as
/// [`quantize_q8k`](crate::quantize_q8k) leaves them for a K-quant product — a code a word
/// from word 0, each block's scale as f32 bits from word `scales_at` — one dispatch instead of
/// two, the same bits.
///
/// `layer_params` holds the layer's parts that are set, in this order: each query head's
/// attention sink (`sinks`), the query heads' norm gains then the key heads' (`norm`,
/// `head_dim` each), the query, key and value biases (`biased`).
#[kernel(
    workgroup = 128,
    uses(
        tree_max,
        f16_bits,
        q8_0_code,
        q8k_code,
        q8k_scale,
        cached_key_dot,
        cached_value,
        head_squares
    )
)]
pub fn rope_attention(
    q: &mut [f32],
    k: &[f32],
    v: &[f32],
    cs: &[f32],
    k_cache: &mut [u32],
    v_cache: &mut [u32],
    layer_params: &[f32],
    out: &mut [u32],
    #[uniform] n_head: u32,
    #[uniform] n_head_kv: u32,
    #[uniform] head_dim: u32,
    #[uniform] rope_dim: u32,
    #[uniform] pos0: u32,
    #[uniform] scale: f32,
    #[uniform] f16: u32,
    #[uniform] slots: u32,
    #[uniform] window: u32,
    #[uniform] softcap: f32,
    #[uniform] sinks: u32,
    #[uniform] form: u32,
    #[uniform] scales_at: u32,
    #[uniform] norm: u32,
    #[uniform] eps: f32,
    #[uniform] biased: u32,
    #[uniform] query_scale: f32,
    #[shared] qs: &mut [f32; 256],
    #[shared] ps: &mut [f32; 128],
    #[shared] rows: &mut [u32; 128],
    #[shared] acc: &mut [f32; 256],
    #[shared] heads: &mut [f32; 5 * 256],
    #[shared] vs: &mut [f32; 4 * 256],
) {
    let h = wid();
    let i = wid_y();
    let t = lid();
    let half = rope_dim / 2u32;
    let group = n_head / n_head_kv;
    let kv_dim = n_head_kv * head_dim;
    let kv_off = (h / group) * head_dim;
    let q_off = (i * n_head + h) * head_dim;
    let pos = pos0 + i;
    // Whether this workgroup writes its token's key and value for its kv head.
    let owner = h % group == 0u32;
    // Where `layer_params`' gains and biases start.
    let mut gains_at = 0u32;
    if sinks != 0u32 {
        gains_at = n_head;
    }
    let mut bias_at = gains_at;
    if norm != 0u32 {
        bias_at = gains_at + 2u32 * head_dim;
    }
    let q_bias = bias_at + h * head_dim;
    let k_bias = bias_at + n_head * head_dim + kv_off;
    let v_bias = k_bias + kv_dim;
    // `heads` slot `j <= i` holds the step's key of row `j`, slot `i + 1` the query; `vs`
    // slot `j` the value of row `j`. Each thread loads (and normalizes) dimensions `t` and
    // `t + 128` of each.
    for s in 0u32..(i + 2u32) {
        for part in 0u32..2u32 {
            let d = t + 128u32 * part;
            if d < head_dim {
                if s <= i {
                    let mut x = k[s * kv_dim + kv_off + d];
                    let mut y = v[s * kv_dim + kv_off + d];
                    if biased != 0u32 {
                        x = x + layer_params[k_bias + d];
                        y = y + layer_params[v_bias + d];
                    }
                    heads[s * 256u32 + d] = x;
                    vs[s * 256u32 + d] = y;
                } else {
                    let mut x = q[q_off + d];
                    if biased != 0u32 {
                        x = x + layer_params[q_bias + d];
                    }
                    heads[s * 256u32 + d] = x * query_scale;
                }
            }
        }
    }
    if norm != 0u32 {
        for s in 0u32..(i + 2u32) {
            let mut x = [0.0f32; 2];
            for part in 0u32..2u32 {
                if t + 128u32 * part < head_dim {
                    x[part] = heads[s * 256u32 + t + 128u32 * part];
                }
            }
            let head_scale =
                1.0 / (head_squares(acc, t, x[0], x[1]) / (head_dim as f32) + eps).sqrt();
            // The key heads' gains follow the query heads'.
            let mut g = gains_at;
            if s <= i {
                g = gains_at + head_dim;
            }
            for part in 0u32..2u32 {
                let d = t + 128u32 * part;
                if d < head_dim {
                    heads[s * 256u32 + d] = x[part] * head_scale * layer_params[g + d];
                }
            }
        }
    }
    barrier();
    // The rotations: each thread's two dimensions of a head read before any is written.
    for s in 0u32..(i + 2u32) {
        let mut at_pos = pos;
        if s <= i {
            at_pos = pos0 + s;
        }
        let mut x = [0.0f32; 2];
        for part in 0u32..2u32 {
            let d = t + 128u32 * part;
            if d < rope_dim {
                let e = d % half;
                let at = 2u32 * (at_pos * half + e);
                let c = cs[at];
                let sn = cs[at + 1u32];
                let a = heads[s * 256u32 + e];
                let b = heads[s * 256u32 + e + half];
                x[part] = a * sn + b * c;
                if d < half {
                    x[part] = a * c - b * sn;
                }
            }
        }
        barrier();
        for part in 0u32..2u32 {
            let d = t + 128u32 * part;
            if d < rope_dim {
                heads[s * 256u32 + d] = x[part];
            }
        }
    }
    barrier();
    let query = (i + 1u32) * 256u32;
    for part in 0u32..2u32 {
        let d = t + part * 128u32;
        if d < head_dim {
            qs[d] = heads[query + d];
            q[q_off + d] = heads[query + d];
        }
    }
    let own = i * 256u32;
    let slot_at = (pos % slots) * kv_dim + kv_off;
    if owner {
        if f16 == 0u32 {
            for part in 0u32..2u32 {
                let d = t + part * 128u32;
                if d < head_dim {
                    k_cache[slot_at + d] = f32_to_bits(heads[own + d]);
                    v_cache[slot_at + d] = f32_to_bits(vs[own + d]);
                }
            }
        } else if 2u32 * t < head_dim {
            let a = own + 2u32 * t;
            k_cache[slot_at / 2u32 + t] = f16_bits(heads[a]) | (f16_bits(heads[a + 1u32]) << 16u32);
            v_cache[slot_at / 2u32 + t] = f16_bits(vs[a]) | (f16_bits(vs[a + 1u32]) << 16u32);
        }
    }
    barrier();
    let len = pos + 1u32;
    let mut start = 0u32;
    if window > 0u32 && len > window {
        start = len - window;
    }
    let tiles = (len - start + 127u32) / 128u32;
    let mut m: f32 = -3.4028235e38;
    let mut l: f32 = 0.0;
    if sinks != 0u32 {
        m = layer_params[h];
        l = 1.0;
    }
    let mut o: f32 = 0.0;
    let mut o_hi: f32 = 0.0;
    for tile in 0u32..tiles {
        // Thread `t` scores position `p`: from the cache (`rows[t]`: its slot) before the step,
        // from `heads` (`rows[t]`: `slots` + its row of the step) within it.
        let first = start + tile * 128u32;
        let p = first + t;
        let valid = p < len;
        let count = (len - first).min(128u32);
        let mut row = 0u32;
        let mut s: f32 = -3.4028235e38;
        if valid {
            let mut dot: f32 = 0.0;
            if p >= pos0 {
                row = slots + (p - pos0);
                let kb = (p - pos0) * 256u32;
                if f16 != 0u32 {
                    for e in 0u32..head_dim / 2u32 {
                        let w = f16_bits(heads[kb + 2u32 * e])
                            | (f16_bits(heads[kb + 2u32 * e + 1u32]) << 16u32);
                        dot += qs[2u32 * e] * unpack_f16_lo(w)
                            + qs[2u32 * e + 1u32] * unpack_f16_hi(w);
                    }
                } else {
                    for e in 0u32..head_dim {
                        dot += qs[e] * heads[kb + e];
                    }
                }
            } else {
                row = p % slots;
                dot = cached_key_dot(qs, k_cache, row * kv_dim + kv_off, head_dim, f16);
            }
            s = dot * scale;
            if softcap > 0.0 {
                s = softcap * (s / softcap).tanh();
            }
        }
        acc[t] = s;
        rows[t] = row;
        barrier();
        tree_max(acc, t, 128u32);
        let m_new = m.max(acc[0]);
        let correction = (m - m_new).exp();
        if valid {
            ps[t] = (s - m_new).exp();
        } else {
            ps[t] = 0.0;
        }
        barrier();
        let mut tile_sum: f32 = 0.0;
        let mut tile_o: f32 = 0.0;
        let mut tile_o_hi: f32 = 0.0;
        for j in 0u32..count {
            let w = ps[j];
            tile_sum += w;
            let r = rows[j];
            for part in 0u32..2u32 {
                let dim = t + part * 128u32;
                if dim < head_dim {
                    let mut x: f32 = 0.0;
                    if r >= slots {
                        x = vs[(r - slots) * 256u32 + dim];
                        if f16 != 0u32 {
                            x = unpack_f16_lo(f16_bits(x));
                        }
                    } else {
                        x = cached_value(v_cache, r * kv_dim + kv_off + dim, f16);
                    }
                    if part == 0u32 {
                        tile_o += w * x;
                    } else {
                        tile_o_hi += w * x;
                    }
                }
            }
        }
        l = l * correction + tile_sum;
        o = o * correction + tile_o;
        o_hi = o_hi * correction + tile_o_hi;
        m = m_new;
        barrier();
    }
    if form == 0u32 {
        // OUT_F32
        if t < head_dim {
            out[q_off + t] = f32_to_bits(o / l);
        }
        if t + 128u32 < head_dim {
            out[q_off + t + 128u32] = f32_to_bits(o_hi / l);
        }
        return;
    }
    // A word's values come from several threads (a block's from 32): through `qs`, which no
    // thread reads after the last tile's barrier.
    if t < head_dim {
        qs[t] = o / l;
    }
    if t + 128u32 < head_dim {
        qs[t + 128u32] = o_hi / l;
    }
    barrier();
    if form == 1u32 {
        // OUT_HALVES
        if 2u32 * t < head_dim {
            out[q_off / 2u32 + t] =
                f16_bits(qs[2u32 * t]) | (f16_bits(qs[2u32 * t + 1u32]) << 16u32);
        }
    } else if form == 3u32 {
        // OUT_Q8_K, the head one block: every thread finds the signed value of the largest
        // magnitude, the first on ties (as `q8k_block_max`'s tree does), and writes codes `t`
        // and `t + 128`; thread 0 the block's scale.
        let mut max: f32 = 0.0;
        for e in 0u32..256u32 {
            if qs[e].abs() > max.abs() {
                max = qs[e];
            }
        }
        out[q_off + t] = q8k_code(qs[t], max) as u32;
        out[q_off + t + 128u32] = q8k_code(qs[t + 128u32], max) as u32;
        if t == 0u32 {
            out[scales_at + q_off / 256u32] = f32_to_bits(q8k_scale(max));
        }
    } else if 4u32 * t < head_dim {
        // OUT_Q8_0. Thread `t` writes word `t` of the head: codes `4t .. 4t + 4` of block
        // `t / 8`, whose largest magnitude (exact in any order) it finds itself; the block's
        // first word's thread writes its scale.
        let first = 32u32 * (t / 8u32);
        let mut amax: f32 = 0.0;
        for e in 0u32..32u32 {
            amax = amax.max(qs[first + e].abs());
        }
        let mut word = 0u32;
        for b in 0u32..4u32 {
            let code = q8_0_code(qs[4u32 * t + b], amax);
            word = word | (((code as u32) & 255u32) << (8u32 * b));
        }
        out[q_off / 4u32 + t] = word;
        if t % 8u32 == 0u32 {
            out[scales_at + q_off / 32u32 + t / 8u32] =
                f32_to_bits(unpack_f16_lo(f16_bits(amax / 127.0)));
        }
    }
}
