//! CPU backend (scalar reference and SIMD) against the golden values.
//!
//! Tolerances and why:
//! * F32 weights (no activation quantization): only f32 summation order differs from
//!   llama.cpp (max |logit| ≈ 17, 256-wide sums: ~1e-5 expected) → max |Δlogit| ≤ 1e-3 and the
//!   same argmax at every position (the bound).
//! * Quantized activations (TQ + Q8_K vs llama.cpp, I2_S + per-token int8 vs our float64
//!   reference): rounding to int8 is discontinuous — a 1e-7 difference can move one code by a
//!   step, and that grows through later layers — so each layer is checked with teacher forcing
//!   (the reference's own input of the layer) at ≤ 1e-4, and end to end with cosine ≥ 0.999 at
//!   every position and the same argmax on ≥ 90 % of positions.

use hesper_engine::model::Logits;
use hesper_tests::{argmax, cosine, cpu_model, isas, max_abs_diff, Golden, ALL};

/// Our end-to-end logits for every sequence of `g`.
fn end_to_end(g: &Golden, isa: hesper_cpu::Isa) -> Vec<Vec<f32>> {
    let file = g.file();
    let model = cpu_model(&file, isa, None);
    g.sequences
        .iter()
        .map(|s| {
            let mut session = model.new_session(s.tokens.len(), 64).expect("session");
            model
                .eval(&mut session, &s.tokens, Logits::All)
                .expect("eval")
        })
        .collect()
}

#[test]
fn float_weights_match_llama_cpp_tightly() {
    for stem in ["tiny-f32", "tiny-f32-scale"] {
        let g = Golden::load(stem);
        assert_eq!(g.act_quant, "none");
        for isa in isas() {
            for (s, ours) in g.sequences.iter().zip(end_to_end(&g, isa)) {
                let d = max_abs_diff(&ours, &s.logits);
                println!("{stem} {isa:?} n={} max|Δlogit| = {d:.3e}", s.tokens.len());
                assert!(d <= 1e-3, "{stem} {isa:?}: max |Δlogit| {d} > 1e-3");
                for (i, (a, b)) in ours
                    .chunks(g.n_vocab)
                    .zip(s.logits.chunks(g.n_vocab))
                    .enumerate()
                {
                    assert_eq!(
                        argmax(a),
                        argmax(b),
                        "{stem} {isa:?}: argmax differs at position {i}"
                    );
                }
            }
        }
    }
}

#[test]
fn quantized_models_match_end_to_end() {
    for stem in ["tiny-tq2_0", "tiny-tq1_0", "tiny-tq2_0-f16emb", "tiny-i2s"] {
        let g = Golden::load(stem);
        assert_ne!(g.act_quant, "none");
        for isa in isas() {
            let (mut same, mut total) = (0, 0);
            let mut worst_cos = 1.0f64;
            let mut worst_abs = 0.0f32;
            for (s, ours) in g.sequences.iter().zip(end_to_end(&g, isa)) {
                worst_abs = worst_abs.max(max_abs_diff(&ours, &s.logits));
                for (a, b) in ours.chunks(g.n_vocab).zip(s.logits.chunks(g.n_vocab)) {
                    worst_cos = worst_cos.min(cosine(a, b));
                    same += usize::from(argmax(a) == argmax(b));
                    total += 1;
                }
            }
            println!("{stem} {isa:?}: max|Δlogit| {worst_abs:.3e}, min cosine {worst_cos:.6}, argmax {same}/{total}");
            assert!(
                worst_cos >= 0.999,
                "{stem} {isa:?}: cosine {worst_cos} < 0.999"
            );
            assert!(
                same * 10 >= total * 9,
                "{stem} {isa:?}: argmax agrees on only {same}/{total} positions"
            );
        }
    }
}

