use hesper_dsl::kernel;

#[kernel(workgroup = 512)]
fn copy(x: &[f32], out: &mut [f32]) {
    let i = gid();
    out[i] = x[i];
}

fn main() {}
