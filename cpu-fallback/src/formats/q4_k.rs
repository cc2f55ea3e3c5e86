//! Q4_K rows: dotted with Q8_K-quantized activations, block by block; where the instruction
//! set has a kernel for it, sixteen rows at a time from their interleaved copy
//! ([`crate::interleave_q4_k`], [`rows16_dot`]).

use hesper_engine::formats::{Layout, Q4K};

use super::{ActivationKind, CpuLayout};
use crate::interleave::ROWS;
#[cfg(target_arch = "x86_64")]
use crate::kernels::{avx2, interleaved_q4_k};
use crate::kernels::{scalar, Isa};
use crate::quant::{quantize_q8_k, Q8KBlock};

impl CpuLayout for Q4K {
    type Act = Vec<Q8KBlock>;
    const ACT: ActivationKind = ActivationKind::Q8K;

    fn quantize(x: &[f32]) -> Vec<Q8KBlock> {
        quantize_q8_k(x)
    }

    #[inline]
    fn dot(self, isa: Isa, row: &[u8], act: &Vec<Q8KBlock>) -> f32 {
        by_isa!(isa,
            x86: avx2::q4_k_dot(row, act),
            neon: q4_k_dot(row, act),
            scalar: scalar::q4_k_dot(row, act),
        )
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn dot_x4(self, isa: Isa, row: &[u8], act: [&Vec<Q8KBlock>; 4]) -> Option<[f32; 4]> {
        x86_only!(isa, avx2::q4_k_dot_x4(row, act.map(Vec::as_slice)))
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn dot_rows4(self, isa: Isa, rows: &[u8], act: &Vec<Q8KBlock>) -> Option<[f32; 4]> {
        x86_only!(isa, avx2::q4_k_dot_rows4(rows, act))
    }
}

/// Several tokens' Q8_K activations packed for the interleaved kernels ([`rows16_dot`], and
/// Q6_K's), so that a kernel reads them through one pointer: block by block, each of the 64
/// activation dwords of every token side by side, then every token's sixteen partial sums `Σq`
/// (of sixteen values each), then every token's scale.
pub struct Packed {
    tokens: usize,
    xq: Vec<i32>,
    bsum: Vec<i32>,
    d: Vec<f32>,
}

impl Packed {
    /// `acts` (one entry per token, as many blocks each) packed.
    pub fn new(acts: &[&[Q8KBlock]]) -> Self {
        let (tokens, blocks) = (acts.len(), acts.first().map_or(0, |a| a.len()));
        let mut p = Self {
            tokens,
            xq: Vec::with_capacity(64 * tokens * blocks),
            bsum: Vec::with_capacity(16 * tokens * blocks),
            d: Vec::with_capacity(tokens * blocks),
        };
        for b in 0..blocks {
            for g in 0..64 {
                p.xq.extend(acts.iter().map(|a| {
                    let q = &a[b].qs[4 * g..4 * g + 4];
                    i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8])
                }));
            }
            for s in 0..16 {
                p.bsum.extend(acts.iter().map(|a| i32::from(a[b].bsums[s])));
            }
            p.d.extend(acts.iter().map(|a| a[b].d));
        }
        p
    }

    /// The packed dwords, partial sums and scales, checked to hold `T` tokens.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn parts<const T: usize>(&self) -> (&[i32], &[i32], &[f32]) {
        assert_eq!(self.tokens, T, "the activations packed for another tile");
        (&self.xq, &self.bsum, &self.d)
    }

    /// Token `t`'s activations taken back out.
    pub(crate) fn token(&self, t: usize) -> Vec<Q8KBlock> {
        let at = |b: usize| b * self.tokens + t;
        (0..self.d.len() / self.tokens)
            .map(|b| {
                let mut blk = Q8KBlock {
                    d: self.d[at(b)],
                    qs: [0; 256],
                    sum: 0,
                    bsums: [0; 16],
                };
                for (g, q) in blk.qs.chunks_exact_mut(4).enumerate() {
                    let word = self.xq[(64 * b + g) * self.tokens + t].to_le_bytes();
                    for (q, byte) in q.iter_mut().zip(word) {
                        *q = byte as i8;
                    }
                }
                for s in 0..16 {
                    blk.bsums[s] = self.bsum[(16 * b + s) * self.tokens + t] as i16;
                }
                blk.sum = blk.qs.iter().map(|&q| i32::from(q)).sum();
                blk
            })
            .collect()
    }
}

/// Sixteen Q4_K rows interleaved into one block (`block`, see [`crate::interleave_q4_k`])
/// against the `T` tokens of `p`: `out[t][l]` is row `l` · token `t`, equal bit for bit to
/// [`scalar::q4_k_dot`] on the row.
#[inline]
pub fn rows16_dot<const T: usize>(isa: Isa, block: &[u8], p: &Packed) -> [[f32; ROWS]; T] {
    k_rows16_dot::<false, T>(isa, block, p, Q4K::row_bytes, scalar::q4_k_dot)
}

/// [`rows16_dot`] of Q4_K (`FIVE` false) or Q5_K (`FIVE` true), which share one interleaved
/// layout and kernel; `row_bytes` and `dot` are the type's row size and scalar kernel (the
/// reference where the instruction set has no interleaved kernel).
#[inline]
pub(super) fn k_rows16_dot<const FIVE: bool, const T: usize>(
    isa: Isa,
    block: &[u8],
    p: &Packed,
    row_bytes: fn(usize) -> usize,
    dot: fn(&[u8], &[Q8KBlock]) -> f32,
) -> [[f32; ROWS]; T] {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512Vnni` is chosen only when the CPU reports AVX-512 F, BW, VL and VNNI
        // (`Isa::detect`; `CpuBackend::with_isa` refuses it otherwise); the kernel asserts the
        // shapes before reading.
        Isa::Avx512Vnni => unsafe {
            let (xq, bsum, d) = p.parts::<T>();
            interleaved_q4_k::k_rows16_vnni512::<FIVE, T>(block, xq, bsum, d)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2` is chosen only on CPUs with AVX2, FMA and F16C; the kernel asserts
        // the shapes before reading.
        Isa::Avx2 => unsafe {
            let (xq, bsum, d) = p.parts::<T>();
            interleaved_q4_k::k_rows16_avx2::<FIVE, T>(block, xq, bsum, d)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `AvxVnni` is chosen only when the CPU reports AVX2, FMA, F16C and AVX-VNNI;
        // the kernel asserts the shapes before reading.
        Isa::AvxVnni => unsafe {
            let (xq, bsum, d) = p.parts::<T>();
            interleaved_q4_k::k_rows16_avxvnni::<FIVE, T>(block, xq, bsum, d)
        },
        _ => {
            // The reference: each row taken back out of the block.
            let cols = block.len() / crate::interleave_q4_k::block_bytes(FIVE) * 256;
            let acts: Vec<_> = (0..T).map(|t| p.token(t)).collect();
            let row = |l, row: &mut [u8]| crate::interleave_q4_k::row::<FIVE>(block, cols, l, row);
            super::rows16_reference::<_, T>(row_bytes(cols), &acts, row, |row, a| dot(row, a))
        }
    }
}
