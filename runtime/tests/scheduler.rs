//! The continuous-batching scheduler on the built-in trained model (CPU): a sequence's tokens
//! do not depend on what runs beside it, a shared prefix is reused bit for bit, a client that
//! goes away frees its sequence, a full queue refuses, a sequence waits for room in the KV
//! pool, hidden states (embeddings) are computed between steps, and the slots show what runs.

use std::sync::atomic::Ordering;

use hesper_engine::attention::AttentionConfig;
use hesper_engine::model::{vector_source, Logits, SeqStep};
use hesper_engine::sampler::SamplerConfig;
use hesper_engine::tokenizer::Tokenizer;
use hesper_runtime::scheduler::{
    self, Finish, Job, JobEvent, SchedulerConfig, SubmitError, Submitter,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

mod common;
use common::kjv;

const PROMPTS: [&str; 8] = [
    "In the beginning",
    "And it came to pass, when the king heard the words of the book of the law",
    "The LORD is my shepherd",
    "Then answered Jesus and said unto them",
    "And God said",
    "Blessed are the poor in spirit: for theirs is the kingdom of heaven. Blessed are they that mourn",
    "Hear, O Israel",
    "And the earth was without form, and void",
];

/// Runs a scheduler over `model` on a thread of its own while `f` submits jobs.
fn with_scheduler<R>(config: SchedulerConfig, queue: usize, f: impl FnOnce(&Submitter) -> R) -> R {
    let (model, tok) = kjv();
    let (submitter, jobs) = scheduler::queue(queue);
    let gauges = submitter.gauges().clone();
    std::thread::scope(|s| {
        s.spawn(|| scheduler::run(&model, &tok, &config, jobs, &gauges).expect("scheduler"));
        let r = f(&submitter);
        drop(submitter);
        r
    })
}

fn config(parallel: usize, batch: usize) -> SchedulerConfig {
    SchedulerConfig {
        n_ctx: 256,
        parallel,
        batch,
        keep_idle: parallel,
        kv_pool: None,
        attention: AttentionConfig::default(),
    }
}

fn job(
    tok: &Tokenizer,
    prompt: &str,
    seed: u64,
    max_tokens: usize,
) -> (Job, UnboundedReceiver<JobEvent>) {
    let (events, rx) = unbounded_channel();
    let job = Job {
        prompt: tok.encode(prompt, tok.add_bos(), true).expect("encode"),
        sampling: SamplerConfig {
            seed,
            ..Default::default()
        },
        max_tokens,
        top_logprobs: None,
        cache_prompt: true,
        ignore_eos: false,
        constraint: None,
        events,
    };
    (job, rx)
}

/// The tokens of a finished sequence, its cached prefix and how it ended.
fn drain(rx: &mut UnboundedReceiver<JobEvent>) -> (Vec<u32>, usize, Finish) {
    let (mut tokens, mut cached) = (Vec::new(), usize::MAX);
    loop {
        match rx.blocking_recv().expect("the sequence ends with an event") {
            JobEvent::Started { cached_tokens } => cached = cached_tokens,
            JobEvent::Token { id, .. } => tokens.push(id),
            JobEvent::Done(f) => return (tokens, cached, f),
            JobEvent::Failed(e) => panic!("sequence failed: {e}"),
        }
    }
}

#[test]
fn a_batched_step_gives_each_session_its_logits_alone_bit_for_bit() {
    let (model, tok) = kjv();
    let prompts: Vec<Vec<u32>> = PROMPTS[..3]
        .iter()
        .map(|p| tok.encode(p, true, true).unwrap())
        .collect();
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            let mut s = model.new_session(64, 64).unwrap();
            model.eval(&mut s, p, Logits::Last).unwrap()
        })
        .collect();
    // The first two prompts in chunks of 3 tokens, the third whole; then one decode step.
    let mut sessions: Vec<_> = (0..3).map(|_| model.new_session(64, 1).unwrap()).collect();
    let mut scratch = model.new_batch_scratch(32, 3).unwrap();
    let mut last: Vec<Option<Vec<f32>>> = vec![None; 3];
    let mut done = [0usize; 3];
    while done.iter().zip(&prompts).any(|(d, p)| d < &p.len()) {
        let mut steps = Vec::new();
        let mut which = Vec::new();
        for (i, s) in sessions.iter_mut().enumerate() {
            let p = &prompts[i];
            if done[i] == p.len() {
                continue;
            }
            let n = if i == 2 {
                p.len()
            } else {
                3.min(p.len() - done[i])
            };
            steps.push(SeqStep {
                session: s,
                tokens: &p[done[i]..done[i] + n],
                logits: done[i] + n == p.len(),
            });
            which.push(i);
            done[i] += n;
        }
        let rows = model.step(&mut scratch, &mut steps).unwrap();
        for (i, r) in which.into_iter().zip(rows) {
            if r.is_some() {
                last[i] = r;
            }
        }
    }
    for (i, l) in last.iter().enumerate() {
        let l = l.as_ref().expect("logits of every prompt");
        assert_eq!(l.len(), model.sampled_vocab());
        assert!(
            l.iter()
                .zip(&alone[i])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "prompt {i}"
        );
    }
    // A step over more rows than the scratch holds is refused before anything runs.
    let mut s = model.new_session(64, 1).unwrap();
    let long = vec![1u32; 33];
    let err = model
        .step(
            &mut scratch,
            &mut [SeqStep {
                session: &mut s,
                tokens: &long,
                logits: true,
            }],
        )
        .unwrap_err();
    assert!(err.to_string().contains("exceeds its scratch"), "{err}");
    assert_eq!(s.pos(), 0);
}

