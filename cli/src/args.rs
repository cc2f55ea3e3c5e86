//! Flags shared by several sub-commands, spelled like llama.cpp's.

use std::path::PathBuf;

use clap::Args;

/// Which model to load and how to run it.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file (default: the tiny demo model built into hesper-rs).
    #[arg(
        long = "gguf",
        short = 'm',
        visible_alias = "model",
        value_name = "FILE"
    )]
    pub gguf: Option<PathBuf>,
    /// CPU threads (default: all cores).
    #[arg(short = 't', long = "threads", value_name = "N")]
    pub threads: Option<usize>,
}

impl ModelArgs {
    /// Worker threads to use.
    pub fn threads(&self) -> usize {
        self.threads
            .filter(|&t| t > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

/// Context and batching.
#[derive(Args, Debug, Clone)]
pub struct ContextArgs {
    /// Context size in tokens (default: the model's training context).
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<usize>,
    /// Tokens evaluated per step while processing a prompt.
    #[arg(
        short = 'b',
        long = "batch-size",
        value_name = "N",
        default_value_t = 256
    )]
    pub batch_size: usize,
}
