//! Quality cost of `--lm-head q8_0` and `--lm-head q6_k` (the LM head re-quantized at load)
//! against the exact head, on every golden sequence: KL divergence of the next-token
//! distributions and top-1 agreement. The figures are printed (and recorded in BENCHMARKS.md).
//!
//! Expected sizes. Q8_0: like ggml, a Q8_0 matrix multiplies Q8_0-quantized activations, so
//! both the weights (step amax/127 ≈ 0.006 for these std-0.25 embeddings) and the normalised
//! hidden state (step ≈ 3/127) are rounded. Over 256-wide rows that moves each logit by a
//! noise of std ≈ 0.04, and the KL of the next-token distribution by ≈ ½·0.04² ≈ 8e-4.
//! Q6_K: 6-bit weights with a scale per 16 values (step ≈ max of 16 values / 32 ≈ 0.016, so a
//! rounding noise of std ≈ 0.0045 per weight) times Q8_K activations (as Q8_0): each logit
//! moves by ≈ √(256)·0.0045·|h| ≈ 0.07 plus the activation part, a KL of ≈ ½·0.08² ≈ 3e-3.
//! Bounds at about 6× those estimates: max KL < 5e-3 (Q8_0) and < 2e-2 (Q6_K), top-1
//! agreement ≥ 95 % and ≥ 90 %; a wrong layout or scale gives KL > 1.

use hesper_engine::model::{HeadFormat, LoadOptions, Logits};
use hesper_tests::{argmax, cpu_model_with, Golden, ALL};

fn log_softmax(l: &[f32]) -> Vec<f64> {
    let max = l.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = l.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    l.iter().map(|&v| v as f64 - lse).collect()
}

/// Runs every golden sequence with the exact head and with `head`; checks the bounds and
/// prints the figures.
fn head_costs_little(head: HeadFormat, max_kl: f64, min_top1_percent: usize) {
    for stem in ALL {
        let g = Golden::load(stem);
        let file = g.file();
        let isa = hesper_cpu::Isa::detect();
        let exact = cpu_model_with(&file, isa, LoadOptions::default());
        let quant = cpu_model_with(
            &file,
            isa,
            LoadOptions {
                head,
                ..Default::default()
            },
        );
        let (mut kl_sum, mut kl_max, mut same, mut total) = (0.0f64, 0.0f64, 0usize, 0usize);
        for s in &g.sequences {
            let n = s.tokens.len();
            let run = |m: &hesper_engine::model::Model<hesper_cpu::CpuBackend>| {
                let mut session = m.new_session(n, 64).expect("session");
                m.eval(&mut session, &s.tokens, Logits::All).expect("eval")
            };
            let (a, b) = (run(&exact), run(&quant));
            for (p, q) in a.chunks(g.n_vocab).zip(b.chunks(g.n_vocab)) {
                let (lp, lq) = (log_softmax(p), log_softmax(q));
                let kl: f64 = lp.iter().zip(&lq).map(|(x, y)| x.exp() * (x - y)).sum();
                kl_sum += kl;
                kl_max = kl_max.max(kl);
                same += usize::from(argmax(p) == argmax(q));
                total += 1;
            }
        }
        let kl_mean = kl_sum / total as f64;
        println!("{stem}: lm-head {head:?} vs exact: mean KL {kl_mean:.2e}, max KL {kl_max:.2e}, top-1 {same}/{total}");
        assert!(kl_max < max_kl, "{stem}: max KL {kl_max}");
        assert!(
            same * 100 >= total * min_top1_percent,
            "{stem}: top-1 agreement {same}/{total}"
        );
    }
}

#[test]
fn q8_0_head_costs_little_and_is_measured() {
    head_costs_little(HeadFormat::Q8_0, 5e-3, 95);
}

#[test]
fn q6_k_head_costs_little_and_is_measured() {
    head_costs_little(HeadFormat::Q6K, 2e-2, 90);
}
