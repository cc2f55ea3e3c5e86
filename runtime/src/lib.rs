//! hesper-runtime: generation shared by every front end (see the crate README).
//!
//! * [`load`]: the backend `auto`/`cpu`/`gpu` picks, and a model loaded onto it;
//! * [`settings`]: sampling settings checked (named as llama.cpp's flags), a seed from the clock;
//! * [`evaluator`]: what predicts the next token: a model here ([`Local`]) or a ring;
//! * [`generation`]: one streamed completion, its [`Event`]s and [`Stats`];
//! * [`chat`]: a conversation in one context, trimmed when it outgrows it;
//! * [`perplexity`]: perplexity and KL divergence over a text, as `llama-perplexity` computes them;
//! * `scheduler` (native only): many sequences batched over one model, for a server;
//! * `grammar` (feature `grammar`): JSON schemas and grammars as token masks (llguidance);
//! * `ring` (feature `ring`, native only): a model split layer-wise over processes.

pub mod chat;
mod clock;
pub mod evaluator;
pub mod generation;
#[cfg(feature = "grammar")]
pub mod grammar;
pub mod load;
pub mod perplexity;
#[cfg(feature = "ring")]
pub mod ring;
#[cfg(not(target_arch = "wasm32"))]
pub mod scheduler;
pub mod settings;

pub use evaluator::{Evaluator, Local, ModelRef};
pub use generation::{complete, Completion, Event, Flow, Stats};

use hesper_engine::chat::ChatError;
use hesper_engine::model::ModelError;
use hesper_engine::tokenizer::TokenizerError;
use thiserror::Error;

/// What can go wrong while generating.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// The model refused (context full, a bad token, a device error).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Text could not be tokenized.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The chat template refused the conversation.
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// A setting that cannot mean anything.
    #[error(transparent)]
    Setting(#[from] settings::SettingError),
    /// A ring node failed or was lost.
    #[cfg(feature = "ring")]
    #[error(transparent)]
    Ring(#[from] ring::RingError),
    /// A hot-swap check refused the file (the weights loaded before stay).
    #[cfg(unix)]
    #[error(transparent)]
    Reload(#[from] hesper_engine::model::ReloadError),
    /// The front end could not take the output (e.g. a closed pipe).
    #[error(transparent)]
    Output(#[from] std::io::Error),
}
