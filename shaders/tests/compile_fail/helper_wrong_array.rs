use hesper_dsl::{kernel, kernel_fn};

#[kernel_fn]
fn total(acc: &mut [f32; 64], t: u32) {
    if t == 0u32 {
        for i in 1..64u32 {
            acc[0] += acc[i];
        }
    }
    barrier();
}

// The helper works on the kernel's array `acc`; handing it `buf` is refused at compile time.
#[kernel(workgroup = 64, uses(total))]
fn sum64(x: &[f32], out: &mut [f32], #[shared] buf: &mut [f32; 64]) {
    let t = lid();
    buf[t] = x[t];
    barrier();
    total(buf, t);
    out[0] = buf[0];
}

fn main() {}
