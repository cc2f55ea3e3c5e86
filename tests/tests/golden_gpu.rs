//! The WebGPU backend (Mesa lavapipe in CI; no adapter is a failure) against the same golden
//! values and tolerances as the CPU backend, and against the CPU backend itself.
//!
//! Tolerances are those of `golden_cpu.rs` and for the same reasons (f32 summation order for
//! float weights; discontinuous int8 rounding for quantized activations). GPU vs CPU on the
//! same file differs by summation order (tree reductions vs sequential sums) and WGSL's
//! 2.5-ulp division in the activation scales, which can move an int8 code by one step — so
//! float files must agree to 1e-3 and quantized files to cosine ≥ 0.999.

use hesper_engine::model::Logits;
use hesper_gpu_backend::{GpuBackend, MatrixCores};
use hesper_tests::layers::check_layers;
use hesper_tests::ops::run_ops;
use hesper_tests::{argmax, cosine, cpu_model, gpu_model, max_abs_diff, Golden, ALL, TINY_BOUND};

fn logits_all<B: hesper_engine::backend::Backend>(
    model: &hesper_engine::model::Model<B>,
    tokens: &[u32],
    batch: usize,
) -> Vec<f32> {
    let mut session = model.new_session(tokens.len(), batch).expect("session");
    model.eval(&mut session, tokens, Logits::All).expect("eval")
}

#[test]
fn gpu_matches_the_golden_values() {
    for stem in ALL {
        let g = Golden::load(stem);
        let model = gpu_model(&g.file(), None);
        let agreement = g.agreement(
            g.sequences
                .iter()
                .map(|s| logits_all(&model, &s.tokens, 64)),
        );
        println!("{stem} gpu: {agreement}");
        if g.act_quant == "none" {
            assert!(agreement.max_abs <= 1e-3, "{stem}: {agreement}");
            assert_eq!(
                agreement.same_argmax, agreement.positions,
                "{stem}: {agreement}"
            );
        } else {
            assert!(agreement.within(TINY_BOUND), "{stem}: {agreement}");
        }
    }
}

#[test]
fn gpu_matches_the_cpu_backend() {
    for stem in ALL {
        let g = Golden::load(stem);
        let file = g.file();
        let gpu = gpu_model(&file, None);
        let cpu = cpu_model(&file, hesper_cpu::Isa::Scalar, None);
        let s = g.sequences.last().expect("a sequence");
        let (a, b) = (
            logits_all(&gpu, &s.tokens, 64),
            logits_all(&cpu, &s.tokens, 64),
        );
        let d = max_abs_diff(&a, &b);
        let c = a
            .chunks(g.n_vocab)
            .zip(b.chunks(g.n_vocab))
            .map(|(x, y)| cosine(x, y))
            .fold(1.0, f64::min);
        println!("{stem} gpu vs cpu: max|Δlogit| {d:.3e}, min cosine {c:.7}");
        if g.act_quant == "none" {
            assert!(d <= 1e-3, "{stem}: max |Δlogit| {d}");
        } else {
            assert!(c >= 0.999, "{stem}: cosine {c}");
        }
    }
}

#[test]
fn gpu_cached_decode_equals_prefill() {
    for stem in ALL {
        let g = Golden::load(stem);
        let model = gpu_model(&g.file(), None);
        let s = g.sequences.last().expect("a sequence");
        let n = s.tokens.len();
        let prefill = logits_all(&model, &s.tokens, 64);
        // Uneven prefill pieces (batch 3), then one token at a time.
        let mut cached = model.new_session(n, 3).expect("session");
        let split = n / 2;
        let mut got = model
            .eval(&mut cached, &s.tokens[..split], Logits::All)
            .expect("first half");
        for &t in &s.tokens[split..] {
            got.extend(model.eval(&mut cached, &[t], Logits::Last).expect("decode"));
        }
        for (i, (a, b)) in got
            .chunks(g.n_vocab)
            .zip(prefill.chunks(g.n_vocab))
            .enumerate()
        {
            let c = cosine(a, b);
            assert!(c >= 0.9999, "{stem}: position {i} cosine {c}");
            assert_eq!(argmax(a), argmax(b), "{stem}: argmax differs at {i}");
        }
    }
}

