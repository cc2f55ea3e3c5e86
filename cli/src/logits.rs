//! `hesper-rs logits`: evaluate token ids exactly as given and write every position's logits.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use hesper_engine::backend::Backend;
use hesper_engine::model::{Logits, Model};

use crate::args::{ContextArgs, ModelArgs};
use crate::load::{load, run_model};

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
    /// Output file: float32 little-endian, [n_tokens][n_vocab].
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    out: PathBuf,
}

/// Runs `logits`.
pub fn run(args: LogitsArgs) -> Result<()> {
    let loaded = load(&args.model, None)?;
    let tokens: Vec<u32> = match (&args.tokens, &args.prompt) {
        (Some(list), _) => parse_ids(list)?,
        (None, Some(text)) => {
            let Some(tok) = &loaded.tokenizer else {
                bail!("this model has no tokenizer; pass --tokens")
            };
            tok.encode(text, tok.add_bos(), true)?
        }
        (None, None) => bail!("pass --tokens or --prompt"),
    };
    let logits = run_model!(&loaded.model, |model| all_logits(&args, model, &tokens))?;
    let n_vocab = logits.len() / tokens.len().max(1);
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut f = std::fs::File::create(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    f.write_all(&bytes)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    eprintln!(
        "hesper: wrote {} × {} logits (float32 LE) to {}",
        tokens.len(),
        n_vocab,
        args.out.display()
    );
    Ok(())
}

/// Every position's logits of `tokens` on `model`.
fn all_logits<B: Backend>(args: &LogitsArgs, model: &Model<B>, tokens: &[u32]) -> Result<Vec<f32>> {
    let n_ctx = args
        .ctx
        .ctx_size
        .unwrap_or(model.config.n_ctx_train)
        .max(tokens.len());
    let mut session = model.new_session(n_ctx, args.ctx.batch_size)?;
    Ok(model.eval(&mut session, tokens, Logits::All)?)
}

fn parse_ids(list: &str) -> Result<Vec<u32>> {
    let ids = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .with_context(|| format!("--tokens: {s:?} is not a token id"))
        })
        .collect::<Result<Vec<_>>>()?;
    if ids.is_empty() {
        bail!("--tokens is empty");
    }
    Ok(ids)
}
