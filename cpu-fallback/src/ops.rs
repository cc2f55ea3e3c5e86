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

/// `out = act(gate) · up`.
pub fn glu(gate: &[f32], up: &[f32], len: usize, act: Activation, out: &mut [f32]) {
    let it = out[..len].iter_mut().zip(&gate[..len]).zip(&up[..len]);
    match act {
        Activation::Silu => it.for_each(|((o, &g), &u)| *o = g / (1.0 + (-g).exp()) * u),
        Activation::Relu2 => it.for_each(|((o, &g), &u)| {
            let r = g.max(0.0);
            *o = r * r * u;
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rotates_pairs_half_apart() {
        let s = RopeShape {
            n_head: 1,
            head_dim: 4,
            rope_dim: 4,
            base: 10000.0,
            scale: 1.0,
            freq_factors: None,
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
