//! Workgroup reductions shared by the kernels (`#[kernel_fn]` helpers). Every thread of the
//! workgroup must call them (they contain barriers) with the same `width`/`lanes`. All but
//! [`subgroup_total`] use no subgroup operations, so they are correct for every subgroup size.
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
