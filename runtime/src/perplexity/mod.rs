//! Perplexity and KL divergence over a token sequence, as llama.cpp's `llama-perplexity`
//! computes them.
//!
//! The tokens are cut into chunks of `n_ctx`; each chunk is evaluated from an empty context with
//! its first token replaced by BOS (when the model adds one), and only the second half of each
//! chunk is scored: position `j` in `n_ctx/2 .. n_ctx-1` predicts token `j + 1`, so every scored
//! token sees at least `n_ctx/2` tokens before it. A token's negative log-likelihood is
//! `-(l[t] - max l - ln Σ exp(l - max l))`, in f64; PPL = exp(mean NLL), and its error is the
//! standard error of the mean NLL times PPL.
//!
//! * [`score_chunk`] evaluates one chunk and hands back the log-probabilities of its scored
//!   positions;
//! * [`Accumulator`] gathers NLLs into a [`Estimate`];
//! * [`kl::Divergence`] compares log-probabilities with a base model's, [`base_file`] keeps them;
//! * [`text::tokenize_for`] tokenizes as much of a text as the chunks need.

pub mod base_file;
pub mod kl;
pub mod text;

use hesper_engine::backend::Backend;
use hesper_engine::model::{Logits, Model, ModelError, Session};
use thiserror::Error;

/// Why a perplexity run cannot start.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PerplexityError {
    /// Fewer tokens than one chunk.
    #[error("the text gives {tokens} tokens; a context of {n_ctx} needs at least {n_ctx} (use a longer text or a smaller -c)")]
    TooShort {
        /// Tokens the text gave.
        tokens: usize,
        /// The context asked for.
        n_ctx: usize,
    },
    /// A context too small to score anything.
    #[error("-c {0}: perplexity needs a context of at least 4 tokens")]
    ContextTooSmall(usize),
}

/// How the tokens are cut into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunks {
    /// Tokens per chunk (the context).
    pub n_ctx: usize,
    /// Chunks evaluated.
    pub n_chunk: usize,
}

impl Chunks {
    /// As many whole chunks of `n_ctx` as `n_tokens` holds, at most `max_chunks`.
    pub fn new(
        n_tokens: usize,
        n_ctx: usize,
        max_chunks: Option<usize>,
    ) -> Result<Self, PerplexityError> {
        if n_ctx < 4 {
            return Err(PerplexityError::ContextTooSmall(n_ctx));
        }
        let whole = n_tokens / n_ctx;
        if whole == 0 {
            return Err(PerplexityError::TooShort {
                tokens: n_tokens,
                n_ctx,
            });
        }
        let n_chunk = max_chunks.map_or(whole, |m| m.clamp(1, whole));
        Ok(Self { n_ctx, n_chunk })
    }

    /// The first scored position of a chunk.
    pub fn first(&self) -> usize {
        self.n_ctx / 2
    }

    /// Tokens scored per chunk.
    pub fn scored(&self) -> usize {
        self.n_ctx - 1 - self.first()
    }

    /// The tokens of chunk `i` of `tokens`.
    pub fn chunk<'a>(&self, tokens: &'a [u32], i: usize) -> &'a [u32] {
        &tokens[i * self.n_ctx..(i + 1) * self.n_ctx]
    }
}

/// Log-probabilities of one row of logits, computed in f64 and stored as f32.
pub fn log_softmax(logits: &[f32], out: &mut [f32]) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let norm = max + sum.ln();
    for (o, &l) in out.iter_mut().zip(logits) {
        *o = (l as f64 - norm) as f32;
    }
}

/// Evaluates `chunk` from an empty context (its first token replaced by `bos` when given), `batch`
/// tokens per step, and returns the log-probabilities of its scored positions,
/// `[chunks.scored()][n_vocab]`. Async for the browser's read-back; natively
/// `pollster::block_on` drives it.
pub async fn score_chunk<B: Backend>(
    model: &Model<B>,
    session: &mut Session<B>,
    chunks: &Chunks,
    chunk: &[u32],
    bos: Option<u32>,
    batch: usize,
) -> Result<Vec<f32>, ModelError> {
    let n_vocab = model.config.n_vocab;
    let first = chunks.first();
    let mut tokens = chunk.to_vec();
    if let Some(bos) = bos {
        tokens[0] = bos;
    }
    session.truncate(0);
    let mut out = vec![0f32; chunks.scored() * n_vocab];
    let mut pos = 0;
    for piece in tokens.chunks(batch.max(1)) {
        let logits = model.eval_async(session, piece, Logits::All).await?;
        for (k, row) in logits.chunks_exact(n_vocab).enumerate() {
            let p = pos + k;
            if (first..first + chunks.scored()).contains(&p) {
                let at = (p - first) * n_vocab;
                log_softmax(row, &mut out[at..at + n_vocab]);
            }
        }
        pos += piece.len();
    }
    Ok(out)
}

/// The tokens a chunk's scored positions predict.
pub fn targets<'a>(chunks: &Chunks, chunk: &'a [u32]) -> &'a [u32] {
    &chunk[chunks.first() + 1..chunks.n_ctx]
}

/// Running sums of negative log-likelihoods.
#[derive(Debug, Clone, Copy, Default)]
pub struct Accumulator {
    sum: f64,
    sum2: f64,
    count: usize,
}

/// A perplexity with its standard error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// exp(mean NLL).
    pub ppl: f64,
    /// Standard error of the mean NLL, times `ppl` (0 with fewer than two tokens).
    pub err: f64,
    /// Mean NLL, nats per token.
    pub mean_nll: f64,
    /// Tokens scored.
    pub count: usize,
}

impl Accumulator {
    /// Adds one token's NLL.
    pub fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.sum2 += nll * nll;
        self.count += 1;
    }

    /// Adds the NLL of every scored position of a chunk: `logp` as [`score_chunk`] gives it.
    pub fn add_chunk(&mut self, logp: &[f32], targets: &[u32]) {
        let n_vocab = logp.len() / targets.len().max(1);
        for (row, &t) in logp.chunks_exact(n_vocab).zip(targets) {
            self.add(-(row[t as usize] as f64));
        }
    }

    /// The estimate so far.
    pub fn estimate(&self) -> Estimate {
        let n = self.count.max(1) as f64;
        let mean = self.sum / n;
        let var = self.sum2 / n - mean * mean;
        let ppl = mean.exp();
        let err = if self.count > 1 && var > 0.0 {
            (var / (n - 1.0)).sqrt() * ppl
        } else {
            0.0
        };
        Estimate {
            ppl,
            err,
            mean_nll: mean,
            count: self.count,
        }
    }
}

#[cfg(test)]
mod tests;
