//! Layer-by-layer teacher forcing, for any backend: each layer is loaded alone and fed the
//! reference's own input of that layer (its embedding for layer 0, the reference's residual
//! stream after the previous layer otherwise), and its output compared with the reference's;
//! then the LM head alone is fed the reference's last hidden state.
//!
//! Bounds and why (f16-rounded inputs: [`F16_FLIP`]): without activation quantization only f32
//! summation order differs, so
//! every row is within 1e-4. With quantized activations, rounding to int8 is discontinuous — a
//! 1e-7 difference can move one code by a step inside the layer — so a few rows per layer and
//! sequence may exceed 1e-4 if they stay nearly parallel (cosine ≥ 0.9999): one row per 16384
//! values of the layer's output (`n_tokens · n_embd`), at least one, since the chance of a flip
//! grows with the number of codes quantized. Measured: at most one such row per layer on the
//! tiny models (≤ 33 × 256), two in a layer of 16 × 2560 (the 2B4T geometry, GPU). A wrong
//! activation scheme moves every row. The head: like
//! llama.cpp we round the head's input to f16 for an F16 head, and its goldens do the same, so
//! only summation order differs (1e-4 of |logit| ≤ 17); our float64 reference and bitnet.cpp
//! do not round (`UNROUNDED_HEAD_REFERENCES`), so there the bound is the f16 step 2^-11 times
//! Σ|x·w| ≈ 20 for these rows (≈ 1e-2). A quantized head's input may flip as a layer's does,
//! under the same rule (tokens for rows).

use std::ops::Range;

use hesper_engine::backend::Backend;
use hesper_engine::gguf::GgmlType;
use hesper_engine::model::Model;

use crate::{cosine, max_abs_diff, Golden, UNROUNDED_HEAD_REFERENCES};

/// How far a row of a layer may move, relative to its largest value, when the inputs of F16
/// products round to f16 (llama.cpp and hesper-rs both do): an input that lands on the other
/// side of an f16 rounding boundary moves by one f16 step (2⁻¹¹ of its size) times its weight.
/// Many inputs do (rows of 256 values, a 1e-7 difference before the rounding), so any number of
/// rows may move, each at most this far and nearly parallel (cosine ≥ 0.99999): measured at most
/// 2.0e-4 of the row's largest value (1.0e-3 at 5, 2.6e-3 at 14). A wrong graph moves rows by
/// whole units.
pub const F16_FLIP: f32 = 5e-4;

/// [`F16_FLIP`] for the inputs of BF16 products, which round to bf16 (8 significant bits where
/// f16 keeps 11): one step is 8 times as far. Measured (`tiny-llama-bf16`, llama.cpp's file):
/// at most 4.2e-3 on rows whose largest value is above 1, cosine ≥ 0.9999995.
pub const BF16_FLIP: f32 = 8.0 * F16_FLIP;

/// Runs the check on every sequence of `g` that has hidden states; `load(range)` loads those layers of `g`'s model on
/// the backend under test. `label` names the backend in messages. Returns the worst row
/// difference within the 1e-4 bound.
pub fn check_layers<B: Backend>(
    g: &Golden,
    label: &str,
    load: impl Fn(Range<usize>) -> Model<B>,
) -> f32 {
    check_layers_with(g, label, 0.9999, load)
}

