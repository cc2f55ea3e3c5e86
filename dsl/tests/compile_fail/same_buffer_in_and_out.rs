use hesper_dsl::kernel;
use hesper_gpu::GpuBuffer;

#[kernel(workgroup = 64)]
fn add_assign(x: &mut [f32], y: &[f32], #[uniform] n: u32) {
    let i = gid();
    if i < n {
        x[i] = x[i] + y[i];
    }
}

// One buffer as both the output and an input: the borrow checker refuses.
fn launch(buf: &mut GpuBuffer<f32>) -> add_assign::Args<'_> {
    add_assign::Args { x: buf, y: buf, n: 1 }
}

fn main() {}
