//! Workgroup reductions shared by the kernels (`#[kernel_fn]` helpers). Every thread of the
//! workgroup must call them (they contain barriers) with the same `width`/`lanes`. None uses
//! subgroup operations, so they are correct for every subgroup size. A kernel passes its
//! workgroup array of the helper's name and type (`acc`, `sums`, `vals`/`idxs`).

use hesper_dsl::kernel_fn;

/// Sums `acc[0..width]` into `acc[0]` (`width` a power of two ≤ 256; thread `t` adds pairs).
#[kernel_fn]
pub fn tree_sum(acc: &mut [f32; 256], t: u32, width: u32) {
    let mut stride = width / 2u32;
    while stride > 0 {
        if t < stride {
            acc[t] += acc[t + stride];
        }
        barrier();
        stride = stride >> 1u32;
    }
}

/// [`tree_sum`] for integers, over the array `sums`.
#[kernel_fn]
pub fn tree_sum_i32(sums: &mut [i32; 256], t: u32, width: u32) {
    let mut stride = width / 2u32;
    while stride > 0 {
        if t < stride {
            sums[t] += sums[t + stride];
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

/// The matrix kernels' epilogue: thread `t` (lane `lane` of its row's `lanes`) holds partial
/// sums of up to four tokens at `acc[64·j + t]`; after this the row's first thread holds the
/// totals.
#[kernel_fn]
pub fn row_sums(acc: &mut [f32; 256], t: u32, lane: u32, lanes: u32) {
    let mut stride = lanes / 2u32;
    while stride > 0 {
        if lane < stride {
            for j in 0..4u32 {
                acc[64u32 * j + t] += acc[64u32 * j + t + stride];
            }
        }
        barrier();
        stride = stride >> 1u32;
    }
}

/// [`row_sums`] for integers.
#[kernel_fn]
pub fn row_sums_i32(acc: &mut [i32; 256], t: u32, lane: u32, lanes: u32) {
    let mut stride = lanes / 2u32;
    while stride > 0 {
        if lane < stride {
            for j in 0..4u32 {
                acc[64u32 * j + t] += acc[64u32 * j + t + stride];
            }
        }
        barrier();
        stride = stride >> 1u32;
    }
}
