//! Every SIMD kernel against the scalar reference on random inputs, including sizes that are
//! not multiples of the vector width.

use hesper_cpu::formats::{float, i2s, mxfp4, q4_0, q4_k, q5_k, q6_k, q8_0, CpuLayout};
use hesper_cpu::kernels::{scalar, Isa};
use hesper_cpu::quant::{
    quantize_i8_row, quantize_q8_0, quantize_q8_k, round_f16, Q8KBlock, Q8_0Block,
};
use hesper_cpu::{
    interleave, interleave_f16, interleave_mxfp4, interleave_q4_0, interleave_q4_k,
    interleave_q6_k, interleave_q8_0,
};
use hesper_engine::formats::q6_k::{decode_q6_k_block, q6_k_block, Q6_K_BLOCK_BYTES};
use hesper_engine::formats::{
    q8_0_block, Mxfp4, Tq1_0, Tq2_0, F16, F32, Q4K, Q4_0, Q5K, Q6K, Q8_0,
};
use proptest::prelude::*;

/// Every SIMD instruction set this CPU runs, each forced in turn rather than only the one
/// `Isa::detect` picks.
fn simds() -> Vec<Isa> {
    let isas: Vec<Isa> = Isa::supported()
        .into_iter()
        .filter(|&isa| isa != Isa::Scalar)
        .collect();
    // CI runs on x86_64 machines with AVX2 and under qemu-aarch64 (whose default CPU has NEON
    // and dotprod); a run that silently tested nothing would pass.
    #[cfg(target_arch = "x86_64")]
    assert!(
        isas.contains(&Isa::Avx2),
        "this x86_64 CPU has no AVX2/FMA/F16C: the SIMD kernels are untested"
    );
    // Says in the test log which variants this host exercised (CI hosts differ: AVX2 only,
    // or AVX-512 VNNI).
    println!("variants tested: {:?}", isas);
    #[cfg(target_arch = "aarch64")]
    assert!(
        isas.contains(&Isa::Neon),
        "NEON not reported: the SIMD kernels are untested"
    );
    isas
}

