//! hesper-runtime: generation shared by every front end (see the crate README).
//!
//! * [`load`]: the backend `auto`/`cpu`/`gpu` picks, and a model loaded onto it;
//! * [`settings`]: sampling settings checked (named as llama.cpp's flags), a seed from the clock;
//! * [`generation`]: one streamed completion, its [`Event`]s and [`Stats`];
//! * [`chat`]: a conversation in one context, trimmed when it outgrows it.

pub mod chat;
mod clock;
pub mod generation;
pub mod load;
pub mod settings;

pub use generation::{complete, Completion, Event, Flow, Stats};

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
    /// A setting that cannot mean anything.
    #[error(transparent)]
    Setting(#[from] settings::SettingError),
    /// The front end could not take the output (e.g. a closed pipe).
    #[error(transparent)]
    Output(#[from] std::io::Error),
}
