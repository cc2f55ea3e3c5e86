//! `hesper-rs generate`: stream text from a prompt, or chat with `--chat`. The generation
//! itself (sampling, stopping, chat framing) is `hesper-runtime`'s; this file parses flags
//! and prints.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use hesper_engine::backend::Backend;
use hesper_engine::chat::TemplateOrigin;
use hesper_engine::gguf::Gguf;
use hesper_engine::model::Reload;
use hesper_engine::sampler::{Sampler, SamplerConfig};
use hesper_engine::tokenizer::Tokenizer;
use hesper_runtime::chat::{ChatContext, Conversation, Turn};
use hesper_runtime::settings;
use hesper_runtime::{
    complete, run_model, with_model, Evaluator, Event, Flow, Local, ModelRef, RuntimeError, Stats,
};

use crate::args::{ContextArgs, ModelArgs};
use crate::chat_template::chat_template;
use crate::load::load_with;
use crate::report::{note, note_inline};

/// Most tokens of a chat reply when `-n` is not given.
const CHAT_REPLY_TOKENS: usize = 512;

/// The prompt when `-p` is not given (and `--chat` is off).
const DEFAULT_PROMPT: &str = "Once upon a time";

/// Flags of `generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub ctx: ContextArgs,
    /// Prompt text (default "Once upon a time"); with --chat, the first message.
    #[arg(
        help_heading = "Prompt",
        short = 'p',
        long = "prompt",
        value_name = "TEXT"
    )]
    pub prompt: Option<String>,
    /// Read the prompt from a file instead of -p.
    #[arg(
        help_heading = "Prompt",
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "prompt"
    )]
    pub file: Option<PathBuf>,
    /// The prompt, as -p gives it (`hesper-rs generate "Hello there"`).
    #[arg(
        help_heading = "Prompt",
        value_name = "PROMPT",
        conflicts_with_all = ["prompt", "file"]
    )]
    pub positional_prompt: Option<String>,
    /// Tokens to generate (default: until end of text).
    ///
    /// -1 = until end of text or a full context that does not shift, and
    /// in chat until the end of the turn or 512 tokens, a quarter of the context at most;
    /// -2 = until end of text or a full context, shifting or not).
    #[arg(help_heading = "Prompt", short = 'n', long = "n-predict", value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,
    /// Interactive chat using the model's chat template (also `hesper-rs chat`).
    #[arg(
        help_heading = "Prompt",
        long = "chat",
        visible_alias = "conversation",
        short_alias = 'i'
    )]
    pub chat: bool,
    /// System prompt for --chat (also -sys).
    #[arg(help_heading = "Prompt", long = "system-prompt", value_name = "TEXT")]
    system_prompt: Option<String>,
    /// A Jinja chat template for --chat instead of the file's `tokenizer.chat_template`.
    #[arg(
        help_heading = "Prompt",
        long = "chat-template-file",
        value_name = "FILE"
    )]
    chat_template_file: Option<PathBuf>,
    /// With --chat: before each message, swap in the tensors that changed in the model file
    /// and evaluate the conversation again with them, as if they had always been there. The
    /// model is read into memory instead of mapped.
    #[arg(long = "hot-swap")]
    pub hot_swap: bool,
    /// Sampling temperature (0 or below = greedy).
    #[arg(
        help_heading = "Sampling",
        long = "temp",
        value_name = "T",
        default_value_t = 0.8,
        allow_negative_numbers = true
    )]
    temp: f32,
    /// Top-k sampling (0 = off).
    #[arg(
        help_heading = "Sampling",
        long = "top-k",
        value_name = "N",
        default_value_t = 40
    )]
    top_k: usize,
    /// Top-p (nucleus) sampling (1.0 = off).
    #[arg(
        help_heading = "Sampling",
        long = "top-p",
        value_name = "P",
        default_value_t = 0.95
    )]
    top_p: f32,
    /// Min-p sampling (0.0 = off).
    #[arg(
        help_heading = "Sampling",
        long = "min-p",
        value_name = "P",
        default_value_t = 0.05
    )]
    min_p: f32,
    /// Penalise repeats of the last --repeat-last-n tokens (1.0 = off).
    #[arg(
        help_heading = "Sampling",
        long = "repeat-penalty",
        value_name = "F",
        default_value_t = 1.0
    )]
    repeat_penalty: f32,
    /// Tokens the penalties look back over.
    #[arg(
        help_heading = "Sampling",
        long = "repeat-last-n",
        value_name = "N",
        default_value_t = 64
    )]
    repeat_last_n: usize,
    /// Subtract this from a recent token's logit per time it occurs (0.0 = off).
    #[arg(
        help_heading = "Sampling",
        long = "frequency-penalty",
        value_name = "F",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    frequency_penalty: f32,
    /// Subtract this from a recent token's logit once if it occurs (0.0 = off).
    #[arg(
        help_heading = "Sampling",
        long = "presence-penalty",
        value_name = "F",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    presence_penalty: f32,
    /// Random seed (default or -1: from the clock); the same seed gives the same text.
    #[arg(
        help_heading = "Sampling",
        long = "seed",
        value_name = "N",
        short = 's',
        short_alias = 'S',
        allow_negative_numbers = true
    )]
    seed: Option<Seed>,
    /// When the context is full: stop (`none`), or shift it (`sinks`).
    ///
    /// With `sinks`: keep the first --keep
    /// positions, discard half of the rest and go on, later keys rotated to their new
    /// positions (llama.cpp's context shift). Text after a shift no longer sees what was
    /// discarded: on the built-in model (-c 256, 7 935 held-out tokens) PPL 24.40 shifting,
    /// 24.63 with --keep 0, 26.23 restarting empty when full, 84.70 holding all 8 192 positions
    /// (past its training context; BENCHMARKS.md). Dense attention; not over a ring or in --chat.
    #[arg(
        help_heading = "Context and attention",
        long = "context-shift",
        value_enum,
        default_value = "none"
    )]
    context_shift: ContextShift,
    /// Positions kept at the start when the context shifts (attention sinks) [default: 4].
    #[arg(
        help_heading = "Context and attention",
        long = "keep",
        value_name = "N"
    )]
    keep: Option<usize>,
}

