//! RMSNorm.
//!
//! A row is one workgroup, so decoding one token is one workgroup on one core and its time is
//! memory latency, not bandwidth. [`rms_norm_sg`] therefore loads `AHEAD` of a thread's
//! elements (256 apart) before using the first — an index past the row is clamped to its last
//! element and that value is not used — and pays the latency once per `256·AHEAD` elements
//! instead of once per 256 (on an H100, 15.2 → 11.3 µs a row of 2560); every sum adds the same
//! values in the same order. The fused norm and quantizer gained nothing from it there
//! (17.6 → 17.9 µs) and lost on lavapipe, so it keeps one element in flight, as does the plain
//! [`rms_norm`] of devices without subgroups (not measured on one).

use hesper_dsl::{kernel, kernel_fn};

use crate::half::f16_bits;
use crate::quantize::{pack_codes, q8_0_block_max, q8_0_code, q8k_block_max, q8k_code, q8k_scale};
use crate::reduce::{subgroup_largest, subgroup_total, tree_sum};

/// RMSNorm of one row per workgroup: `y = x / sqrt(mean(x²) + eps) · w`, or with `add` set
/// `y += x / sqrt(mean(x²) + eps) · w` (Gemma's normalized outputs added to the residual
/// stream: the same product, then the add `add_assign` would make), with a tree reduction in
/// workgroup memory (correct for any subgroup size: no subgroup operations).
#[kernel(workgroup = 256, uses(tree_sum))]
pub fn rms_norm(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    #[uniform] width: u32,
    #[uniform] eps: f32,
    #[uniform] add: u32,
    #[shared] acc: &mut [f32; 256],
) {
    let row = wid();
    let t = lid();
    let base = row * width;
    let mut sum: f32 = 0.0;
    for i in (t..width).step_by(256) {
        let v = x[base + i];
        sum += v * v;
    }
    acc[t] = sum;
    barrier();
    tree_sum(acc, t, 256u32);
    let scale = 1.0 / (acc[0] / (width as f32) + eps).sqrt();
    for i in (t..width).step_by(256) {
        let v = x[base + i] * scale * w[i];
        if add != 0u32 {
            y[base + i] = y[base + i] + v;
        } else {
            y[base + i] = v;
        }
    }
}

/// [`rms_norm`] with subgroup sums where the device has subgroups: each subgroup adds its
/// threads' squares with `subgroupAdd`, its first invocation leaves the sum at
/// `acc[subgroup_index]`, and every thread adds the `subgroup_count` partials. That holds
/// whatever the subgroup size (4 to 128) and however threads are grouped, and takes one barrier
/// instead of eight.
#[kernel(
    workgroup = 256,
    features(subgroups),
    uses(subgroup_total),
    consts(AHEAD = 4)
)]
pub fn rms_norm_sg<const AHEAD: u32>(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    #[uniform] width: u32,
    #[uniform] eps: f32,
    #[uniform] add: u32,
    #[shared] acc: &mut [f32; 256],
) {
    let row = wid();
    let t = lid();
    let base = row * width;
    let last = width - 1u32;
    let mut sum: f32 = 0.0;
    for i in (t..width).step_by(256 * AHEAD) {
        let mut v = [0.0f32; AHEAD];
        for k in 0..AHEAD {
            v[k] = x[base + (i + 256u32 * k).min(last)];
        }
        for k in 0..AHEAD {
            if i + 256u32 * k < width {
                sum += v[k] * v[k];
            }
        }
    }
    let total = subgroup_total(
        sum,
        acc,
        subgroup_invocation(),
        subgroup_index(),
        subgroup_count(),
    );
    let scale = 1.0 / (total / (width as f32) + eps).sqrt();
    for i in (t..width).step_by(256 * AHEAD) {
        let mut v = [0.0f32; AHEAD];
        for k in 0..AHEAD {
            v[k] = x[base + (i + 256u32 * k).min(last)];
        }
        let mut g = [0.0f32; AHEAD];
        for k in 0..AHEAD {
            g[k] = w[(i + 256u32 * k).min(last)];
        }
        for k in 0..AHEAD {
            if i + 256u32 * k < width {
                let at = base + i + 256u32 * k;
                let out = v[k] * scale * g[k];
                if add != 0u32 {
                    y[at] = y[at] + out;
                } else {
                    y[at] = out;
                }
            }
        }
    }
}

