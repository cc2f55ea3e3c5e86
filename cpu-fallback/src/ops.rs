//! Element-wise operations, with ggml's arithmetic (attention is in [`crate::attention`]).

use hesper_engine::backend::RopeShape;
use hesper_engine::config::Activation;
use rayon::prelude::*;

use crate::kernels::Isa;

/// RMSNorm of each `w.len()`-wide row ([`crate::kernels::scalar::rms_norm_row`]'s
/// arithmetic on `isa`); rows are split between the threads.
pub fn rms_norm(isa: Isa, x: &[f32], w: &[f32], n: usize, eps: f32, out: &mut [f32]) {
    let d = w.len();
    x[..n * d]
        .par_chunks_exact(d)
        .zip(out[..n * d].par_chunks_exact_mut(d))
        .for_each(|(xr, yr)| isa.rms_norm_row(xr, w, eps, yr));
}

/// NeoX RoPE in place: per head, pair `i` with `i + rope_dim/2`, rotated by the angles of
/// [`RopeShape::angles`].
pub fn rope(x: &mut [f32], n: usize, pos0: usize, s: &RopeShape) {
    let angles = s.angles(pos0, n);
    for (row, cs) in x
        .chunks_exact_mut(s.n_head * s.head_dim)
        .take(n)
        .zip(angles.chunks_exact(2 * (s.rope_dim / 2)))
    {
        s.rotate_row(row, cs);
    }
}

/// `x = cap · tanh(x · scale / cap)`: a soft cap of scaled values (Gemma 2's attention scores
/// and logits).
pub fn softcap(x: &mut [f32], scale: f32, cap: f32) {
    x.iter_mut()
        .for_each(|v| *v = cap * (*v * scale / cap).tanh());
}

/// `out = act(gate) · up`, split between the threads (each value on its own: the same bits).
pub fn glu(gate: &[f32], up: &[f32], len: usize, act: Activation, out: &mut [f32]) {
    /// Values per task: enough to outweigh a task's cost, small enough to share a prompt's.
    const CHUNK: usize = 16 << 10;
    out[..len]
        .par_chunks_mut(CHUNK)
        .zip(gate[..len].par_chunks(CHUNK))
        .zip(up[..len].par_chunks(CHUNK))
        .for_each(|((o, g), u)| glu_chunk(g, u, act, o));
}

/// [`glu`] over one stretch of values.
fn glu_chunk(gate: &[f32], up: &[f32], act: Activation, out: &mut [f32]) {
    let it = out.iter_mut().zip(gate).zip(up);
    match act {
        Activation::Silu => it.for_each(|((o, &g), &u)| *o = g / (1.0 + (-g).exp()) * u),
        Activation::Relu2 => it.for_each(|((o, &g), &u)| {
            let r = g.max(0.0);
            *o = r * r * u;
        }),
        Activation::GeluTanh => it.for_each(|((o, &g), &u)| *o = gelu_tanh(g) * u),
        Activation::SwigluClamped => it.for_each(|((o, &g), &u)| *o = swiglu_clamped(g, u)),
    }
}

/// gpt-oss's clamped SwiGLU as [`Activation::SwigluClamped`] defines it (ggml's `swiglu_oai`
/// step by step): the gate capped, its SiLU of slope α, times the clamped up projection + 1.
pub fn swiglu_clamped(g: f32, u: f32) -> f32 {
    let limit = Activation::CLAMPED_LIMIT;
    let x = g.min(limit);
    let y = u.clamp(-limit, limit);
    x / (1.0 + (Activation::CLAMPED_ALPHA * -x).exp()) * (y + 1.0)
}

/// GELU's tanh approximation as [`Activation::GeluTanh`] defines it: `x / (1 + exp(−2u))`,
/// `u = √(2/π)·(x + 0.044715·x³)`.
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x);
    x / (1.0 + (-2.0 * u).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_is_the_tanh_approximation() {
        for x in [-6.0f32, -2.5, -1.0, -0.1, 0.0, 0.3, 1.0, 2.0, 7.5] {
            let (xd, c) = (f64::from(x), (2.0 / std::f64::consts::PI).sqrt());
            let want = 0.5 * xd * (1.0 + (c * (xd + 0.044715 * xd.powi(3))).tanh());
            let got = f64::from(gelu_tanh(x));
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "gelu({x}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn the_clamped_swiglu_caps_the_gate_and_clamps_the_up_projection() {
        let silu = |x: f64| x / (1.0 + (-1.702 * x).exp());
        for (g, u) in [
            (0.5f32, 2.0f32),
            (-3.0, -9.0),
            (9.0, 1.0),
            (8.0, 12.0),
            (-20.0, 0.0),
        ] {
            let (gd, ud) = (f64::from(g).min(7.0), f64::from(u).clamp(-7.0, 7.0));
            let want = silu(gd) * (ud + 1.0);
            let got = f64::from(swiglu_clamped(g, u));
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "swiglu_clamped({g}, {u}) = {got}, want {want}"
            );
        }
        // Past the limits nothing moves.
        assert_eq!(swiglu_clamped(7.0, 7.0), swiglu_clamped(70.0, 70.0));
        assert_eq!(swiglu_clamped(1.0, -7.0), swiglu_clamped(1.0, -70.0));
    }

    #[test]
    fn rope_rotates_pairs_half_apart() {
        let s = RopeShape {
            n_head: 1,
            head_dim: 4,
            rope_dim: 4,
            base: 10000.0,
            scale: 1.0,
            freq_factors: None,
            attn_factor: 1.0,
            yarn: None,
        };
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        rope(&mut x, 1, 1, &s);
        // Pair (0, 2) rotates by angle 1.
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[2] - 1f32.sin()).abs() < 1e-6);
        let mut y = vec![1.0, 2.0, 3.0, 4.0];
        rope(&mut y, 1, 0, &s);
        assert_eq!(y, vec![1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn rms_norm_normalises() {
        let mut y = vec![0.0; 4];
        rms_norm(
            Isa::Scalar,
            &[2.0, 2.0, 2.0, 2.0],
            &[1.0, 2.0, 1.0, 1.0],
            1,
            0.0,
            &mut y,
        );
        assert_eq!(y, vec![1.0, 2.0, 1.0, 1.0]);
    }
}
