use hesper_dsl::kernel;

// A loop to a kernel constant is unrolled, so it cannot `break`.
#[kernel(workgroup = 64, consts(TILE = 4))]
fn first_nonzero<const TILE: u32>(x: &[f32], out: &mut [u32]) {
    let mut s = [0.0f32; TILE];
    for j in 0..TILE {
        if x[j] != 0.0 {
            break;
        }
        s[j] = x[j];
    }
    out[0] = 0u32;
}

fn main() {}