/// The sum of the squares of one head (up to 256 values) over a workgroup of 128 threads:
/// thread `t` holds values `a` (element `t`) and `b` (element `t + 128`, 0 past the head) and
/// adds their squares, then a tree adds the threads' sums in `acc` (free when it is called,
/// free again when it returns). [`rms_norm_heads`] and `rope_attention` normalize heads with
/// it, so the two give the same bits.
#[kernel_fn]
pub fn head_squares(acc: &mut [f32; _], t: u32, a: f32, b: f32) -> f32 {
    acc[t] = a * a + b * b;
    barrier();
    let mut stride: u32 = 64;
    while stride > 0 {
        if t < stride {
            acc[t] = acc[t] + acc[t + stride];
        }
        barrier();
        stride = stride >> 1u32;
    }
    let total = acc[0];
    barrier();
    total
}

/// RMSNorm of the query heads and the key heads in one launch (the per-head norms of Qwen3 and
/// Gemma 3), a workgroup of 128 threads a head of `width` ≤ 256: workgroup `r < q_rows`
/// normalizes row `r` of `xq` with the gains `wq` into `yq`, workgroup `q_rows + r` row `r` of
/// `xk` with `wk` into `yk`. The squares are summed by [`head_squares`], as `rope_attention`
/// sums a decoded token's heads when it normalizes them itself, and each value is
/// `x · scale · w` as there: the same bits either way.
#[kernel(workgroup = 128, uses(head_squares))]
pub fn rms_norm_heads(
    xq: &[f32],
    wq: &[f32],
    yq: &mut [f32],
    xk: &[f32],
    wk: &[f32],
    yk: &mut [f32],
    #[uniform] q_rows: u32,
    #[uniform] width: u32,
    #[uniform] eps: f32,
    #[shared] acc: &mut [f32; 128],
) {
    let keys = wid() >= q_rows;
    let mut row = wid();
    if keys {
        row = wid() - q_rows;
    }
    let t = lid();
    let base = row * width;
    let mut v = [0.0f32; 2];
    for part in 0..2u32 {
        let e = t + 128u32 * part;
        if e < width {
            if keys {
                v[part] = xk[base + e];
            } else {
                v[part] = xq[base + e];
            }
        }
    }
    let scale = 1.0 / (head_squares(acc, t, v[0], v[1]) / (width as f32) + eps).sqrt();
    for part in 0..2u32 {
        let e = t + 128u32 * part;
        if e < width {
            if keys {
                yk[base + e] = v[part] * scale * wk[e];
            } else {
                yq[base + e] = v[part] * scale * wq[e];
            }
        }
    }
}

/// [`rms_norm_sg`] and, in the same pass, [`quantize_i8_packed`](crate::quantize_i8_packed) of
/// its output: `y` as `rms_norm_sg` writes it, then `s = 127 / max(max|y|, 1e-5)`, the codes
/// `clamp(rne(y·s), −128, 127)` four to a word, `scale[row] = s` and `Σq` of the row in `sum`.
/// The products of `y` are computed again, not read back, with the same operations in the same
/// order: the same bits as the two kernels one after the other. The row's largest magnitude and
/// `Σq` go through subgroups too (a maximum and an integer sum are exact in any order): four
/// barriers where trees took twenty. `width` is a multiple of 4.
#[kernel(
    workgroup = 256,
    features(subgroups),
    uses(subgroup_total, subgroup_largest)
)]
pub fn rms_norm_quantize_i8_packed_sg(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    q: &mut [u32],
    scale: &mut [f32],
    sum: &mut [i32],
    #[uniform] width: u32,
    #[uniform] eps: f32,
    #[shared] acc: &mut [f32; 256],
    #[shared] sums: &mut [i32; 256],
) {
    let row = wid();
    let t = lid();
    let base = row * width;
    let mut squares: f32 = 0.0;
    for i in (t..width).step_by(256) {
        let v = x[base + i];
        squares += v * v;
    }
    let total = subgroup_total(
        squares,
        acc,
        subgroup_invocation(),
        subgroup_index(),
        subgroup_count(),
    );
    let norm = 1.0 / (total / (width as f32) + eps).sqrt();
    let mut m: f32 = 0.0;
    for i in (t..width).step_by(256) {
        let v = x[base + i] * norm * w[i];
        y[base + i] = v;
        m = m.max(v.abs());
    }
    // Every thread has read the partial sums before they are overwritten.
    barrier();
    let largest = subgroup_largest(
        m,
        acc,
        subgroup_invocation(),
        subgroup_index(),
        subgroup_count(),
    );
    let s = 127.0 / largest.max(0.00001);
    let words = width / 4u32;
    let mut codes: i32 = 0;
    for wd in (t..words).step_by(256) {
        let mut packed: u32 = 0u32;
        for b in 0..4u32 {
            let i = 4u32 * wd + b;
            let v = x[base + i] * norm * w[i];
            let c = (v * s).round().clamp(-128.0, 127.0) as i32;
            codes += c;
            packed = packed | (((c as u32) & 255u32) << (8u32 * b));
        }
        q[row * words + wd] = packed;
    }
    // Σq: each subgroup's sum, then the first thread adds them (integers: exact in any order).
    let part = subgroup_add(codes);
    if subgroup_invocation() == 0u32 {
        sums[subgroup_index()] = part;
    }
    barrier();
    if t == 0 {
        let mut total: i32 = 0;
        for g in 0u32..subgroup_count() {
            total += sums[g];
        }
        scale[row] = s;
        sum[row] = total;
    }
}

