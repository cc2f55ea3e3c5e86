//! `hesper-rs perplexity`: perplexity of a model over a text file, and KL divergence against a
//! base model's saved log-probabilities, with `llama-perplexity`'s flags and figures
//! (the arithmetic lives in `hesper_runtime::perplexity`).

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use hesper_engine::backend::Backend;
use hesper_engine::model::{Model, Reload};
use hesper_runtime::load::AnyModel;
use hesper_runtime::perplexity::base_file::{self, Header};
use hesper_runtime::perplexity::kl::{Divergence, Report, Spread};
use hesper_runtime::perplexity::text::tokenize_for;
use hesper_runtime::perplexity::{score_chunk, targets, Accumulator, Chunks};
use hesper_runtime::run_model;

use crate::args::{ContextArgs, ModelArgs};
use crate::load::load_with;
use crate::output::OutputFile;
use crate::report::note;
use hesper_engine::attention::AttentionConfig;

/// Flags of `perplexity`.
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    ctx: ContextArgs,
    /// Text file to score (UTF-8), cut into chunks of -c tokens; the second half of each chunk
    /// is scored, as llama-perplexity does.
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        required_unless_present = "kl_divergence",
        conflicts_with = "kl_divergence"
    )]
    file: Option<PathBuf>,
    /// Score at most N chunks (default: every whole chunk the text holds).
    #[arg(long = "chunks", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    chunks: Option<u64>,
    /// Save every scored token's log-probabilities to FILE, the base of a later
    /// `--kl-divergence` run (f32: n_vocab × 4 bytes per scored token). With --kl-divergence:
    /// the base file to compare with.
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    kl_base: Option<PathBuf>,
    /// Compare this model with the base file named by --kl-divergence-base, on its tokens and
    /// context: KL divergence, Δp of the right token, same top token, both perplexities.
    #[arg(long = "kl-divergence", requires = "kl_base")]
    kl_divergence: bool,
    /// Loop as ik_llama.cpp's hot-swap does: after each pass, run --pre-reload-script, swap in
    /// the tensors that changed in the model file, and measure again; the loop ends when a
    /// check finds nothing changed. The model is read into memory instead of mapped.
    #[arg(long = "hot-swap", conflicts_with_all = ["kl_base", "kl_divergence"])]
    hot_swap: bool,
    /// A program run before each --hot-swap check (it edits the model file, e.g. with
    /// `hesper-rs quantize`); its failure ends the loop.
    #[arg(long = "pre-reload-script", value_name = "PATH", requires = "hot_swap")]
    pre_reload_script: Option<PathBuf>,
}

