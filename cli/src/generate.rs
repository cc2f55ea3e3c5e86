//! `hesper-rs generate`: stream text from a prompt, or chat with `--chat`.

use std::io::{BufRead, Write};
use std::str::FromStr;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use hesper_engine::backend::Backend;
use hesper_engine::chat::{format_prompt, Role};
use hesper_engine::model::{Logits, Model, ModelError, Session};
use hesper_engine::sampler::{Sampler, SamplerConfig};
use hesper_engine::tokenizer::{TextStream, Tokenizer};

use crate::args::{ContextArgs, ModelArgs};
use crate::load::{load, run_model};
use crate::report::{note, note_inline, one_line};

/// The prompt when `-p` is not given (and `--chat` is off).
const DEFAULT_PROMPT: &str = "Once upon a time";

/// Flags of `generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    ctx: ContextArgs,
    /// Prompt text (default "Once upon a time"); with --chat, the first message.
    #[arg(short = 'p', long = "prompt")]
    prompt: Option<String>,
    /// Tokens to generate (-1 or -2 = until end of text or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,
    /// Interactive chat using the model's chat template (also `hesper-rs chat`).
    #[arg(long = "chat", visible_alias = "conversation", short_alias = 'i')]
    chat: bool,
    /// System prompt for --chat.
    #[arg(long = "system-prompt", short = 's', value_name = "TEXT")]
    system_prompt: Option<String>,
    /// Sampling temperature (0 or below = greedy).
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
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
    /// Random seed (default or -1: from the clock); the same seed gives the same text.
    #[arg(long = "seed", short = 'S', allow_negative_numbers = true)]
    seed: Option<Seed>,
}

/// `--seed`: a number, or -1 for one from the clock (llama.cpp's spelling).
#[derive(Debug, Clone, Copy)]
struct Seed(Option<u64>);

impl FromStr for Seed {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "-1" => Ok(Self(None)),
            t => t
                .parse()
                .map(|v| Self(Some(v)))
                .map_err(|_| format!("expected a number from 0 to {} or -1", u64::MAX)),
        }
    }
}

impl GenerateArgs {
    /// These flags with `--chat` on (`hesper-rs chat`).
    pub fn into_chat(self) -> Self {
        Self { chat: true, ..self }
    }

    /// Rejects flag combinations and values that cannot mean anything.
    fn check(&self) -> Result<()> {
        if self.n_predict < -2 {
            bail!(
                "-n/--n-predict {}: give a count, or -1 for until end of text",
                self.n_predict
            );
        }
        if self.system_prompt.is_some() && !self.chat {
            bail!("-s/--system-prompt applies to --chat (a plain prompt has no chat template)");
        }
        Ok(())
    }

