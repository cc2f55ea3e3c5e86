//! A batch of tokens multiplies exactly like the same tokens one at a time: the prefill path
//! (token blocks, four-token kernels, row chunks across threads) only reorders work.

use hesper_cpu::{CpuBackend, CpuMatrix, Isa};
use hesper_engine::backend::{Backend, MatrixUse};
use hesper_engine::formats::{Encode, Layout, Tq1_0, Q8_0, TQ1_0_BLOCK_BYTES};
use hesper_engine::weights::{Format, MatrixDesc};

/// An I2_S matrix of `rows` × `cols` with codes in 0..=2 from a fixed generator.
fn i2s_matrix(rows: usize, cols: usize) -> CpuMatrix {
    let mut s = 7u64;
    let data: Vec<u8> = (0..rows * cols / 4)
        .map(|_| {
            (0..4).fold(0u8, |b, k| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                b | ((((s >> 33) % 3) as u8) << (2 * k))
            })
        })
        .collect();
    let desc = desc(Format::I2S { beta: 0.0421 }, rows, cols, data.len());
    CpuMatrix::owned(data, desc, None)
}

/// `n` tokens of `cols` activations from a fixed pattern.
fn activations(n: usize, cols: usize) -> Vec<f32> {
    (0..n * cols)
        .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 250.0)
        .collect()
}

/// `w` (`rows` × `cols`) times each token of `x` alone (decode's product), the outputs one
/// after another.
fn one_at_a_time(
    w: &CpuMatrix,
    isa: Isa,
    x: &[f32],
    (rows, cols): (usize, usize),
    pool: &rayon::ThreadPool,
) -> Vec<f32> {
    x.chunks_exact(cols)
        .flat_map(|xt| {
            let mut out = vec![0.0; rows];
            pool.install(|| w.matmul(isa, xt, 1, &mut out));
            out
        })
        .collect()
}

/// A pool of two threads, so that row chunks are split between them.
fn two_threads() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap()
}

#[test]
fn a_batch_equals_its_tokens_one_at_a_time() {
    // 1024 columns: 16 tokens a block, so 101 tokens span seven blocks, the last one partial
    // and not a multiple of four.
    let (rows, cols, n) = (300usize, 1024usize, 101usize);
    let w = i2s_matrix(rows, cols);
    let x = activations(n, cols);
    let pool = two_threads();
    for isa in Isa::supported() {
        let mut batched = vec![0.0; n * rows];
        pool.install(|| w.matmul(isa, &x, n, &mut batched));
        assert_eq!(
            batched,
            one_at_a_time(&w, isa, &x, (rows, cols), &pool),
            "{isa:?}"
        );
    }
}

#[test]
fn the_interleaved_copy_multiplies_like_the_file() {
    // 320 rows: twenty blocks of sixteen, split between threads; 37 tokens: four passes of
    // eight, one of four and one single token.
    let (rows, cols, n) = (320usize, 640usize, 37usize);
    let x = activations(n, cols);
    let pool = two_threads();
    let plain = i2s_matrix(rows, cols);
    let mut want = vec![0.0; n * rows];
    pool.install(|| plain.matmul(Isa::Scalar, &x, n, &mut want));
    let tiled = i2s_matrix(rows, cols).interleaved();
    for isa in Isa::supported() {
        let mut batched = vec![0.0; n * rows];
        pool.install(|| tiled.matmul(isa, &x, n, &mut batched));
        assert_eq!(batched, want, "{isa:?}, {n} tokens");
        let mut one = vec![0.0; rows];
        pool.install(|| tiled.matmul(isa, &x[..cols], 1, &mut one));
        assert_eq!(one, want[..rows], "{isa:?}, one token");
    }
}

/// F16 and Q8_0 products of a batch (four-row, four-token tiles and four-token kernels, then
/// the rows and tokens left over, row chunks across threads) equal the same tokens one at a
/// time bit for bit, on every instruction set: a token's logits do not depend on its batch.
#[test]
fn float_and_q8_0_batches_equal_their_tokens_one_at_a_time() {
    // 301 rows: the last of each thread's chunk not a whole tile; 39 tokens: blocks of four
    // and a rest of three; F16 rows of 203 columns (not a multiple of eight), Q8_0 rows of
    // seven blocks.
    let (rows, n) = (301usize, 39usize);
    let pool = two_threads();
    for (format, cols, data) in [
        (Format::F16, 203, f16_rows(rows, 203)),
        (Format::Q8_0, 224, q8_0_rows(rows, 224)),
    ] {
        let x = activations(n, cols);
        let desc = desc(format, rows, cols, data.len());
        let w = CpuMatrix::owned(data, desc, None);
        for isa in Isa::supported() {
            let mut batched = vec![0.0; n * rows];
            pool.install(|| w.matmul(isa, &x, n, &mut batched));
            let mut single = vec![0.0; n * rows];
            for (t, xt) in x.chunks_exact(cols).enumerate() {
                pool.install(|| w.matmul(isa, xt, 1, &mut single[t * rows..(t + 1) * rows]));
            }
            assert_eq!(batched, single, "{format:?} {isa:?}");
        }
    }
}