/// Runs `perplexity`.
pub fn run(args: PerplexityArgs) -> Result<()> {
    let attention = args.ctx.attention.config()?;
    let base_name = args.kl_base.as_ref().map(|p| p.display().to_string());
    // A base file to write is started first: a path that cannot be written, or that is the
    // model or the text, fails before any work.
    let base_file = match (&args.kl_base, args.kl_divergence) {
        (Some(path), false) => {
            let inputs: Vec<&Path> = (args.model.file.gguf.iter().chain(&args.file))
                .map(PathBuf::as_path)
                .collect();
            Some((path, OutputFile::create(path, &inputs)?))
        }
        _ => None,
    };
    let mut base_in = None;
    let mut text = None;
    if args.kl_divergence {
        let path = args.kl_base.as_ref().expect("clap requires it");
        let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let mut r = BufReader::with_capacity(1 << 20, f);
        let header = Header::read(&mut r).with_context(|| path.display().to_string())?;
        let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        if len != header.file_len() {
            bail!(
                "{}: the KL base file holds {len} bytes where its header promises {} (truncated?)",
                path.display(),
                header.file_len()
            );
        }
        base_in = Some((header, r));
    } else if let Some(path) = &args.file {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        text = Some(
            String::from_utf8(bytes)
                .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text ({e})", path.display()))?,
        );
    }
    let mut loaded = load_with(&args.model, None, args.hot_swap)?;
    let n_vocab = loaded.model.config().n_vocab;
    let bos = loaded
        .tokenizer
        .as_ref()
        .filter(|t| t.add_bos())
        .and_then(|t| t.bos());
    let (chunks, tokens) = match (&base_in, &text) {
        (Some((header, _)), _) => {
            if let Some(c) = args
                .ctx
                .ctx_size
                .filter(|&c| c != 0 && c != header.chunks.n_ctx)
            {
                bail!(
                    "-c {c}: the base file {} was made with -c {}",
                    base_name.as_deref().unwrap_or_default(),
                    header.chunks.n_ctx
                );
            }
            if header.n_vocab != n_vocab {
                bail!(
                    "the base file has a vocabulary of {} tokens, this model {n_vocab}",
                    header.n_vocab
                );
            }
            let mut chunks = header.chunks;
            if let Some(m) = args.chunks {
                chunks.n_chunk = chunks.n_chunk.min(m as usize);
            }
            (chunks, header.tokens.clone())
        }
        (None, Some(text)) => {
            let Some(tok) = &loaded.tokenizer else {
                bail!("this model has no tokenizer to read the text with");
            };
            let start = Instant::now();
            let n_ctx = args.ctx.n_ctx(loaded.model.config().n_ctx_train);
            let max_chunks = args.chunks.map(|m| m as usize);
            let needed = max_chunks.map(|m| m.saturating_mul(n_ctx));
            let (tokens, bytes) = tokenize_for(tok, text, needed)?;
            let chunks = Chunks::new(tokens.len(), n_ctx, max_chunks)?;
            let of = if bytes < text.len() {
                format!(
                    " (the first {bytes} of {} bytes, enough for the chunks)",
                    text.len()
                )
            } else {
                String::new()
            };
            note!(
                "perplexity: {} tokens{of}, tokenized in {:.0} ms",
                tokens.len(),
                start.elapsed().as_secs_f64() * 1e3
            );
            (chunks, tokens)
        }
        (None, None) => bail!("pass -f FILE, or --kl-divergence with --kl-divergence-base FILE"),
    };
    let mut base_out = match base_file {
        Some((path, mut w)) => {
            let header = Header {
                chunks,
                n_vocab,
                tokens: tokens[..chunks.n_chunk * chunks.n_ctx].to_vec(),
            };
            header.write(&mut w)?;
            note!(
                "perplexity: saving log-probabilities to {} ({:.1} MB)",
                path.display(),
                header.file_len() as f64 / 1e6
            );
            Some(w)
        }
        None => None,
    };
    note!("perplexity: backend: {}", loaded.model.backend_name());
    note!(
        "perplexity: calculating perplexity over {} chunks, n_ctx={}, batch_size={}",
        chunks.n_chunk,
        chunks.n_ctx,
        args.ctx.batch_size.min(chunks.n_ctx)
    );
    let mut job = Job {
        chunks,
        tokens: &tokens,
        bos,
        batch: args.ctx.batch_size,
        attention,
        base_in: base_in.as_mut().map(|(_, r)| r as &mut (dyn Read + Send)),
        base_out: base_out.as_mut().map(|w| w as &mut (dyn Write + Send)),
    };
    run_model!(&loaded.model, |model| job.run(model))?;
    if args.hot_swap {
        hot_swap_loop(
            &mut loaded.model,
            args.pre_reload_script.as_deref(),
            &mut job,
        )?;
    }
    if let Some(w) = base_out {
        w.commit()?;
    }
    Ok(())
}

/// ik_llama.cpp's hot-swap loop: run the script, swap in what changed, measure again, until
/// a check finds nothing changed. A file the swap refuses ends the loop with its reason.
fn hot_swap_loop(model: &mut AnyModel, script: Option<&Path>, job: &mut Job<'_>) -> Result<()> {
    for pass in 2.. {
        if let Some(script) = script {
            let status = std::process::Command::new(script)
                .status()
                .with_context(|| {
                    format!("--pre-reload-script {}: cannot run it", script.display())
                })?;
            if !status.success() {
                bail!(
                    "--pre-reload-script {}: {status}; the hot-swap loop ends",
                    script.display()
                );
            }
        }
        let start = Instant::now();
        let swap = match model.reload_changed() {
            Ok(Reload::Swapped(swap)) => swap,
            Ok(Reload::Unchanged) => {
                note!("perplexity: hot-swap: no tensor changed; done");
                return Ok(());
            }
            Err(e) => bail!("hot-swap: {e}; the loop ends with the weights loaded before"),
        };
        note!(
            "perplexity: hot-swap pass {pass}: {} tensor(s) swapped in in {:.1} ms ({:.1} MB read): {}",
            swap.tensors.len(),
            start.elapsed().as_secs_f64() * 1e3,
            swap.bytes_read as f64 / 1e6,
            swap.describe()
        );
        run_model!(&*model, |m| job.run(m))?;
    }
    Ok(())
}

/// One perplexity run over loaded tokens.
struct Job<'a> {
    chunks: Chunks,
    tokens: &'a [u32],
    bos: Option<u32>,
    batch: usize,
    attention: AttentionConfig,
    base_in: Option<&'a mut (dyn Read + Send)>,
    base_out: Option<&'a mut (dyn Write + Send)>,
}