/// `--context-shift` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextShift {
    /// Stop at a full context.
    None,
    /// Keep the first --keep positions, discard half of the rest.
    Sinks,
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
    /// Reads `-f FILE` (or the positional prompt) into the prompt (as -p would give it).
    pub fn read_prompt_file(&mut self) -> Result<()> {
        if let Some(text) = self.positional_prompt.take() {
            self.prompt = Some(text);
        }
        if let Some(path) = &self.file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("-f/--file {}: cannot read it as text", path.display()))?;
            self.prompt = Some(text);
        }
        Ok(())
    }

    /// These flags with `--chat` on (`hesper-rs chat`).
    pub fn into_chat(self) -> Self {
        Self { chat: true, ..self }
    }

    /// `--hot-swap` is checked between a chat's turns: refused without `--chat`.
    pub fn check_hot_swap(&self) -> Result<()> {
        if self.hot_swap && !self.chat {
            bail!("--hot-swap applies to --chat (checked between turns), perplexity, serve and ring workers");
        }
        Ok(())
    }

    /// Rejects flag combinations and values that cannot mean anything.
    pub fn check(&self) -> Result<()> {
        if self.n_predict < -2 {
            bail!(
                "-n/--n-predict {}: give a count, or -1 for until end of text",
                self.n_predict
            );
        }
        if self.system_prompt.is_some() && !self.chat {
            bail!("-sys/--system-prompt applies to --chat (a plain prompt has no chat template)");
        }
        if self.chat_template_file.is_some() && !self.chat {
            bail!("--chat-template-file applies to --chat (a plain prompt has no chat template)");
        }
        self.ctx.attention.config()?;
        if self.context_shift == ContextShift::None && self.keep.is_some() {
            bail!("--keep applies to --context-shift sinks");
        }
        if self.context_shift == ContextShift::Sinks && self.chat {
            bail!("--context-shift applies to a plain prompt (--chat drops whole turns instead)");
        }
        Ok(())
    }

    /// Most tokens per chat reply: `-n`, or for -1 [`CHAT_REPLY_TOKENS`] (a quarter of the
    /// context at most), so a model that never ends its turn hands it back.
    fn chat_reply_limit(&self, n_ctx: usize) -> i64 {
        match self.n_predict {
            -1 => CHAT_REPLY_TOKENS.min(n_ctx / 4).max(1) as i64,
            n => n,
        }
    }

    /// Positions kept when the context shifts, `None` when it does not.
    pub fn shift_keep(&self) -> Option<usize> {
        (self.context_shift == ContextShift::Sinks).then(|| self.keep.unwrap_or(4))
    }

    /// The sampling flags as the sampler's settings (a seed from the clock when none or -1).
    pub fn sampling(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: Vec::new(),
            seed: self
                .seed
                .and_then(|s| s.0)
                .unwrap_or_else(settings::clock_seed),
        }
    }
}