#[test]
fn a_sequence_gets_the_same_tokens_alone_or_beside_seven_others() {
    let (_, tok) = kjv();
    // Alone: one sequence at a time.
    let (alone, alone_steps) = with_scheduler(config(8, 16), 8, |sub| {
        let tokens: Vec<Vec<u32>> = (0..8)
            .map(|i| {
                let (j, mut rx) = job(&tok, PROMPTS[i], 100 + i as u64, 24);
                sub.submit(j).unwrap();
                drain(&mut rx).0
            })
            .collect();
        (tokens, sub.gauges().steps.load(Ordering::Relaxed))
    });
    // Together, with a step budget of 16 tokens: prompts go in chunks beside other sequences'
    // decoding. The prefix cache is off so every prompt is evaluated the same way twice.
    let together: Vec<Vec<u32>> = with_scheduler(config(8, 16), 8, |sub| {
        let mut rxs: Vec<_> = (0..8)
            .map(|i| {
                let (mut j, rx) = job(&tok, PROMPTS[i], 100 + i as u64, 24);
                j.cache_prompt = false;
                sub.submit(j).unwrap();
                rx
            })
            .collect();
        let tokens = rxs.iter_mut().map(|rx| drain(rx).0).collect();
        let steps = sub.gauges().steps.load(Ordering::Relaxed);
        assert!(
            steps < alone_steps,
            "the sequences shared steps: {steps} of {alone_steps}"
        );
        tokens
    });
    assert!(alone.iter().all(|t| t.len() == 24));
    assert_eq!(alone, together);
    assert_ne!(alone[0], alone[4], "different prompts and seeds differ");
}

#[test]
fn a_shared_prefix_is_reused_and_gives_the_same_tokens() {
    let (_, tok) = kjv();
    let system = "Hear, O Israel: The LORD our God is one LORD. ";
    let first = format!("{system}And thou shalt love the LORD thy God");
    let second = format!("{system}And these words, which I command thee this day");
    let prefix = tok.encode(system, tok.add_bos(), true).unwrap().len();
    let (cached, reused, fresh) = with_scheduler(config(2, 64), 4, |sub| {
        let (j, mut rx) = job(&tok, &first, 1, 8);
        sub.submit(j).unwrap();
        drain(&mut rx);
        let (j, mut rx) = job(&tok, &second, 2, 8);
        sub.submit(j).unwrap();
        let (reused, cached, _) = drain(&mut rx);
        let (mut j, mut rx) = job(&tok, &second, 2, 8);
        j.cache_prompt = false;
        sub.submit(j).unwrap();
        let (fresh, not_cached, _) = drain(&mut rx);
        assert_eq!(not_cached, 0);
        (cached, reused, fresh)
    });
    assert!(
        cached >= prefix - 1 && cached < prefix + 4,
        "{cached} cached of a {prefix}-token prefix"
    );
    assert_eq!(reused, fresh);
}

