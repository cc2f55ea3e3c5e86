//! The CPU side of every weight layout, one file each: how a layout wants its activations
//! quantized and which kernel of each instruction set dots a row with them ([`CpuLayout`]).
//! The matrix driver ([`crate::matmul`]) is written once over the object-safe [`RowKernels`]
//! every [`CpuLayout`] is, and a matrix picks its layout once, at load ([`row_kernels`]).

/// The kernel of `isa` among a layout's: the AVX2 one on every x86 variant, the NEON one
/// named `$neon` in both AArch64 variants (plain and `dotprod`), the scalar one elsewhere.
macro_rules! by_isa {
    ($isa:expr, x86: $x86:expr, neon: $neon:ident($($arg:expr),*), scalar: $scalar:expr $(,)?) => {
        match $isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: every x86 variant has AVX2, FMA and F16C (`Isa::detect`;
            // `CpuBackend::with_isa` refuses the others); the matrix driver passes whole rows
            // of whole blocks, as many as the activations have.
            $crate::kernels::x86!() => unsafe { $x86 },
            #[cfg(target_arch = "aarch64")]
            $crate::kernels::Isa::Neon => $crate::kernels::neon::plain::$neon($($arg),*),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `NeonDot` is chosen only when the CPU reports `dotprod` (`Isa::detect`;
            // `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the shapes.
            $crate::kernels::Isa::NeonDot => unsafe {
                $crate::kernels::neon::dotprod::$neon($($arg),*)
            },
            _ => $scalar,
        }
    };
}

/// `Some` of an x86 kernel's result on every x86 variant (the AVX2 kernel of a shape only x86
/// has), `None` elsewhere.
macro_rules! x86_only {
    ($isa:expr, $call:expr) => {
        match $isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: every x86 variant has AVX2, FMA and F16C (`Isa::detect`;
            // `CpuBackend::with_isa` refuses the others); the matrix driver passes whole rows of
            // whole blocks, as many as each token's activations have.
            $crate::kernels::x86!() => Some(unsafe { $call }),
            _ => None,
        }
    };
}

pub mod float;
pub mod i2s;
pub mod mxfp4;
pub mod q4_0;
pub mod q4_k;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
mod ternary;

use hesper_engine::formats::Layout;
use hesper_engine::weights::Format;
use rayon::prelude::*;

use crate::interleave::ROWS;
use crate::kernels::Isa;
use crate::quant::{I8Row, Q8KBlock, Q8_0Block};

/// How a weight layout wants its activations: layouts of one kind share one quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationKind {
    /// Per-row int8 with one scale (bitnet.cpp's I2_S activations).
    I8Row,
    /// ggml Q8_K blocks (TQ1_0, TQ2_0, Q4_K, Q5_K, Q6_K).
    Q8K,
    /// ggml Q8_0 blocks (Q8_0, Q4_0, MXFP4).
    Q8_0,
    /// f32 rounded through f16.
    F16,
    /// f32 rounded through bf16.
    BF16,
    /// f32 as is.
    F32,
}

/// A batch of activations, one entry per token, in the form some layout multiplies with.
pub enum Activations {
    /// Per-row int8 ([`ActivationKind::I8Row`]).
    I8(Vec<I8Row>),
    /// Q8_K blocks.
    Q8K(Vec<Vec<Q8KBlock>>),
    /// Q8_0 blocks.
    Q8_0(Vec<Vec<Q8_0Block>>),
    /// Floats (rounded as the layout's kind says).
    Float(Vec<Vec<f32>>),
}

/// One token's activations of some form, and how a batch of them is kept in [`Activations`].
pub trait Token: Sized + Send + Sync {
    /// The batch of `tokens`.
    fn batch(tokens: Vec<Self>) -> Activations;
    /// The tokens of `batch`, which holds this form.
    fn tokens(batch: &Activations) -> &[Self];
}

/// The variant of [`Activations`] each token form lives in.
macro_rules! token {
    ($ty:ty, $variant:ident) => {
        impl Token for $ty {
            fn batch(tokens: Vec<Self>) -> Activations {
                Activations::$variant(tokens)
            }

            fn tokens(batch: &Activations) -> &[Self] {
                match batch {
                    Activations::$variant(tokens) => tokens,
                    _ => unreachable!("activations are quantized for the matrix's own layout"),
                }
            }
        }
    };
}
token!(I8Row, I8);
token!(Vec<Q8KBlock>, Q8K);
token!(Vec<Q8_0Block>, Q8_0);
token!(Vec<f32>, Float);

/// A weight layout on the CPU: its activation quantizer and its row kernels, each choosing
/// the instruction set's own code (the scalar one is the reference the others are tested
/// against).
pub trait CpuLayout: Layout {
    /// One token's activations as the kernels read them.
    type Act: Token;
    /// The quantization `quantize` is (layouts of one kind share the result).
    const ACT: ActivationKind;

