//! hesper-rs GPU kernels, written in the shader DSL. Each `#[kernel]` function becomes a module
//! holding its WGSL and binding table (see the `hesper-dsl` crate).

use hesper_dsl::kernel;

/// `out[i] = x[i] + y[i]` (the residual add).
#[kernel(workgroup = 256)]
pub fn add(x: &[f32], y: &[f32], out: &mut [f32], #[uniform] n: u32) {
    let i = gid();
    if i < n {
        out[i] = x[i] + y[i];
    }
}

/// `out = silu(gate) · up` (llama.cpp mainline's BitNet FFN).
#[kernel(workgroup = 256)]
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32], #[uniform] n: u32) {
    let i = gid();
    if i < n {
        let g = gate[i];
        out[i] = g / (1.0 + (-g).exp()) * up[i];
    }
}

/// `out = relu(gate)² · up` (BitNet b1.58 2B4T's FFN).
#[kernel(workgroup = 256)]
pub fn relu2_mul(gate: &[f32], up: &[f32], out: &mut [f32], #[uniform] n: u32) {
    let i = gid();
    if i < n {
        let r = gate[i].max(0.0);
        out[i] = r * r * up[i];
    }
}

/// RMSNorm of one row per workgroup: `y = x / sqrt(mean(x²) + eps) · w`, with a tree
/// reduction in workgroup memory (correct for any subgroup size: no subgroup operations).
#[kernel(workgroup = 256)]
pub fn rms_norm(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    #[uniform] width: u32,
    #[uniform] eps: f32,
    #[shared] acc: &mut [f32; 256],
) {
    let row = wid();
    let t = lid();
    let base = row * width;
    let mut sum: f32 = 0.0;
    for i in (t..width).step_by(256) {
        let v = x[base + i];
        sum += v * v;
    }
    acc[t] = sum;
    barrier();
    let mut stride: u32 = 128;
    while stride > 0 {
        if t < stride {
            acc[t] += acc[t + stride];
        }
        barrier();
        stride = stride >> 1u32;
    }
    let scale = 1.0 / (acc[0] / (width as f32) + eps).sqrt();
    for i in (t..width).step_by(256) {
        y[base + i] = x[base + i] * scale * w[i];
    }
}

/// First stage of argmax: each workgroup reduces 256 × `per_thread` logits to its largest value
/// and the first index holding it, written to `best[wid]` / `best_index[wid]`.
#[kernel(workgroup = 256)]
pub fn argmax_partial(
    logits: &[f32],
    best: &mut [f32],
    best_index: &mut [u32],
    #[uniform] n: u32,
    #[uniform] per_thread: u32,
    #[shared] vals: &mut [f32; 256],
    #[shared] idxs: &mut [u32; 256],
) {
    let t = lid();
    let start = wid() * 256u32 * per_thread;
    let mut v: f32 = -3.4028235e38;
    let mut k: u32 = 0u32;
    for j in 0..per_thread {
        let i = start + j * 256u32 + t;
        if i < n && logits[i] > v {
            v = logits[i];
            k = i;
        }
    }
    vals[t] = v;
    idxs[t] = k;
    barrier();
    let mut stride: u32 = 128;
    while stride > 0 {
        if t < stride {
            let o = t + stride;
            if vals[o] > vals[t] || (vals[o] == vals[t] && idxs[o] < idxs[t]) {
                vals[t] = vals[o];
                idxs[t] = idxs[o];
            }
        }
        barrier();
        stride = stride >> 1u32;
    }
    if t == 0 {
        best[wid()] = vals[0];
        best_index[wid()] = idxs[0];
    }
}

/// NeoX RoPE in place: for token `t`, head `h`, pair `i < rope_dim/2`, rotates
/// `(x[i], x[i + rope_dim/2])` by the angle whose `(cos, sin)` the host put at
/// `cs[2·(t·half + i)]` (a table per position, so every backend uses the same angles).
#[kernel(workgroup = 64)]
pub fn rope_neox(
    x: &mut [f32],
    cs: &[f32],
    #[uniform] n_tokens: u32,
    #[uniform] n_head: u32,
    #[uniform] head_dim: u32,
    #[uniform] rope_dim: u32,
) {
    let half = rope_dim / 2u32;
    let idx = gid();
    if idx < n_tokens * n_head * half {
        let i = idx % half;
        let head = (idx / half) % n_head;
        let t = idx / (half * n_head);
        let base = (t * n_head + head) * head_dim;
        let c = cs[2u32 * (t * half + i)];
        let s = cs[2u32 * (t * half + i) + 1u32];
        let a = x[base + i];
        let b = x[base + i + half];
        x[base + i] = a * c - b * s;
        x[base + i + half] = a * s + b * c;
    }
}

/// BitLinear for I2_S weights (bitnet.cpp's layout: 128-element groups of 32 bytes, 2-bit
/// codes MSB-first, read here as little-endian u32 words) times one token's int8 activations
/// (held as i32): one workgroup per output row, exact integer sums, then bitnet.cpp's
/// epilogue `(Σ code·q − Σq) / act_scale · beta`.
#[kernel(workgroup = 256)]
pub fn bitlinear_i2s(
    codes: &[u32],
    q: &[i32],
    out: &mut [f32],
    #[uniform] cols: u32,
    #[uniform] beta: f32,
    #[uniform] act_scale: f32,
    #[uniform] act_sum: i32,
    #[shared] acc: &mut [i32; 256],
) {
    let row = wid();
    let t = lid();
    let words = cols / 16u32;
    let mut sum: i32 = 0;
    for w in (t..words).step_by(256) {
        let packed = codes[row * words + w];
        for b in 0..4u32 {
            let at = w * 4u32 + b;
            let k = (at / 32u32) * 128u32 + at % 32u32;
            let bits = (packed >> (8u32 * b)) & 255u32;
            sum += ((bits >> 6u32) as i32) * q[k];
            sum += (((bits >> 4u32) & 3u32) as i32) * q[k + 32u32];
            sum += (((bits >> 2u32) & 3u32) as i32) * q[k + 64u32];
            sum += ((bits & 3u32) as i32) * q[k + 96u32];
        }
    }
    acc[t] = sum;
    barrier();
    let mut stride: u32 = 128;
    while stride > 0 {
        if t < stride {
            acc[t] += acc[t + stride];
        }
        barrier();
        stride = stride >> 1u32;
    }
    if t == 0 {
        out[row] = ((acc[0] - act_sum) as f32) / act_scale * beta;
    }
}