#[test]
fn a_client_that_goes_away_frees_its_sequence_and_a_full_queue_refuses() {
    let (_, tok) = kjv();
    with_scheduler(config(1, 16), 1, |sub| {
        let (j, mut rx) = job(&tok, PROMPTS[0], 1, 200);
        sub.submit(j).unwrap();
        assert!(matches!(rx.blocking_recv(), Some(JobEvent::Started { .. })));
        // One sequence runs and one job waits: the next is refused.
        let (waiting, mut waiting_rx) = job(&tok, PROMPTS[1], 2, 4);
        sub.submit(waiting).unwrap();
        let (refused, _) = job(&tok, PROMPTS[2], 3, 4);
        assert_eq!(sub.submit(refused).err(), Some(SubmitError::Full));
        // The first client goes away: its sequence ends and the waiting one runs to its end.
        drop(rx);
        let (tokens, _, finish) = drain(&mut waiting_rx);
        assert_eq!((tokens.len(), finish), (4, Finish::Length));
        // The gauges are set once the step that ended it is done.
        let g = sub.gauges();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while g.running.load(Ordering::Relaxed) != 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(g.running.load(Ordering::Relaxed), 0);
        assert_eq!(g.queued.load(Ordering::Relaxed), 0);
        assert!(g.generated_tokens.load(Ordering::Relaxed) < 200);
    });
}

#[test]
fn a_sequence_waits_for_room_in_the_kv_pool() {
    let (_, tok) = kjv();
    // Two contexts of 256 positions: two long answers hold all of it, a third request waits.
    let pool = SchedulerConfig {
        kv_pool: Some(512),
        ..config(3, 16)
    };
    with_scheduler(pool, 4, |sub| {
        let (a, mut a_rx) = job(&tok, PROMPTS[0], 1, 200);
        let (b, mut b_rx) = job(&tok, PROMPTS[2], 2, 200);
        let (c, mut c_rx) = job(&tok, PROMPTS[4], 3, 4);
        for j in [a, b, c] {
            sub.submit(j).unwrap();
        }
        for rx in [&mut a_rx, &mut b_rx] {
            assert!(matches!(rx.blocking_recv(), Some(JobEvent::Started { .. })));
        }
        // The first two are 200 tokens from their end; the third has not started.
        assert!(c_rx.try_recv().is_err());
        let g = sub.gauges();
        assert_eq!(g.kv_capacity.load(Ordering::Relaxed), 512);
        assert_eq!(g.queued.load(Ordering::Relaxed), 1);
        let (a_tokens, _, _) = drain(&mut a_rx);
        let (c_tokens, _, finish) = drain(&mut c_rx);
        drain(&mut b_rx);
        assert_eq!(
            (a_tokens.len(), c_tokens.len(), finish),
            (200, 4, Finish::Length)
        );
        assert!(g.kv_positions.load(Ordering::Relaxed) <= 512);
    });
}

