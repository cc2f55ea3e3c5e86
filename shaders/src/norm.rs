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