/// A small deterministic generator (proptest picks the seed).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    /// A byte of four random 2-bit codes in 0..=2.
    fn codes(&mut self) -> u8 {
        (0..4).fold(0u8, |b, k| b | (((self.next() % 3) as u8) << (2 * k)))
    }

    /// A float in [lo, lo + span] on a 1/100 grid.
    fn float(&mut self, lo: f32, span: u32) -> f32 {
        (self.next() % (span * 100 + 1)) as f32 / 100.0 + lo
    }

    /// A TQ2_0 row of `blocks` blocks with small f16 scales.
    fn tq2_0_row(&mut self, blocks: usize) -> Vec<u8> {
        let mut row = Vec::new();
        for _ in 0..blocks {
            row.extend((0..64).map(|_| self.codes()));
            row.extend(half::f16::from_f32((self.next() % 100) as f32 / 1000.0).to_le_bytes());
        }
        row
    }

    /// A TQ1_0 row of `blocks` blocks: random packed bytes (every byte value decodes to
    /// digits 0..=2) and small f16 scales.
    fn tq1_0_row(&mut self, blocks: usize) -> Vec<u8> {
        let mut row = Vec::new();
        for _ in 0..blocks {
            row.extend((0..52).map(|_| self.next() as u8));
            row.extend(half::f16::from_f32((self.next() % 100) as f32 / 1000.0).to_le_bytes());
        }
        row
    }

    /// A Q6_K row of `blocks` blocks with random codes, sub-block scales (full i8 range, so
    /// −128 too) and block scales.
    fn q6_k_row(&mut self, blocks: usize) -> Vec<u8> {
        let mut row = Vec::new();
        for _ in 0..blocks {
            row.extend((0..Q6_K_BLOCK_BYTES - 2).map(|_| self.next() as u8));
            row.extend(
                half::f16::from_f32(self.float(-0.01, 0) + (self.next() % 100) as f32 / 5000.0)
                    .to_le_bytes(),
            );
        }
        row
    }

    /// `blocks` blocks of `block_bytes` random bytes whose f16 numbers at `halves` (byte
    /// offsets) are small scales of either sign: every code, sub-block scale and minimum the
    /// layout can hold.
    fn blocks(&mut self, blocks: usize, block_bytes: usize, halves: &[usize]) -> Vec<u8> {
        let mut row: Vec<u8> = (0..blocks * block_bytes)
            .map(|_| self.next() as u8)
            .collect();
        for blk in row.chunks_exact_mut(block_bytes) {
            for &at in halves {
                let d =
                    half::f16::from_f32(self.float(-0.01, 0) + (self.next() % 100) as f32 / 5000.0);
                blk[at..at + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
        row
    }

    /// A row of random MXFP4 blocks (every code), their exponents around 1 (2^-8 to 2^7).
    fn mxfp4_row(&mut self, blocks: usize) -> Vec<u8> {
        let mut row = self.blocks(blocks, 17, &[]);
        for blk in row.chunks_exact_mut(17) {
            blk[0] = 120 + (self.next() % 16) as u8;
        }
        row
    }

    /// Q8_K activations of `cols` values in [-10, 10].
    fn q8_k(&mut self, cols: usize) -> Vec<Q8KBlock> {
        quantize_q8_k(&(0..cols).map(|_| self.float(-10.0, 20)).collect::<Vec<_>>())
    }
}

fn rel_close(a: f32, b: f32, scale: f32) -> bool {
    (a - b).abs() <= 1e-5 * scale.max(1.0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// I2_S: the integer code sum is bit-identical.
    #[test]
    fn i2s_matches_scalar(groups in 1usize..60, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let cols = groups * 128;
        let row: Vec<u8> = (0..cols / 4).map(|_| g.codes()).collect();
        let q = quantize_i8_row(&(0..cols).map(|_| g.float(-1.0, 2)).collect::<Vec<_>>());
        for isa in simds() {
            prop_assert_eq!(i2s::code_dot(isa, &row, &q.q), scalar::i2s_code_dot(&row, &q.q), "{:?}", isa);
        }
    }

    /// The four-token I2_S kernel equals four single-token scalar dots (full i8 range).
    #[test]
    fn i2s_x4_matches_scalar(groups in 1usize..30, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let cols = groups * 128;
        let row: Vec<u8> = (0..cols / 4).map(|_| g.codes()).collect();
        let qs: Vec<Vec<i8>> = (0..4).map(|_| (0..cols).map(|_| g.next() as u8 as i8).collect()).collect();
        for isa in simds() {
            let got = i2s::code_dot_x4(isa, &row, [&qs[0], &qs[1], &qs[2], &qs[3]]);
            for (k, q) in qs.iter().enumerate() {
                prop_assert_eq!(got[k], scalar::i2s_code_dot(&row, q), "{:?}", isa);
            }
        }
    }

    /// The four-row I2_S kernel equals four single-row scalar dots (full i8 range).
    #[test]
    fn i2s_rows4_matches_scalar(groups in 1usize..60, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let cols = groups * 128;
        let rows: Vec<u8> = (0..cols).map(|_| g.codes()).collect();
        let q: Vec<i8> = (0..cols).map(|_| g.next() as u8 as i8).collect();
        for isa in simds() {
            let got = i2s::code_dot_rows4(isa, &rows, &q);
            for (k, row) in rows.chunks_exact(cols / 4).enumerate() {
                prop_assert_eq!(got[k], scalar::i2s_code_dot(row, &q), "{:?}", isa);
            }
        }
    }

    /// The interleaved I2_S kernels (sixteen rows × 1, 3, 4 or 8 tokens, the chain counts
    /// the matmul uses and one it does not) equal single scalar dots (full i8 range).
    #[test]
    fn i2s_rows16_matches_scalar(groups in 1usize..24, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let cols = groups * 128;
        let rows: Vec<u8> = (0..4 * cols).map(|_| g.codes()).collect();
        let tiles = interleave::interleave(&rows, cols / 4);
        let qs: Vec<Vec<i8>> = (0..8).map(|_| (0..cols).map(|_| g.next() as u8 as i8).collect()).collect();
        let want: Vec<Vec<i32>> = qs
            .iter()
            .map(|q| rows.chunks_exact(cols / 4).map(|row| scalar::i2s_code_dot(row, q)).collect())
            .collect();
        let q = |t: usize| qs[t].as_slice();
        for isa in Isa::supported() {
            let got: Vec<[i32; 16]> = [
                i2s::rows16_dot::<1>(isa, &tiles, [q(0)]).to_vec(),
                i2s::rows16_dot::<3>(isa, &tiles, [q(1), q(2), q(3)]).to_vec(),
                i2s::rows16_dot::<4>(isa, &tiles, [q(4), q(5), q(6), q(7)]).to_vec(),
            ]
            .concat();
            let eight = i2s::rows16_dot::<8>(isa, &tiles, std::array::from_fn(q));
            for t in 0..8 {
                prop_assert_eq!(&got[t][..], &want[t][..], "{:?}, token {}", isa, t);
                prop_assert_eq!(&eight[t][..], &want[t][..], "{:?}, token {} of 8", isa, t);
            }
        }
    }

    /// The four-row TQ2_0 kernel is bit-identical to four single-row scalar dots.
    #[test]
    fn tq2_0_rows4_matches_scalar(blocks in 1usize..30, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let rows: Vec<Vec<u8>> = (0..4).map(|_| g.tq2_0_row(blocks)).collect();
        let act = g.q8_k(blocks * 256);
        for isa in simds() {
            let got = Tq2_0.dot_rows4(isa, &rows.concat(), &act).expect("a four-row kernel");
            for (k, row) in rows.iter().enumerate() {
                prop_assert_eq!(got[k].to_bits(), scalar::tq2_0_dot(row, &act).to_bits(), "{:?}", isa);
            }
        }
    }

    /// TQ1_0 × Q8_K, one row, four rows and four tokens: bit-identical to the scalar path.
    #[test]
    fn tq1_0_matches_scalar(blocks in 1usize..12, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let rows: Vec<Vec<u8>> = (0..4).map(|_| g.tq1_0_row(blocks)).collect();
        let acts: Vec<Vec<Q8KBlock>> = (0..4).map(|_| g.q8_k(blocks * 256)).collect();
        let want = |row: &[u8], act: &[Q8KBlock]| scalar::tq1_0_dot(row, act).to_bits();
        for isa in simds() {
            prop_assert_eq!(Tq1_0.dot(isa, &rows[0], &acts[0]).to_bits(), want(&rows[0], &acts[0]), "{:?}", isa);
            let got = Tq1_0.dot_rows4(isa, &rows.concat(), &acts[0]).expect("a four-row kernel");
            for (k, row) in rows.iter().enumerate() {
                prop_assert_eq!(got[k].to_bits(), want(row, &acts[0]), "{:?}", isa);
            }
            let got = Tq1_0.dot_x4(isa, &rows[0], [&acts[0], &acts[1], &acts[2], &acts[3]]).expect("a four-token kernel");
            for (t, act) in acts.iter().enumerate() {
                prop_assert_eq!(got[t].to_bits(), want(&rows[0], act), "{:?}", isa);
            }
        }
    }

    /// TQ2_0 × Q8_K: bit-identical (same integer sums, same float order).
    #[test]
    fn tq2_0_matches_scalar(blocks in 1usize..30, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let row = g.tq2_0_row(blocks);
        let act = g.q8_k(blocks * 256);
        for isa in simds() {
            prop_assert_eq!(Tq2_0.dot(isa, &row, &act).to_bits(), scalar::tq2_0_dot(&row, &act).to_bits(), "{:?}", isa);
        }
    }

    /// The four-token TQ2_0 kernel is bit-identical to four scalar dots.
    #[test]
    fn tq2_0_x4_matches_scalar(blocks in 1usize..12, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let row = g.tq2_0_row(blocks);
        let acts: Vec<Vec<Q8KBlock>> = (0..4).map(|_| g.q8_k(blocks * 256)).collect();
        for isa in simds() {
            let got = Tq2_0.dot_x4(isa, &row, [&acts[0], &acts[1], &acts[2], &acts[3]]).expect("a four-token kernel");
            for (k, a) in acts.iter().enumerate() {
                prop_assert_eq!(got[k].to_bits(), scalar::tq2_0_dot(&row, a).to_bits(), "{:?}", isa);
            }
        }
    }

    /// Q6_K × Q8_K: bit-identical (exact integer block sums, same float order), with every
    /// code, scale and sign the format can hold.
    #[test]
    fn q6_k_matches_scalar(blocks in 1usize..30, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let row = g.q6_k_row(blocks);
        let act = g.q8_k(blocks * 256);
        for isa in simds() {
            prop_assert_eq!(Q6K.dot(isa, &row, &act).to_bits(), scalar::q6_k_dot(&row, &act).to_bits(), "{:?}", isa);
        }
    }

    /// Q4_0 and MXFP4 × Q8_0, Q4_K and Q5_K × Q8_K: bit-identical (exact integer block sums,
    /// the same float order), with every code, scale and minimum the formats can hold.
    #[test]
    fn q4_0_and_k_quants_match_scalar(blocks in 1usize..20, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let q4_0 = g.blocks(8 * blocks + blocks % 4, 18, &[0]);
        let q4_0_act = quantize_q8_0(&(0..(8 * blocks + blocks % 4) * 32).map(|_| g.float(-10.0, 20)).collect::<Vec<_>>());
        let mxfp4 = g.mxfp4_row(8 * blocks + blocks % 4);
        let (q4_k, q5_k) = (g.blocks(blocks, 144, &[0, 2]), g.blocks(blocks, 176, &[0, 2]));
        let act = g.q8_k(blocks * 256);
        for isa in simds() {
            prop_assert_eq!(Q4_0.dot(isa, &q4_0, &q4_0_act).to_bits(), scalar::q4_0_dot(&q4_0, &q4_0_act).to_bits(), "{:?}", isa);
            prop_assert_eq!(Mxfp4.dot(isa, &mxfp4, &q4_0_act).to_bits(), scalar::mxfp4_dot(&mxfp4, &q4_0_act).to_bits(), "{:?} MXFP4", isa);
            prop_assert_eq!(Q4K.dot(isa, &q4_k, &act).to_bits(), scalar::q4_k_dot(&q4_k, &act).to_bits(), "{:?}", isa);
            prop_assert_eq!(Q5K.dot(isa, &q5_k, &act).to_bits(), scalar::q5_k_dot(&q5_k, &act).to_bits(), "{:?}", isa);
        }
    }

    /// The four-token Q4_0, Q4_K, Q5_K and Q6_K kernels and the four-row Q4_0, Q4_K and Q5_K
    /// ones: every token and row bit for bit the scalar dot.
    #[test]
    fn k_quant_tiles_match_scalar(blocks in 1usize..8, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let q4_k: Vec<Vec<u8>> = (0..4).map(|_| g.blocks(blocks, 144, &[0, 2])).collect();
        let q5_k: Vec<Vec<u8>> = (0..4).map(|_| g.blocks(blocks, 176, &[0, 2])).collect();
        let q6_k = g.q6_k_row(blocks);
        let q4_0: Vec<Vec<u8>> = (0..4).map(|_| g.blocks(8 * blocks, 18, &[0])).collect();
        let q4_0_acts: Vec<_> = (0..4)
            .map(|_| quantize_q8_0(&(0..blocks * 256).map(|_| g.float(-10.0, 20)).collect::<Vec<_>>()))
            .collect();
        let acts: Vec<Vec<Q8KBlock>> = (0..4).map(|_| g.q8_k(blocks * 256)).collect();
        let four = [&acts[0], &acts[1], &acts[2], &acts[3]];
        for isa in simds() {
            if let Some(q6) = Q6K.dot_x4(isa, &q6_k, four) {
                for (t, a) in acts.iter().enumerate() {
                    prop_assert_eq!(q6[t].to_bits(), scalar::q6_k_dot(&q6_k, a).to_bits(), "{:?} Q6_K token {}", isa, t);
                }
            } else {
                prop_assert!(!cfg!(target_arch = "x86_64"), "{:?}: no Q6_K four-token kernel", isa);
            }
            let q4_0_four = [&q4_0_acts[0], &q4_0_acts[1], &q4_0_acts[2], &q4_0_acts[3]];
            let q4_0_tiles = (Q4_0.dot_x4(isa, &q4_0[0], q4_0_four), Q4_0.dot_rows4(isa, &q4_0.concat(), &q4_0_acts[0]));
            if let (Some(x4), Some(rows4)) = q4_0_tiles {
                for k in 0..4 {
                    prop_assert_eq!(x4[k].to_bits(), scalar::q4_0_dot(&q4_0[0], &q4_0_acts[k]).to_bits(), "{:?} Q4_0 token {}", isa, k);
                    prop_assert_eq!(rows4[k].to_bits(), scalar::q4_0_dot(&q4_0[k], &q4_0_acts[0]).to_bits(), "{:?} Q4_0 row {}", isa, k);
                }
            } else {
                prop_assert!(!cfg!(target_arch = "x86_64"), "{:?}: no Q4_0 tile", isa);
            }
            let x4 = [Q4K.dot_x4(isa, &q4_k[0], four), Q5K.dot_x4(isa, &q5_k[0], four)];
            let rows4 = [Q4K.dot_rows4(isa, &q4_k.concat(), &acts[0]), Q5K.dot_rows4(isa, &q5_k.concat(), &acts[0])];
            let tiled = x4.iter().chain(&rows4).all(Option::is_some);
            prop_assert!(tiled || !cfg!(target_arch = "x86_64"), "{:?}: no K-quant tile", isa);
            for k in 0..4 {
                if let ([Some(q4), Some(q5)], [Some(q4_rows), Some(q5_rows)]) = (x4, rows4) {
                    prop_assert_eq!(q4[k].to_bits(), scalar::q4_k_dot(&q4_k[0], &acts[k]).to_bits(), "{:?} Q4_K token {}", isa, k);
                    prop_assert_eq!(q5[k].to_bits(), scalar::q5_k_dot(&q5_k[0], &acts[k]).to_bits(), "{:?} Q5_K token {}", isa, k);
                    prop_assert_eq!(q4_rows[k].to_bits(), scalar::q4_k_dot(&q4_k[k], &acts[0]).to_bits(), "{:?} Q4_K row {}", isa, k);
                    prop_assert_eq!(q5_rows[k].to_bits(), scalar::q5_k_dot(&q5_k[k], &acts[0]).to_bits(), "{:?} Q5_K row {}", isa, k);
                }
            }
        }
    }

    /// F32 and F16 rows of any length: equal up to summation order.
    #[test]
    fn float_dots_match_scalar(x in proptest::collection::vec(-4.0f32..4.0, 1..1100), w in proptest::collection::vec(-4.0f32..4.0, 1100)) {
        let w = &w[..x.len()];
        let scale: f32 = x.iter().zip(w).map(|(a, b)| (a * b).abs()).sum();
        let f32_row: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let f16_row: Vec<u8> = w.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
        for isa in simds() {
            let (a, b) = (F32.dot(isa, &f32_row, &x), scalar::f32_dot(&f32_row, &x));
            prop_assert!(rel_close(a, b, scale), "{isa:?} f32 {a} vs {b}");
            let (a, b) = (F16.dot(isa, &f16_row, &x), scalar::f16_dot(&f16_row, &x));
            prop_assert!(rel_close(a, b, scale), "{isa:?} f16 {a} vs {b}");
        }
    }

    /// F16 tiles (one row × four tokens, four rows × one token, four rows × four tokens): every
    /// row and token bit for bit the instruction set's single dot, which is the scalar one up
    /// to summation order. A token's logits then do not depend on the batch it came in.
    #[test]
    fn f16_tiles_equal_the_single_dot(n in 1usize..700, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let rows: Vec<Vec<u8>> = (0..4).map(|_| {
            (0..n).flat_map(|_| half::f16::from_f32(g.float(-4.0, 8)).to_le_bytes()).collect()
        }).collect();
        let quad = rows.concat();
        let xs: Vec<Vec<f32>> = (0..4).map(|_| (0..n).map(|_| g.float(-4.0, 8)).collect()).collect();
        let four = [&xs[0], &xs[1], &xs[2], &xs[3]];
        for isa in simds() {
            let x4 = F16.dot_x4(isa, &rows[0], four);
            let rows4 = F16.dot_rows4(isa, &quad, &xs[0]);
            let tile = F16.dot_rows4_x4(isa, &quad, four);
            let tiled = x4.is_some() && rows4.is_some() && tile.is_some();
            prop_assert!(tiled || !cfg!(target_arch = "x86_64"), "{:?}: no F16 tile", isa);
            for (r, row) in rows.iter().enumerate() {
                for (t, x) in xs.iter().enumerate() {
                    let one = F16.dot(isa, row, x);
                    let want = scalar::f16_dot(row, x);
                    let scale: f32 = row.chunks_exact(2).zip(x)
                        .map(|(w, x)| (half::f16::from_le_bytes([w[0], w[1]]).to_f32() * x).abs())
                        .sum();
                    prop_assert!(rel_close(one, want, scale), "{isa:?}: {one} vs {want}");
                    if let Some(tile) = tile {
                        prop_assert_eq!(tile[r][t].to_bits(), one.to_bits(), "{:?} tile row {} token {}", isa, r, t);
                    }
                    if let (Some(x4), 0) = (x4, r) {
                        prop_assert_eq!(x4[t].to_bits(), one.to_bits(), "{:?} x4 token {}", isa, t);
                    }
                    if let (Some(rows4), 0) = (rows4, t) {
                        prop_assert_eq!(rows4[r].to_bits(), one.to_bits(), "{:?} rows4 row {}", isa, r);
                    }
                }
            }
        }
    }

    /// The four-query attention kernels (query heads sharing a kv head) equal the one-query
    /// kernels of the same instruction set bit for bit, on every instruction set.
    #[test]
    fn grouped_attention_equals_one_query_at_a_time(hd in 1usize..150, len in 1usize..14, extra in 0usize..9, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let stride = hd + extra;
        let qs: Vec<Vec<f32>> = (0..4).map(|_| (0..hd).map(|_| g.float(-2.0, 4)).collect()).collect();
        let kv: Vec<f32> = (0..(len - 1) * stride + hd).map(|_| g.float(-2.0, 4)).collect();
        let ps: Vec<Vec<f32>> = (0..4).map(|_| (0..len).map(|_| g.float(0.0, 1)).collect()).collect();
        for isa in Isa::supported() {
            let mut four = vec![vec![0.0f32; len]; 4];
            let [a, b, c, d] = &mut four[..] else { unreachable!() };
            isa.scores_x4([&qs[0], &qs[1], &qs[2], &qs[3]], &kv, stride, [a, b, c, d]);
            for (q, got) in qs.iter().zip(&four) {
                let mut one = vec![0.0f32; len];
                isa.scores(q, &kv, stride, &mut one);
                prop_assert_eq!(&one, got, "{:?} scores", isa);
            }
            let mut four = vec![vec![7.0f32; hd]; 4];
            let [a, b, c, d] = &mut four[..] else { unreachable!() };
            isa.weighted_sum_x4([&ps[0], &ps[1], &ps[2], &ps[3]], &kv, stride, [a, b, c, d]);
            for (p, got) in ps.iter().zip(&four) {
                let mut one = vec![7.0f32; hd];
                isa.weighted_sum(p, &kv, stride, &mut one);
                prop_assert_eq!(&one, got, "{:?} weighted sums", isa);
            }
        }
    }

    /// RMSNorm: the f64 sum of squares in lanes may round differently in its last bits; the
    /// output is within 2 ULP of the scalar path's.
    #[test]
    fn rms_norm_matches_scalar(d in 1usize..700, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let x: Vec<f32> = (0..d).map(|_| g.float(-3.0, 6)).collect();
        let w: Vec<f32> = (0..d).map(|_| g.float(-1.0, 2)).collect();
        for isa in simds() {
            let (mut a, mut b) = (vec![0.0; d], vec![0.0; d]);
            isa.rms_norm_row(&x, &w, 1e-5, &mut a);
            scalar::rms_norm_row(&x, &w, 1e-5, &mut b);
            for (j, (a, b)) in a.iter().zip(&b).enumerate() {
                prop_assert!((a - b).abs() <= 2.5e-7 * b.abs(), "{:?} y[{}]: {} vs {}", isa, j, a, b);
            }
        }
    }

    /// The softmax with a vector `exp`: every probability within 3 ULP (5e-7 relative) of the
    /// scalar path's (libm `expf`, a sequential f64 sum), over spreads of scores from flat to
    /// ones that underflow.
    #[test]
    fn softmax_matches_scalar(len in 1usize..300, spread in 0.0f32..200.0, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let x: Vec<f32> = (0..len).map(|_| g.float(-1.0, 2) * spread).collect();
        for isa in simds() {
            let (mut a, mut b) = (x.clone(), x.clone());
            isa.softmax(&mut a, 0.37);
            scalar::softmax(&mut b, 0.37);
            for (j, (a, b)) in a.iter().zip(&b).enumerate() {
                prop_assert!((a - b).abs() <= 5e-7 * b.abs() + 1e-37, "{:?} p[{}]: {} vs {}", isa, j, a, b);
            }
        }
    }

    /// Attention scores and weighted sums over strided cached rows, head widths that are not
    /// multiples of 8 or 64 included: equal up to summation order and FMA rounding.
    #[test]
    fn attention_kernels_match_scalar(hd in 1usize..150, len in 1usize..11, extra in 0usize..9, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let stride = hd + extra;
        let q: Vec<f32> = (0..hd).map(|_| g.float(-2.0, 4)).collect();
        let kv: Vec<f32> = (0..(len - 1) * stride + hd).map(|_| g.float(-2.0, 4)).collect();
        let p: Vec<f32> = (0..len).map(|_| g.float(0.0, 1)).collect();
        for isa in simds() {
            let (mut a, mut b) = (vec![0.0; len], vec![0.0; len]);
            isa.scores(&q, &kv, stride, &mut a);
            scalar::scores(&q, &kv, stride, &mut b);
            for (j, (a, b)) in a.iter().zip(&b).enumerate() {
                let key = &kv[j * stride..][..hd];
                let scale: f32 = q.iter().zip(key).map(|(x, y)| (x * y).abs()).sum();
                prop_assert!(rel_close(*a, *b, scale), "{isa:?} score {j}: {a} vs {b}");
            }
            let (mut a, mut b) = (vec![7.0; hd], vec![7.0; hd]);
            isa.weighted_sum(&p, &kv, stride, &mut a);
            scalar::weighted_sum(&p, &kv, stride, &mut b);
            for (d, (a, b)) in a.iter().zip(&b).enumerate() {
                let scale: f32 = p.iter().enumerate().map(|(j, pj)| (pj * kv[j * stride + d]).abs()).sum();
                prop_assert!(rel_close(*a, *b, scale), "{isa:?} dim {d}: {a} vs {b}");
            }
        }
    }

    /// Q8_0 × Q8_0: equal up to float summation order.
    #[test]
    fn q8_0_matches_scalar(w in proptest::collection::vec(-3.0f32..3.0, 32..2048), x in proptest::collection::vec(-3.0f32..3.0, 2048)) {
        let cols = w.len() / 32 * 32;
        let (w, x) = (&w[..cols], &x[..cols]);
        let row: Vec<u8> = w.chunks_exact(32).flat_map(|b| {
            let (d, qs) = q8_0_block(b);
            d.to_le_bytes().into_iter().chain(qs.map(|q| q as u8))
        }).collect();
        let act = quantize_q8_0(x);
        let scale: f32 = w.iter().zip(x).map(|(a, b)| (a * b).abs()).sum();
        for isa in simds() {
            let (a, b) = (Q8_0.dot(isa, &row, &act), scalar::q8_0_dot(&row, &act));
            prop_assert!(rel_close(a, b, scale), "{isa:?} {a} vs {b}");
        }
    }

    /// The interleaved F16 kernel (sixteen rows × 1, 3, 4, 8 or 12 tokens: AVX2's passes of
    /// four and of six) equals single scalar dots bit for bit: f16 products are exact in f32,
    /// so its FMAs round as the scalar sum.
    #[test]
    fn f16_rows16_matches_scalar(cols in 1usize..300, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let rows: Vec<u8> = (0..16 * cols)
            .flat_map(|_| half::f16::from_f32(g.float(-4.0, 8) * 1.37).to_le_bytes())
            .collect();
        let tiles = interleave_f16::interleave(&rows, 2 * cols);
        let xs: Vec<Vec<f32>> = (0..12)
            .map(|_| round_f16(&(0..cols).map(|_| g.float(-3.0, 6) * 0.731).collect::<Vec<_>>()))
            .collect();
        let want: Vec<Vec<u32>> = xs
            .iter()
            .map(|x| rows.chunks_exact(2 * cols).map(|r| scalar::f16_dot(r, x).to_bits()).collect())
            .collect();
        let x: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
        let pack = |r: std::ops::Range<usize>| float::pack_f16(&x[r]);
        for isa in Isa::supported() {
            let got: Vec<[f32; 16]> = [
                float::f16_rows16_dot::<1>(isa, &tiles, &pack(0..1)).to_vec(),
                float::f16_rows16_dot::<3>(isa, &tiles, &pack(1..4)).to_vec(),
                float::f16_rows16_dot::<4>(isa, &tiles, &pack(4..8)).to_vec(),
            ]
            .concat();
            let eight = float::f16_rows16_dot::<8>(isa, &tiles, &pack(0..8));
            let twelve = float::f16_rows16_dot::<12>(isa, &tiles, &pack(0..12));
            let four_blocks = float::f16_rows64_dot(isa, [&tiles[..]; 4], x[0]);
            for block in four_blocks {
                prop_assert_eq!(block.map(f32::to_bits).to_vec(), want[0].clone(), "{:?}, 64 rows", isa);
            }
            let bits = |v: &[f32; 16]| v.map(f32::to_bits).to_vec();
            for t in 0..8 {
                prop_assert_eq!(&bits(&got[t]), &want[t], "{:?}, token {}", isa, t);
                prop_assert_eq!(&bits(&eight[t]), &want[t], "{:?}, token {} of 8", isa, t);
            }
            for t in 0..12 {
                prop_assert_eq!(&bits(&twelve[t]), &want[t], "{:?}, token {} of 12", isa, t);
            }
        }
    }

    /// The interleaved Q8_0 kernel (sixteen rows × 1, 3, 4 or 8 tokens) equals single scalar
    /// dots bit for bit: weights over the whole i8 range (−128 too), any f16 scale.
    #[test]
    fn q8_0_rows16_matches_scalar(blocks in 1usize..40, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let cols = blocks * 32;
        let row_bytes = blocks * 34;
        let rows: Vec<u8> = (0..16 * blocks)
            .flat_map(|_| {
                let d = half::f16::from_f32(g.float(-2.0, 4) / 64.0).to_le_bytes();
                let qs: Vec<u8> = (0..32).map(|_| g.next() as u8).collect();
                d.into_iter().chain(qs)
            })
            .collect();
        let tiles = interleave_q8_0::interleave(&rows, row_bytes);
        let acts: Vec<_> = (0..8)
            .map(|_| quantize_q8_0(&(0..cols).map(|_| g.float(-3.0, 6)).collect::<Vec<_>>()))
            .collect();
        let want: Vec<Vec<u32>> = acts
            .iter()
            .map(|a| rows.chunks_exact(row_bytes).map(|r| scalar::q8_0_dot(r, a).to_bits()).collect())
            .collect();
        let a: Vec<&[Q8_0Block]> = acts.iter().map(Vec::as_slice).collect();
        let pack = |r: std::ops::Range<usize>| q8_0::Packed::new(&a[r]);
        for isa in Isa::supported() {
            let got: Vec<[f32; 16]> = [
                q8_0::rows16_dot::<1>(isa, &tiles, &pack(0..1)).to_vec(),
                q8_0::rows16_dot::<3>(isa, &tiles, &pack(1..4)).to_vec(),
                q8_0::rows16_dot::<4>(isa, &tiles, &pack(4..8)).to_vec(),
            ]
            .concat();
            let eight = q8_0::rows16_dot::<8>(isa, &tiles, &pack(0..8));
            for t in 0..8 {
                let bits = |v: &[f32; 16]| v.map(f32::to_bits).to_vec();
                prop_assert_eq!(&bits(&got[t]), &want[t], "{:?}, token {}", isa, t);
                prop_assert_eq!(&bits(&eight[t]), &want[t], "{:?}, token {} of 8", isa, t);
            }
        }
    }

    /// The interleaved MXFP4 kernel (sixteen rows × 1, 2, 3, 4 or 8 tokens) equals single
    /// scalar dots bit for bit: every code, exponents from 2^-8 to 2^7 and the two subnormal
    /// ones.
    #[test]
    fn mxfp4_rows16_matches_scalar(blocks in 1usize..40, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let cols = blocks * 32;
        let row_bytes = blocks * 17;
        let mut rows = g.mxfp4_row(16 * blocks);
        rows[0] = 0;
        rows[17] = 1;
        let tiles = interleave_mxfp4::interleave(&rows, row_bytes);
        let acts: Vec<_> = (0..8)
            .map(|_| quantize_q8_0(&(0..cols).map(|_| g.float(-3.0, 6)).collect::<Vec<_>>()))
            .collect();
        let want: Vec<Vec<u32>> = acts
            .iter()
            .map(|a| rows.chunks_exact(row_bytes).map(|r| scalar::mxfp4_dot(r, a).to_bits()).collect())
            .collect();
        let a: Vec<&[Q8_0Block]> = acts.iter().map(Vec::as_slice).collect();
        let pack = |r: std::ops::Range<usize>| q8_0::Packed::new(&a[r]);
        for isa in Isa::supported() {
            let got: Vec<[f32; 16]> = [
                mxfp4::rows16_dot::<1>(isa, &tiles, &pack(0..1)).to_vec(),
                mxfp4::rows16_dot::<2>(isa, &tiles, &pack(1..3)).to_vec(),
                mxfp4::rows16_dot::<1>(isa, &tiles, &pack(3..4)).to_vec(),
                mxfp4::rows16_dot::<4>(isa, &tiles, &pack(4..8)).to_vec(),
            ]
            .concat();
            let eight = mxfp4::rows16_dot::<8>(isa, &tiles, &pack(0..8));
            let three = mxfp4::rows16_dot::<3>(isa, &tiles, &pack(0..3));
            for t in 0..8 {
                let bits = |v: &[f32; 16]| v.map(f32::to_bits).to_vec();
                prop_assert_eq!(&bits(&got[t]), &want[t], "{:?}, token {}", isa, t);
                prop_assert_eq!(&bits(&eight[t]), &want[t], "{:?}, token {} of 8", isa, t);
                if t < 3 {
                    prop_assert_eq!(&bits(&three[t]), &want[t], "{:?}, token {} of 3", isa, t);
                }
            }
        }
    }

    /// The interleaved Q4_0 kernel (sixteen rows × 1, 3, 4 or 8 tokens) equals single scalar
    /// dots bit for bit: every code, any f16 scale.
    #[test]
    fn q4_0_rows16_matches_scalar(blocks in 1usize..40, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let cols = blocks * 32;
        let row_bytes = blocks * 18;
        let rows = g.blocks(16 * blocks, 18, &[0]);
        let tiles = interleave_q4_0::interleave(&rows, row_bytes);
        let acts: Vec<_> = (0..8)
            .map(|_| quantize_q8_0(&(0..cols).map(|_| g.float(-3.0, 6)).collect::<Vec<_>>()))
            .collect();
        let want: Vec<Vec<u32>> = acts
            .iter()
            .map(|a| rows.chunks_exact(row_bytes).map(|r| scalar::q4_0_dot(r, a).to_bits()).collect())
            .collect();
        let a: Vec<&[Q8_0Block]> = acts.iter().map(Vec::as_slice).collect();
        let pack = |r: std::ops::Range<usize>| q8_0::Packed::new(&a[r]);
        for isa in Isa::supported() {
            let got: Vec<[f32; 16]> = [
                q4_0::rows16_dot::<1>(isa, &tiles, &pack(0..1)).to_vec(),
                q4_0::rows16_dot::<3>(isa, &tiles, &pack(1..4)).to_vec(),
                q4_0::rows16_dot::<4>(isa, &tiles, &pack(4..8)).to_vec(),
            ]
            .concat();
            let eight = q4_0::rows16_dot::<8>(isa, &tiles, &pack(0..8));
            for t in 0..8 {
                let bits = |v: &[f32; 16]| v.map(f32::to_bits).to_vec();
                prop_assert_eq!(&bits(&got[t]), &want[t], "{:?}, token {}", isa, t);
                prop_assert_eq!(&bits(&eight[t]), &want[t], "{:?}, token {} of 8", isa, t);
            }
        }
    }

    /// The interleaved Q6_K kernel (sixteen rows × 1, 3, 4 or 8 tokens) equals single scalar
    /// dots bit for bit: every code, scale and sign.
    #[test]
    fn q6_k_rows16_matches_scalar(blocks in 1usize..6, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let cols = blocks * 256;
        let row_bytes = blocks * 210;
        let rows = g.q6_k_row(16 * blocks);
        let tiles = interleave_q6_k::interleave(&rows, row_bytes);
        let acts: Vec<_> = (0..8).map(|_| g.q8_k(cols)).collect();
        let want: Vec<Vec<u32>> = acts
            .iter()
            .map(|a| rows.chunks_exact(row_bytes).map(|r| scalar::q6_k_dot(r, a).to_bits()).collect())
            .collect();
        let a: Vec<&[Q8KBlock]> = acts.iter().map(Vec::as_slice).collect();
        let pack = |r: std::ops::Range<usize>| q4_k::Packed::new(&a[r]);
        for isa in Isa::supported() {
            let got: Vec<[f32; 16]> = [
                q6_k::rows16_dot::<1>(isa, &tiles, &pack(0..1)).to_vec(),
                q6_k::rows16_dot::<3>(isa, &tiles, &pack(1..4)).to_vec(),
                q6_k::rows16_dot::<4>(isa, &tiles, &pack(4..8)).to_vec(),
            ]
            .concat();
            let eight = q6_k::rows16_dot::<8>(isa, &tiles, &pack(0..8));
            for t in 0..8 {
                let bits = |v: &[f32; 16]| v.map(f32::to_bits).to_vec();
                prop_assert_eq!(&bits(&got[t]), &want[t], "{:?}, token {}", isa, t);
                prop_assert_eq!(&bits(&eight[t]), &want[t], "{:?}, token {} of 8", isa, t);
            }
        }
    }

    /// The interleaved Q4_K and Q5_K kernel (sixteen rows × 1, 3, 4 or 8 tokens) equals single
    /// scalar dots bit for bit: every code, scale, minimum and sign of d and dmin.
    #[test]
    fn q4_k_and_q5_k_rows16_match_scalar(blocks in 1usize..6, seed in any::<u64>()) {
        let mut g = Lcg(seed);
        let cols = blocks * 256;
        let acts: Vec<_> = (0..8).map(|_| g.q8_k(cols)).collect();
        let a: Vec<&[Q8KBlock]> = acts.iter().map(Vec::as_slice).collect();
        let pack = |r: std::ops::Range<usize>| q4_k::Packed::new(&a[r]);
        for five in [false, true] {
            let block_bytes = if five { 176 } else { 144 };
            let row_bytes = blocks * block_bytes;
            let rows = g.blocks(16 * blocks, block_bytes, &[0, 2]);
            let tiles = if five {
                interleave_q4_k::interleave::<true>(&rows, row_bytes)
            } else {
                interleave_q4_k::interleave::<false>(&rows, row_bytes)
            };
            let dot = if five { scalar::q5_k_dot } else { scalar::q4_k_dot };
            let want: Vec<Vec<u32>> = acts
                .iter()
                .map(|a| rows.chunks_exact(row_bytes).map(|r| dot(r, a).to_bits()).collect())
                .collect();
            for isa in Isa::supported() {
                let (got, all): (Vec<[f32; 16]>, [[f32; 16]; 8]) = if five {
                    let got = [
                        q5_k::rows16_dot::<1>(isa, &tiles, &pack(0..1)).to_vec(),
                        q5_k::rows16_dot::<3>(isa, &tiles, &pack(1..4)).to_vec(),
                        q5_k::rows16_dot::<4>(isa, &tiles, &pack(4..8)).to_vec(),
                    ];
                    (got.concat(), q5_k::rows16_dot::<8>(isa, &tiles, &pack(0..8)))
                } else {
                    let got = [
                        q4_k::rows16_dot::<1>(isa, &tiles, &pack(0..1)).to_vec(),
                        q4_k::rows16_dot::<3>(isa, &tiles, &pack(1..4)).to_vec(),
                        q4_k::rows16_dot::<4>(isa, &tiles, &pack(4..8)).to_vec(),
                    ];
                    (got.concat(), q4_k::rows16_dot::<8>(isa, &tiles, &pack(0..8)))
                };
                for t in 0..8 {
                    let bits = |v: &[f32; 16]| v.map(f32::to_bits).to_vec();
                    prop_assert_eq!(&bits(&got[t]), &want[t], "five {} {:?}, token {}", five, isa, t);
                    prop_assert_eq!(&bits(&all[t]), &want[t], "five {} {:?}, token {} of 8", five, isa, t);
                }
            }
        }
    }
}

/// The Q6_K dot means what the decoder says: Σ decode(w)·(d·q) over the Q8_K activations, up
/// to f32 rounding (the dot sums exact integers per block, the oracle sums products).
#[test]
fn q6_k_dot_agrees_with_the_decoder() {
    let mut g = Lcg(7);
    let blocks = 10;
    let w: Vec<f32> = (0..blocks * 256).map(|_| g.float(-0.5, 1)).collect();
    let row: Vec<u8> = w.chunks_exact(256).flat_map(q6_k_block).collect();
    let act = g.q8_k(blocks * 256);
    let mut decoded = [0.0f32; 256];
    let (mut want, mut scale) = (0.0f64, 0.0f64);
    for (blk, a) in row.chunks_exact(Q6_K_BLOCK_BYTES).zip(&act) {
        decode_q6_k_block(blk, &mut decoded);
        for (wv, &q) in decoded.iter().zip(&a.qs) {
            let term = f64::from(*wv) * f64::from(a.d) * f64::from(q);
            want += term;
            scale += term.abs();
        }
    }
    for isa in Isa::supported() {
        let got = f64::from(Q6K.dot(isa, &row, &act));
        assert!(
            (got - want).abs() <= 1e-6 * scale,
            "{isa:?}: {got} vs {want}"
        );
    }
}

/// The Q4_0, MXFP4, Q4_K and Q5_K dots mean what their decoders say: Σ decode(w)·(d·q), up to f32
/// rounding (the dots sum exact integers per block, the oracle sums products in f64). A dot
/// that dropped the minimums, the fifth bit or a sub-block's scale would be off by far more.
#[test]
fn q4_0_and_k_quant_dots_agree_with_their_decoders() {
    fn check<L: CpuLayout>(layout: L, row: &[u8], act: &L::Act, q: &[(f32, &[i8])]) {
        let mut decoded = vec![0.0f32; L::BLOCK];
        let (mut want, mut scale) = (0.0f64, 0.0f64);
        for (blk, &(d, qs)) in row.chunks_exact(L::BLOCK_BYTES).zip(q) {
            layout.decode_block(blk, &mut decoded);
            for (wv, &q) in decoded.iter().zip(qs) {
                let term = f64::from(*wv) * f64::from(d) * f64::from(q);
                want += term;
                scale += term.abs();
            }
        }
        for isa in Isa::supported() {
            let got = f64::from(layout.dot(isa, row, act));
            assert!(
                (got - want).abs() <= 1e-6 * scale,
                "{} {isa:?}: {got} vs {want}",
                L::NAME
            );
        }
    }
    let mut g = Lcg(11);
    let blocks = 6;
    let act = g.q8_k(blocks * 256);
    let q: Vec<(f32, &[i8])> = act.iter().map(|a| (a.d, &a.qs[..])).collect();
    check(Q4K, &g.blocks(blocks, 144, &[0, 2]), &act, &q);
    check(Q5K, &g.blocks(blocks, 176, &[0, 2]), &act, &q);
    let act = quantize_q8_0(
        &(0..blocks * 256)
            .map(|_| g.float(-10.0, 20))
            .collect::<Vec<_>>(),
    );
    let q: Vec<(f32, &[i8])> = act.iter().map(|a| (a.d, &a.qs[..])).collect();
    check(Q4_0, &g.blocks(8 * blocks, 18, &[0]), &act, &q);
    check(Mxfp4, &g.mxfp4_row(8 * blocks), &act, &q);
}
