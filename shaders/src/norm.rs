//! RMSNorm.

use hesper_dsl::kernel;

use crate::reduce::tree_sum;

/// RMSNorm of one row per workgroup: `y = x / sqrt(mean(x²) + eps) · w`, with a tree
/// reduction in workgroup memory (correct for any subgroup size: no subgroup operations).
#[kernel(workgroup = 256, uses(tree_sum))]
pub fn rms_norm(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    #[uniform] width: u32,
    #[uniform] eps: f32,
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
        y[base + i] = x[base + i] * scale * w[i];
    }
}

/// [`rms_norm`] with subgroup sums where the device has subgroups: each subgroup adds its
/// threads' squares with `subgroupAdd`, its first invocation leaves the sum at
/// `acc[subgroup_index]`, and every thread adds the `subgroup_count` partials. That holds
/// whatever the subgroup size (4 to 128) and however threads are grouped, and takes one barrier
/// instead of eight.
#[kernel(workgroup = 256, features(subgroups))]
pub fn rms_norm_sg(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    #[uniform] width: u32,
    #[uniform] eps: f32,
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
    let part = subgroup_add(sum);
    if subgroup_invocation() == 0u32 {
        acc[subgroup_index()] = part;
    }
    barrier();
    let mut total: f32 = 0.0;
    for s in 0u32..subgroup_count() {
        total += acc[s];
    }
    let scale = 1.0 / (total / (width as f32) + eps).sqrt();
    for i in (t..width).step_by(256) {
        y[base + i] = x[base + i] * scale * w[i];
    }
}
