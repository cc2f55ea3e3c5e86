//! Batched steps (a server's continuous batching, `Model::step`): several sessions' prompts in
//! chunks beside each other's decoding give each session the logits it gets alone, bit for bit,
//! on the CPU (every instruction set, every golden layout and family) and on the GPU: every
//! kernel sums a row in an order that does not depend on the rows beside it, so a request's
//! answer does not depend on the others a server runs with it.

use hesper_engine::backend::Backend;
use hesper_engine::model::{Logits, Model, SeqStep};
use hesper_tests::{cpu_model, gpu_model, isas, max_abs_diff, Golden, ALL, FAMILIES, QUANTS};

/// Decode tokens fed to every session after its prompt.
const DECODE: [u32; 3] = [5, 9, 2];

/// Three prompts from the golden's sequences: each prompt's last logits, then each decode
/// token's, alone (one session after another) and batched (all three sessions per step, the
/// first two prompts in chunks of 3, the third whole), as `[alone, batched]`.
fn alone_and_batched<B: Backend>(model: &Model<B>, g: &Golden) -> [Vec<Vec<f32>>; 2] {
    let n = model.sampled_vocab();
    let prompts: Vec<&[u32]> = (0..3)
        .map(|i| g.sequences[i % g.sequences.len()].tokens.as_slice())
        .map(|t| &t[..t.len().min(9)])
        .collect();
    let mut alone = Vec::new();
    for p in &prompts {
        let mut s = model.new_session(32, 32).expect("session");
        alone.push(model.eval(&mut s, p, Logits::Last).expect("eval")[..n].to_vec());
        for t in DECODE {
            alone.push(model.eval(&mut s, &[t], Logits::Last).expect("eval")[..n].to_vec());
        }
    }
    let mut sessions: Vec<_> = (0..3)
        .map(|_| model.new_session(32, 1).expect("session"))
        .collect();
    let mut scratch = model.new_batch_scratch(16, 3).expect("scratch");
    let mut batched = vec![Vec::new(); 3];
    let mut done = [0usize; 3];
    let mut decoded = [0usize; 3];
    while decoded.iter().any(|&d| d < DECODE.len()) {
        let mut steps = Vec::new();
        for (i, s) in sessions.iter_mut().enumerate() {
            let p = prompts[i];
            let tokens = if done[i] < p.len() {
                let n = if i == 2 {
                    p.len()
                } else {
                    3.min(p.len() - done[i])
                };
                done[i] += n;
                &p[done[i] - n..done[i]]
            } else if decoded[i] < DECODE.len() {
                decoded[i] += 1;
                &DECODE[decoded[i] - 1..decoded[i]]
            } else {
                continue;
            };
            let logits = done[i] == p.len();
            steps.push((
                i,
                SeqStep {
                    session: s,
                    tokens,
                    logits,
                },
            ));
        }
        let (which, mut steps): (Vec<usize>, Vec<_>) = steps.into_iter().unzip();
        let rows = model.step(&mut scratch, &mut steps).expect("step");
        for (i, r) in which.into_iter().zip(rows) {
            batched[i].extend(r);
        }
    }
    [alone, batched.into_iter().flatten().collect()]
}

/// Asserts that every row of `batched` equals the same row of `alone` bit for bit.
fn assert_identical(alone: &[Vec<f32>], batched: &[Vec<f32>], what: &str) {
    assert_eq!(alone.len(), batched.len(), "{what}");
    for (a, b) in alone.iter().zip(batched) {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what}: batched logits differ from alone by up to {}",
            max_abs_diff(a, b)
        );
    }
}

#[test]
fn cpu_batched_steps_give_each_session_its_logits_alone() {
    for stem in ALL.iter().chain(FAMILIES).chain(QUANTS) {
        let g = Golden::load(stem);
        for isa in isas() {
            let model = cpu_model(&g.file(), isa, None);
            let [alone, batched] = alone_and_batched(&model, &g);
            assert_identical(&alone, &batched, &format!("{stem} {isa:?}"));
        }
    }
}

#[test]
fn gpu_batched_steps_give_each_session_its_logits_alone() {
    for stem in [
        "tiny-i2s",
        "tiny-tq2_0",
        "tiny-llama-q4_k_m",
        "tiny-qwen2-f16",
    ] {
        let g = Golden::load(stem);
        let model = gpu_model(&g.file(), None);
        let [alone, batched] = alone_and_batched(&model, &g);
        assert_identical(&alone, &batched, stem);
    }
}
