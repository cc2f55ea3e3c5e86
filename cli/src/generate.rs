//! `hesper-rs generate`: stream text from a prompt, or chat with `--chat`.

use std::io::{BufRead, Write};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use hesper_engine::backend::Backend;
use hesper_engine::chat::{format_prompt, format_turn, Role};
use hesper_engine::model::{Logits, Model, Session};
use hesper_engine::sampler::{Sampler, SamplerConfig};
use hesper_engine::tokenizer::{TextStream, Tokenizer};

use crate::args::{ContextArgs, ModelArgs};
use crate::load::{load, run_model};

/// Flags of `generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    ctx: ContextArgs,
    /// Prompt text.
    #[arg(short = 'p', long = "prompt", default_value = "Once upon a time")]
    prompt: String,
    /// Tokens to generate (-1 = until end of text or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_hyphen_values = true)]
    n_predict: i64,
    /// Interactive chat using the model's chat template.
    #[arg(long = "chat", visible_alias = "conversation", short_alias = 'i')]
    chat: bool,
    /// System prompt for --chat.
    #[arg(long = "system-prompt", short = 's', value_name = "TEXT")]
    system_prompt: Option<String>,
    /// Sampling temperature (0 = greedy).
    #[arg(long = "temp", default_value_t = 0.8)]
    temp: f32,
    /// Top-k sampling (0 = off).
    #[arg(long = "top-k", default_value_t = 40)]
    top_k: usize,
    /// Top-p (nucleus) sampling (1.0 = off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    top_p: f32,
    /// Min-p sampling (0.0 = off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    min_p: f32,
    /// Penalise repeats of the last --repeat-last-n tokens (1.0 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Tokens the repeat penalty looks back over.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    repeat_last_n: usize,
    /// Random seed (default: from the clock); the same seed gives the same text.
    #[arg(long = "seed", short = 'S')]
    seed: Option<u64>,
}

impl GenerateArgs {
    fn sampler(&self) -> Result<Sampler> {
        if !(0.0..=1.0).contains(&self.top_p) || !(0.0..=1.0).contains(&self.min_p) {
            bail!("--top-p and --min-p must lie between 0 and 1");
        }
        if self.temp.is_nan() || self.repeat_penalty <= 0.0 {
            bail!("--temp must be a number and --repeat-penalty positive");
        }
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        Ok(Sampler::new(SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed,
        }))
    }
}

/// Timings for the closing stats line.
#[derive(Default)]
struct Stats {
    prompt_tokens: usize,
    prompt_ms: f64,
    gen_tokens: usize,
    gen_ms: f64,
}

/// Runs `generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    let loaded = load(&args.model, None)?;
    let Some(tok) = loaded.tokenizer.as_ref() else {
        bail!("{} has no tokenizer (tokenizer.ggml.model is missing or \"none\"); use `hesper-rs logits --tokens`", loaded.model.file().source);
    };
    run_model!(&loaded.model, |model| generate_on(
        &args,
        model,
        tok,
        loaded.load_ms
    ))
}

/// `generate` on a model loaded on any backend.
fn generate_on<B: Backend>(
    args: &GenerateArgs,
    model: &Model<B>,
    tok: &Tokenizer,
    load_ms: f64,
) -> Result<()> {
    let n_ctx = args.ctx.ctx_size.unwrap_or(model.config.n_ctx_train).max(1);
    let mut session = model.new_session(n_ctx, args.ctx.batch_size)?;
    let mut sampler = args.sampler()?;
    let banner = || {
        eprintln!(
            "hesper: {} | {} | ctx {n_ctx}",
            model.file.source,
            model.backend.name()
        )
    };
    let mut stats = Stats::default();
    if args.chat {
        banner();
        chat(args, model, tok, &mut session, &mut sampler, &mut stats)?;
    } else {
        let prompt = tok.encode(&args.prompt, tok.add_bos(), true)?;
        if prompt.len() > n_ctx {
            bail!(
                "the prompt is {} tokens, longer than the context ({n_ctx}); raise -c/--ctx-size",
                prompt.len()
            );
        }
        banner();
        print!("{}", args.prompt);
        complete(
            model,
            tok,
            &mut session,
            &mut sampler,
            &prompt,
            args.n_predict,
            &mut stats,
        )?;
        println!();
    }
    print_stats(load_ms, &stats);
    Ok(())
}

/// What one evaluation hands the sampler.
enum Next {
    /// The greedy choice, found by the backend.
    Token(u32),
    /// The last position's logits.
    Logits(Vec<f32>),
}

