use hesper_dsl::{kernel, kernel_fn};

#[kernel_fn]
fn total(acc: &mut [f32; _], t: u32) {
    if t == 0u32 {
        for i in 1..64u32 {
            acc[0] += acc[i];
        }
    }
    barrier();
}

// The helper is instantiated with the kernel's own array, of any name, but its element type
// must be the helper's: handing an `i32` array to an `f32` parameter is a type error.
#[kernel(workgroup = 64, uses(total))]
fn sum64(x: &[i32], out: &mut [i32], #[shared] buf: &mut [i32; 64]) {
    let t = lid();
    buf[t] = x[t];
    barrier();
    total(buf, t);
    out[0] = buf[0];
}

fn main() {}
