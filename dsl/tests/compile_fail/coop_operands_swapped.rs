use hesper_dsl::kernel;

// A matrix's role is its type: the right operand loaded where the left one goes does not
// compile, nor does a half read back as a float.
#[kernel(workgroup = 32, features(cooperative_matrix))]
fn swapped(out: &mut [f32], #[shared] a: &mut [f16; 256], #[shared] c: &mut [f32; 256]) {
    let b = coop_load_b_columns(a, 0u32, 16u32);
    let acc = coop_multiply_add(b, b, coop_zero());
    coop_store_columns(acc, c, 0u32, 16u32);
    out[0] = a[0];
}

fn main() {}
