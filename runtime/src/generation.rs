//! One streamed completion: evaluate the input, then sample, stop and detokenize token by
//! token, handing the text to the front end as it becomes valid UTF-8.

use hesper_engine::model::{Prediction, Readout};
use hesper_engine::sampler::Sampler;
use hesper_engine::tokenizer::{TextStream, Tokenizer};

use crate::clock::now_ms;
use crate::evaluator::Evaluator;
use crate::RuntimeError;

/// What a completion tells its front end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<'a> {
    /// Generated text, in order (control tokens left out).
    Text(&'a str),
    /// Generation stopped because the context holds `n_ctx` positions, all used.
    ContextFull {
        /// Context size.
        n_ctx: usize,
    },
    /// A chat turn did not fit; earlier turns were dropped and `kept` remain.
    Trimmed {
        /// Turns still in the context.
        kept: usize,
        /// Context size.
        n_ctx: usize,
    },
    /// A chat message was not sent: `tokens` (with the framing an answer needs) do not fit
    /// a context of `n_ctx` even alone.
    Refused {
        /// The message's length in tokens.
        tokens: usize,
        /// Context size.
        n_ctx: usize,
    },
}

/// What the front end wants after an event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Flow {
    /// Go on.
    #[default]
    Continue,
    /// Stop generating (a stop button); honoured after [`Event::Text`]. The completion ends
    /// as if its token limit had been reached.
    Stop,
}

/// Where the time went, summed over completions (llama.cpp's closing lines).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Input tokens evaluated.
    pub prompt_tokens: usize,
    /// Time evaluating them, ms.
    pub prompt_ms: f64,
    /// Tokens generated.
    pub gen_tokens: usize,
    /// Time generating them, ms.
    pub gen_ms: f64,
}

/// How a completion ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The end-of-generation token that ended it, if one did.
    pub end: Option<u32>,
    /// Whether the front end stopped it ([`Flow::Stop`]).
    pub stopped: bool,
    /// The text generated (as shown).
    pub text: String,
}

/// Evaluates `input` at the evaluator's next positions, then samples and streams tokens
/// until an end-of-generation token, `n_predict` tokens (negative: no limit) or a full context
/// (one that does not shift: [`Evaluator::has_room`]; with `n_predict` −2, as llama.cpp's, a
/// context that would shift stops the generation too).
pub async fn complete<E: Evaluator>(
    eval: &mut E,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    input: &[u32],
    n_predict: i64,
    stats: &mut Stats,
    on_event: &mut dyn FnMut(Event<'_>) -> Result<Flow, RuntimeError>,
) -> Result<Completion, RuntimeError> {
    for &t in input {
        sampler.accept(t);
    }
    // Greedy decoding needs only the argmax and top-k sampling only the top k, which the
    // backend finds without handing back the logits (on a GPU: 4 or 8·k bytes read back
    // instead of the whole vocabulary).
    let readout = if sampler.is_greedy() {
        Readout::Argmax
    } else {
        sampler
            .backend_top_k()
            .map_or(Readout::Logits, Readout::Top)
    };
    let t0 = now_ms();
    let mut next_of = eval.predict(input, readout).await?;
    stats.prompt_ms += now_ms() - t0;
    stats.prompt_tokens += input.len();
    let mut stream = TextStream::for_display(tok);
    let mut text = String::new();
    let mut produced = 0i64;
    let t0 = now_ms();
    let mut end = None;
    let mut stopped = false;
    while n_predict < 0 || produced < n_predict {
        let next = match &next_of {
            Prediction::Token(t) => *t,
            Prediction::Top(top) => sampler.sample_top(top.clone()),
            Prediction::Logits(logits) => sampler.sample(logits),
        };
        if tok.is_end_of_generation(next) {
            end = Some(next);
            break;
        }
        sampler.accept(next);
        let piece = stream.push(next);
        let flow = on_event(Event::Text(&piece))?;
        text.push_str(&piece);
        produced += 1;
        if flow == Flow::Stop {
            stopped = true;
            break;
        }
        let full = eval.pos() >= eval.n_ctx();
        if !eval.has_room() || (n_predict == -2 && full) {
            on_event(Event::ContextFull {
                n_ctx: eval.n_ctx(),
            })?;
            break;
        }
        next_of = eval.predict(&[next], readout).await?;
    }
    let rest = stream.finish();
    if !rest.is_empty() {
        on_event(Event::Text(&rest))?;
        text.push_str(&rest);
    }
    stats.gen_ms += now_ms() - t0;
    stats.gen_tokens += produced as usize;
    Ok(Completion { end, stopped, text })
}