/// [`rms_norm_sg`] and, in the same pass, [`pack_f16`](crate::pack_f16) of its output: `y` as
/// `rms_norm_sg` writes it (the squares summed in the same order), and its values rounded to
/// halves, two to a word, in `h` (`width / 2` words a row) for the F16 product that reads `y`
/// next. `width` is even.
#[kernel(workgroup = 256, features(subgroups), uses(subgroup_total, f16_bits))]
pub fn rms_norm_pack_f16_sg(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    h: &mut [u32],
    #[uniform] width: u32,
    #[uniform] eps: f32,
    #[shared] acc: &mut [f32; 256],
) {
    let row = wid();
    let t = lid();
    let base = row * width;
    let mut squares: f32 = 0.0;
    for i in (t..width).step_by(256) {
        let v = x[base + i];
        squares += v * v;
    }
    let total = subgroup_total(
        squares,
        acc,
        subgroup_invocation(),
        subgroup_index(),
        subgroup_count(),
    );
    let norm = 1.0 / (total / (width as f32) + eps).sqrt();
    let words = width / 2u32;
    for wd in (t..words).step_by(256) {
        let i = 2u32 * wd;
        let v0 = x[base + i] * norm * w[i];
        let v1 = x[base + i + 1u32] * norm * w[i + 1u32];
        y[base + i] = v0;
        y[base + i + 1u32] = v1;
        h[row * words + wd] = f16_bits(v0) | (f16_bits(v1) << 16u32);
    }
}

/// Gemma's normalized sublayer output added to the residual stream, then the stream's next
/// norm, in one pass a row: `x += y / sqrt(mean(y²) + eps) · w_add` as [`rms_norm_sg`] with
/// `add` writes it, then `out = x / sqrt(mean(x²) + eps) · w` as `rms_norm_sg` writes it
/// (`halves` 0) or as [`rms_norm_pack_f16_sg`] does, with its halves in `h` (`halves` 1, for the
/// F16 product that reads `out` next; `width` even). Each sum of squares is added in those
/// kernels' order (thread `t`: elements `t, t + 256, …`, then the subgroup sums), so the same
/// bits as the two kernels one after the other; the second pass reads the stream values other
/// threads wrote after a storage barrier.
#[kernel(workgroup = 256, features(subgroups), uses(subgroup_total, f16_bits))]
pub fn rms_norm_add_norm_sg(
    y: &[f32],
    w_add: &[f32],
    x: &mut [f32],
    w: &[f32],
    out: &mut [f32],
    h: &mut [u32],
    #[uniform] width: u32,
    #[uniform] eps: f32,
    #[uniform] halves: u32,
    #[shared] acc: &mut [f32; 256],
) {
    let row = wid();
    let t = lid();
    let base = row * width;
    let mut squares: f32 = 0.0;
    for i in (t..width).step_by(256) {
        let v = y[base + i];
        squares += v * v;
    }
    let total = subgroup_total(
        squares,
        acc,
        subgroup_invocation(),
        subgroup_index(),
        subgroup_count(),
    );
    let scale = 1.0 / (total / (width as f32) + eps).sqrt();
    let mut stream_squares: f32 = 0.0;
    for i in (t..width).step_by(256) {
        let added = y[base + i] * scale * w_add[i];
        let v = x[base + i] + added;
        x[base + i] = v;
        stream_squares += v * v;
    }
    // Every thread has read `acc` before it is written again.
    barrier();
    let stream_total = subgroup_total(
        stream_squares,
        acc,
        subgroup_invocation(),
        subgroup_index(),
        subgroup_count(),
    );
    let norm = 1.0 / (stream_total / (width as f32) + eps).sqrt();
    storage_barrier();
    if halves == 0u32 {
        for i in (t..width).step_by(256) {
            out[base + i] = x[base + i] * norm * w[i];
        }
    } else {
        let words = width / 2u32;
        for wd in (t..words).step_by(256) {
            let i = 2u32 * wd;
            let v0 = x[base + i] * norm * w[i];
            let v1 = x[base + i + 1u32] * norm * w[i + 1u32];
            out[base + i] = v0;
            out[base + i + 1u32] = v1;
            h[row * words + wd] = f16_bits(v0) | (f16_bits(v1) << 16u32);
        }
    }
}