/// A prompt of more than a tile of tokens ([`hesper_gpu_backend::GEMM_STEP`]) read in one step
/// runs the tiled kernels (on `dot4I8Packed`: `bitlinear_tq_gemm` for TQ, `matvec_kq_gemm` for
/// the K-quants, `matvec_q8_0_gemm` for Q8_0 and Q4_0; on any adapter `matvec_f16_gemm`,
/// `matvec_bf16_gemm` and `matvec_f32_gemm` for the float layouts) for every projection; read
/// four tokens a step, the matrix-vector kernels' decode instances. TQ1_0 (rewritten as TQ2_0
/// at load), TQ2_0, Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0, F16, BF16 and F32 files, Llama's,
/// Mistral's and Qwen2's graphs: every position's logits the same bits either way, so a
/// server's request gets the same tokens whatever its batch-mates.
#[test]
fn gpu_prompt_in_tiled_products_equals_decoding_it() {
    // Tiled launches of the prompt: Q/K/V, output, gate/up and down of each of the 2 layers (in
    // the _K_M mixtures one layer's V is Q6_K beside Q4_K/Q5_K Q and K, so a product of its own
    // beside theirs), and the LM head where it is the file's type (every position's logits are
    // asked for, so all rows; Q4_0's head is Q6_K).
    for (stem, kernel, launched) in [
        ("tiny-llama-tq1_0", "bitlinear_tq_gemm", 2 * 4),
        ("tiny-qwen2-tq2_0", "bitlinear_tq_gemm", 2 * 4),
        ("tiny-llama-q4_k_m", "matvec_kq_gemm", 2 * 4 + 1 + 1),
        ("tiny-llama-q5_k_m", "matvec_kq_gemm", 2 * 4 + 1 + 1),
        ("tiny-llama-q6_k", "matvec_kq_gemm", 2 * 4 + 1),
        ("tiny-llama-q8_0", "matvec_q8_0_gemm", 2 * 4 + 1),
        ("tiny-llama-q4_0", "matvec_q8_0_gemm", 2 * 4),
        ("tiny-llama-f16", "matvec_f16_gemm", 2 * 4 + 1),
        ("tiny-llama-bf16", "matvec_bf16_gemm", 2 * 4 + 1),
        ("tiny-mistral-f32", "matvec_f32_gemm", 2 * 4 + 1),
    ] {
        let g = Golden::load(stem);
        let model = gpu_model(&g.file(), None);
        assert!(model.backend.packed_dot(), "lavapipe has dot4I8Packed");
        let tokens = tiled_prompt(&g);
        let n = tokens.len();
        let before = launches(&model.backend, kernel);
        let tiled = logits_all(&model, &tokens, n);
        assert_eq!(
            launches(&model.backend, kernel) - before,
            launched,
            "{stem}: tiled launches"
        );
        let decoded = logits_all(&model, &tokens, hesper_gpu_backend::TOKEN_TILE as usize);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(&tiled) == bits(&decoded),
            "{stem}: max|Δ| {}",
            max_abs_diff(&tiled, &decoded)
        );
    }
}