/// A batch over the interleaved F16 copy (AVX-VNNI's groups of twelve tokens in two passes of
/// six, the other instruction sets' groups of eight, then four, then one; row chunks across
/// threads) equals the scalar kernel over the file's rows bit for bit, and so does each token alone.
#[test]
fn an_interleaved_f16_batch_equals_the_scalar_products() {
    // 320 rows: twenty blocks of sixteen; 41 tokens: 3 × 12 + 4 + 1 on AVX-VNNI, 5 × 8 + 1
    // elsewhere; 203 columns: not a multiple of the kernels' stretch.
    let (rows, cols, n) = (320usize, 203usize, 41usize);
    let pool = two_threads();
    let x = activations(n, cols);
    let data = f16_rows(rows, cols);
    let desc = desc(Format::F16, rows, cols, data.len());
    let plain = CpuMatrix::owned(data.clone(), desc.clone(), None);
    let mut want = vec![0.0; n * rows];
    pool.install(|| plain.matmul(Isa::Scalar, &x, n, &mut want));
    let tiled = CpuMatrix::owned(data, desc, None).interleaved();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for isa in Isa::supported() {
        let mut batched = vec![0.0; n * rows];
        pool.install(|| tiled.matmul(isa, &x, n, &mut batched));
        assert_eq!(bits(&batched), bits(&want), "{isa:?}: batch");
        let single = one_at_a_time(&tiled, isa, &x, (rows, cols), &pool);
        assert_eq!(bits(&single), bits(&want), "{isa:?}: one at a time");
    }
}

/// The description of a `rows` × `cols` matrix of `format` held in `len` bytes.
fn desc(format: Format, rows: usize, cols: usize, len: usize) -> MatrixDesc {
    MatrixDesc {
        name: "w".into(),
        rows,
        cols,
        format,
        range: 0..len,
    }
}

/// Rows of F16 weights in [-1, 1).
fn f16_rows(rows: usize, cols: usize) -> Vec<u8> {
    activations(rows, cols)
        .iter()
        .flat_map(|&v| half::f16::from_f32(v / 4.0).to_le_bytes())
        .collect()
}

/// Rows of Q8_0 blocks of values in [-4, 4).
fn q8_0_rows(rows: usize, cols: usize) -> Vec<u8> {
    let values = activations(rows, cols);
    let mut data = vec![0; values.len() / Q8_0::BLOCK * Q8_0::BLOCK_BYTES];
    for (b, out) in values
        .chunks_exact(Q8_0::BLOCK)
        .zip(data.chunks_exact_mut(Q8_0::BLOCK_BYTES))
    {
        Q8_0::encode_block(b, out);
    }
    data
}

