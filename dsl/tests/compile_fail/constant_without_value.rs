use hesper_dsl::kernel;

// A `const` generic needs its value in the attribute.
#[kernel(workgroup = 64)]
fn tiled<const TILE: u32>(out: &mut [u32]) {
    out[0] = TILE;
}

fn main() {}
