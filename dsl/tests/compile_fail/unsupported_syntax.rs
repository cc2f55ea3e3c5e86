use hesper_dsl::kernel;

#[kernel(workgroup = 64)]
fn square(x: &[f32], out: &mut [f32]) {
    let f = |v: f32| v * v;
    let i = gid();
    out[i] = f(x[i]);
}

fn main() {}
