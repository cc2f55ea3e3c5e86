//! Rotary position embedding.

use hesper_dsl::{kernel, kernel_fn};

/// NeoX RoPE in place: for token `t` (at position `pos0 + t`), head `h`, pair
/// `i < rope_dim/2`, rotates `(x[i], x[i + rope_dim/2])` by the angle whose `(cos, sin)` the
/// host put at `cs[2·(pos·half + i)]` (one table built by `RopeShape::angles`, so every
/// backend rotates by the same angles).
#[kernel(workgroup = 64)]
pub fn rope_neox(
    x: &mut [f32],
    cs: &[f32],
    #[uniform] n_tokens: u32,
    #[uniform] n_head: u32,
    #[uniform] head_dim: u32,
    #[uniform] rope_dim: u32,
    #[uniform] pos0: u32,
) {
    let half = rope_dim / 2u32;
    let idx = gid();
    if idx < n_tokens * n_head * half {
        let i = idx % half;
        let head = (idx / half) % n_head;
        let t = idx / (half * n_head);
        let base = (t * n_head + head) * head_dim;
        let at = 2u32 * ((pos0 + t) * half + i);
        let c = cs[at];
        let s = cs[at + 1u32];
        let a = x[base + i];
        let b = x[base + i + half];
        x[base + i] = a * c - b * s;
        x[base + i + half] = a * s + b * c;
    }
}

/// Normal (GPT-J) RoPE in place: pair `i` is `(x[2i], x[2i+1])`, rotated by the same angle
/// table as [`rope_neox`] (ggml's `rope` mode 0). BitNet uses NeoX; this serves models that
/// rotate adjacent pairs.
#[kernel(workgroup = 64)]
pub fn rope_norm(
    x: &mut [f32],
    cs: &[f32],
    #[uniform] n_tokens: u32,
    #[uniform] n_head: u32,
    #[uniform] head_dim: u32,
    #[uniform] rope_dim: u32,
    #[uniform] pos0: u32,
) {
    let half = rope_dim / 2u32;
    let idx = gid();
    if idx < n_tokens * n_head * half {
        let i = idx % half;
        let head = (idx / half) % n_head;
        let t = idx / (half * n_head);
        let base = (t * n_head + head) * head_dim;
        let at = 2u32 * ((pos0 + t) * half + i);
        let c = cs[at];
        let s = cs[at + 1u32];
        let a = x[base + 2u32 * i];
        let b = x[base + 2u32 * i + 1u32];
        x[base + 2u32 * i] = a * c - b * s;
        x[base + 2u32 * i + 1u32] = a * s + b * c;
    }
}

/// Element `d` (`< rope_dim`) of the head at `base` of `x`, rotated by NeoX RoPE at position
/// `pos` with the angle table `cs` ([`rope_neox`](crate::rope_neox)'s expressions, so the same
/// bits as its output). `rope_neox_kv_write` rotates the keys it caches with it.
#[kernel_fn]
pub fn rope_neox_value(x: &[f32], cs: &[f32], base: u32, d: u32, half: u32, pos: u32) -> f32 {
    let i = d % half;
    let at = 2u32 * (pos * half + i);
    let c = cs[at];
    let s = cs[at + 1u32];
    let a = x[base + i];
    let b = x[base + i + half];
    let mut value = a * s + b * c;
    if d < half {
        value = a * c - b * s;
    }
    value
}
