//! Quality cost of `--lm-head q8_0` (the LM head re-quantized to Q8_0 at load) against the
//! exact head, on every golden sequence: KL divergence of the next-token distributions and
//! top-1 agreement. The figures are printed (and recorded in BENCHMARKS.md).
//!
//! Expected size: like ggml, a Q8_0 matrix multiplies Q8_0-quantized activations, so both the
//! weights (step amax/127 ≈ 0.006 for these std-0.25 embeddings) and the normalised hidden
//! state (step ≈ 3/127) are rounded. Over 256-wide rows that moves each logit by a noise of
//! std ≈ 0.04, and the KL of the next-token distribution by ≈ ½·0.04² ≈ 8e-4. Bounds: max KL
//! < 5e-3 and top-1 agreement ≥ 95 %; a wrong layout or scale gives KL > 1.

use hesper_engine::model::{HeadFormat, LoadOptions, Logits};
use hesper_tests::{argmax, cpu_model_with, Golden, ALL};

fn log_softmax(l: &[f32]) -> Vec<f64> {
    let max = l.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = l.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    l.iter().map(|&v| v as f64 - lse).collect()
}

#[test]
fn q8_0_head_costs_little_and_is_measured() {
    for stem in ALL {
        let g = Golden::load(stem);
        let file = g.file();
        let isa = hesper_cpu::Isa::detect();
        let exact = cpu_model_with(&file, isa, LoadOptions::default());
        let q8 = cpu_model_with(
            &file,
            isa,
            LoadOptions {
                head: HeadFormat::Q8_0,
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
            let (a, b) = (run(&exact), run(&q8));
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
        println!("{stem}: lm-head q8_0 vs exact: mean KL {kl_mean:.2e}, max KL {kl_max:.2e}, top-1 {same}/{total}");
        assert!(kl_max < 5e-3, "{stem}: max KL {kl_max}");
        assert!(
            same * 100 >= total * 95,
            "{stem}: top-1 agreement {same}/{total}"
        );
    }
}
