//! A model split by layer ranges — what ring nodes run — computes exactly what the whole model
//! computes: node A embeds and runs `[0, k)`, node B runs `[k, n)` and the head, both with their
//! own KV caches, over a prompt and then token-by-token decode.

use hesper_cpu::Isa;
use hesper_engine::model::Logits;
use hesper_tests::{cpu_model, Golden, ALL};

#[test]
fn split_models_equal_the_whole_model_bit_for_bit() {
    for stem in ALL {
        let g = Golden::load(stem);
        let file = g.file();
        let s = g.sequences.last().expect("a sequence");
        let (prompt, rest) = s.tokens.split_at(s.tokens.len() / 2);
        let n_ctx = s.tokens.len();

        let whole = cpu_model(&file, Isa::detect(), None);
        let mut ws = whole.new_session(n_ctx, 8).expect("session");
        let mut expected = whole.eval(&mut ws, prompt, Logits::All).expect("prefill");
        for &t in rest {
            expected.extend(whole.eval(&mut ws, &[t], Logits::Last).expect("decode"));
        }

        for k in 1..g.n_layer {
            let a = cpu_model(&file, Isa::detect(), Some(0..k));
            let b = cpu_model(&file, Isa::detect(), Some(k..g.n_layer));
            let (mut sa, mut sb) = (
                a.new_session(n_ctx, 8).expect("a"),
                b.new_session(n_ctx, 8).expect("b"),
            );
            let mut step = |tokens: &[u32], all: bool| {
                let x = a.embed(&mut sa, tokens).expect("embed");
                let h = a.forward_hidden(&mut sa, &x).expect("node a");
                let h = b.forward_hidden(&mut sb, &h).expect("node b");
                let rows = if all {
                    h
                } else {
                    h[h.len() - g.n_embd..].to_vec()
                };
                b.logits_from_hidden(&mut sb, &rows).expect("head")
            };
            let mut got = step(prompt, true);
            for &t in rest {
                got.extend(step(&[t], false));
            }
            assert_eq!(got.len(), expected.len());
            let same = got
                .iter()
                .zip(&expected)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "{stem}: split at layer {k} differs from the whole model"
            );
        }
    }
}