    fn sampler(&self) -> Result<Sampler> {
        let unit = |v: f32| (0.0..=1.0).contains(&v);
        if !unit(self.top_p) {
            bail!("--top-p {}: must lie between 0 and 1", self.top_p);
        }
        if !unit(self.min_p) {
            bail!("--min-p {}: must lie between 0 and 1", self.min_p);
        }
        if !self.temp.is_finite() {
            bail!(
                "--temp {}: must be a finite number (0 or below = greedy)",
                self.temp
            );
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            bail!(
                "--repeat-penalty {}: must be a finite number above 0 (1 = off)",
                self.repeat_penalty
            );
        }
        let seed = self.seed.and_then(|s| s.0).unwrap_or_else(|| {
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
    args.check()?;
    // Bad sampling flags fail before a model is loaded.
    args.sampler()?;
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
    let n_ctx = args.ctx.n_ctx(model.config.n_ctx_train);
    let mut session = model.new_session(n_ctx, args.ctx.batch_size)?;
    ContextArgs::note_past_training(n_ctx, model.config.n_ctx_train);
    let mut sampler = args.sampler()?;
    let banner = || {
        note!(
            "hesper: {} | {} | ctx {n_ctx}",
            model.file.source,
            model.backend.name()
        )
    };
    let mut stats = Stats::default();
    if args.chat {
        banner();
        let mut chat = Chat {
            args,
            model,
            tok,
            session: &mut session,
            sampler: &mut sampler,
            stats: &mut stats,
            history: Vec::new(),
            pending_end: None,
        };
        chat.run()?;
    } else {
        let text = args.prompt.as_deref().unwrap_or(DEFAULT_PROMPT);
        let prompt = tok.encode(text, tok.add_bos(), true)?;
        if prompt.len() > n_ctx {
            bail!(
                "the prompt is {} tokens, longer than the context ({n_ctx}); raise -c/--ctx-size",
                prompt.len()
            );
        }
        banner();
        let mut out = std::io::stdout().lock();
        write!(out, "{text}")?;
        complete(
            model,
            tok,
            &mut session,
            &mut sampler,
            &prompt,
            args.n_predict,
            &mut stats,
        )?;
        writeln!(out)?;
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

/// How a completion ended.
struct Completion {
    /// The end-of-generation token that ended it, if one did.
    end: Option<u32>,
    /// The text shown.
    text: String,
}

/// Evaluates `input`, then samples and streams tokens until end of generation, `n_predict`
/// tokens, or a full context.
fn complete<B: Backend>(
    model: &Model<B>,
    tok: &Tokenizer,
    session: &mut Session<B>,
    sampler: &mut Sampler,
    input: &[u32],
    n_predict: i64,
    stats: &mut Stats,
) -> Result<Completion> {
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
    let mut stream = TextStream::for_display(tok);
    let mut out = std::io::stdout().lock();
    let mut text = String::new();
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
        let piece = stream.push(next);
        write!(out, "{piece}")?;
        out.flush()?;
        text.push_str(&piece);
        produced += 1;
        if session.pos() >= session.n_ctx() {
            note!("\nhesper: context full ({} tokens)", session.n_ctx());
            break;
        }
        next_of = step(session, &[next])?;
    }
    let rest = stream.finish();
    write!(out, "{rest}")?;
    text.push_str(&rest);
    stats.gen_ms += t0.elapsed().as_secs_f64() * 1e3;
    stats.gen_tokens += produced as usize;
    Ok(Completion { end, text })
}

/// An interactive chat: one turn per line of stdin. A turn that cannot be taken (invalid
/// UTF-8, a message longer than the context) is refused with a note and the chat goes on;
/// when the conversation outgrows the context, its oldest turns are dropped, saying so.
struct Chat<'a, B: Backend> {
    args: &'a GenerateArgs,
    model: &'a Model<B>,
    tok: &'a Tokenizer,
    session: &'a mut Session<B>,
    sampler: &'a mut Sampler,
    stats: &'a mut Stats,
    /// The turns in the context, oldest first (the system prompt is not among them).
    history: Vec<(Role, String)>,
    /// The token that ended the last answer, still to be fed back.
    pending_end: Option<u32>,
}

/// One line of stdin.
enum Line {
    Text(String),
    NotUtf8,
    End,
}

impl<B: Backend> Chat<'_, B> {
    fn run(&mut self) -> Result<()> {
        note!("hesper: chat mode; type a message and press Enter, Ctrl-D to quit");
        let stdin = std::io::stdin();
        let mut input = stdin.lock();
        let mut first = self.args.prompt.clone();
        loop {
            let line = match first.take() {
                Some(p) => {
                    note!("\n> {p}");
                    p
                }
                None => {
                    note_inline!("\n> ");
                    match read_line(&mut input)? {
                        Line::Text(t) => t,
                        Line::NotUtf8 => {
                            note!("hesper: that line is not valid UTF-8; not sent");
                            continue;
                        }
                        Line::End => break,
                    }
                }
            };
            if !line.trim().is_empty() {
                self.turn(line)?;
            }
        }
        Ok(())
    }

    /// Sends one user message and streams the answer.
    fn turn(&mut self, message: String) -> Result<()> {
        let tokens = match self.continuation(&message)? {
            Some(t) => t,
            None => match self.restart_with(&message)? {
                Some(t) => t,
                None => return Ok(()),
            },
        };
        let done = complete(
            self.model,
            self.tok,
            self.session,
            self.sampler,
            &tokens,
            self.args.n_predict,
            self.stats,
        );
        let done = match done {
            Ok(d) => d,
            // The model refused (not the terminal): the context may hold part of this turn,
            // so the next one starts afresh.
            Err(e) if e.downcast_ref::<ModelError>().is_some() => {
                note!(
                    "\nhesper: this turn failed ({}); the conversation starts over",
                    one_line(&e)
                );
                self.history.clear();
                self.session.truncate(0);
                self.pending_end = None;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        writeln!(std::io::stdout())?;
        self.history.push((Role::User, message));
        self.history.push((Role::Assistant, done.text));
        self.pending_end = done.end;
        Ok(())
    }

    /// The tokens that add `message` to the conversation in the context, if they fit with
    /// room for an answer.
    fn continuation(&mut self, message: &str) -> Result<Option<Vec<u32>>> {
        if self.session.pos() == 0 {
            return self.fresh(message, 0);
        }
        let mut input = Vec::new();
        let mut text = String::new();
        // The previous answer must end with its end-of-turn token.
        match self.pending_end {
            Some(t) => input.push(t),
            None => text.push_str("<|eot_id|>"),
        }
        text.push_str(&format_prompt(&[(Role::User, message.to_string())]));
        input.extend(self.tok.encode(&text, false, true)?);
        Ok(self.fits(self.session.pos(), input))
    }

    /// `message` after the system prompt and the turns from `history[from..]`, as a new
    /// context, if that fits.
    fn fresh(&self, message: &str, from: usize) -> Result<Option<Vec<u32>>> {
        let mut turns = Vec::new();
        if let Some(sys) = &self.args.system_prompt {
            turns.push((Role::System, sys.clone()));
        }
        turns.extend(self.history[from..].iter().cloned());
        turns.push((Role::User, message.to_string()));
        let tokens = self
            .tok
            .encode(&format_prompt(&turns), self.tok.add_bos(), true)?;
        Ok(self.fits(0, tokens))
    }

    /// `tokens` if they fit after `pos` with at least one position left for the answer.
    fn fits(&self, pos: usize, tokens: Vec<u32>) -> Option<Vec<u32>> {
        (pos + tokens.len() < self.session.n_ctx()).then_some(tokens)
    }

    /// Starts the context over with as many recent turns as fit before `message`; `None`
    /// (and a note) when the message does not fit even alone.
    fn restart_with(&mut self, message: &str) -> Result<Option<Vec<u32>>> {
        let n_ctx = self.session.n_ctx();
        // Whole exchanges (a user turn and its answer) are dropped, oldest first.
        for from in (0..=self.history.len()).step_by(2) {
            if let Some(tokens) = self.fresh(message, from)? {
                note!(
                    "hesper: the conversation outgrew the context ({n_ctx} tokens); it goes on from its {} latest turn(s)",
                    self.history.len() - from
                );
                self.history.drain(..from);
                self.session.truncate(0);
                self.pending_end = None;
                return Ok(Some(tokens));
            }
        }
        let alone = self.tok.encode(message, false, true)?.len();
        note!(
            "hesper: this message is {alone} tokens, too long for the context ({n_ctx} tokens, an answer needs room too); not sent (raise -c/--ctx-size)"
        );
        Ok(None)
    }
}

/// Reads one line of stdin without its line ending.
fn read_line(input: &mut impl BufRead) -> Result<Line> {
    let mut bytes = Vec::new();
    if input.read_until(b'\n', &mut bytes)? == 0 {
        return Ok(Line::End);
    }
    while matches!(bytes.last(), Some(b'\n' | b'\r')) {
        bytes.pop();
    }
    Ok(String::from_utf8(bytes).map_or(Line::NotUtf8, Line::Text))
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
    note!();
    note!("hesper:        load time = {load_ms:10.2} ms");
    note!(
        "hesper: prompt eval time = {:10.2} ms / {:5} tokens ({pp_ms:8.2} ms per token, {pp_tps:8.2} tokens per second)",
        s.prompt_ms, s.prompt_tokens
    );
    note!("hesper:        eval time = {:10.2} ms / {:5} runs   ({tg_ms:8.2} ms per token, {tg_tps:8.2} tokens per second)", s.gen_ms, s.gen_tokens);
}
