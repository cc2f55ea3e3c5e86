//! Workgroup reductions shared by the kernels (`#[kernel_fn]` helpers). Every thread of the
//! workgroup must call them (they contain barriers) with the same `width`/`lanes`. All but
//! [`subgroup_total`] and [`subgroup_largest`] use no subgroup operations, so they are correct
//! for every subgroup size.
//! A kernel passes its own workgroup arrays (of any name; the generic ones of any element
//! type).

use hesper_dsl::kernel_fn;
use hesper_gpu::twin::Scalar;

/// Sums `acc[0..width]` into `acc[0]` (`width` a power of two ≤ the array's length; thread
/// `t` adds pairs), for any element type.
#[kernel_fn]
pub fn tree_sum<T: Scalar>(acc: &mut [T; _], t: u32, width: u32) {
    let mut stride = width / 2u32;
    while stride > 0 {
        if t < stride {
            acc[t] = acc[t] + acc[t + stride];
        }
        barrier();
        stride = stride >> 1u32;
    }
}

/// The largest of `acc[0..width]` into `acc[0]`.
#[kernel_fn]
pub fn tree_max(acc: &mut [f32; 256], t: u32, width: u32) {
    let mut stride = width / 2u32;
    while stride > 0 {
        if t < stride {
            acc[t] = acc[t].max(acc[t + stride]);
        }
        barrier();
        stride = stride >> 1u32;
    }
}

/// The largest value of `vals[0..256]` and the smallest index holding it, into `vals[0]` and
/// `idxs[0]`.
#[kernel_fn]
pub fn tree_argmax(vals: &mut [f32; 256], idxs: &mut [u32; 256], t: u32) {
    let mut stride: u32 = 128;
    while stride > 0 {
        if t < stride {
            let o = t + stride;
            if vals[o] > vals[t] || (vals[o] == vals[t] && idxs[o] < idxs[t]) {
                vals[t] = vals[o];
                idxs[t] = idxs[o];
            }
        }
        barrier();
        stride = stride >> 1u32;
    }
}

/// The matrix kernels' reduction: thread `t` (lane `lane` of its row's `lanes`) holds partial
/// sums of the `tile` tokens at `acc[64·j + t]`; after this the row's first thread holds the
/// totals. For any element type.
#[kernel_fn]
pub fn row_sums<T: Scalar>(acc: &mut [T; _], t: u32, lane: u32, lanes: u32, tile: u32) {
    let mut stride = lanes / 2u32;
    while stride > 0 {
        if lane < stride {
            for j in 0..tile {
                acc[64u32 * j + t] = acc[64u32 * j + t] + acc[64u32 * j + t + stride];
            }
        }
        barrier();
        stride = stride >> 1u32;
    }
}

/// The reduction of the matrix kernels whose tiled kernels follow their order (TQ, the
/// K-quants, Q8_0, F16, BF16 and F32): thread `t` (lane `lane`) holds the sums of its blocks
/// (words) `lane, lane + lanes, …` of the `tile` tokens at `acc[64·j + t]` (0.0 if it has
/// none); after this the row's first thread holds `((0 + p₀) + p₁) + …` over the `lanes` lanes in lane order — the order a tiled
/// kernel walking the blocks lane by lane ([`lane_order_block`]) meets each lane's last block.
/// Token `j`'s sum is added up by the row's lane `j % lanes`, so a row's lanes fold their tokens
/// side by side. (`lanes` and `tile` are compile-time constants of the kernels, so the loops
/// unroll: with a bound known only at run time lavapipe ran the whole kernel about 1.5×
/// slower.)
#[kernel_fn]
pub fn row_fold(acc: &mut [f32; _], t: u32, lane: u32, lanes: u32, tile: u32) {
    let first = t - lane;
    for k in 0u32..(tile + lanes - 1u32) / lanes {
        let j = lane + k * lanes;
        if j < tile {
            let mut total: f32 = 0.0;
            for l in 0u32..lanes {
                total = total + acc[64u32 * j + first + l];
            }
            acc[64u32 * j + first] = total;
        }
    }
    barrier();
}

/// The `i`-th block of a row of `blocks` walked lane by lane, each lane's blocks in the order
/// its matrix-vector kernel sums them: lane 0's `0, lanes, 2·lanes, …`, then lane 1's, and so
/// on (the first `blocks % lanes` lanes have one block more than the others). A lane's run
/// ends at its block `b` with `b + lanes ≥ blocks`.
#[kernel_fn]
pub fn lane_order_block(i: u32, blocks: u32, lanes: u32) -> u32 {
    let per = blocks / lanes;
    let longer = blocks % lanes;
    let first = longer * (per + 1u32);
    let mut lane = 0u32;
    let mut k = 0u32;
    if i < first {
        lane = i / (per + 1u32);
        k = i % (per + 1u32);
    } else {
        lane = longer + (i - first) / per;
        k = (i - first) % per;
    }
    lane + k * lanes
}

/// The sum of every thread's `part` over the workgroup through subgroup sums: the first thread
/// of each subgroup (`invocation` 0) writes its subgroup's sum to `acc[index]` (`index` of
/// `count` subgroups), then every thread adds `acc[0..count]` in order, so all get the same
/// total. For kernels with `features(subgroups)`, which pass their subgroup built-ins in.
#[kernel_fn(features(subgroups))]
pub fn subgroup_total(
    part: f32,
    acc: &mut [f32; _],
    invocation: u32,
    index: u32,
    count: u32,
) -> f32 {
    let sum = subgroup_add(part);
    if invocation == 0u32 {
        acc[index] = sum;
    }
    barrier();
    let mut total: f32 = 0.0;
    for s in 0u32..count {
        total += acc[s];
    }
    total
}

/// The largest of every thread's `part` over the workgroup, as [`subgroup_total`] adds (a
/// maximum is exact in any order, so it equals [`tree_max`]'s in two barriers, not eight).
/// `acc` must be free: every thread done reading what it held.
#[kernel_fn(features(subgroups))]
pub fn subgroup_largest(
    part: f32,
    acc: &mut [f32; _],
    invocation: u32,
    index: u32,
    count: u32,
) -> f32 {
    let largest = subgroup_max(part);
    if invocation == 0u32 {
        acc[index] = largest;
    }
    barrier();
    let mut all = acc[0];
    for s in 1u32..count {
        all = all.max(acc[s]);
    }
    all
}
