//! `hesper-rs tokenize` and `detokenize`: the model's tokenizer alone, as llama.cpp's
//! `llama-tokenize` prints it (`ID -> 'piece'`), or ids only.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use hesper_engine::tokenizer::Tokenizer;

use crate::args::FileArgs;
use crate::load::open_file;

/// Flags of `tokenize`.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    #[command(flatten)]
    model: FileArgs,
    /// The text to tokenize (or the positional TEXT; neither: stdin).
    #[arg(short = 'p', long = "prompt", value_name = "TEXT")]
    prompt: Option<String>,
    /// The text to tokenize, as -p gives it (`hesper-rs tokenize "Hello there"`).
    #[arg(value_name = "TEXT", conflicts_with_all = ["prompt", "file"])]
    text: Option<String>,
    /// Read the text from a file instead of -p.
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "prompt"
    )]
    file: Option<PathBuf>,
    /// Print only the ids, as a list (`[1, 2, 3]`).
    #[arg(long = "ids")]
    ids: bool,
    /// Do not add BOS, even where the model's prompts start with it.
    #[arg(long = "no-bos")]
    no_bos: bool,
    /// Tokenize the text of control tokens (`<|eot_id|>`) as plain text.
    #[arg(long = "no-parse-special")]
    no_parse_special: bool,
}

/// Flags of `detokenize`.
#[derive(Args, Debug)]
pub struct DetokenizeArgs {
    #[command(flatten)]
    model: FileArgs,
    /// Token ids, comma- or space-separated (`1,2,3`; `[1, 2, 3]` as `tokenize --ids` prints).
    #[arg(value_name = "IDS", required = true, num_args = 1..)]
    ids: Vec<String>,
}

/// The tokenizer of the file `model` names.
fn tokenizer(model: &FileArgs) -> Result<Tokenizer> {
    let file = open_file(model)?;
    model
        .tokenizer(file.header())
        .with_context(|| format!("{}: cannot build the tokenizer", file.source))?
        .with_context(|| format!("{} has no tokenizer", file.source))
}

/// Runs `tokenize`.
pub fn tokenize(args: TokenizeArgs) -> Result<()> {
    let text = match (args.prompt.as_ref().or(args.text.as_ref()), &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("-f/--file {}: cannot read it as text", path.display()))?,
        (None, None) => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .context("stdin: cannot read it as text")?;
            text
        }
    };
    let tok = tokenizer(&args.model)?;
    let ids = tok.encode(&text, tok.add_bos() && !args.no_bos, !args.no_parse_special)?;
    let mut out = std::io::stdout().lock();
    if args.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "[{}]", list.join(", "))?;
    } else {
        for id in ids {
            let piece = String::from_utf8_lossy(&tok.token_piece(id, true)).into_owned();
            writeln!(out, "{id:6} -> '{piece}'")?;
        }
    }
    Ok(())
}

/// Runs `detokenize`.
pub fn detokenize(args: DetokenizeArgs) -> Result<()> {
    let joined = args.ids.join(" ");
    let ids = joined
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .with_context(|| format!("{s:?} is not a token id"))
        })
        .collect::<Result<Vec<u32>>>()?;
    let tok = tokenizer(&args.model)?;
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= tok.vocab_size()) {
        bail!(
            "token id {bad} is past the vocabulary ({} tokens)",
            tok.vocab_size()
        );
    }
    writeln!(std::io::stdout(), "{}", tok.decode(&ids))?;
    Ok(())
}