/// [`rms_norm_sg`] and, in the same pass, [`quantize_q8_0`](crate::quantize_q8_0) of its output,
/// spread over the row: a workgroup for each 256 values of a row (the grid is
/// [`span_grid`](crate::span_grid)`(width, rows)`). Every workgroup sums its row's squares
/// itself, in `rms_norm_sg`'s order (thread `t` adds elements `t, t + 256, …`, then the
/// subgroup sums), so all of a row's workgroups scale by the same bits; each then writes its 256
/// values of `y` and quantizes its eight 32-value blocks (the codes four to a word). The same
/// bits as the two kernels one after the other. `width` is a multiple of 32.
#[kernel(
    workgroup = 256,
    features(subgroups),
    uses(subgroup_total, f16_bits, q8_0_block_max, q8_0_code, pack_codes)
)]
pub fn rms_norm_quantize_q8_0_sg(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    q: &mut [u32],
    d: &mut [f32],
    #[uniform] width: u32,
    #[uniform] eps: f32,
    #[shared] acc: &mut [f32; 256],
    #[shared] codes: &mut [u32; 256],
) {
    let base = wid_y() * width;
    let t = lid();
    let mut squares: f32 = 0.0;
    for i in (t..width).step_by(256) {
        let v = x[base + i];
        squares += v * v;
    }
    let total = subgroup_total(
        squares,
        acc,
        subgroup_invocation(),
        subgroup_index(),
        subgroup_count(),
    );
    let norm = 1.0 / (total / (width as f32) + eps).sqrt();
    let i = wid() * 256u32 + t;
    let mut v: f32 = 0.0;
    if i < width {
        v = x[base + i] * norm * w[i];
        y[base + i] = v;
    }
    // Every thread has read the partial sums before they are overwritten.
    barrier();
    let amax = q8_0_block_max(acc, t, v.abs());
    let word = pack_codes(codes, t, q8_0_code(v, amax));
    if i < width {
        if t % 4u32 == 0u32 {
            q[(base + i) / 4u32] = word;
        }
        if t % 32u32 == 0u32 {
            d[(base + i) / 32u32] = unpack_f16_lo(f16_bits(amax / 127.0));
        }
    }
}

/// [`rms_norm_sg`] and, in the same pass, [`quantize_q8k`](crate::quantize_q8k) of its output
/// (the K-quants' and TQ's activations), a workgroup for each 256-value block of a row (the
/// grid is [`span_grid`](crate::span_grid)`(width, rows)`), each summing its row's squares
/// itself as [`rms_norm_quantize_q8_0_sg`] does: the same bits as the two kernels one after the
/// other. `width` is a multiple of 256.
#[kernel(
    workgroup = 256,
    features(subgroups),
    uses(subgroup_total, q8k_block_max, q8k_code, q8k_scale)
)]
pub fn rms_norm_quantize_q8k_sg(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    q: &mut [i32],
    d: &mut [f32],
    #[uniform] width: u32,
    #[uniform] eps: f32,
    #[shared] vals: &mut [f32; 256],
    #[shared] idxs: &mut [u32; 256],
) {
    let base = wid_y() * width;
    let t = lid();
    let mut squares: f32 = 0.0;
    for i in (t..width).step_by(256) {
        let v = x[base + i];
        squares += v * v;
    }
    let total = subgroup_total(
        squares,
        vals,
        subgroup_invocation(),
        subgroup_index(),
        subgroup_count(),
    );
    let norm = 1.0 / (total / (width as f32) + eps).sqrt();
    let i = wid() * 256u32 + t;
    let v = x[base + i] * norm * w[i];
    y[base + i] = v;
    // Every thread has read the partial sums before they are overwritten.
    barrier();
    let max = q8k_block_max(vals, idxs, t, v);
    q[base + i] = q8k_code(v, max);
    if t == 0 {
        d[(base + i) / 256u32] = q8k_scale(max);
    }
}
