//! Crafted models run for a few tokens: copies of the demo models whose weights hold NaN or
//! infinities, whose tensor table declares sizes that run into the next tensor, or whose layer
//! count disagrees with their tensors. Every load and every step ends in `Ok` or a clear
//! `Err` — never a panic — and a NaN or infinite logit is never turned into a token: greedy
//! decoding, top-k and the whole row agree with the logits `eval` returns, and refuse where it
//! refuses. Bounded by `HESPER_MODEL_FUZZ_SECS` (default 5 s) of mutations per model.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hesper_cpu::{CpuBackend, Isa};
use hesper_engine::file::ModelFile;
use hesper_engine::gguf::Gguf;
use hesper_engine::model::{Logits, Model, ModelError, Prediction, Readout};
use hesper_tests::random::Rng;

/// What was done to a copy, for the failure message.
struct Mutation {
    bytes: Vec<u8>,
    what: String,
}

/// One random mutation of `base`.
fn mutate(base: &[u8], g: &Gguf, rng: &mut Rng) -> Mutation {
    let mut bytes = base.to_vec();
    let tensors = g.tensors();
    let t = &tensors[(rng.next_u64() % tensors.len() as u64) as usize];
    let pick = |rng: &mut Rng, n: u64| (rng.next_u64() % n.max(1)) as usize;
    let what = match rng.next_u64() % 4 {
        // Non-finite values in the weights (any layout: f32 and f16 patterns, also in the
        // scales of block formats, and random bytes in ternary codes).
        0 | 1 => {
            let n = t.nbytes.unwrap_or(0) as usize;
            let patterns: [&[u8]; 5] = [
                &[0x00, 0x7e],
                &[0x00, 0x7c],
                &[0x00, 0xfc],
                &[0x00, 0x00, 0xc0, 0x7f],
                &[0x00, 0x00, 0x80, 0x7f],
            ];
            let p = patterns[pick(rng, patterns.len() as u64)];
            let count = 1 + pick(rng, 64);
            for _ in 0..count {
                if n >= p.len() {
                    let at = t.start as usize + pick(rng, (n - p.len()) as u64 / 2) * 2;
                    bytes[at..at + p.len()].copy_from_slice(p);
                }
            }
            format!("{count} × {p:02x?} in {}", t.name)
        }
        // A dimension declared larger: the tensor runs into the next one, or out of the file.
        2 => {
            let at = hesper_tests::dim0_offset(&bytes, &t.name);
            let grown = t.ne[0] * (2 + pick(rng, 3) as u64);
            bytes[at..at + 8].copy_from_slice(&grown.to_le_bytes());
            format!("{} ne[0] {} → {grown}", t.name, t.ne[0])
        }
        // A layer count that disagrees with the tensors.
        _ => {
            let (key, value) = g
                .metadata()
                .iter()
                .find(|(k, _)| k.ends_with(".block_count"))
                .expect("a block count");
            let n = value.as_u64().unwrap_or(0);
            let key_at = bytes
                .windows(key.len())
                .position(|w| w == key.as_bytes())
                .expect("the key");
            // The value follows the key and its u32 type.
            let at = key_at + key.len() + 4;
            let to = [n.saturating_sub(1), n + 1, 0][pick(rng, 3)] as u32;
            bytes[at..at + 4].copy_from_slice(&to.to_le_bytes());
            format!("{key} {n} → {to}")
        }
    };
    Mutation { bytes, what }
}

/// How a crafted model ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The file or the model was refused at load.
    Refused,
    /// It loaded; its logits were refused as not finite.
    NonFinite,
    /// It loaded and predicted from finite logits.
    Ran,
}

/// Loads and runs `m`: every outcome must be `Ok` or an error, and the readouts must agree
/// with the logits.
fn check(m: &Mutation) -> Outcome {
    let Ok(file) = ModelFile::from_bytes(m.bytes.clone(), "crafted") else {
        return Outcome::Refused;
    };
    let backend = CpuBackend::with_isa(1, Isa::Scalar).expect("cpu");
    let Ok(model) = Model::load(backend, file, Default::default()) else {
        return Outcome::Refused;
    };
    let tokens = [1u32, 5, 9, 2];
    let session = || model.new_session(8, 4).expect("session");
    let row = model.eval(&mut session(), &tokens, Logits::Last);
    let readouts = [Readout::Argmax, Readout::Top(8), Readout::Logits];
    for readout in readouts {
        let got = model.predict(&mut session(), &tokens, readout);
        match (&row, got) {
            (Ok(row), Ok(p)) => {
                assert!(
                    row.iter().all(|v| v.is_finite()),
                    "{}: eval gave a non-finite row",
                    m.what
                );
                let best = hesper_tests::argmax(&row[..model.sampled_vocab()]) as u32;
                let picked = match p {
                    Prediction::Token(t) => t,
                    Prediction::Top(top) => top[0].0,
                    Prediction::Logits(r) => hesper_tests::argmax(&r) as u32,
                };
                assert_eq!(picked, best, "{}: {readout:?}", m.what);
            }
            (Err(ModelError::NonFiniteLogits { .. }), Err(ModelError::NonFiniteLogits { .. })) => {}
            (Err(ModelError::NonFiniteLogits { token, .. }), Ok(p)) => {
                panic!(
                    "{}: {readout:?} gave {p:?} where eval refused token {token}",
                    m.what
                )
            }
            (Ok(_), Err(e)) => panic!("{}: {readout:?} failed ({e}) where eval did not", m.what),
            (Err(_), _) => {}
        }
    }
    match row {
        Ok(_) => Outcome::Ran,
        Err(ModelError::NonFiniteLogits { .. }) => Outcome::NonFinite,
        Err(_) => Outcome::Refused,
    }
}

#[test]
fn crafted_models_end_in_ok_or_an_error_and_never_sample_non_finite_logits() {
    let secs: u64 = std::env::var("HESPER_MODEL_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    for (i, name) in [
        "models/hesper-tiny.gguf",
        "golden-values/models/tiny-tq2_0.gguf",
    ]
    .iter()
    .enumerate()
    {
        let base = std::fs::read(root.join(name)).expect("model");
        let g = Gguf::parse(&base).expect("gguf");
        let mut rng = Rng::new(0x5eed + i as u64);
        let start = Instant::now();
        let mut seen = std::collections::BTreeMap::<String, usize>::new();
        // At least `secs`; on a slow machine (qemu) on until every ending was reached, within
        // six times as long: a refused block scale no longer ends in non-finite logits, so
        // those take more mutations to reach.
        let all_seen = |seen: &std::collections::BTreeMap<String, usize>| seen.len() >= 3;
        while start.elapsed() < Duration::from_secs(secs)
            || (!all_seen(&seen) && start.elapsed() < Duration::from_secs(6 * secs))
        {
            let m = mutate(&base, &g, &mut rng);
            match catch_unwind(AssertUnwindSafe(|| check(&m))) {
                Ok(outcome) => *seen.entry(format!("{outcome:?}")).or_default() += 1,
                Err(p) => {
                    let why = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    panic!("{name}, {}: {why}", m.what);
                }
            }
        }
        println!("{name}: {seen:?}");
        // Each kind of ending was reached, or the mutations test nothing.
        for outcome in [Outcome::Refused, Outcome::NonFinite, Outcome::Ran] {
            assert!(
                seen.contains_key(&format!("{outcome:?}")),
                "{name}: no {outcome:?} in {seen:?}"
            );
        }
    }
}
