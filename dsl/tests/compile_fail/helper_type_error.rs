use hesper_dsl::{kernel, kernel_fn};

// A helper's body is checked the same way, and so is a kernel's call of it.
#[kernel_fn]
fn halve(v: f32) -> f32 {
    v / 2u32
}

#[kernel(workgroup = 64, uses(halve))]
fn halves(x: &[f32], out: &mut [u32]) {
    let i = gid();
    out[i] = halve(x[i]);
}

fn main() {}
