//! Element-wise kernels: the residual add and the gated activations of the FFN.

use hesper_dsl::kernel;

/// `x[i] += y[i]` (the residual add, in place).
#[kernel(workgroup = 256)]
pub fn add_assign(x: &mut [f32], y: &[f32], #[uniform] n: u32) {
    let i = gid();
    if i < n {
        x[i] = x[i] + y[i];
    }
}

/// `out = silu(gate) · up` (llama.cpp mainline's BitNet FFN).
#[kernel(workgroup = 256)]
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32], #[uniform] n: u32) {
    let i = gid();
    if i < n {
        let g = gate[i];
        out[i] = g / (1.0 + (-g).exp()) * up[i];
    }
}

/// `out = relu(gate)² · up` (BitNet b1.58 2B4T's FFN).
#[kernel(workgroup = 256)]
pub fn relu2_mul(gate: &[f32], up: &[f32], out: &mut [f32], #[uniform] n: u32) {
    let i = gid();
    if i < n {
        let r = gate[i].max(0.0);
        out[i] = r * r * up[i];
    }
}
