//! `hesper-rs logits`: evaluate token ids exactly as given and write every position's logits.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use hesper_engine::backend::Backend;
use hesper_engine::model::{Logits, Model};
use hesper_runtime::run_model;

use crate::args::{ContextArgs, ModelArgs};
use crate::load::load;
use crate::output::OutputFile;
use crate::report::note;

/// Flags of `logits`.
#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    ctx: ContextArgs,
    /// Comma-separated token ids, evaluated as given (no BOS is added).
    #[arg(
        long = "tokens",
        value_name = "IDS",
        required_unless_present = "prompt"
    )]
    tokens: Option<String>,
    /// Text to tokenize instead of --tokens (BOS added as the model asks).
    #[arg(short = 'p', long = "prompt", conflicts_with = "tokens")]
    prompt: Option<String>,
    /// Output file (`-`: standard output): float32 little-endian, [n_tokens][n_vocab]; written whole or not at all
    /// (a failed run leaves an existing file as it was), never over the model.
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    out: PathBuf,
}

/// Runs `logits`.
pub fn run(args: LogitsArgs) -> Result<()> {
    let ids = args.tokens.as_deref().map(parse_ids).transpose()?;
    args.ctx.attention.config()?;
    // Started first: an unwritable path, or the model's own file, fails before any work.
    let inputs: Vec<&Path> = args.model.file.gguf.iter().map(PathBuf::as_path).collect();
    let mut out = OutputFile::create(&args.out, &inputs)?;
    let loaded = load(&args.model, None)?;
    let tokens: Vec<u32> = match (ids, &args.prompt) {
        (Some(ids), _) => ids,
        (None, Some(text)) => {
            let Some(tok) = &loaded.tokenizer else {
                bail!("this model has no tokenizer; pass --tokens")
            };
            tok.encode(text, tok.add_bos(), true)?
        }
        (None, None) => bail!("pass --tokens or --prompt"),
    };
    if tokens.is_empty() {
        bail!("--prompt gives no tokens");
    }
    let n_vocab = run_model!(&loaded.model, |model| write_logits(
        &args, model, &tokens, &mut out
    ))?;
    out.commit()?;
    note!(
        "hesper: wrote {} × {} logits (float32 LE) to {}, computed on {}",
        tokens.len(),
        n_vocab,
        args.out.display(),
        loaded.model.backend_name()
    );
    Ok(())
}

/// Evaluates `tokens` a batch at a time and writes each batch's logits as it comes, so only
/// one batch of logits is ever held. Returns the vocabulary size.
fn write_logits<B: Backend>(
    args: &LogitsArgs,
    model: &Model<B>,
    tokens: &[u32],
    out: &mut impl Write,
) -> Result<usize> {
    let asked = args.ctx.n_ctx(model.config.n_ctx_train);
    let n_ctx = asked.max(tokens.len());
    if n_ctx > asked {
        note!("hesper: the context is raised from {asked} to {n_ctx} positions to hold every token id given");
    }
    let attention = args.ctx.attention.config()?;
    let mut session = model.new_session_with(n_ctx, args.ctx.batch_size, &attention)?;
    ContextArgs::note_past_training(n_ctx, model.config.n_ctx_train);
    let mut bytes = Vec::new();
    for chunk in tokens.chunks(args.ctx.batch_size.max(1)) {
        let logits = model.eval(&mut session, chunk, Logits::All)?;
        bytes.clear();
        bytes.extend(logits.iter().flat_map(|v| v.to_le_bytes()));
        out.write_all(&bytes)
            .with_context(|| format!("cannot write {}", args.out.display()))?;
    }
    Ok(model.config.n_vocab)
}

/// The ids of `--tokens`: comma-separated, none empty.
fn parse_ids(list: &str) -> Result<Vec<u32>> {
    let ids = list
        .split(',')
        .map(str::trim)
        .enumerate()
        .map(|(i, s)| {
            if s.is_empty() {
                bail!("--tokens: item {} is empty (give ids like 1,2,3)", i + 1);
            }
            s.parse::<u32>()
                .with_context(|| format!("--tokens: {s:?} is not a token id"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::parse_ids;

    #[test]
    fn token_lists() {
        assert_eq!(parse_ids("1, 2,3").unwrap(), [1, 2, 3]);
        for bad in ["", "1,,2", "1,2,", ",1", "1,x", "-1", "4294967296"] {
            assert!(parse_ids(bad).is_err(), "{bad:?}");
        }
    }
}