/// The Q8_0, Q4_K_M and TQ1_0 files' prompts on the matrix-core kernels' stand-ins (the tile
/// walks a device's matrix cores run, written out where lavapipe runs them; Q4_0 and MXFP4 run
/// as Q8_0, TQ1_0 as TQ2_0): every projection (and the LM head, where it is the file's type)
/// launches them, and every position's logits are the portable tiled kernels' bits (which are
/// the decode kernels', above).
#[test]
fn gpu_prompt_on_the_matrix_core_stand_in_equals_the_tiled_products() {
    for (stem, stand_in, tiled, launched) in [
        (
            "tiny-llama-q8_0",
            "matvec_q8_0_coop_stand_in",
            "matvec_q8_0_gemm",
            2 * 4 + 1,
        ),
        // Q4_K beside one layer's Q6_K V (a product of its own) and the head.
        (
            "tiny-llama-q4_k_m",
            "matvec_kq_coop_stand_in",
            "matvec_kq_gemm",
            2 * 4 + 1 + 1,
        ),
        (
            "tiny-llama-tq1_0",
            "bitlinear_tq_coop_stand_in",
            "bitlinear_tq_gemm",
            2 * 4,
        ),
    ] {
        let g = Golden::load(stem);
        let model = gpu_model(&g.file(), None);
        let tokens = tiled_prompt(&g);
        let mut logits = Vec::new();
        for (cores, kernel) in [(MatrixCores::StandIn, stand_in), (MatrixCores::Off, tiled)] {
            assert_eq!(model.backend.set_matrix_cores(cores), cores);
            let before = launches(&model.backend, kernel);
            logits.push(logits_all(&model, &tokens, tokens.len()));
            assert_eq!(
                launches(&model.backend, kernel) - before,
                launched,
                "{stem}: {kernel} launches"
            );
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(&logits[0]) == bits(&logits[1]),
            "{stem}: max|Δ| {}",
            max_abs_diff(&logits[0], &logits[1])
        );
    }
}

/// A prompt of [`hesper_gpu_backend::GEMM_STEP`] + 37 tokens of `g`'s vocabulary: more than a
/// tile, not a multiple of one.
fn tiled_prompt(g: &Golden) -> Vec<u32> {
    let n = hesper_gpu_backend::GEMM_STEP + 37;
    (0..n).map(|i| (i * 37 + 11) % g.n_vocab as u32).collect()
}

/// Launches of the product kernel `kernel` so far.
fn launches(backend: &GpuBackend, kernel: &str) -> u64 {
    backend.product_launches().get(kernel).copied().unwrap_or(0)
}

#[test]
fn both_i2s_paths_match_the_cpu() {
    // The packed (dot4I8Packed) and plain I2_S kernels compute the same exact integer sums:
    // switching paths must not change the logits beyond the float order of the other ops.
    let g = Golden::load("tiny-i2s");
    let file = g.file();
    let cpu = cpu_model(&file, hesper_cpu::Isa::Scalar, None);
    let s = g.sequences.last().expect("a sequence");
    let want = logits_all(&cpu, &s.tokens, 64);
    let gpu = gpu_model(&file, None);
    let mut results = Vec::new();
    for packed in [false, true] {
        let used = gpu.backend.set_packed_dot(packed);
        let got = logits_all(&gpu, &s.tokens, 64);
        let d = max_abs_diff(&got, &want);
        println!("tiny-i2s gpu (packed dot {used}) vs cpu: max|Δlogit| {d:.3e}");
        assert!(d <= 1e-3, "packed dot {used}: max |Δlogit| {d}");
        results.push((used, got));
    }
    // lavapipe (CI) has the packed dot product, so both paths really ran.
    assert!(results[1].0, "no packed dot product on this adapter");
    assert_eq!(results[0].1, results[1].1, "the two paths differ");
}

#[test]
fn every_gpu_layer_matches_with_teacher_forcing() {
    // The bounds of `hesper_tests::layers`, as on the CPU.
    for stem in ALL {
        let g = Golden::load(stem);
        let file = g.file();
        let worst = check_layers(&g, "gpu", |r| gpu_model(&file, Some(r)));
        println!("{stem} gpu: worst teacher-forced layer max|Δ| {worst:.3e}");
    }
}

#[test]
fn every_gpu_op_matches_the_reference() {
    // The bound of `hesper_tests::ops`, as on the CPU: each op is fed the reference's input.
    let backend = hesper_gpu_backend::GpuBackend::new().unwrap_or_else(|e| panic!("{e}"));
    for stem in ALL {
        let worst = run_ops(&backend, stem);
        println!("{stem} gpu: worst op |Δ|/scale = {worst:.2e}");
    }
}