/// Rows of random Q4_0, MXFP4, Q4_K, Q5_K or Q6_K blocks with small scales of either sign
/// (every code, sub-block scale and minimum; MXFP4's exponents 2^-8 to 2^-5), from a fixed
/// generator.
fn block_rows(format: Format, rows: usize, cols: usize) -> Vec<u8> {
    let (block, bytes, halves): (usize, usize, &[usize]) = match format {
        Format::Q4_0 => (32, 18, &[0]),
        Format::MXFP4 => (32, 17, &[]),
        Format::Q4K => (256, 144, &[0, 2]),
        Format::Q5K => (256, 176, &[0, 2]),
        _ => (256, 210, &[208]),
    };
    let mut s = 11u64;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let mut data: Vec<u8> = (0..rows * cols / block * bytes)
        .map(|_| next() as u8)
        .collect();
    for blk in data.chunks_exact_mut(bytes) {
        if format == Format::MXFP4 {
            blk[0] = 120 + (next() % 4) as u8;
        }
        for &at in halves {
            let d = half::f16::from_f32((next() % 200) as f32 / 10000.0 - 0.01);
            blk[at..at + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    data
}

/// Q4_0, MXFP4 and K-quant products of a batch (four-row and four-token kernels, the
/// interleaved copies, row chunks across threads) equal the same tokens one at a time bit for
/// bit, and the scalar kernels' results, on every instruction set.
#[test]
fn q4_0_mxfp4_and_k_quant_batches_equal_their_tokens_one_at_a_time() {
    // 320 rows: twenty blocks of sixteen; 37 tokens: four-token kernels, then a rest of one,
    // and the interleaved kernel's passes of eight, four and one.
    let (rows, cols, n) = (320usize, 512usize, 37usize);
    let pool = two_threads();
    let x = activations(n, cols);
    for format in [
        Format::Q4_0,
        Format::MXFP4,
        Format::Q4K,
        Format::Q5K,
        Format::Q6K,
    ] {
        let data = block_rows(format, rows, cols);
        let desc = desc(format, rows, cols, data.len());
        let plain = CpuMatrix::owned(data.clone(), desc.clone(), None);
        let mut want = vec![0.0; n * rows];
        pool.install(|| plain.matmul(Isa::Scalar, &x, n, &mut want));
        let tiled = CpuMatrix::owned(data, desc, None).interleaved();
        for w in [&plain, &tiled] {
            for isa in Isa::supported() {
                let mut batched = vec![0.0; n * rows];
                pool.install(|| w.matmul(isa, &x, n, &mut batched));
                let mut single = vec![0.0; n * rows];
                for (t, xt) in x.chunks_exact(cols).enumerate() {
                    pool.install(|| w.matmul(isa, xt, 1, &mut single[t * rows..(t + 1) * rows]));
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&batched), bits(&want), "{format:?} {isa:?}: batch");
                assert_eq!(
                    bits(&single),
                    bits(&want),
                    "{format:?} {isa:?}: one at a time"
                );
            }
        }
    }
}

/// An F16 embedding table is repacked only when it is also the LM head (a tied head, multiplied
/// every step); either way its rows come back as the file holds them, and the tied head's
/// products are the scalar kernel's.
#[test]
fn an_f16_embedding_is_repacked_only_as_a_tied_head() {
    let (rows, cols) = (64usize, 256usize);
    let data = f16_rows(rows, cols);
    let desc = MatrixDesc {
        name: "token_embd.weight".into(),
        rows,
        cols,
        format: Format::F16,
        range: 0..data.len(),
    };
    let x = activations(3, cols);
    let tokens = [0u32, 17, 63];
    for isa in Isa::supported() {
        let backend = CpuBackend::with_isa(1, isa).expect("cpu");
        let load = |usage| {
            backend
                .load_owned_matrix(desc.clone(), data.clone(), None, usage)
                .expect("load")
        };
        let (table, head) = (load(MatrixUse::Embedding), load(MatrixUse::TiedHead));
        assert!(!table.is_interleaved(), "{isa:?}");
        assert_eq!(head.is_interleaved(), isa.interleaves_f16(), "{isa:?}");
        let (mut from_table, mut from_head) = (vec![0.0; 3 * cols], vec![0.0; 3 * cols]);
        backend.embed(&table, &tokens, &mut from_table);
        backend.embed(&head, &tokens, &mut from_head);
        assert_eq!(from_table, from_head, "{isa:?}: embedding rows");
        assert!(from_table.iter().any(|&v| v != 0.0));
        // The copy's kernels sum each row in column order, as the scalar kernel does (the
        // file layout's SIMD dot sums eight lanes apart).
        let reference = if head.is_interleaved() {
            Isa::Scalar
        } else {
            isa
        };
        let (mut want, mut got) = (vec![0.0; 3 * rows], vec![0.0; 3 * rows]);
        table.matmul(reference, &x, 3, &mut want);
        head.matmul(isa, &x, 3, &mut got);
        assert_eq!(got, want, "{isa:?}: products");
    }
}

/// A TQ1_0 matrix is rewritten as TQ2_0 at load where the instruction set's kernels read TQ2_0
/// faster (not as an embedding table only looked up, nor with repacking off): its rows decode
/// as the file holds them and its products are the TQ1_0 kernels' to the bit, for a token and
/// for a batch.
#[test]
fn a_tq1_0_matrix_is_rewritten_as_tq2_0_with_the_same_products() {
    // 22 rows: five groups of four rows (decode's kernel) and two rows left over.
    let (rows, cols) = (22usize, 512usize);
    let values: Vec<f32> = activations(rows, cols)
        .iter()
        .enumerate()
        .map(|(i, &v)| v.signum() * if (i / 7) % 3 == 0 { 0.0 } else { 0.25 })
        .collect();
    let mut data = vec![0u8; rows * cols / 256 * TQ1_0_BLOCK_BYTES];
    for (v, b) in values
        .chunks_exact(256)
        .zip(data.chunks_exact_mut(TQ1_0_BLOCK_BYTES))
    {
        Tq1_0::encode_block(v, b);
    }
    let desc = desc(Format::TQ1_0, rows, cols, data.len());
    let as_stored = CpuMatrix::owned(data.clone(), desc.clone(), None);
    let pool = two_threads();
    for isa in Isa::supported() {
        for repack in [true, false] {
            let backend = CpuBackend::with_isa(1, isa)
                .expect("cpu")
                .with_repack(repack);
            let load = |usage| {
                backend
                    .load_owned_matrix(desc.clone(), data.clone(), None, usage)
                    .expect("load")
            };
            let (w, table) = (load(MatrixUse::Product), load(MatrixUse::Embedding));
            let rewritten = repack && isa.rewrites_tq1_0();
            let want_format = if rewritten {
                Format::TQ2_0
            } else {
                Format::TQ1_0
            };
            assert_eq!(w.desc.format, want_format, "{isa:?}, repack {repack}");
            assert_eq!(table.desc.format, Format::TQ1_0, "{isa:?}: a table");
            let (mut row, mut stored) = (vec![0.0; cols], vec![0.0; cols]);
            for r in [0, 7, rows - 1] {
                w.decode_row(r, &mut row);
                as_stored.decode_row(r, &mut stored);
                assert_eq!(row, stored, "{isa:?}: row {r}");
            }
            for n in [1, 5] {
                let x = activations(n, cols);
                let (mut want, mut got) = (vec![0.0; n * rows], vec![0.0; n * rows]);
                pool.install(|| as_stored.matmul(isa, &x, n, &mut want));
                pool.install(|| w.matmul(isa, &x, n, &mut got));
                assert_eq!(got, want, "{isa:?}, {n} tokens");
                assert!(got.iter().any(|&v| v != 0.0));
            }
        }
    }
}

/// Bytes handed over (a streamed load: the ring's nodes, the page) are interleaved at load
/// wherever a matrix of the file would be, so those loads run the same kernels at the same
/// speed: every layout the instruction set repacks.
#[test]
fn a_matrix_handed_over_is_repacked_as_one_in_a_file() {
    let (rows, cols) = (320usize, 512usize);
    for isa in Isa::supported() {
        let backend = CpuBackend::with_isa(1, isa).expect("cpu");
        for (format, data, repacked) in [
            (Format::Q8_0, q8_0_rows(rows, cols), isa.interleaves_q8_0()),
            (Format::F16, f16_rows(rows, cols), isa.interleaves_f16()),
            (
                Format::Q4_0,
                block_rows(Format::Q4_0, rows, cols),
                isa.interleaves_q4_0(),
            ),
            (
                Format::MXFP4,
                block_rows(Format::MXFP4, rows, cols),
                isa.interleaves_mxfp4(),
            ),
            (
                Format::Q4K,
                block_rows(Format::Q4K, rows, cols),
                isa.interleaves_q4_k(),
            ),
            (
                Format::Q5K,
                block_rows(Format::Q5K, rows, cols),
                isa.interleaves_q4_k(),
            ),
            (
                Format::Q6K,
                block_rows(Format::Q6K, rows, cols),
                isa.interleaves_q6_k(),
            ),
        ] {
            let desc = desc(format, rows, cols, data.len());
            let w = backend
                .load_owned_matrix(desc, data, None, MatrixUse::Product)
                .expect("load");
            assert_eq!(w.is_interleaved(), repacked, "{format:?} on {isa:?}");
        }
    }
}

#[test]
fn an_f16_matrix_multiplies_any_count_of_tokens_like_one_at_a_time() {
    // An F16 LM head kept as the file stores it (a tied embedding table): one to nine tokens,
    // so tiles of four, the two or three left over (the tile with a token repeated) and a
    // single one left over all meet the decode kernel's values.
    let (rows, cols) = (68usize, 200usize);
    let data: Vec<u8> = activations(rows, cols)
        .iter()
        .flat_map(|&v| half::f16::from_f32(v * 0.1).to_le_bytes())
        .collect();
    let desc = MatrixDesc {
        name: "head".into(),
        rows,
        cols,
        format: Format::F16,
        range: 0..data.len(),
    };
    let w = CpuMatrix::owned(data, desc, None);
    let pool = two_threads();
    for isa in Isa::supported() {
        for n in 1..=9 {
            let x = activations(n, cols);
            let mut batched = vec![0.0; n * rows];
            pool.install(|| w.matmul(isa, &x, n, &mut batched));
            let single = one_at_a_time(&w, isa, &x, (rows, cols), &pool);
            assert_eq!(batched, single, "{isa:?}, {n} tokens");
        }
    }
}