impl Job<'_> {
    fn run<B: Backend>(&mut self, model: &Model<B>) -> Result<()> {
        let c = self.chunks;
        let n_vocab = model.config.n_vocab;
        if let Some(&t) = self.tokens.iter().find(|&&t| t as usize >= n_vocab) {
            bail!("token id {t} is outside the vocabulary (size {n_vocab})");
        }
        let batch = self.batch.clamp(1, c.n_ctx);
        let mut session = model.new_session_with(c.n_ctx, batch, &self.attention)?;
        let mut ppl = Accumulator::default();
        let mut kl = Divergence::default();
        let mut base = vec![0f32; c.scored() * n_vocab];
        let mut out = std::io::stdout().lock();
        if self.base_in.is_some() {
            writeln!(
                out,
                "chunk             PPL  ln(PPL(Q)/PPL(base))  KL divergence    Δp RMS  Same top p"
            )?;
        }
        let start = Instant::now();
        for i in 0..c.n_chunk {
            let chunk = c.chunk(self.tokens, i);
            let logp = pollster::block_on(score_chunk(
                model,
                &mut session,
                &c,
                chunk,
                self.bos,
                self.batch,
            ))?;
            if i == 0 {
                let secs = start.elapsed().as_secs_f64();
                note!(
                    "perplexity: {secs:.2} seconds per pass - ETA {:.2} minutes",
                    secs * c.n_chunk as f64 / 60.0
                );
            }
            let want = targets(&c, chunk);
            if let Some(w) = self.base_out.as_mut() {
                base_file::write_chunk(w, &logp).context("cannot write the base file")?;
            }
            match self.base_in.as_mut() {
                Some(r) => {
                    base_file::read_chunk(r, &mut base, n_vocab, i * c.scored())?;
                    kl.add_chunk(&logp, &base, want);
                    let r = kl.report();
                    writeln!(
                        out,
                        "{:5} {:15.4} {:21.5} {:14.5} {:8.3}% {:10.3}%",
                        i + 1,
                        r.ppl.ppl,
                        r.ln_ppl_ratio.mean,
                        r.kld.mean,
                        100.0 * r.rms_dp.mean,
                        100.0 * r.same_top.mean
                    )?;
                }
                None => {
                    ppl.add_chunk(&logp, want);
                    write!(out, "[{}]{:.4},", i + 1, ppl.estimate().ppl)?;
                    out.flush()?;
                }
            }
        }
        if self.base_in.is_some() {
            print_report(&mut out, &kl.report())?;
        } else {
            let e = ppl.estimate();
            writeln!(out)?;
            writeln!(out, "Final estimate: PPL = {:.4} +/- {:.5}", e.ppl, e.err)?;
        }
        Ok(())
    }
}

/// The statistics block of `llama-perplexity --kl-divergence`.
fn print_report(out: &mut impl Write, r: &Report) -> std::io::Result<()> {
    let (q, b) = (r.ppl, r.ppl_base);
    writeln!(out, "\n====== Perplexity statistics ======")?;
    writeln!(out, "Tokens scored                 : {}", r.count)?;
    writeln!(
        out,
        "Mean PPL(Q)                   : {:10.6} ± {:10.6}",
        q.ppl, q.err
    )?;
    writeln!(
        out,
        "Mean PPL(base)                : {:10.6} ± {:10.6}",
        b.ppl, b.err
    )?;
    writeln!(
        out,
        "Cor(ln(PPL(Q)), ln(PPL(base))): {:9.2}%",
        100.0 * r.cor_ln_p
    )?;
    let l = r.ln_ppl_ratio;
    writeln!(
        out,
        "Mean ln(PPL(Q)/PPL(base))     : {:10.6} ± {:10.6}",
        l.mean, l.err
    )?;
    writeln!(
        out,
        "Mean PPL(Q)/PPL(base)         : {:10.6} ± {:10.6}",
        l.mean.exp(),
        l.mean.exp() * l.err
    )?;
    writeln!(out, "\n====== KL divergence statistics ======")?;
    writeln!(out, "Mean    KLD: {:10.6} ± {:10.6}", r.kld.mean, r.kld.err)?;
    spread(out, "KLD", &r.kld_spread, 1.0, "")?;
    writeln!(out, "\n====== Token probability statistics ======")?;
    writeln!(
        out,
        "Mean    Δp: {:8.3} ± {:5.3} %",
        100.0 * r.dp.mean,
        100.0 * r.dp.err
    )?;
    spread(out, "Δp", &r.dp_spread, 100.0, " %")?;
    writeln!(
        out,
        "RMS Δp    : {:8.3} ± {:5.3} %",
        100.0 * r.rms_dp.mean,
        100.0 * r.rms_dp.err
    )?;
    writeln!(
        out,
        "Same top p: {:8.3} ± {:5.3} %",
        100.0 * r.same_top.mean,
        100.0 * r.same_top.err
    )
}

fn spread(
    out: &mut impl Write,
    what: &str,
    s: &Spread,
    scale: f64,
    unit: &str,
) -> std::io::Result<()> {
    for (label, v) in [
        ("Maximum", s.max),
        ("99.9%  ", s.p99_9),
        ("99.0%  ", s.p99),
        ("95.0%  ", s.p95),
        ("90.0%  ", s.p90),
        ("Median ", s.median),
        ("10.0%  ", s.p10),
        (" 5.0%  ", s.p5),
        (" 1.0%  ", s.p1),
        (" 0.1%  ", s.p0_1),
        ("Minimum", s.min),
    ] {
        writeln!(out, "{label} {what}: {:10.6}{unit}", scale * v)?;
    }
    Ok(())
}
