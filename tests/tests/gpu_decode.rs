//! Decoding on the WebGPU backend: the shipped demo model generates the same greedy tokens on
//! the GPU as on the CPU, a step submitted in parts while it is recorded (the same logits as
//! in one submit, a mixture's too), every pipeline, bind group and buffer reused from the first token on, and a
//! model split into layer ranges (a ring's GPU nodes) equals the whole.

use std::path::PathBuf;
use std::sync::Arc;

use hesper_engine::backend::Backend;
use hesper_engine::file::ModelFile;
use hesper_engine::model::{Logits, Model};
use hesper_gpu_backend::FLUSH_DISPATCHES;
use hesper_tests::{cosine, cpu_model, gpu_model, Golden};

fn shipped_model() -> Arc<ModelFile> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/hesper-tiny.gguf");
    ModelFile::open(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// `n` greedy tokens after `prompt`, decoded one at a time.
fn greedy<B: Backend>(model: &Model<B>, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = model.new_session(prompt.len() + n, 8).expect("session");
    let mut next = model.eval_greedy(&mut s, prompt).expect("prefill");
    let mut out = vec![next];
    while out.len() < n {
        next = model.eval_greedy(&mut s, &[next]).expect("decode");
        out.push(next);
    }
    out
}

#[test]
fn gpu_and_cpu_generate_the_same_64_greedy_tokens() {
    let file = shipped_model();
    let prompt = [1u32, 9038, 2501, 263, 931];
    let cpu = greedy(
        &cpu_model(&file, hesper_cpu::Isa::Scalar, None),
        &prompt,
        64,
    );
    let gpu = greedy(&gpu_model(&file, None), &prompt, 64);
    assert_eq!(gpu, cpu);
}

#[test]
fn nothing_is_created_after_the_first_token() {
    let file = shipped_model();
    let model = gpu_model(&file, None);
    let mut s = model.new_session(32, 8).expect("session");
    let mut next = model.eval_greedy(&mut s, &[1, 2, 3]).expect("prefill");
    // The first token of each kind (argmax and logits read back) sets everything up.
    next = model.eval_greedy(&mut s, &[next]).expect("first token");
    model
        .eval(&mut s, &[next], Logits::Last)
        .expect("first logits");
    let before = model.backend.stats();
    let steps = 5;
    for _ in 0..steps {
        next = model.eval_greedy(&mut s, &[next]).expect("decode");
    }
    // Logits read back are one submit too.
    model.eval(&mut s, &[next], Logits::Last).expect("decode");
    let after = model.backend.stats();
    let per_step =
        1 + (after.dispatches - before.dispatches) / (steps + 1) / FLUSH_DISPATCHES as u64;
    assert_eq!(
        after.submits - before.submits,
        (steps + 1) * per_step,
        "queue submits"
    );
    assert_eq!(
        after.cache.misses, before.cache.misses,
        "pipelines compiled after the first token"
    );
    assert!(after.cache.hits > before.cache.hits);
    assert_eq!(
        after.bind_groups, before.bind_groups,
        "bind groups created after the first token"
    );
    assert_eq!(
        after.buffers, before.buffers,
        "buffers created after the first token"
    );
    println!(
        "created so far: {} buffers, {} bind groups",
        after.buffers, after.bind_groups
    );
    let per_token = (after.dispatches - before.dispatches) / (steps + 1);
    println!("{per_token} dispatches per token");
    // A token whose logits are read back: the embedding's row decoded on the host (a copy,
    // the table is Q8_0); per layer 9 dispatches (RMSNorm with the activation quantization
    // after it four times, one product of the joined Q, K and V, RoPE of Q and K with the
    // cache write and attention in one, the output, gate/up and down products); the LM head's
    // two (the output norm with its Q8_0 quantizer, the product of the tied table).
    let d0 = model.backend.stats().dispatches;
    model.eval(&mut s, &[next], Logits::Last).expect("decode");
    let n_layer = model.config.n_layer as u64;
    assert_eq!(
        model.backend.stats().dispatches - d0,
        9 * n_layer + 2,
        "dispatches of a token"
    );
}

#[test]
fn a_decoded_layer_launches_what_its_family_needs() {
    // A decoded token's layers alone (what `bench --backend gpu` counts a layer): BF16 7
    // (its products round their input), F16 and the Q8_0 family 8 (attention leaves the
    // halves or blocks its output projection reads), the K-quants, TQ and BitNet 9 (a Q8_K
    // block or an I2_S scale spans heads of 64 or 128, so attention's output is quantized
    // apart).
    let launched = |stem: &str| {
        let g = Golden::load(stem);
        let model = gpu_model(&g.file(), None);
        let mut s = model.new_session(1, 1).expect("session");
        let x = model.embed(&mut s, &[1]).expect("embed");
        let d0 = model.backend.stats().dispatches;
        model.forward_hidden(&mut s, &x).expect("layers");
        (model.backend.stats().dispatches - d0, g.n_layer as u64)
    };
    let cases = [
        ("tiny-llama-bf16", 7),
        ("tiny-qwen3-f16", 8),
        ("tiny-llama-q8_0", 8),
        ("tiny-llama-q4_0", 8),
        ("tiny-llama-q6_k", 9),
        ("tiny-tq2_0", 9),
        // A mixture's FFN, whatever its count of experts: the norm (quantizing for the
        // experts), the router's product and routing, one launch a stacked matrix whose rows
        // each pick their expert (gate and up joined, with the activation; down, its input
        // quantized), and the weighted sum added to the residual — 7 beside F16 attention's 4;
        // more where the file mixes layouts that quantize apart (Qwen3-MoE's Q4_K_M) or the
        // family adds biases (gpt-oss: its router's, and the experts' gate and up apart, their
        // biases added with the activation, down's with the sum).
        ("tiny-qwen3moe-f16", 11),
        ("tiny-qwen3moe-q4_k_m", 15),
        ("tiny-gpt-oss-mxfp4", 16),
    ];
    for (stem, per_layer) in cases {
        let (n, layers) = launched(stem);
        assert_eq!(n, per_layer * layers, "{stem}: dispatches");
    }
    // Heads of 256 (Falcon3's) are one Q8_K block each: attention leaves the blocks a K-quant
    // output projection reads, 8 a layer (9 in layer 1, whose Q6_K V is a product apart).
    assert_eq!(
        launched("tiny-falcon3-q4_k_m"),
        (8 + 9, 2),
        "tiny-falcon3-q4_k_m"
    );
}

#[test]
fn gpu_layer_ranges_chain_to_the_whole_model() {
    let g = Golden::load("tiny-i2s");
    let file = g.file();
    let s = g.sequences.last().expect("a sequence");
    let n = s.tokens.len();
    let whole = gpu_model(&file, None);
    let mut ws = whole.new_session(n, 64).expect("session");
    let want = whole.eval(&mut ws, &s.tokens, Logits::All).expect("eval");
    let first = gpu_model(&file, Some(0..1));
    let last = gpu_model(&file, Some(1..g.n_layer));
    let (mut fs, mut ls) = (
        first.new_session(n, 64).expect("session"),
        last.new_session(n, 64).expect("session"),
    );
    let x = first.embed(&mut fs, &s.tokens).expect("embed");
    let h = first.forward_hidden(&mut fs, &x).expect("layer 0");
    let h = last.forward_hidden(&mut ls, &h).expect("layers 1..");
    let got = last.logits_from_hidden(&mut ls, &h).expect("head");
    // The same kernels on the same data in the same order: identical, not just close.
    assert_eq!(got.len(), want.len());
    let c = cosine(&got, &want);
    assert!(got == want, "split differs from whole (cosine {c})");
}

#[test]
fn timestamp_queries_time_every_kernel_of_a_token() {
    let file = shipped_model();
    let model = gpu_model(&file, None);
    let mut s = model.new_session(8, 8).expect("session");
    let first = model.eval_greedy(&mut s, &[1, 2]).expect("prefill");
    // lavapipe (CI) and every desktop GPU driver offer TIMESTAMP_QUERY.
    assert!(model.backend.set_profiling(true), "no TIMESTAMP_QUERY");
    let before = model.backend.stats();
    model.eval_greedy(&mut s, &[first]).expect("decode");
    let dispatches = model.backend.stats().dispatches - before.dispatches;
    let times = model.backend.kernel_times();
    model.backend.set_profiling(false);
    let calls: u64 = times.iter().map(|k| k.calls).sum();
    assert_eq!(calls, dispatches, "every dispatch timed once");
    let names: Vec<&str> = times.iter().map(|k| k.name).collect();
    let (bitlinear, head) = if model.backend.packed_dot() {
        ("bitlinear_i2s_dp4", "matvec_q8_0_dp4")
    } else {
        ("bitlinear_i2s", "matvec_q8_0")
    };
    // The output norm, fused with the Q8_0 LM head's quantizer where there are subgroups.
    let norm = if model.backend.uses_subgroups() {
        "rms_norm_quantize_q8_0_sg"
    } else {
        "rms_norm"
    };
    for k in [bitlinear, "rope_attention", norm, head, "argmax_final"] {
        assert!(names.contains(&k), "{k} missing from {names:?}");
    }
    assert!(times.iter().all(|k| k.ns >= 0.0) && times.iter().any(|k| k.ns > 0.0));
}

#[test]
fn gpu_top_k_equals_the_top_of_the_logits_it_would_read_back() {
    // Sampling with top-k reads back only the k candidates (ids and values, 8·k bytes): they
    // must be exactly the k largest logits of the same step, in the CPU sampler's order.
    let file = shipped_model();
    let gpu = gpu_model(&file, None);
    let prompt = [1u32, 9038, 2501, 263, 931];
    for k in [1, 40] {
        let mut a = gpu.new_session(prompt.len() + 1, 8).expect("session");
        let mut b = gpu.new_session(prompt.len() + 1, 8).expect("session");
        let row = gpu.eval(&mut a, &prompt, Logits::Last).expect("logits");
        let top = pollster::block_on(gpu.eval_top_k_async(&mut b, &prompt, k)).expect("top-k");
        assert_eq!(
            top,
            hesper_engine::sampler::top_candidates(&row, k),
            "k = {k}"
        );
        // And the next step (the top-k read overwrote the logits buffer) is unaffected.
        let next = top[0].0;
        let row2 = gpu.eval(&mut a, &[next], Logits::Last).expect("logits");
        let top2 = pollster::block_on(gpu.eval_top_k_async(&mut b, &[next], k)).expect("top-k");
        assert_eq!(
            top2,
            hesper_engine::sampler::top_candidates(&row2, k),
            "k = {k}, step 2"
        );
    }
}

/// A mixture's decoded tokens reuse its buffers from layer to layer and token to token: after
/// the first tokens nothing is created (each product of the stacked experts reads its rows'
/// experts from the router's ids on the GPU; no grid is written for a layer).
#[test]
fn a_mixture_creates_nothing_after_the_first_tokens() {
    let file = Golden::load("tiny-qwen3moe-f16").file();
    let model = gpu_model(&file, None);
    let mut s = model.new_session(32, 8).expect("session");
    let mut next = model
        .eval_greedy(&mut s, &[1, 5, 9, 14, 2])
        .expect("prefill");
    for _ in 0..2 {
        next = model.eval_greedy(&mut s, &[next]).expect("first tokens");
    }
    let before = model.backend.stats();
    for _ in 0..4 {
        next = model.eval_greedy(&mut s, &[next]).expect("decode");
    }
    let after = model.backend.stats();
    assert_eq!(after.buffers - before.buffers, 0, "buffers created");
    assert_eq!(
        after.bind_groups - before.bind_groups,
        0,
        "bind groups created"
    );
}

/// Logits of a step submitted every `flush` dispatches against those of one submit, bit for bit.
fn assert_same_bits(parts: &[f32], whole: &[f32], flush: usize) {
    assert!(
        parts
            .iter()
            .map(|v| v.to_bits())
            .eq(whole.iter().map(|v| v.to_bits())),
        "submitted every {flush} dispatches, the logits differ"
    );
}

/// A mixture submitted in parts gives the logits of one submit, wherever a part ends: a prompt
/// routed on the GPU as the page routes it (each expert's launches behind a gate whose grids the
/// host writes after recording them, the layer's input quantized once for every expert), then
/// tokens decoded by id.
#[test]
fn a_mixture_submitted_in_parts_gives_the_logits_of_one_submit() {
    let file = Golden::load("tiny-qwen3moe-f16").file();
    // Eight rows choosing 2 of 8 experts each: more choices than experts, so not by id.
    let prompt = [1u32, 5, 9, 14, 2, 7, 3, 8];
    let run = |flush: usize| {
        let model = gpu_model(&file, None);
        model.backend.set_experts_routed_on_gpu(true);
        model.backend.set_flush_dispatches(flush);
        let mut s = model.new_session(16, 8).expect("session");
        let mut logits = model.eval(&mut s, &prompt, Logits::All).expect("prefill");
        for token in [3u32, 7, 11] {
            logits.extend(model.eval(&mut s, &[token], Logits::Last).expect("decode"));
        }
        logits
    };
    let whole = run(usize::MAX);
    for flush in 1..=4 {
        let parts = run(flush);
        assert_same_bits(&parts, &whole, flush);
    }
}

#[test]
fn a_step_submitted_in_parts_gives_the_logits_of_one_submit() {
    let file = shipped_model();
    let prompt = [1u32, 9038, 2501, 263, 931];
    let run = |flush: usize| {
        let model = gpu_model(&file, None);
        model.backend.set_flush_dispatches(flush);
        let mut s = model.new_session(16, 8).expect("session");
        let mut logits = model.eval(&mut s, &prompt, Logits::All).expect("prefill");
        let mut submits = Vec::new();
        let mut next = 0;
        for _ in 0..4 {
            let at = model.backend.stats();
            next = model.eval_greedy(&mut s, &[next]).expect("decode");
            let now = model.backend.stats();
            submits.push((now.submits - at.submits, now.dispatches - at.dispatches));
        }
        logits.extend(model.eval(&mut s, &[next], Logits::Last).expect("decode"));
        (logits, submits)
    };
    let (whole, whole_submits) = run(usize::MAX);
    assert!(
        whole_submits.iter().all(|&(s, _)| s == 1),
        "{whole_submits:?}"
    );
    for flush in [1, 5, 8] {
        let (parts, submits) = run(flush);
        for &(s, d) in &submits {
            // A part ends after the first op that brings it to `flush` dispatches.
            assert!(s >= 2, "{d} dispatches in {s} submit");
            assert!(s <= 1 + d / flush as u64, "{d} dispatches in {s} submits");
        }
        assert_same_bits(&parts, &whole, flush);
    }
}

#[test]
fn a_load_does_not_keep_the_weights_it_replaced() {
    // Each layer's gate and up are interleaved into a new matrix by a kernel at load; the
    // bind group of that launch holds the two originals, so it must go with the next loads'
    // batches, not live until the first tokens (every layer's FFN weights twice over).
    let model = gpu_model(&shipped_model(), None);
    let held = model.backend.stats().bind_groups_held;
    assert!(
        held < model.config.n_layer,
        "{held} bind groups held after loading {} layers",
        model.config.n_layer
    );
}
