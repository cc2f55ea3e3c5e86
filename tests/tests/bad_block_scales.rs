//! A weight block whose f16 scale is infinite or NaN is refused when the model loads, naming
//! the tensor and the block, in every block format; and a hot-swap to such a file is refused,
//! keeping the weights it had, and not read again while it stays as it is. (ggml computes with
//! such a block: one `d = inf` in a Q4_K block made every logit exactly 0.0 — finite, so no
//! guard on the logits could tell.) A hot-swap check also never blocks on a path that became
//! a pipe.

use std::path::PathBuf;
use std::sync::Arc;

use hesper_cpu::{CpuBackend, Isa};
use hesper_engine::backend::Backend;
use hesper_engine::file::ModelFile;
use hesper_engine::gguf::Gguf;
use hesper_engine::model::{LoadOptions, Logits, Model, Reload, ReloadError};
use hesper_tests::golden_dir;
use hesper_tests::scratch::Scratch;

/// f16 bit patterns that are not finite numbers.
const NON_FINITE: [(u16, &str); 3] = [(0x7c00, "inf"), (0xfc00, "-inf"), (0x7e00, "NaN")];

/// Block index written into (each tensor below holds more blocks than this).
const BLOCK: usize = 3;

/// (golden model, a block format it holds, bytes per block, where the block's f16 scales are).
const CASES: &[(&str, &str, usize, &[usize])] = &[
    ("tiny-llama-q8_0.gguf", "Q8_0", 34, &[0]),
    ("tiny-llama-q4_0.gguf", "Q4_0", 18, &[0]),
    ("tiny-llama-q4_k_m.gguf", "Q4_K", 144, &[0, 2]),
    ("tiny-llama-q5_k_m.gguf", "Q5_K", 176, &[0, 2]),
    ("tiny-llama-q4_k_m.gguf", "Q6_K", 210, &[208]),
    ("tiny-llama-tq1_0.gguf", "TQ1_0", 54, &[52]),
    ("tiny-tq2_0.gguf", "TQ2_0", 66, &[64]),
];

fn model_path(name: &str) -> PathBuf {
    golden_dir().join("models").join(name)
}

fn cpu() -> CpuBackend {
    CpuBackend::with_isa(2, Isa::detect()).unwrap_or_else(|e| panic!("{e}"))
}

fn load(bytes: Vec<u8>) -> Result<Model<CpuBackend>, String> {
    let file: Arc<ModelFile> =
        ModelFile::from_bytes(bytes, "crafted").map_err(|e| e.to_string())?;
    Model::load(cpu(), file, LoadOptions::default()).map_err(|e| e.to_string())
}

/// Every tensor of type `format` in `bytes`, with where its data starts.
fn tensors_of(bytes: &[u8], format: &str) -> Vec<(String, usize)> {
    let g = Gguf::parse(bytes).expect("parse");
    g.tensors()
        .iter()
        .filter(|t| t.ty.to_string() == format)
        .map(|t| (t.name.clone(), t.start as usize))
        .collect()
}

/// `bytes` with the scale at `offset` of block [`BLOCK`] of the tensor at `start` set to `bits`.
fn with_scale(bytes: &[u8], start: usize, block_bytes: usize, offset: usize, bits: u16) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let at = start + BLOCK * block_bytes + offset;
    out[at..at + 2].copy_from_slice(&bits.to_le_bytes());
    out
}

#[test]
fn a_non_finite_block_scale_is_refused_at_load_naming_tensor_and_block() {
    for &(file, format, block_bytes, scales) in CASES {
        let bytes = std::fs::read(model_path(file)).expect("model");
        load(bytes.clone()).unwrap_or_else(|e| panic!("{file} as shipped: {e}"));
        let tensors = tensors_of(&bytes, format);
        assert!(!tensors.is_empty(), "{file} holds no {format} tensor");
        for (i, (name, start)) in tensors.iter().enumerate() {
            // Each scale of the format, each non-finite value, spread over the tensors.
            let offset = scales[i % scales.len()];
            let (bits, what) = NON_FINITE[i % NON_FINITE.len()];
            let crafted = with_scale(&bytes, *start, block_bytes, offset, bits);
            let err = match load(crafted) {
                Ok(_) => panic!("{file}: {name} with a {what} scale at byte {offset} loaded"),
                Err(e) => e,
            };
            assert!(
                err.contains(&format!("{name:?}"))
                    && err.contains(&format!("block {BLOCK} (of {format})"))
                    && err.contains("not a finite number"),
                "{file} {name}: {err}"
            );
        }
    }
}

fn logits<B: Backend>(model: &Model<B>) -> Vec<u32> {
    let tokens = [1, 15, 200, 7];
    let mut s = model.new_session(tokens.len(), 4).expect("session");
    let v = model.eval(&mut s, &tokens, Logits::All).expect("eval");
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_hot_swap_to_a_non_finite_block_scale_is_refused_and_the_weights_stay() {
    let source = model_path("tiny-llama-q4_k_m.gguf");
    let bytes = std::fs::read(&source).expect("model");
    let copy = Scratch::new("bad-scales-swap", &source);
    let mut model = Model::load_hot_swap(cpu(), &copy.0, LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let before = logits(&model);
    let (name, start) = tensors_of(&bytes, "Q4_K").pop().expect("a Q4_K tensor");
    copy.write(&with_scale(&bytes, start, 144, 2, 0x7c00));
    let err = model
        .reload_changed()
        .expect_err("a non-finite scale is refused")
        .to_string();
    assert!(
        err.contains(&format!("{name:?}")) && err.contains(&format!("block {BLOCK} (of Q4_K)")),
        "{err}"
    );
    assert_eq!(logits(&model), before, "the weights it had");
    // The same bytes again are not read again: the refusal is remembered with the file's stamp.
    let again = model.reload_changed().expect_err("still refused");
    assert!(matches!(again, ReloadError::StillRefused { .. }), "{again}");
    assert!(again.to_string().contains(&format!("{name:?}")), "{again}");
    // Put right, the file is read again and holds what was loaded: nothing to swap.
    copy.write(&bytes);
    assert_eq!(model.reload_changed().expect("check"), Reload::Unchanged);
}

/// A pipe put at the model's path is refused at once: opening it waits for no writer.
#[test]
fn a_pipe_at_the_model_path_is_refused_without_blocking() {
    let source = model_path("tiny-llama-q8_0.gguf");
    let copy = Scratch::new("bad-scales-pipe", &source);
    let mut model = Model::load_hot_swap(cpu(), &copy.0, LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::remove_file(&copy.0).expect("remove");
    let made = std::process::Command::new("mkfifo")
        .arg(&copy.0)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let (tx, rx) = std::sync::mpsc::channel();
    let checker = std::thread::spawn(move || {
        let r = model.reload_changed().map_err(|e| e.to_string());
        tx.send(r).expect("send");
        model
    });
    let r = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the check blocked on the pipe");
    let err = r.expect_err("a pipe is refused");
    assert!(err.contains("a pipe"), "{err}");
    let mut model = checker.join().expect("join");
    std::fs::remove_file(&copy.0).expect("remove the pipe");
    std::fs::copy(&source, &copy.0).expect("restore");
    assert_eq!(model.reload_changed().expect("check"), Reload::Unchanged);
}
