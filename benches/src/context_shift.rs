//! `context_shift`: what generating past the context costs in quality. A long text streams
//! through the built-in model in steps of 32 tokens, every token after the first context's
//! worth scored by the log-probability the model gave it, under:
//!
//! * `-c C --context-shift sinks --keep 4` (and `--keep 0`): the context shifts when full;
//! * `-c C`, restarted empty when full (what a run without shifting must do to go on);
//! * `-c N`, the whole text in one context (past the model's training context when N > C).
//!
//! Usage: `cargo run --release -p hesper-benches --bin context_shift -- [C] [N] [THREADS]`
//! (defaults 256, 8192, 2; text `models/kjv-valid.txt`, model `models/hesper-kjv.gguf`).

use std::path::PathBuf;

use hesper_cpu::CpuBackend;
use hesper_engine::file::ModelFile;
use hesper_engine::model::{LoadOptions, Logits, Model};
use hesper_engine::tokenizer::Tokenizer;

/// Tokens evaluated per step.
const STEP: usize = 32;

/// What happens when the context is full.
#[derive(Clone, Copy)]
enum Full {
    Shift(usize),
    Restart,
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n_ctx: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(8192);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let file = ModelFile::open(&root.join("models/hesper-kjv.gguf")).expect("the built-in model");
    let tok = Tokenizer::from_gguf(file.header())
        .expect("tokenizer")
        .expect("the model has a tokenizer");
    let text = std::fs::read_to_string(root.join("models/kjv-valid.txt")).expect("the text");
    let mut tokens = tok.encode(&text, tok.add_bos(), false).expect("tokens");
    tokens.truncate(n);
    let backend = CpuBackend::new(threads).expect("backend");
    let model = Model::load(backend, file, LoadOptions::default()).expect("model");
    println!(
        "{} tokens, the first {n_ctx} unscored; {} scored\n",
        tokens.len(),
        tokens.len() - n_ctx - 1
    );
    println!("| run | PPL of the scored tokens |");
    println!("|---|---:|");
    for (name, ctx, full) in [
        (
            format!("-c {n_ctx} --context-shift sinks (--keep 4)"),
            n_ctx,
            Full::Shift(4),
        ),
        (
            format!("-c {n_ctx} --context-shift sinks --keep 0"),
            n_ctx,
            Full::Shift(0),
        ),
        (
            format!("-c {n_ctx}, restarted when full"),
            n_ctx,
            Full::Restart,
        ),
        (
            format!("-c {} (the whole text)", tokens.len()),
            tokens.len(),
            Full::Restart,
        ),
    ] {
        let ppl = model
            .backend
            .install(|| stream(&model, &tokens, ctx, full, n_ctx));
        println!("| {name} | {ppl:.4} |");
    }
}

/// Perplexity of `tokens[scored_from + 1..]`, each predicted from the logits after the token
/// before it, streaming through a context of `n_ctx` that does `full` when full.
fn stream(
    model: &Model<CpuBackend>,
    tokens: &[u32],
    n_ctx: usize,
    full: Full,
    scored_from: usize,
) -> f64 {
    let new = || model.new_session(n_ctx, STEP).expect("session");
    let mut s = new();
    if let Full::Shift(keep) = full {
        s.set_context_shift(Some(keep)).expect("shift");
    }
    let n_vocab = model.config.n_vocab;
    let (mut nll, mut count) = (0.0f64, 0usize);
    for (c, chunk) in tokens.chunks(STEP).enumerate() {
        if matches!(full, Full::Restart) && s.pos() + chunk.len() > n_ctx {
            s = new();
        }
        let logits = model.eval(&mut s, chunk, Logits::All).expect("eval");
        for (j, row) in logits.chunks_exact(n_vocab).enumerate() {
            let at = c * STEP + j;
            if at < scored_from || at + 1 >= tokens.len() {
                continue;
            }
            let max = row.iter().copied().fold(f32::MIN, f32::max);
            let sum: f64 = row.iter().map(|&l| f64::from(l - max).exp()).sum();
            let target = f64::from(row[tokens[at + 1] as usize] - max);
            nll += sum.ln() - target;
            count += 1;
        }
    }
    (nll / count as f64).exp()
}
