//! A conversation kept in one context: the model's chat template renders it, and only the text
//! that a new message adds is evaluated. A message that does not fit after the history makes
//! the conversation start over in a fresh context with as many recent turns as fit; one that
//! does not fit even alone is refused. Either way the conversation goes on.

use hesper_engine::chat::{ChatTemplate, Role};
use hesper_engine::sampler::Sampler;
use hesper_engine::tokenizer::Tokenizer;

use crate::evaluator::Evaluator;
use crate::generation::{complete, Event, Flow, Stats};
use crate::RuntimeError;

/// A conversation's text; the tokens live in the session it is used with.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    /// The system prompt, kept through every trim.
    pub system: Option<String>,
    /// The turns in the context, oldest first.
    history: Vec<(Role, String)>,
    /// The text the context holds: the rendered prompts and the answers.
    context_text: String,
}

/// Tokens to evaluate, and the text the context holds once they are.
type Framed = (Vec<u32>, String);

/// What became of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// Answered with this text.
    Answered(String),
    /// Not sent: it does not fit the context even alone (an [`Event::Refused`] said so).
    Refused,
}

/// The evaluator, tokenizer and sampler a conversation runs on.
pub struct ChatContext<'a, E: Evaluator> {
    /// The model (or ring) with the context holding the conversation's tokens.
    pub eval: &'a mut E,
    /// Its tokenizer.
    pub tok: &'a Tokenizer,
    /// Its chat template.
    pub template: &'a ChatTemplate,
    /// The sampler.
    pub sampler: &'a mut Sampler,
    /// Most tokens per answer (negative: no limit).
    pub n_predict: i64,
    /// Timings, summed over turns.
    pub stats: &'a mut Stats,
}

impl Conversation {
    /// A conversation with an optional system prompt.
    pub fn new(system: Option<String>) -> Self {
        Self {
            system,
            ..Self::default()
        }
    }

    /// The turns currently in the context.
    pub fn history(&self) -> &[(Role, String)] {
        &self.history
    }

    /// Sends `message`, streams the answer through `on_event`, and keeps both in the history.
    pub async fn send<E: Evaluator>(
        &mut self,
        cx: &mut ChatContext<'_, E>,
        message: &str,
        on_event: &mut dyn FnMut(Event<'_>) -> Result<Flow, RuntimeError>,
    ) -> Result<Turn, RuntimeError> {
        let (tokens, text) = match self.continuation(cx, message)? {
            Some(t) => t,
            None => match self.restart_with(cx, message, on_event)? {
                Some(t) => t,
                None => return Ok(Turn::Refused),
            },
        };
        let done = complete(
            cx.eval,
            cx.tok,
            cx.sampler,
            &tokens,
            cx.n_predict,
            cx.stats,
            on_event,
        )
        .await;
        let done = match done {
            Ok(d) => d,
            Err(e) => {
                // The context may hold part of this turn: the next one starts afresh.
                self.history.clear();
                self.context_text.clear();
                cx.eval.truncate(0);
                return Err(e);
            }
        };
        self.history.push((Role::User, message.to_string()));
        self.history.push((Role::Assistant, done.text.clone()));
        self.context_text = text + &done.text;
        if done.stopped {
            // The answer's last token was shown but never evaluated: the next message renders
            // the conversation afresh.
            cx.eval.truncate(0);
        }
        Ok(Turn::Answered(done.text))
    }

    /// The tokens that add `message` to the conversation in the context, and the text the
    /// context then holds, if they fit with room for an answer: the whole conversation
    /// rendered, less the text the context holds already. `None` also when the rendering does
    /// not begin with that text (a template that rewrites past answers, or moves the system
    /// prompt to the latest message); the conversation is then evaluated afresh.
    fn continuation<E: Evaluator>(
        &self,
        cx: &ChatContext<'_, E>,
        message: &str,
    ) -> Result<Option<Framed>, RuntimeError> {
        let pos = cx.eval.pos();
        if pos == 0 {
            return self.fresh(cx, message, 0);
        }
        let mut turns = self.turns(0);
        turns.push((Role::User, message.to_string()));
        let next = cx.template.render(&turns, true)?;
        let Some(added) = next.strip_prefix(self.context_text.as_str()) else {
            return Ok(None);
        };
        let tokens = cx.tok.encode(added, false, true)?;
        Ok(fits(cx, pos, tokens).map(|t| (t, next)))
    }

    /// The system prompt and the turns from `history[from..]`.
    fn turns(&self, from: usize) -> Vec<(Role, String)> {
        let mut turns = Vec::new();
        if let Some(sys) = &self.system {
            turns.push((Role::System, sys.clone()));
        }
        turns.extend(self.history[from..].iter().cloned());
        turns
    }

    /// `message` after the system prompt and the turns from `history[from..]`, as a new
    /// context, with its text, if that fits.
    fn fresh<E: Evaluator>(
        &self,
        cx: &ChatContext<'_, E>,
        message: &str,
        from: usize,
    ) -> Result<Option<Framed>, RuntimeError> {
        let mut turns = self.turns(from);
        turns.push((Role::User, message.to_string()));
        let text = cx.template.render(&turns, true)?;
        let tokens = cx.tok.encode(&text, cx.tok.add_bos(), true)?;
        Ok(fits(cx, 0, tokens).map(|t| (t, text)))
    }

    /// Starts the context over with as many recent turns as fit before `message`; `None`
    /// when the message does not fit even alone.
    fn restart_with<E: Evaluator>(
        &mut self,
        cx: &mut ChatContext<'_, E>,
        message: &str,
        on_event: &mut dyn FnMut(Event<'_>) -> Result<Flow, RuntimeError>,
    ) -> Result<Option<Framed>, RuntimeError> {
        let n_ctx = cx.eval.n_ctx();
        // Whole exchanges (a message and its answer) are dropped, oldest first.
        for from in (0..=self.history.len()).step_by(2) {
            if let Some(framed) = self.fresh(cx, message, from)? {
                self.history.drain(..from);
                cx.eval.truncate(0);
                if from > 0 {
                    on_event(Event::Trimmed {
                        kept: self.history.len(),
                        n_ctx,
                    })?;
                }
                return Ok(Some(framed));
            }
        }
        let tokens = cx.tok.encode(message, false, true)?.len();
        on_event(Event::Refused { tokens, n_ctx })?;
        Ok(None)
    }
}

/// `tokens` if they fit after `pos` with at least one position left for the answer.
fn fits<E: Evaluator>(cx: &ChatContext<'_, E>, pos: usize, tokens: Vec<u32>) -> Option<Vec<u32>> {
    (pos + tokens.len() < cx.eval.n_ctx()).then_some(tokens)
}
