//! The KV-cache write.

use hesper_dsl::kernel;

/// Writes the keys and values of `n` new tokens (`[n][kv_dim]` each) into one layer's caches
/// at positions `pos0..pos0+n`, both in one dispatch.
#[kernel(workgroup = 256)]
pub fn kv_write(
    k: &[f32],
    v: &[f32],
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    #[uniform] len: u32,
    #[uniform] at: u32,
) {
    let i = gid();
    if i < len {
        k_cache[at + i] = k[i];
        v_cache[at + i] = v[i];
    }
}