/// Evaluates `input`, then samples and streams tokens until end of generation, `n_predict`
/// tokens, or a full context. Returns the token that ended generation, if any.
fn complete<B: Backend>(
    model: &Model<B>,
    tok: &Tokenizer,
    session: &mut Session<B>,
    sampler: &mut Sampler,
    input: &[u32],
    n_predict: i64,
    stats: &mut Stats,
) -> Result<Option<u32>> {
    for &t in input {
        sampler.accept(t);
    }
    // Greedy decoding needs only the argmax, which the backend finds without handing back
    // the logits (on a GPU: a 4-byte read-back instead of the whole vocabulary).
    let greedy = sampler.is_greedy();
    let step = |session: &mut Session<B>, input: &[u32]| -> Result<Next> {
        Ok(if greedy {
            Next::Token(model.eval_greedy(session, input)?)
        } else {
            Next::Logits(model.eval(session, input, Logits::Last)?)
        })
    };
    let t0 = Instant::now();
    let mut next_of = step(session, input)?;
    stats.prompt_ms += t0.elapsed().as_secs_f64() * 1e3;
    stats.prompt_tokens += input.len();
    let mut stream = TextStream::new(tok);
    let mut out = std::io::stdout().lock();
    let mut produced = 0i64;
    let t0 = Instant::now();
    let mut end = None;
    while n_predict < 0 || produced < n_predict {
        let next = match &next_of {
            Next::Token(t) => *t,
            Next::Logits(logits) => sampler.sample(logits),
        };
        if tok.is_end_of_generation(next) {
            end = Some(next);
            break;
        }
        sampler.accept(next);
        write!(out, "{}", stream.push(next))?;
        out.flush()?;
        produced += 1;
        if session.pos() >= session.n_ctx() {
            eprintln!("\nhesper: context full ({} tokens)", session.n_ctx());
            break;
        }
        next_of = step(session, &[next])?;
    }
    write!(out, "{}", stream.finish())?;
    stats.gen_ms += t0.elapsed().as_secs_f64() * 1e3;
    stats.gen_tokens += produced as usize;
    Ok(end)
}

fn chat<B: Backend>(
    args: &GenerateArgs,
    model: &Model<B>,
    tok: &Tokenizer,
    session: &mut Session<B>,
    sampler: &mut Sampler,
    stats: &mut Stats,
) -> Result<()> {
    eprintln!("hesper: chat mode; type a message and press Enter, Ctrl-D to quit");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut pending_end: Option<u32> = None;
    let mut first = true;
    loop {
        eprint!("\n> ");
        let Some(line) = lines.next() else { break };
        let line = line.context("cannot read stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        let mut text = String::new();
        let mut input = Vec::new();
        if first {
            let mut turns = Vec::new();
            if let Some(sys) = &args.system_prompt {
                turns.push((Role::System, sys.clone()));
            }
            turns.push((Role::User, line));
            text.push_str(&format_prompt(&turns));
        } else {
            // The previous answer must end with its end-of-turn token.
            match pending_end.take() {
                Some(t) => input.push(t),
                None => text.push_str("<|eot_id|>"),
            }
            text.push_str(&format_turn(Role::User, &line));
            text.push_str("Assistant: ");
        }
        input.extend(tok.encode(&text, first && tok.add_bos(), true)?);
        first = false;
        if session.pos() + input.len() > session.n_ctx() {
            bail!(
                "the conversation no longer fits the context ({} tokens); raise -c/--ctx-size",
                session.n_ctx()
            );
        }
        pending_end = complete(model, tok, session, sampler, &input, args.n_predict, stats)?;
        println!();
    }
    Ok(())
}

fn print_stats(load_ms: f64, s: &Stats) {
    let per = |ms: f64, n: usize| {
        if n > 0 {
            (ms / n as f64, 1e3 * n as f64 / ms)
        } else {
            (0.0, 0.0)
        }
    };
    let (pp_ms, pp_tps) = per(s.prompt_ms, s.prompt_tokens);
    let (tg_ms, tg_tps) = per(s.gen_ms, s.gen_tokens);
    eprintln!();
    eprintln!("hesper:        load time = {load_ms:10.2} ms");
    eprintln!(
        "hesper: prompt eval time = {:10.2} ms / {:5} tokens ({pp_ms:8.2} ms per token, {pp_tps:8.2} tokens per second)",
        s.prompt_ms, s.prompt_tokens
    );
    eprintln!("hesper:        eval time = {:10.2} ms / {:5} runs   ({tg_ms:8.2} ms per token, {tg_tps:8.2} tokens per second)", s.gen_ms, s.gen_tokens);
}