    /// One token's activations (a row of the matrix's width).
    fn quantize(x: &[f32]) -> Self::Act;

    /// One row · one token.
    fn dot(self, isa: Isa, row: &[u8], a: &Self::Act) -> f32;

    /// One row · four tokens, where a kernel unpacks the row once for all four.
    fn dot_x4(self, _isa: Isa, _row: &[u8], _a: [&Self::Act; 4]) -> Option<[f32; 4]> {
        None
    }

    /// Four consecutive rows (`rows` holds all four) · four tokens, `[row][token]`, where a
    /// kernel keeps the tile in registers: each token's activations are loaded once for
    /// several rows (read from L2 once per four rows instead of once per row).
    fn dot_rows4_x4(self, _isa: Isa, _rows: &[u8], _a: [&Self::Act; 4]) -> Option<[[f32; 4]; 4]> {
        None
    }

    /// Four consecutive rows (`rows` holds all four) · one token, where a kernel has them.
    fn dot_rows4(self, _isa: Isa, _rows: &[u8], _a: &Self::Act) -> Option<[f32; 4]> {
        None
    }
}

/// A [`CpuLayout`] behind a pointer: what a matrix keeps, chosen once at load. Each method
/// runs a whole loop over rows (and tokens), so the indirect call is paid once per task and
/// the loop itself is compiled for the layout.
pub trait RowKernels: Send + Sync {
    /// The quantization the layout reads.
    fn activation(&self) -> ActivationKind;

    /// The first `n` rows of `x` (rows of `cols`), quantized in parallel.
    fn quantize_batch(&self, x: &[f32], cols: usize, n: usize) -> Activations;

    /// `out[i] = scale · rows[i] · token 0 of act`, for the whole stored rows `rows` holds
    /// (as many as `out` has).
    fn rows_dot(&self, isa: Isa, rows: &[u8], act: &Activations, scale: f32, out: &mut [f32]);

    /// `out[t * width + i] = scale · rows[i] · token t of act` for `t` in `tokens` and each of
    /// the `width` whole stored rows `rows` holds: each row meets every token while it is in
    /// cache.
    #[allow(clippy::too_many_arguments)]
    fn rows_tokens(
        &self,
        isa: Isa,
        rows: &[u8],
        act: &Activations,
        tokens: std::ops::Range<usize>,
        scale: f32,
        out: &mut [f32],
        width: usize,
    );
}

impl<L: CpuLayout> RowKernels for L {
    fn activation(&self) -> ActivationKind {
        L::ACT
    }

    fn quantize_batch(&self, x: &[f32], cols: usize, n: usize) -> Activations {
        L::Act::batch(x.par_chunks_exact(cols).take(n).map(L::quantize).collect())
    }

    fn rows_dot(&self, isa: Isa, rows: &[u8], act: &Activations, scale: f32, out: &mut [f32]) {
        let a = &L::Act::tokens(act)[0];
        let Some(row_bytes) = rows.len().checked_div(out.len()) else {
            return;
        };
        // Four rows per pass where the layout has a kernel for it.
        let mut done = 0;
        for (o, four) in out
            .chunks_exact_mut(4)
            .zip(rows.chunks_exact(4 * row_bytes))
        {
            let Some(values) = self.dot_rows4(isa, four, a) else {
                break;
            };
            for (o, v) in o.iter_mut().zip(values) {
                *o = v * scale;
            }
            done += 4;
        }
        let rest = rows[done * row_bytes..].chunks_exact(row_bytes);
        for (o, row) in out[done..].iter_mut().zip(rest) {
            *o = self.dot(isa, row, a) * scale;
        }
    }

    fn rows_tokens(
        &self,
        isa: Isa,
        rows: &[u8],
        act: &Activations,
        tokens: std::ops::Range<usize>,
        scale: f32,
        out: &mut [f32],
        width: usize,
    ) {
        let a = L::Act::tokens(act);
        let Some(row_bytes) = rows.len().checked_div(width) else {
            return;
        };
        let mut put = |t: usize, i: usize, v: f32| out[t * width + i] = v * scale;
        let mut i = 0;
        // Four rows and four tokens per pass, where the layout has a tile kernel.
        while i + 4 <= width {
            let quad = &rows[i * row_bytes..(i + 4) * row_bytes];
            let mut t = tokens.start;
            while t + 4 <= tokens.end {
                let four = [&a[t], &a[t + 1], &a[t + 2], &a[t + 3]];
                let Some(values) = self.dot_rows4_x4(isa, quad, four) else {
                    break;
                };
                for (r, values) in values.into_iter().enumerate() {
                    for (k, v) in values.into_iter().enumerate() {
                        put(t + k, i + r, v);
                    }
                }
                t += 4;
            }
            if t == tokens.start && tokens.len() >= 4 {
                // No tile kernel: one row at a time from here on.
                break;
            }
            t = rows4_leftover(*self, isa, quad, a, t..tokens.end, &mut |t, r, v| {
                put(t, i + r, v)
            });
            for r in 0..4 {
                let row = &quad[r * row_bytes..(r + 1) * row_bytes];
                row_tokens(*self, isa, row, a, t..tokens.end, &mut |t, v| {
                    put(t, i + r, v)
                });
            }
            i += 4;
        }
        for (i, row) in rows.chunks_exact(row_bytes).enumerate().skip(i) {
            row_tokens(*self, isa, row, a, tokens.clone(), &mut |t, v| put(t, i, v));
        }
    }
}

