//! Causal attention over the KV cache, flash-style: keys are visited in tiles of 128 with an
//! online softmax (running max `m`, running sum `l`), so no score row is ever stored whole and
//! prefill and decode are the same kernel. Dense, it visits positions `0..=i`; sparse
//! (`hesper_engine::attention::SparsePattern`), the window's positions ascending, then one tile
//! of scattered positions (globals and log-stride positions outside the window), then the
//! landmarks of the whole blocks before the window.

use hesper_dsl::kernel;

use crate::reduce::tree_max;

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
#[kernel(workgroup = 128, uses(tree_max))]
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
            } else if f16 != 0u32 {
                for e in 0u32..head_dim / 2u32 {
                    let w = k_cache[kb / 2u32 + e];
                    dot += qs[2u32 * e] * unpack_f16_lo(w) + qs[2u32 * e + 1u32] * unpack_f16_hi(w);
                }
            } else {
                for e in 0u32..head_dim {
                    dot += qs[e] * f32_from_bits(k_cache[kb + e]);
                }
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
                    } else if f16 != 0u32 {
                        let word = v_cache[at / 2u32];
                        x = select(
                            unpack_f16_lo(word),
                            unpack_f16_hi(word),
                            (at & 1u32) == 1u32,
                        );
                    } else {
                        x = f32_from_bits(v_cache[at]);
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
