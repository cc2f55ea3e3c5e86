use hesper_dsl::kernel;

#[kernel(workgroup = 256)]
fn reduce(x: &[f32], out: &mut [f32], #[shared] acc: &mut [f32; 8192]) {
    let t = lid();
    acc[t] = x[t];
    barrier();
    out[t] = acc[t];
}

fn main() {}
