//! The 256-bit `vpdpbusd` bodies of the AVX-VNNI kernels (Q8_0, Q4_K, Q5_K, Q6_K) run with
//! the instruction's EVEX encoding (AVX-512 VL + VNNI), so that a host without AVX-VNNI (AMD
//! Zen 4, CI's usual machine) checks everything but the opcode against the AVX2 kernels.

use std::arch::x86_64::*;

use super::interleaved_q4_k::{k_rows16_avx2, k_rows16_halves, ByteDots};
use super::interleaved_q8_0::{q8_0_rows16_avx2, q8_0_rows16_vnni256, Rows16};
use crate::formats::q4_k::Packed;
use crate::formats::q8_0::Packed as Q8Packed;
use crate::kernels::interleaved_q6_k::{q6_k_rows16_avx2, q6_k_rows16_halves};
use crate::quant::{quantize_q8_0, quantize_q8_k};

/// The AVX-VNNI passes run with the EVEX encoding of the same instruction (AVX-512 VL +
/// VNNI), so a host without AVX-VNNI (AMD Zen 4) still checks everything but the opcode.
struct EvexDots;

impl ByteDots for EvexDots {
    const WIDE: bool = true;
    #[inline(always)]
    unsafe fn add(acc: __m256i, codes: __m256i, x: __m256i) -> __m256i {
        // SAFETY: the caller's CPU has AVX-512 VL and VNNI.
        unsafe { _mm256_dpbusd_epi32(acc, codes, x) }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn k_evex<const FIVE: bool, const T: usize>(block: &[u8], p: &Packed) -> [Rows16; T] {
    let (xq, bsum, d) = p.parts::<T>();
    // SAFETY: forwarded from the caller.
    unsafe { k_rows16_halves::<EvexDots, FIVE, T>(block, xq, bsum, d) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q6_k_evex<const T: usize>(block: &[u8], p: &Packed) -> [Rows16; T] {
    let (xq, bsum, d) = p.parts::<T>();
    // SAFETY: forwarded from the caller.
    unsafe { q6_k_rows16_halves::<EvexDots, T>(block, xq, bsum, d) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q8_0_evex<const T: usize>(block: &[u8], p: &Q8Packed) -> [Rows16; T] {
    let (xq, d, bias) = p.parts::<T>();
    // SAFETY: forwarded from the caller.
    unsafe { q8_0_rows16_vnni256::<EvexDots, T>(block, xq, d, bias) }
}

/// Sixteen rows of `blocks` random blocks of `bytes`, each with small f16 numbers at
/// `halves` (byte offsets), from a fixed generator.
fn rows(blocks: usize, bytes: usize, halves: &[usize]) -> Vec<u8> {
    let mut s = 7u64;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let mut data: Vec<u8> = (0..16 * blocks * bytes).map(|_| next() as u8).collect();
    for blk in data.chunks_exact_mut(bytes) {
        for &at in halves {
            let v = half::f16::from_f32((next() % 200) as f32 / 10000.0 - 0.01);
            blk[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    data
}

/// `T` tokens of `cols` activations as Q8_K blocks, packed for the kernels.
fn tokens<const T: usize>(cols: usize) -> Packed {
    let acts: Vec<_> = (0..T)
        .map(|t| {
            let x: Vec<f32> = (0..cols)
                .map(|k| ((k * 37 + t * 11) % 97) as f32 / 24.0 - 2.0)
                .collect();
            quantize_q8_k(&x)
        })
        .collect();
    let a: Vec<&[_]> = acts.iter().map(Vec::as_slice).collect();
    Packed::new(&a)
}

fn bits<const T: usize>(v: [Rows16; T]) -> Vec<u32> {
    v.iter().flatten().map(|x| x.to_bits()).collect()
}

/// Every pass shape (both halves at once for one or two Q4_K tokens, one half at a time for
/// the rest) of the 256-bit `vpdpbusd` body equals the AVX2 kernel bit for bit.
fn k_quants_agree<const T: usize>() {
    let blocks = 3;
    let cols = 256 * blocks;
    let p = tokens::<T>(cols);
    let q4 = crate::interleave_q4_k::interleave::<false>(&rows(blocks, 144, &[0, 2]), 144 * blocks);
    let q5 = crate::interleave_q4_k::interleave::<true>(&rows(blocks, 176, &[0, 2]), 176 * blocks);
    let q6 = crate::interleave_q6_k::interleave(&rows(blocks, 210, &[208]), 210 * blocks);
    let (xq, bsum, d) = p.parts::<T>();
    // SAFETY: the caller checked the features; whole blocks of sixteen rows and T tokens.
    unsafe {
        let avx2 = k_rows16_avx2::<false, T>(&q4, xq, bsum, d);
        assert_eq!(
            bits(k_evex::<false, T>(&q4, &p)),
            bits(avx2),
            "Q4_K, {T} tokens"
        );
        let avx2 = k_rows16_avx2::<true, T>(&q5, xq, bsum, d);
        assert_eq!(
            bits(k_evex::<true, T>(&q5, &p)),
            bits(avx2),
            "Q5_K, {T} tokens"
        );
        let avx2 = q6_k_rows16_avx2::<T>(&q6, xq, bsum, d);
        assert_eq!(
            bits(q6_k_evex::<T>(&q6, &p)),
            bits(avx2),
            "Q6_K, {T} tokens"
        );
    }
}

/// Every pass shape (one to four tokens, both halves at once) of the 256-bit `vpdpbusd` Q8_0
/// body equals the AVX2 kernel bit for bit; weights of every byte, -128 included.
fn q8_0_agrees<const T: usize>() {
    let blocks = 5;
    let cols = 32 * blocks;
    let acts: Vec<_> = (0..T)
        .map(|t| {
            let x: Vec<f32> = (0..cols)
                .map(|k| ((k * 29 + t * 13) % 89) as f32 / 20.0 - 2.2)
                .collect();
            quantize_q8_0(&x)
        })
        .collect();
    let a: Vec<&[_]> = acts.iter().map(Vec::as_slice).collect();
    let p = Q8Packed::new(&a);
    let w = crate::interleave_q8_0::interleave(&rows(blocks, 34, &[0]), 34 * blocks);
    let (xq, d, _) = p.parts::<T>();
    // SAFETY: the caller checked the features; whole blocks of sixteen rows and T tokens.
    unsafe {
        let avx2 = q8_0_rows16_avx2::<T>(&w, xq, d);
        assert_eq!(bits(q8_0_evex::<T>(&w, &p)), bits(avx2), "Q8_0, {T} tokens");
    }
}

#[test]
fn the_vpdpbusd_passes_match_the_avx2_kernels() {
    if !(is_x86_feature_detected!("avx512vl") && is_x86_feature_detected!("avx512vnni")) {
        println!("this host has no AVX-512 VNNI: the 256-bit vpdpbusd body is only compiled");
        return;
    }
    k_quants_agree::<1>();
    k_quants_agree::<2>();
    k_quants_agree::<3>();
    k_quants_agree::<8>();
    q8_0_agrees::<1>();
    q8_0_agrees::<2>();
    q8_0_agrees::<3>();
    q8_0_agrees::<4>();
    q8_0_agrees::<8>();
}
