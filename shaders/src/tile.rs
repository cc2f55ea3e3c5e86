//! The output stage every matrix kernel shares (`bitlinear.rs`, `matvec.rs`).
//!
//! A matrix kernel gives each output row `lanes` threads and each workgroup a tile of `TILE`
//! tokens (the `TILE` constant of every matrix kernel, equal to
//! [`TOKEN_TILE`](crate::TOKEN_TILE)); after its row reduction the first thread of row `r`
//! holds the row's unscaled total for token `t0 + j` at `res[64·j + t]`. [`store_rows`] turns
//! those into the output as the launch's `mode` says:
//!
//! | mode | output |
//! |---|---|
//! | [`STORE`] | `out[tok·rows + row] = v·scale` |
//! | [`ADD`] | `out[tok·rows + row] += v·scale` (the residual add, fused) |
//! | [`GLU_RELU2`] | rows interleave gate (even) and up (odd): `out[tok·rows/2 + row/2] = relu(g)²·u` |
//! | [`GLU_SILU`] | as above with `silu(g)·u` |
//! | [`GLU_GELU`] | as above with `gelu(g)·u` (tanh approximation) |
//! | [`GLU_CLAMPED`] | as above with gpt-oss's clamped SwiGLU |
//! | [`SPLIT_QKV`] | rows of Q, then K from `split_k`, then V from `split_v` (a joined matrix): `out`, `out_k`, `out_v[tok·width + row − start] = v·scale`, `v·scale_odd`, `v·scale_v` |
//!
//! with `g = v_even·scale`, `u = v_odd·scale_odd`: the same arithmetic, in the same order, as
//! a plain product followed by `add_assign`, `relu2_mul`, `silu_mul`, `gelu_mul` or `swiglu_clamped_mul` (or three products of
//! their own), so fusing them changes no bit. `out_k` and `out_v` are written only by
//! [`SPLIT_QKV`].

use hesper_dsl::kernel_fn;

/// `out = v·scale`.
pub const STORE: u32 = 0;
/// `out += v·scale`.
pub const ADD: u32 = 1;
/// `out = relu(g)²·u` over interleaved gate/up rows.
pub const GLU_RELU2: u32 = 2;
/// `out = silu(g)·u` over interleaved gate/up rows.
pub const GLU_SILU: u32 = 3;
/// Q, K and V rows of one joined matrix into three outputs.
pub const SPLIT_QKV: u32 = 4;
/// `out = gelu(g)·u` (tanh approximation) over interleaved gate/up rows.
pub const GLU_GELU: u32 = 5;
/// `out = min(g, 7)·σ(1.702·min(g, 7))·(clamp(u, −7, 7) + 1)` over interleaved gate/up rows.
pub const GLU_CLAMPED: u32 = 6;

/// Writes the tile's row totals `res[64·j + t]` (held by each row's first thread) to `out` as
/// `mode` says (see the module docs); every thread of the workgroup calls it.
#[kernel_fn]
pub fn store_rows(
    res: &mut [f32; _],
    out: &mut [f32],
    out_k: &mut [f32],
    out_v: &mut [f32],
    t: u32,
    lane: u32,
    lanes: u32,
    r: u32,
    window_rows: u32,
    row0: u32,
    rows: u32,
    t0: u32,
    n: u32,
    tile: u32,
    mode: u32,
    scale: f32,
    scale_odd: f32,
    split_k: u32,
    split_v: u32,
    scale_v: f32,
) {
    barrier();
    let row = row0 + r;
    if lane == 0u32 && r < window_rows {
        for j in 0..tile {
            let at = 64u32 * j + t;
            if t0 + j >= n {
                break;
            }
            if mode == 0u32 {
                out[(t0 + j) * rows + row] = res[at] * scale;
            } else if mode == 1u32 {
                let i = (t0 + j) * rows + row;
                out[i] = out[i] + res[at] * scale;
            } else if mode == 4u32 {
                if row < split_k {
                    out[(t0 + j) * split_k + row] = res[at] * scale;
                } else if row < split_v {
                    out_k[(t0 + j) * (split_v - split_k) + row - split_k] = res[at] * scale_odd;
                } else {
                    out_v[(t0 + j) * (rows - split_v) + row - split_v] = res[at] * scale_v;
                }
            } else if row % 2u32 == 0u32 {
                let g = res[at] * scale;
                let u = res[at + lanes] * scale_odd;
                let i = (t0 + j) * (rows / 2u32) + row / 2u32;
                if mode == 2u32 {
                    let p = g.max(0.0);
                    out[i] = p * p * u;
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
    }
}

/// The first weight row of workgroup row `t0`'s expert in an `_id` instance (`by_id` 1: expert
/// `ids[t0]` of a stacked matrix of `rows` rows an expert, whose window holds the experts from
/// `expert0` on); 0 in the other instances.
#[kernel_fn]
pub fn expert_base(ids: &[u32], t0: u32, rows: u32, expert0: u32, by_id: u32) -> u32 {
    let mut base = 0u32;
    if by_id == 1u32 {
        base = (ids[t0] - expert0) * rows;
    }
    base
}

/// The rows workgroup row `t0` computes: `rows`, or in an `_id` instance 0 where its expert
/// (`ids[t0]`) is not among the window's `experts` from `expert0` on (another launch's).
#[kernel_fn]
pub fn expert_rows(ids: &[u32], t0: u32, rows: u32, expert0: u32, experts: u32, by_id: u32) -> u32 {
    let mut live = rows;
    if by_id == 1u32 {
        let e = ids[t0];
        if e < expert0 || e >= expert0 + experts {
            live = 0u32;
        }
    }
    live
}

/// The activation row workgroup row `t0` reads: `t0 / per_input` in an `_id` instance
/// (`by_id` 1: `per_input` rows picking their experts for each input row), `t0` otherwise.
#[kernel_fn]
pub fn input_row(t0: u32, per_input: u32, by_id: u32) -> u32 {
    let mut row = t0;
    if by_id == 1u32 {
        row = t0 / per_input;
    }
    row
}

/// The activation row of slot `z` in a grouped `_id` instance of a tiled kernel (`by_id` 1):
/// where `gathered` is 1, the row of the (row, choice) pair the slot holds, `ids[order_at + z] /
/// per_input` (`moe_group`'s table: a gate or up product reading the step's rows); else `z`
/// itself (a down product reading its input in slot order, and every other instance).
#[kernel_fn]
pub fn slot_input_row(
    ids: &[u32],
    z: u32,
    order_at: u32,
    per_input: u32,
    gathered: u32,
    by_id: u32,
) -> u32 {
    let mut row = z;
    if by_id == 1u32 && gathered == 1u32 {
        row = ids[order_at + z] / per_input;
    }
    row
}
