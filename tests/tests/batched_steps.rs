//! Batched steps (a server's continuous batching, `Model::step`): several sessions' prompts in
//! chunks beside each other's decoding give each session the logits it gets alone, bit for bit,
//! on the CPU (every instruction set, every golden layout and family) and on the GPU: every
//! kernel sums a row in an order that does not depend on the rows beside it (on the GPU
//! whichever instance, decode or wide-step, the step's size chose), so a request's answer does
//! not depend on the others a server runs with it. Split over layer ranges, as a
//! ring's nodes run it (`Model::step_rows`: tokens in, hidden states across, predictions out),
//! the same batched steps give the same logits again, and each readout is its row's.

use hesper_cpu::Isa;
use hesper_engine::backend::Backend;
use hesper_engine::model::{
    Logits, Model, Prediction, Readout, SeqRows, SeqStep, Session, StepInput, StepOutput,
};
use hesper_engine::sampler::{argmax, top_candidates};
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

/// The steps of [`alone_and_batched`] (its prompts' last logits, then each decode token's)
/// run across two instances, `a` holding the first layers and `b` the rest and the head, each
/// session with a cache in each: every row read out as logits, and each row's argmax and top 5
/// as the last node reads them out checked against the row.
fn split_batched<B: Backend>(a: &Model<B>, b: &Model<B>, g: &Golden) -> Vec<Vec<f32>> {
    let prompts: Vec<&[u32]> = (0..3)
        .map(|i| g.sequences[i % g.sequences.len()].tokens.as_slice())
        .map(|t| &t[..t.len().min(9)])
        .collect();
    let mut sa: Vec<_> = (0..3).map(|_| a.new_session(32, 1).expect("a")).collect();
    let mut sb: Vec<_> = (0..3).map(|_| b.new_session(32, 1).expect("b")).collect();
    let (mut xa, mut xb) = (
        a.new_batch_scratch(16, 3).expect("scratch"),
        b.new_batch_scratch(16, 3).expect("scratch"),
    );
    let mut out = vec![Vec::new(); 3];
    let (mut done, mut decoded) = ([0usize; 3], [0usize; 3]);
    while decoded.iter().any(|&d| d < DECODE.len()) {
        let mut which = Vec::new();
        let mut tokens = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            let n = if done[i] < p.len() {
                let n = if i == 2 {
                    p.len()
                } else {
                    3.min(p.len() - done[i])
                };
                tokens.extend_from_slice(&p[done[i]..done[i] + n]);
                done[i] += n;
                n
            } else if decoded[i] < DECODE.len() {
                tokens.push(DECODE[decoded[i]]);
                decoded[i] += 1;
                1
            } else {
                continue;
            };
            which.push((i, n, done[i] == p.len()));
        }
        let hidden = match a
            .step_rows(
                &mut xa,
                &mut rows(&mut sa, &which, Readout::Logits),
                StepInput::Tokens(&tokens),
            )
            .expect("node a")
        {
            StepOutput::Hidden(h) => h,
            other => panic!("node a ran the head: {other:?}"),
        };
        let mut first = Vec::new();
        for readout in [Readout::Logits, Readout::Argmax, Readout::Top(5)] {
            // Every readout from the same positions: the caches are rewound to them.
            let mut seqs = rows(&mut sb, &which, readout);
            for (s, &(i, n, _)) in seqs.iter_mut().zip(&which) {
                s.pos0 = sa[i].pos() - n;
            }
            let got = match b
                .step_rows(&mut xb, &mut seqs, StepInput::Hidden(&hidden))
                .expect("node b")
            {
                StepOutput::Predictions(p) => p,
                other => panic!("node b handed on hidden states: {other:?}"),
            };
            if readout == Readout::Logits {
                first = got;
                continue;
            }
            for (p, l) in got.iter().zip(&first) {
                let (Some(p), Some(Prediction::Logits(row))) = (p, l) else {
                    assert_eq!((p.is_some(), l.is_some()), (false, false));
                    continue;
                };
                let want = match readout {
                    Readout::Argmax => Prediction::Token(argmax(row.iter().copied())),
                    _ => Prediction::Top(top_candidates(row, 5)),
                };
                assert_eq!(p, &want, "{readout:?}");
            }
        }
        for (&(i, _, _), p) in which.iter().zip(first) {
            if let Some(Prediction::Logits(row)) = p {
                out[i].push(row);
            }
        }
    }
    out.into_iter().flatten().collect()
}

/// The rows of sessions `(index, rows, whether the last is read out)` from `sessions`, each
/// from its session's position, read out as `readout`.
fn rows<'s, B: Backend>(
    sessions: &'s mut [Session<B>],
    which: &[(usize, usize, bool)],
    readout: Readout,
) -> Vec<SeqRows<'s, B>> {
    let mut rest: Vec<_> = sessions.iter_mut().map(Some).collect();
    which
        .iter()
        .map(|&(i, n, wants)| {
            let session = rest[i].take().expect("once");
            SeqRows {
                pos0: session.pos(),
                n,
                readout: wants.then_some(readout),
                session,
            }
        })
        .collect()
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
fn batched_steps_split_over_layer_ranges_give_each_session_its_logits_alone() {
    for stem in ALL.iter().chain(FAMILIES) {
        let g = Golden::load(stem);
        let whole = cpu_model(&g.file(), Isa::detect(), None);
        let [alone, _] = alone_and_batched(&whole, &g);
        for k in [1, g.n_layer - 1] {
            let a = cpu_model(&g.file(), Isa::detect(), Some(0..k));
            let b = cpu_model(&g.file(), Isa::detect(), Some(k..g.n_layer));
            let split = split_batched(&a, &b, &g);
            assert_identical(&alone, &split, &format!("{stem} split at {k}"));
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
        // Head norms in attention's one kernel (decoded rows) or before it (longer steps),
        // F16 products whose halves attention leaves.
        "tiny-qwen3-f16",
    ] {
        let g = Golden::load(stem);
        let model = gpu_model(&g.file(), None);
        let [alone, batched] = alone_and_batched(&model, &g);
        assert_identical(&alone, &batched, stem);
        // Steps of one to four rows ran the matrix kernels' decode instances and longer ones
        // their wide-step instances, so a row met both ways and kept its bits.
        let launched = model.backend.product_launches();
        let wide = launched.keys().filter(|k| k.ends_with("_wide")).count();
        assert!(
            wide > 0 && wide < launched.len(),
            "{stem}: both instances ran: {launched:?}"
        );
    }
}
