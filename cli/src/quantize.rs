//! `hesper-rs quantize IN OUT TYPE`: a model written in another weight type (llama-quantize's
//! arguments and choices, no importance matrix), one line per tensor as it prints them.

use std::io::BufWriter;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use hesper_engine::file::ModelFile;
use hesper_engine::quantize::{pattern_matches, plan, write, QuantType};

use crate::report::note;

/// Flags of `quantize`.
#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// The model to read (any type hesper-rs runs).
    #[arg(value_name = "IN")]
    input: PathBuf,
    /// The file to write (written beside it first, then renamed: never half-written).
    #[arg(value_name = "OUT")]
    output: PathBuf,
    /// The type of every weight matrix: Q8_0, Q6_K, Q5_K_M, Q4_K_M (Q5_K and Q4_K mean these,
    /// as in llama-quantize), TQ2_0, TQ1_0, I2_S, F16, BF16 or F32, chosen per tensor as
    /// llama-quantize chooses (the LM head in Q6_K; in the _M mixes, Q6_K for the value and
    /// FFN down projections of some layers). Norms and other vectors stay as they are; rows
    /// that are not whole blocks get Q8_0 (the quantized types) or F16. The ternary types convert
    /// among themselves without loss (I2_S, one scale per tensor, only from ternary values
    /// with one scale), leave the embedding and LM head as they are unless --tensor-type
    /// names them, and ternarize other weights as llama.cpp's TQ1_0/TQ2_0 do (d = max |w| per
    /// 256 values).
    #[arg(value_name = "TYPE", value_parser = parse_file_type)]
    ty: QuantType,
    /// Another type for the tensors a pattern names (`attn_v=q8_0`, `blk.*.ffn_down.weight=q4_k`;
    /// `*` matches anything, a plain word any name holding it); repeatable, the last match
    /// wins.
    #[arg(long = "tensor-type", value_name = "PATTERN=TYPE", value_parser = parse_override)]
    tensor_type: Vec<(String, QuantType)>,
}

/// A `TYPE` argument (llama-quantize's `Q4_K` and `Q5_K` are its `_M` mixes).
fn parse_file_type(name: &str) -> Result<QuantType, String> {
    QuantType::for_file(name).ok_or_else(|| expected(|_| true))
}

/// A tensor's type in `--tensor-type` (not a mix).
fn parse_type(name: &str) -> Result<QuantType, String> {
    QuantType::from_name(name)
        .filter(|t| !t.is_mix())
        .ok_or_else(|| expected(|t| !t.is_mix()))
}

/// "expected one of …" with the types `keep` keeps.
fn expected(keep: impl Fn(&QuantType) -> bool) -> String {
    let names: Vec<&str> = QuantType::ALL
        .iter()
        .filter(|t| keep(t))
        .map(|t| t.name())
        .collect();
    format!("expected one of {}", names.join(", "))
}

/// A `--tensor-type PATTERN=TYPE` argument.
fn parse_override(text: &str) -> Result<(String, QuantType), String> {
    let (pattern, ty) = text
        .rsplit_once('=')
        .ok_or_else(|| format!("{text:?}: expected PATTERN=TYPE"))?;
    if pattern.is_empty() {
        return Err(format!("{text:?}: the pattern is empty"));
    }
    Ok((pattern.to_string(), parse_type(ty)?))
}

/// Runs `quantize`.
pub fn run(args: QuantizeArgs) -> Result<()> {
    let start = Instant::now();
    let same = match (args.input.canonicalize(), args.output.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        bail!(
            "{}: the output is the input; write another file",
            args.output.display()
        );
    }
    if args.output.is_dir() {
        bail!(
            "{} is a directory; name the file to write",
            args.output.display()
        );
    }
    let file = ModelFile::open(&args.input)?;
    let tensors = file.header().tensors();
    for (pattern, _) in &args.tensor_type {
        if !tensors.iter().any(|t| pattern_matches(pattern, &t.name)) {
            note!(
                "hesper: warning: --tensor-type {pattern:?} matches no tensor of {}",
                args.input.display()
            );
        }
    }
    let plans = plan(tensors, args.ty, &args.tensor_type);
    let partial = args
        .output
        .with_extension(format!("part-{}", std::process::id()));
    // Interrupted (Ctrl-C, SIGTERM, SIGHUP), the part file goes with the process.
    let removed_on_signal = partial.clone();
    ctrlc::set_handler(move || {
        let _ = std::fs::remove_file(&removed_on_signal);
        std::process::exit(130);
    })
    .context("cannot handle signals")?;
    let out = std::fs::File::create(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let mut out = BufWriter::new(out);
    let n = plans.len();
    let result = write(&file, &plans, args.ty, &mut out, &mut |done, total| {
        let p = &plans[done - 1];
        let dims: Vec<String> = p.info.dims().iter().map(u64::to_string).collect();
        let what = match p.to {
            Some(to) => format!("{} -> {}", p.info.ty, to.name()),
            None => format!("{} kept", p.info.ty),
        };
        let why = p
            .note
            .as_deref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        note!(
            "[{done:>w$}/{total}] {:<40} [{}] {what}{why}",
            p.info.name,
            dims.join(", "),
            w = total.to_string().len()
        );
    });
    drop(out);
    let written = match result {
        Ok(bytes) => bytes,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e.into());
        }
    };
    if let Err(e) = std::fs::rename(&partial, &args.output) {
        let _ = std::fs::remove_file(&partial);
        bail!("cannot write {}: {e}", args.output.display());
    }
    let converted = plans.iter().filter(|p| p.to.is_some()).count();
    note!(
        "hesper: wrote {} ({n} tensors, {converted} converted): {:.2} MB -> {:.2} MB in {:.2} s",
        args.output.display(),
        file.len() as f64 / 1e6,
        written as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
