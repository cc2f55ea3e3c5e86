use hesper_dsl::kernel;

// The WGSL printer does not know types; rustc checks the body through the kernel's Rust twin.
#[kernel(workgroup = 64)]
fn add_one(x: &[f32], out: &mut [f32]) {
    let i = gid();
    if i < x.len() {
        out[i] = x[i] + 1u32;
    }
}

fn main() {}
