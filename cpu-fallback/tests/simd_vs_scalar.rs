//! Every SIMD kernel against the scalar reference on random inputs, including sizes that are
//! not multiples of the vector width.

use hesper_cpu::kernels::{scalar, Isa};
use hesper_cpu::quant::{quantize_i8_row, quantize_q8_k, I8Row};
use proptest::prelude::*;

fn simd() -> Isa {
    let isa = Isa::detect();
    // CI runs on x86_64 machines with AVX2; a run that silently tested nothing would pass.
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        isa,
        Isa::Avx2,
        "this x86_64 CPU has no AVX2/FMA/F16C: the SIMD kernels are untested"
    );
    isa
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect()
}

fn rel_close(a: f32, b: f32, scale: f32) -> bool {
    (a - b).abs() <= 1e-5 * scale.max(1.0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// I2_S: the integer code sum is bit-identical.
    #[test]
    fn i2s_matches_scalar(groups in 1usize..60, seed in any::<u64>()) {
        let cols = groups * 128;
        let mut s = seed;
        let mut next = move || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 33) as u32 };
        let row: Vec<u8> = (0..cols / 4).map(|_| { let mut b = 0u8; for k in 0..4 { b |= ((next() % 3) as u8) << (2 * k); } b }).collect();
        let x: Vec<f32> = (0..cols).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
        let mut q = I8Row::default();
        quantize_i8_row(&x, &mut q);
        prop_assert_eq!(simd().i2s_code_dot(&row, &q.q), scalar::i2s_code_dot(&row, &q.q));
    }

    /// TQ2_0 × Q8_K: bit-identical (same integer sums, same float order).
    #[test]
    fn tq2_0_matches_scalar(blocks in 1usize..30, seed in any::<u64>()) {
        let cols = blocks * 256;
        let mut s = seed;
        let mut next = move || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 33) as u32 };
        let mut row = Vec::new();
        for _ in 0..blocks {
            for _ in 0..64 { let mut b = 0u8; for k in 0..4 { b |= ((next() % 3) as u8) << (2 * k); } row.push(b); }
            row.extend(half::f16::from_f32((next() % 100) as f32 / 1000.0).to_le_bytes());
        }
        let x: Vec<f32> = (0..cols).map(|_| (next() % 2001) as f32 / 100.0 - 10.0).collect();
        let mut act = Vec::new();
        quantize_q8_k(&x, &mut act);
        prop_assert_eq!(simd().tq2_0_dot(&row, &act).to_bits(), scalar::tq2_0_dot(&row, &act).to_bits());
    }

    /// F32 and F16 rows of any length: equal up to summation order.
    #[test]
    fn float_dots_match_scalar(x in proptest::collection::vec(-4.0f32..4.0, 1..1100), w in proptest::collection::vec(-4.0f32..4.0, 1100)) {
        let w = &w[..x.len()];
        let f32_row: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let scale: f32 = x.iter().zip(w).map(|(a, b)| (a * b).abs()).sum();
        let (a, b) = (simd().f32_dot(&f32_row, &x), scalar::f32_dot(&f32_row, &x));
        prop_assert!(rel_close(a, b, scale), "f32 {a} vs {b}");
        let f16_row = f16_bytes(w);
        let (a, b) = (simd().f16_dot(&f16_row, &x), scalar::f16_dot(&f16_row, &x));
        prop_assert!(rel_close(a, b, scale), "f16 {a} vs {b}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// The four-token I2_S kernel equals four single-token scalar dots (full i8 range).
    #[test]
    fn i2s_x4_matches_scalar(groups in 1usize..30, seed in any::<u64>()) {
        let cols = groups * 128;
        let mut s = seed;
        let mut next = move || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 33) as u32 };
        let row: Vec<u8> = (0..cols / 4).map(|_| (0..4).fold(0u8, |b, k| b | (((next() % 3) as u8) << (2 * k)))).collect();
        let qs: Vec<Vec<i8>> = (0..4).map(|_| (0..cols).map(|_| (next() % 256) as u8 as i8).collect()).collect();
        let got = simd().i2s_code_dot_x4(&row, [&qs[0], &qs[1], &qs[2], &qs[3]]);
        for (k, q) in qs.iter().enumerate() {
            prop_assert_eq!(got[k], scalar::i2s_code_dot(&row, q));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// The four-token TQ2_0 kernel is bit-identical to four scalar dots.
    #[test]
    fn tq2_0_x4_matches_scalar(blocks in 1usize..12, seed in any::<u64>()) {
        let cols = blocks * 256;
        let mut s = seed;
        let mut next = move || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 33) as u32 };
        let mut row = Vec::new();
        for _ in 0..blocks {
            for _ in 0..64 { row.push((0..4).fold(0u8, |b, k| b | (((next() % 3) as u8) << (2 * k)))); }
            row.extend(half::f16::from_f32((next() % 100) as f32 / 1000.0).to_le_bytes());
        }
        let acts: Vec<Vec<hesper_cpu::quant::Q8KBlock>> = (0..4).map(|_| {
            let x: Vec<f32> = (0..cols).map(|_| (next() % 2001) as f32 / 100.0 - 10.0).collect();
            let mut a = Vec::new();
            quantize_q8_k(&x, &mut a);
            a
        }).collect();
        let got = simd().tq2_0_dot_x4(&row, [&acts[0], &acts[1], &acts[2], &acts[3]]);
        for (k, a) in acts.iter().enumerate() {
            prop_assert_eq!(got[k].to_bits(), scalar::tq2_0_dot(&row, a).to_bits());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Q8_0 × Q8_0: equal up to float summation order.
    #[test]
    fn q8_0_matches_scalar(w in proptest::collection::vec(-3.0f32..3.0, 32..2048), x in proptest::collection::vec(-3.0f32..3.0, 2048)) {
        let cols = w.len() / 32 * 32;
        let (w, x) = (&w[..cols], &x[..cols]);
        let row: Vec<u8> = w.chunks_exact(32).flat_map(|b| {
            let (d, qs) = hesper_engine::weights::q8_0_block(b);
            d.to_le_bytes().into_iter().chain(qs.map(|q| q as u8))
        }).collect();
        let mut act = Vec::new();
        hesper_cpu::quant::quantize_q8_0(x, &mut act);
        let scale: f32 = w.iter().zip(x).map(|(a, b)| (a * b).abs()).sum();
        let (a, b) = (simd().q8_0_dot(&row, &act), scalar::q8_0_dot(&row, &act));
        prop_assert!(rel_close(a, b, scale), "{a} vs {b}");
    }
}
