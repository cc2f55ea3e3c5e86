//! Q8_0 rows: dotted with Q8_0-quantized activations, block by block; where the instruction
//! set has a kernel for it, sixteen rows at a time from their interleaved copy
//! ([`crate::interleave_q8_0`], [`rows16_dot`]).

use hesper_engine::formats::Q8_0;

use super::{ActivationKind, CpuLayout};
use crate::interleave::ROWS;
#[cfg(target_arch = "x86_64")]
use crate::kernels::{avx2, interleaved_q8_0};
use crate::kernels::{scalar, Isa};
use crate::quant::{quantize_q8_0, Q8_0Block};

impl CpuLayout for Q8_0 {
    type Act = Vec<Q8_0Block>;
    const ACT: ActivationKind = ActivationKind::Q8_0;

    fn quantize(x: &[f32]) -> Vec<Q8_0Block> {
        quantize_q8_0(x)
    }

    #[inline]
    fn dot(self, isa: Isa, row: &[u8], act: &Vec<Q8_0Block>) -> f32 {
        by_isa!(isa,
            x86: avx2::q8_0_dot(row, act),
            neon: q8_0_dot(row, act),
            scalar: scalar::q8_0_dot(row, act),
        )
    }
}

/// Several tokens' Q8_0 activations packed for [`rows16_dot`], so that its kernel reads them
/// through one pointer: block by block, each of the eight activation dwords of every token side
/// by side, then every token's scale and `128 · Σq` (what the interleaved copy's offset weights
/// add to a block's sum).
pub struct Packed {
    tokens: usize,
    xq: Vec<i32>,
    d: Vec<f32>,
    bias: Vec<i32>,
}

impl Packed {
    /// `acts` (one entry per token, as many blocks each) packed.
    pub fn new(acts: &[&[Q8_0Block]]) -> Self {
        let (tokens, blocks) = (acts.len(), acts.first().map_or(0, |a| a.len()));
        let mut p = Self {
            tokens,
            xq: Vec::with_capacity(8 * tokens * blocks),
            d: Vec::with_capacity(tokens * blocks),
            bias: Vec::with_capacity(tokens * blocks),
        };
        for b in 0..blocks {
            for g in 0..8 {
                p.xq.extend(acts.iter().map(|a| {
                    let q = &a[b].qs[4 * g..4 * g + 4];
                    i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8])
                }));
            }
            for a in acts {
                p.d.push(a[b].d);
                p.bias
                    .push(128 * a[b].qs.iter().map(|&q| i32::from(q)).sum::<i32>());
            }
        }
        p
    }

    /// The packed dwords, scales and `128 · Σq`, checked to hold `T` tokens.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn parts<const T: usize>(&self) -> (&[i32], &[f32], &[i32]) {
        assert_eq!(self.tokens, T, "the activations packed for another tile");
        (&self.xq, &self.d, &self.bias)
    }

    /// Token `t`'s activations taken back out.
    pub(crate) fn token(&self, t: usize) -> Vec<Q8_0Block> {
        (0..self.d.len() / self.tokens)
            .map(|b| {
                let mut qs = [0i8; 32];
                for (g, q) in qs.chunks_exact_mut(4).enumerate() {
                    let word = self.xq[(8 * b + g) * self.tokens + t].to_le_bytes();
                    for (q, byte) in q.iter_mut().zip(word) {
                        *q = byte as i8;
                    }
                }
                Q8_0Block {
                    d: self.d[b * self.tokens + t],
                    qs,
                }
            })
            .collect()
    }
}

/// Sixteen Q8_0 rows interleaved into one block (`block`, see [`crate::interleave_q8_0`])
/// against the `T` tokens of `p`: `out[t][l]` is row `l` · token `t`, equal bit for bit to
/// [`scalar::q8_0_dot`] on the row.
#[inline]
pub fn rows16_dot<const T: usize>(isa: Isa, block: &[u8], p: &Packed) -> [[f32; ROWS]; T] {
    assert_eq!(p.tokens, T, "the activations packed for another tile");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512Vnni` is chosen only when the CPU reports AVX-512 F, BW, VL and VNNI
        // (`Isa::detect`; `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the
        // shapes before reading.
        Isa::Avx512Vnni => unsafe {
            interleaved_q8_0::q8_0_rows16_vnni512::<T>(block, &p.xq, &p.d, &p.bias)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2` is chosen only on CPUs with AVX2, FMA and F16C; the kernel
        // asserts the shapes before reading.
        Isa::Avx2 => unsafe { interleaved_q8_0::q8_0_rows16_avx2::<T>(block, &p.xq, &p.d) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `AvxVnni` is chosen only when the CPU reports AVX2, FMA, F16C and AVX-VNNI;
        // the kernel asserts the shapes before reading.
        Isa::AvxVnni => unsafe {
            interleaved_q8_0::q8_0_rows16_avxvnni::<T>(block, &p.xq, &p.d, &p.bias)
        },
        _ => {
            // The reference: each row taken back out of the block.
            let row_bytes = block.len() / ROWS;
            let acts: Vec<_> = (0..T).map(|t| p.token(t)).collect();
            let row = |l, row: &mut [u8]| crate::interleave_q8_0::row(block, row_bytes, l, row);
            super::rows16_reference::<_, T>(row_bytes, &acts, row, |row, a| {
                scalar::q8_0_dot(row, a)
            })
        }
    }
}