#[test]
fn hidden_states_are_the_final_norm_of_the_residual_stream() {
    // What an embedding pools: the scheduler's hidden states of a text (asked for while
    // another sequence generates) equal the residual stream leaving the last layer, RMS-normed
    // on the host with the file's `output_norm.weight` — to the rounding of the two norms.
    let (model, tok) = kjv();
    let tokens = tok.encode(PROMPTS[1], true, true).expect("tokens");
    let d = model.config.n_embd;
    let mut s = model.new_session(tokens.len(), 4).expect("session");
    let stream =
        pollster::block_on(model.forward_tokens_at_async(&mut s, 0, &tokens)).expect("forward");
    let weight = vector_source(&model.file, "output_norm.weight", d).expect("output norm");
    let eps = model.config.eps;
    let want: Vec<f32> = stream
        .chunks(d)
        .flat_map(|row| {
            let rms = (row.iter().map(|v| v * v).sum::<f32>() / d as f32 + eps).sqrt();
            row.iter().zip(&weight).map(move |(v, w)| v / rms * w)
        })
        .collect();
    let got = with_scheduler(config(2, 8), 4, |sub| {
        let (j, mut rx) = job(&tok, PROMPTS[0], 1, 40);
        sub.submit(j).expect("queued");
        let h = sub
            .hidden_states(tokens.clone())
            .expect("asked")
            .blocking_recv()
            .expect("answered")
            .expect("hidden states");
        drain(&mut rx);
        h
    });
    assert_eq!(got.len(), tokens.len() * d);
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
        .fold(0.0f32, f32::max);
    // Both are f32 with the same sums in other orders (measured: 4e-7 at worst); a norm
    // without its weight, or of the wrong row, is off by far more than 1e-5.
    assert!(worst < 1e-5, "worst relative difference {worst}");
    // An empty input or one longer than the context is refused, not run.
    with_scheduler(config(1, 8), 4, |sub| {
        for bad in [vec![], vec![1; 300]] {
            let r = sub
                .hidden_states(bad)
                .expect("asked")
                .blocking_recv()
                .expect("answered");
            assert!(r.is_err());
        }
    });
}

#[test]
fn slots_show_each_running_sequence_in_the_lowest_free_slot() {
    let (_, tok) = kjv();
    with_scheduler(config(4, 16), 4, |sub| {
        let ask = || {
            sub.slots()
                .expect("asked")
                .blocking_recv()
                .expect("answered")
        };
        let idle = ask();
        assert_eq!((idle.slots.len(), idle.idle(), idle.n_ctx), (4, 4, 256));
        assert_eq!(idle.kv_capacity, 4 * 256);
        let start = |prompt: &str, seed: u64| {
            let (mut j, mut rx) = job(&tok, prompt, seed, 120);
            j.ignore_eos = true;
            let prompt = j.prompt.clone();
            sub.submit(j).expect("queued");
            // Admitted, and one token generated.
            assert!(matches!(rx.blocking_recv(), Some(JobEvent::Started { .. })));
            assert!(matches!(rx.blocking_recv(), Some(JobEvent::Token { .. })));
            (prompt, rx)
        };
        let (a_prompt, mut a_rx) = start(PROMPTS[0], 1);
        let (b_prompt, mut b_rx) = start(PROMPTS[2], 2);
        // Asked between two steps: each sequence is a step or two past its first token, far
        // from its 120th.
        let busy = ask();
        assert_eq!(busy.idle(), 2);
        for (slot, prompt) in [(0, &a_prompt), (1, &b_prompt)] {
            let s = busy.slots[slot].seq.as_ref().expect("running");
            assert_eq!(&s.prompt, prompt, "slot {slot}");
            assert!(!s.generated.is_empty() && s.generated.len() < 10, "{s:?}");
            assert_eq!(s.generated.len() + s.remaining, 120);
            assert_eq!(s.sampling.seed, slot as u64 + 1);
            assert!(s.kv_positions >= prompt.len() + 120);
            assert!(s.evaluated >= prompt.len());
        }
        assert!(busy.kv_held >= 2 * (a_prompt.len() + 120));
        let (a_tokens, _, _) = drain(&mut a_rx);
        let a_seq = busy.slots[0].seq.as_ref().unwrap();
        // What the slot showed is what the sequence sent (its first token was read above).
        assert!(a_tokens.starts_with(&a_seq.generated[1..]));
        drain(&mut b_rx);
        // Slot 0 is free again: the next sequence takes it, its prompt's prefix cached.
        let (_, mut c_rx) = start(PROMPTS[0], 3);
        let again = ask();
        let c = again.slots[0].seq.as_ref().expect("slot 0 runs again");
        assert!(c.cached > 0, "{c:?}");
        assert!(again.slots[1..].iter().all(|s| s.seq.is_none()));
        drain(&mut c_rx);
        let done = ask();
        assert_eq!(done.idle(), 4);
        assert!(done.cached_prefixes.iter().any(|&n| n >= a_prompt.len()));
    });
}