#[test]
fn every_layer_matches_with_teacher_forcing() {
    for stem in ALL {
        let g = Golden::load(stem);
        let file = g.file();
        let d = g.n_embd;
        for isa in isas() {
            let mut worst = 0.0f32;
            for s in &g.sequences {
                let n = s.tokens.len();
                let layer_out = |l: usize| &s.hidden[l * n * d..(l + 1) * n * d];
                for l in 0..g.n_layer {
                    let model = cpu_model(&file, isa, Some(l..l + 1));
                    let mut session = model.new_session(n, 64).expect("session");
                    let input = if l == 0 {
                        let first = cpu_model(&file, isa, Some(0..1));
                        let mut es = first.new_session(n, 64).expect("session");
                        first.embed(&mut es, &s.tokens).expect("embed")
                    } else {
                        layer_out(l - 1).to_vec()
                    };
                    let ours = model.forward_hidden(&mut session, &input).expect("forward");
                    let mut flipped = 0;
                    for (t, (a, b)) in ours.chunks(d).zip(layer_out(l).chunks(d)).enumerate() {
                        let diff = max_abs_diff(a, b);
                        if diff <= 1e-4 {
                            worst = worst.max(diff);
                            continue;
                        }
                        // A row beyond 1e-4 is only accepted as one int8 code flip inside the
                        // layer (activation-quantized files): at most one such row per layer
                        // and sequence, still nearly parallel to the reference.
                        flipped += 1;
                        let c = cosine(a, b);
                        println!("{stem} {isa:?} layer {l} n={n} token {t}: max |Δ| {diff:.3e}, cosine {c:.7} (quantization flip)");
                        assert!(g.act_quant != "none", "{stem} {isa:?} layer {l} token {t}: max |Δ| {diff} > 1e-4 without activation quantization");
                        assert!(
                            c >= 0.9999,
                            "{stem} {isa:?} layer {l} token {t}: cosine {c}"
                        );
                    }
                    assert!(
                        flipped <= 1,
                        "{stem} {isa:?} layer {l} (n={n}): {flipped} rows beyond 1e-4"
                    );
                }
                // The head alone, fed the reference's last hidden state.
                let head = cpu_model(&file, isa, Some(g.n_layer - 1..g.n_layer));
                let mut hs = head.new_session(n, 64).expect("session");
                let logits = head
                    .logits_from_hidden(&mut hs, layer_out(g.n_layer - 1))
                    .expect("head");
                let diff = max_abs_diff(&logits, &s.logits);
                // Like llama.cpp and bitnet.cpp we round the head's input to f16 for an F16 head.
                // llama.cpp's goldens do the same, so only summation order differs (1e-4 of
                // |logit| ≤ 17). Our float64 reference (tiny-i2s) does not round: there the
                // bound is the f16 step 2^-11 times Σ|x·w| ≈ 20 for these rows (≈ 1e-2).
                let f16_head = file
                    .header()
                    .tensor("token_embd.weight")
                    .is_some_and(|t| t.ty == hesper_engine::gguf::GgmlType::F16);
                let bound = if f16_head && g.act_quant == "per_token_i8" {
                    1e-2
                } else {
                    1e-4 * 17.0
                };
                assert!(
                    diff <= bound,
                    "{stem} {isa:?} LM head: max |Δlogit| {diff} > {bound}"
                );
            }
            println!("{stem} {isa:?}: worst teacher-forced layer max|Δ| {worst:.3e}");
        }
    }
}

#[test]
fn cached_decode_equals_prefill() {
    for stem in ALL {
        let g = Golden::load(stem);
        let file = g.file();
        let model = cpu_model(&file, hesper_cpu::Isa::detect(), None);
        let s = g.sequences.last().expect("a sequence");
        let n = s.tokens.len();
        let mut full = model.new_session(n, 64).expect("session");
        let prefill = model
            .eval(&mut full, &s.tokens, Logits::All)
            .expect("prefill");
        // Feed the prompt in uneven pieces, then one token at a time.
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
            assert_eq!(
                argmax(a),
                argmax(b),
                "{stem}: argmax differs at position {i}"
            );
        }
    }
}