/// Runs `generate`.
pub fn run(mut args: GenerateArgs) -> Result<()> {
    args.check()?;
    args.check_hot_swap()?;
    args.read_prompt_file()?;
    // Bad sampling flags fail before a model is loaded.
    let sampler = settings::sampler(args.sampling())?;
    let loaded = load_with(&args.model, None, args.hot_swap)?;
    let Some(tok) = loaded.tokenizer.as_ref() else {
        bail!("{} has no tokenizer (tokenizer.ggml.model is missing or \"none\"); use `hesper-rs logits --tokens`", loaded.model.file().source);
    };
    let load_ms = loaded.load_ms;
    if args.hot_swap {
        // The model is lent mutably to the chat, which swaps tensors in between turns: the
        // CPU's operations are then handed to its threads one by one.
        let mut model = loaded.model;
        return with_model!(&mut model, |model| generate_on(
            &args, model, tok, sampler, load_ms
        ));
    }
    run_model!(&loaded.model, |model| generate_on(
        &args, model, tok, sampler, load_ms
    ))
}

/// `generate` on a model loaded on any backend, shared or lent for hot-swap.
fn generate_on<B: Backend, M: ModelRef<B>>(
    args: &GenerateArgs,
    model: M,
    tok: &Tokenizer,
    sampler: Sampler,
    load_ms: f64,
) -> Result<()> {
    let m = model.get();
    let n_ctx = args.ctx.n_ctx(m.config.n_ctx_train);
    let attention = args.ctx.attention.config()?;
    let mut session = m.new_session_with(n_ctx, args.ctx.batch_size, &attention)?;
    session.set_context_shift(args.shift_keep())?;
    ContextArgs::note_past_training(n_ctx, m.config.n_ctx_train);
    let label = format!("{} | {}", m.file.source, m.backend.name());
    // The header is read before the chat may swap the model's file for a newer one.
    let header = m.file.clone();
    let mut local = Local {
        model,
        session: &mut session,
    };
    let stats = drive(args, &mut local, (tok, header.header()), sampler, &label)?;
    if session.discarded() > 0 {
        note!(
            "hesper: the context shifted: {} positions discarded in all",
            session.discarded()
        );
    }
    print_stats(load_ms, &stats);
    Ok(())
}

/// What `generate` does once its model is ready, on any evaluator (a model here, or a
/// ring): the prompt's completion or the chat, text on stdout, notes on stderr.
pub fn drive<E: Evaluator>(
    args: &GenerateArgs,
    eval: &mut E,
    (tok, header): (&Tokenizer, &Gguf),
    mut sampler: Sampler,
    label: &str,
) -> Result<Stats> {
    let n_ctx = eval.n_ctx();
    let banner = || {
        note!("hesper: {label} | ctx {n_ctx}");
        crate::report::flush_later();
    };
    let mut stats = Stats::default();
    if args.chat {
        let template = chat_template(args.chat_template_file.as_deref(), header, tok)?;
        banner();
        if *template.origin() != TemplateOrigin::PlainText {
            note!("hesper: chat template: {}", template.origin());
        } else {
            note!("hesper: this model names no chat format, so none is forced on it: each line you type goes on from the text so far, and the model goes on from it (--chat-template-file gives one)");
        }
        let mut cx = ChatContext {
            eval,
            tok,
            template: &template,
            sampler: &mut sampler,
            n_predict: args.chat_reply_limit(n_ctx),
            stats: &mut stats,
        };
        chat(args, &mut cx)?;
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
        drop(out);
        pollster::block_on(complete(
            eval,
            tok,
            &mut sampler,
            &prompt,
            args.n_predict,
            &mut stats,
            &mut print_event,
        ))?;
        writeln!(std::io::stdout())?;
    }
    Ok(stats)
}