/// Four rows of `layout` (`quad`) against the fewer than four tokens `tokens` left over from
/// its tiles: two or three through the tile with the last token repeated (a tile sums each row
/// and token as alone, so the repeats change nothing), one through the kernel of four rows
/// against a token (four accumulator chains, as decode runs them), where the layout has them.
/// `put(token, row, value)` takes each result; returns the first token not done. Kept out of
/// line: the tile loop of [`RowKernels::rows_tokens`] is compiled as tightly as without it.
#[inline(never)]
fn rows4_leftover<L: CpuLayout>(
    layout: L,
    isa: Isa,
    quad: &[u8],
    a: &[L::Act],
    tokens: std::ops::Range<usize>,
    put: &mut dyn FnMut(usize, usize, f32),
) -> usize {
    let (mut t, end) = (tokens.start, tokens.end);
    if end - t >= 2 {
        let pick = |k: usize| &a[(t + k).min(end - 1)];
        if let Some(values) = layout.dot_rows4_x4(isa, quad, [pick(0), pick(1), pick(2), pick(3)]) {
            for (r, values) in values.into_iter().enumerate() {
                for (k, v) in values.into_iter().enumerate().take(end - t) {
                    put(t + k, r, v);
                }
            }
            return end;
        }
    }
    while t < end {
        let Some(values) = layout.dot_rows4(isa, quad, &a[t]) else {
            break;
        };
        for (r, v) in values.into_iter().enumerate() {
            put(t, r, v);
        }
        t += 1;
    }
    t
}

/// One row of `layout` against a range of tokens: four per pass where a kernel unpacks the
/// row once for all four, then one at a time. `put(token, value)` takes each result.
fn row_tokens<L: CpuLayout>(
    layout: L,
    isa: Isa,
    row: &[u8],
    a: &[L::Act],
    tokens: std::ops::Range<usize>,
    put: &mut dyn FnMut(usize, f32),
) {
    let mut t = tokens.start;
    while t + 4 <= tokens.end {
        let Some(values) = layout.dot_x4(isa, row, [&a[t], &a[t + 1], &a[t + 2], &a[t + 3]]) else {
            break;
        };
        for (k, v) in values.into_iter().enumerate() {
            put(t + k, v);
        }
        t += 4;
    }
    for (t, a) in a.iter().enumerate().take(tokens.end).skip(t) {
        put(t, layout.dot(isa, row, a));
    }
}

/// The kernels of `format`'s layout.
pub fn row_kernels(format: Format) -> Box<dyn RowKernels> {
    hesper_engine::with_layout!(format, |layout| Box::new(layout))
}

/// The reference an interleaved kernel is tested against: each of the sixteen rows of an
/// interleaved block taken back out (`row(l, out)` writes row `l`, `row_bytes` long) and dotted
/// with each of the `T` tokens `acts` by the scalar kernel `dot`.
fn rows16_reference<A, const T: usize>(
    row_bytes: usize,
    acts: &[A],
    row: impl Fn(usize, &mut [u8]),
    dot: impl Fn(&[u8], &A) -> f32,
) -> [[f32; ROWS]; T] {
    let mut bytes = vec![0u8; row_bytes];
    let mut out = [[0.0f32; ROWS]; T];
    for l in 0..ROWS {
        row(l, &mut bytes);
        for (o, a) in out.iter_mut().zip(acts) {
            o[l] = dot(&bytes, a);
        }
    }
    out
}

/// `f` of each of the four equal rows `rows` holds (the scalar side of the four-row kernels).
fn each_of_four_rows<T>(rows: &[u8], f: impl Fn(&[u8]) -> T) -> [T; 4] {
    let row_bytes = rows.len() / 4;
    std::array::from_fn(|k| f(&rows[k * row_bytes..(k + 1) * row_bytes]))
}
