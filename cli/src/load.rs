//! Opening a model: the file (or the built-in demo model), a progress bar while a large file
//! is paged in, the CPU backend and the tokenizer.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use hesper_cpu::CpuBackend;
use hesper_engine::file::ModelFile;
use hesper_engine::model::{LoadOptions, Model};
use hesper_engine::tokenizer::Tokenizer;
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::ModelArgs;

/// The demo model built into the binary (random weights; see models/README.md).
const BUILTIN_MODEL: &[u8] = include_bytes!("../../models/hesper-tiny.gguf");
/// Label shown for the built-in model.
pub const BUILTIN_LABEL: &str = "built-in hesper-tiny.gguf (random weights, demo only)";
/// Files above this size get a progress bar while they are paged in.
const PROGRESS_BYTES: usize = 64 << 20;

/// A model ready to run.
pub struct Loaded {
    /// The model on the CPU backend.
    pub model: Model<CpuBackend>,
    /// Its tokenizer, when the file has one.
    pub tokenizer: Option<Tokenizer>,
    /// Wall time of loading, in milliseconds.
    pub load_ms: f64,
}

/// Opens the file named by `args` (or the built-in model) without building a model.
pub fn open_file(args: &ModelArgs) -> Result<Arc<ModelFile>> {
    match &args.gguf {
        Some(path) => Ok(ModelFile::open(path)?),
        None => Ok(ModelFile::from_bytes(
            BUILTIN_MODEL.to_vec(),
            BUILTIN_LABEL,
        )?),
    }
}

/// Loads the model named by `args` onto the CPU backend, holding `layers` (all when `None`).
pub fn load(args: &ModelArgs, layers: Option<Range<usize>>) -> Result<Loaded> {
    let start = Instant::now();
    let file = open_file(args)?;
    if file.len() > PROGRESS_BYTES {
        page_in(&file);
    }
    let tokenizer = args
        .tokenizer(file.header())
        .with_context(|| format!("{}: cannot build the tokenizer", file.source))?;
    let backend = CpuBackend::new(args.threads())?;
    let model = Model::load(
        backend,
        file.clone(),
        LoadOptions {
            layers,
            head: args.lm_head.into(),
            progress: None,
        },
    )
    .with_context(|| format!("{}: cannot load the model", file.source))?;
    Ok(Loaded {
        model,
        tokenizer,
        load_ms: start.elapsed().as_secs_f64() * 1e3,
    })
}

/// Touches every page of the file so the first token does not pay for disk reads, showing a
/// progress bar (hidden when stderr is not a terminal).
fn page_in(file: &ModelFile) {
    let bytes = file.bytes();
    let bar = ProgressBar::new(bytes.len() as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "loading {msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(file.source.clone());
    let mut sink = 0u8;
    for chunk in bytes.chunks(16 << 20) {
        sink ^= chunk.iter().step_by(4096).fold(0u8, |a, &b| a ^ b);
        bar.inc(chunk.len() as u64);
    }
    std::hint::black_box(sink);
    bar.finish_and_clear();
}