/// [`check_layers`] with rows that a quantization flip moved held to cosine ≥ `flip_cosine`
/// (instead of 0.9999): for a model whose un-normalized activations let one flip cascade
/// into others inside the same layer (its test says what an exact computation reaches).
pub fn check_layers_with<B: Backend>(
    g: &Golden,
    label: &str,
    flip_cosine: f64,
    load: impl Fn(Range<usize>) -> Model<B>,
) -> f32 {
    let stem = g.model.file_stem().and_then(|s| s.to_str()).unwrap_or("?");
    let d = g.n_embd;
    let f16_head = g
        .file()
        .header()
        .tensor("token_embd.weight")
        .is_some_and(|t| t.ty == GgmlType::F16);
    // Some products take Q8_0 activations (a scale per 32 values) even where most take Q8_K's
    // (a Q4_K_M mixture's Q8_0 `attn_k` and `attn_v`): flips are counted at Q8_0's rate.
    let q8_0_inputs = g.act_quant == "q8_0"
        || (g.act_quant == "q8_k"
            && g.file()
                .header()
                .tensors()
                .iter()
                .any(|t| matches!(t.ty, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::MXFP4)));
    let mut worst = 0.0f32;
    for s in g.sequences.iter().filter(|s| !s.hidden.is_empty()) {
        let n = s.tokens.len();
        let layer_out = |l: usize| &s.hidden[l * n * d..(l + 1) * n * d];
        for l in 0..g.n_layer {
            let model = load(l..l + 1);
            let mut session = model.new_session(n, 64).expect("session");
            let input = if l == 0 {
                model.embed(&mut session, &s.tokens).expect("embed")
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
                flipped += 1;
                let c = cosine(a, b);
                println!("{stem} {label} layer {l} n={n} token {t}: max |Δ| {diff:.3e}, cosine {c:.7} (quantization flip)");
                assert!(g.act_quant != "none", "{stem} {label} layer {l} token {t}: max |Δ| {diff} > 1e-4 without activation quantization");
                let size = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                let float_flip = match g.act_quant.as_str() {
                    "f16" => Some(F16_FLIP),
                    "bf16" => Some(BF16_FLIP),
                    _ => None,
                };
                assert!(
                    float_flip.is_none_or(|flip| diff <= flip * size && c >= 0.99999),
                    "{stem} {label} layer {l} token {t}: max |Δ| {diff}, cosine {c}: more than {} steps of the input move", g.act_quant
                );
                assert!(
                    c >= flip_cosine,
                    "{stem} {label} layer {l} token {t}: cosine {c}"
                );
            }
            // f16 and bf16 rounding flip many inputs by a step too small to exceed the bound; Q8_0
            // computes a scale per 32 values, eight times as many as Q8_K's 256 (and per-token
            // int8's rows), each a place where an inexact division (WGSL's is 2.5 ulp) moves a code.
            let allowed = match g.act_quant.as_str() {
                "f16" | "bf16" => n,
                _ if q8_0_inputs => (n * d / 2048).max(1),
                _ => (n * d / 16384).max(1),
            };
            assert!(
                flipped <= allowed,
                "{stem} {label} layer {l} (n={n}): {flipped} rows beyond 1e-4 (allowed {allowed})"
            );
        }
        let head = load(g.n_layer - 1..g.n_layer);
        let mut hs = head.new_session(n, 64).expect("session");
        let logits = head
            .logits_from_hidden(&mut hs, layer_out(g.n_layer - 1))
            .expect("head");
        let unrounded = UNROUNDED_HEAD_REFERENCES
            .iter()
            .any(|r| g.reference.starts_with(r));
        let bound = if f16_head && unrounded {
            1e-2
        } else {
            1e-4 * 17.0
        };
        // A quantized head's input may flip a code as a layer's may (the GPU's Q8_0 scale
        // goes through WGSL's 2.5-ulp division): as many tokens as a layer of the same size
        // may move, each nearly parallel.
        let vocab = logits.len() / n;
        let mut flipped = 0;
        for (t, (a, b)) in logits.chunks(vocab).zip(s.logits.chunks(vocab)).enumerate() {
            let diff = max_abs_diff(a, b);
            if diff <= bound {
                continue;
            }
            flipped += 1;
            let c = cosine(a, b);
            println!("{stem} {label} LM head token {t}: max |Δlogit| {diff:.3e}, cosine {c:.7} (quantization flip)");
            assert!(
                g.act_quant != "none" && c >= 0.99999,
                "{stem} {label} LM head token {t}: max |Δlogit| {diff} > {bound}, cosine {c}"
            );
        }
        let allowed = match g.act_quant.as_str() {
            "none" => 0,
            _ if q8_0_inputs => (n * d / 2048).max(1),
            _ => (n * d / 16384).max(1),
        };
        assert!(
            flipped <= allowed,
            "{stem} {label} LM head: {flipped} tokens beyond {bound} (allowed {allowed})"
        );
    }
    worst
}