/// Prints one event: text on stdout as it comes, notes on stderr.
fn print_event(e: Event<'_>) -> Result<Flow, RuntimeError> {
    match e {
        Event::Text(t) => {
            let mut out = std::io::stdout().lock();
            out.write_all(t.as_bytes())?;
            out.flush()?;
        }
        Event::ContextFull { n_ctx } => note!("\nhesper: context full ({n_ctx} tokens)"),
        Event::Trimmed { kept: 0, n_ctx } => note!(
            "hesper: the conversation outgrew the context ({n_ctx} tokens); it starts over from this message"
        ),
        Event::Trimmed { kept, n_ctx } => note!(
            "hesper: the conversation outgrew the context ({n_ctx} tokens); it goes on from its {kept} latest turns"
        ),
        Event::Refused { tokens, n_ctx } => note!(
            "hesper: this message is {tokens} tokens, too long for the context ({n_ctx} tokens, an answer needs room too); not sent (raise -c/--ctx-size)"
        ),
    }
    Ok(Flow::Continue)
}

/// An interactive chat: one turn per line of stdin (`-p`, if given, is the first). A line
/// that is not UTF-8 is refused with a note; the conversation itself trims or refuses what
/// does not fit; a turn the model fails starts the conversation over.
fn chat<E: Evaluator>(args: &GenerateArgs, cx: &mut ChatContext<'_, E>) -> Result<()> {
    note!("hesper: chat mode; type a message and press Enter, Ctrl-D to quit");
    let mut conversation = Conversation::new(args.system_prompt.clone());
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut first = args.prompt.clone();
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
        if line.trim().is_empty() {
            continue;
        }
        if args.hot_swap {
            swap_between_turns(cx.eval);
        }
        match pollster::block_on(conversation.send(cx, &line, &mut print_event)) {
            Ok(Turn::Answered(_)) => writeln!(std::io::stdout())?,
            Ok(Turn::Refused) => {}
            // The model refused this turn (not the terminal): the conversation starts over.
            Err(RuntimeError::Model(e)) => {
                note!("\nhesper: this turn failed ({e}); the conversation starts over")
            }
            // Nothing was evaluated: the conversation goes on without this message.
            Err(RuntimeError::Chat(e)) => note!("hesper: {e}; not sent"),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Swaps in what changed in the model file; the conversation is then evaluated again (its
/// context forgotten), so that it goes on as if the new weights had always been there. A file
/// the swap refuses keeps the weights loaded before, and is looked at again before the next
/// message.
fn swap_between_turns<E: Evaluator>(eval: &mut E) {
    let start = std::time::Instant::now();
    match eval.reload() {
        Ok(Reload::Unchanged) => {}
        Ok(Reload::Swapped(swap)) => {
            eval.truncate(0);
            note!(
                "hesper: hot-swap: {} swapped in ({:.1} ms); the conversation is evaluated again with them",
                swap.describe(),
                start.elapsed().as_secs_f64() * 1e3
            );
        }
        Err(e) => note!("hesper: hot-swap: {e}; the weights loaded before stay (looked at again before the next message)"),
    }
}

/// One line of stdin.
enum Line {
    Text(String),
    NotUtf8,
    End,
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

/// llama.cpp's closing timing lines, on stderr.
pub fn print_stats(load_ms: f64, s: &Stats) {
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
