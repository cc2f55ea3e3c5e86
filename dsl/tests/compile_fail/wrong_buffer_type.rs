use hesper_dsl::kernel;
use hesper_gpu::GpuBuffer;

#[kernel(workgroup = 64)]
fn scale(x: &[f32], out: &mut [f32], #[uniform] n: u32) {
    let i = gid();
    if i < n {
        out[i] = 2.0 * x[i];
    }
}

// u32 words where the kernel reads f32.
fn launch<'a>(words: &'a GpuBuffer<u32>, out: &'a mut GpuBuffer<f32>) -> scale::Args<'a> {
    scale::Args { x: words, out, n: 1 }
}

fn main() {}
