//! Opening a model: the file (or the built-in default model), the backend `--backend` picks
//! (`hesper-runtime`), a progress bar on long work, and the tokenizer.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use hesper_engine::file::ModelFile;
use hesper_engine::model::HeadPlace;
use hesper_engine::source::{read_header, FileSource};
use hesper_engine::tokenizer::Tokenizer;
use hesper_runtime::load::{load as load_model, AnyModel, LoadSettings, Progress};
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::{FileArgs, ModelArgs};
use crate::report::note;

/// The default model built into the binary: tiny, trained on the King James Bible
/// (models/README.md).
const BUILTIN_MODEL: &[u8] = include_bytes!("../../models/hesper-kjv.gguf");
/// The built-in model's file name.
pub const BUILTIN_FILE: &str = "hesper-kjv.gguf";
/// Label shown for the built-in model.
pub const BUILTIN_LABEL: &str = "built-in hesper-kjv.gguf (4 M parameters, King James Bible)";
/// Files above this size get a progress bar while they are paged in or uploaded.
const PROGRESS_BYTES: u64 = 64 << 20;

/// A model ready to run.
pub struct Loaded {
    /// The model.
    pub model: AnyModel,
    /// Its tokenizer, when the file has one.
    pub tokenizer: Option<Tokenizer>,
    /// Wall time of loading, in milliseconds.
    pub load_ms: f64,
}

/// Opens the file named by `args` (or the built-in model) without building a model.
pub fn open_file(args: &FileArgs) -> Result<Arc<ModelFile>> {
    match model_path(args)? {
        Some(path) => Ok(ModelFile::open(&path)?),
        None => Ok(ModelFile::from_bytes(
            BUILTIN_MODEL.to_vec(),
            BUILTIN_LABEL,
        )?),
    }
}

/// The path of the model file `args` names (after a download for `-hf`); `None` for the
/// built-in model.
fn model_path(args: &FileArgs) -> Result<Option<PathBuf>> {
    Ok(match (&args.hf_repo, &args.gguf) {
        (Some(repo), _) => Some(crate::pull::model_path(repo, args.hf_file.as_deref())?),
        (None, path) => path.clone(),
    })
}

/// Loads the model named by `args` onto the backend `--backend` picks, holding `layers`
/// (all when `None`).
pub fn load(args: &ModelArgs, layers: Option<Range<usize>>) -> Result<Loaded> {
    load_with(args, layers, false)
}

/// [`load`], or with `hot_swap` the model read into memory with every tensor hashed, so that
/// [`AnyModel::reload_changed`] can swap in what changes on disk.
pub fn load_with(args: &ModelArgs, layers: Option<Range<usize>>, hot_swap: bool) -> Result<Loaded> {
    load_part(args, layers, HeadPlace::LastLayer, hot_swap)
}

/// [`load_with`], the LM head held where `head_place` says (a ring node's share).
pub fn load_part(
    args: &ModelArgs,
    layers: Option<Range<usize>>,
    head_place: HeadPlace,
    hot_swap: bool,
) -> Result<Loaded> {
    let start = Instant::now();
    args.check_threads()?;
    args.note_thread_cap();
    args.note_llama_flags();
    let (file, hot_swap) = if hot_swap {
        let Some(path) = model_path(&args.file)? else {
            bail!("--hot-swap watches a model file: name one with -m FILE (the built-in model has none)");
        };
        // Only the header is read here; the load reads each tensor into memory.
        let mut source = FileSource::open(&path)?;
        (pollster::block_on(read_header(&mut source))?, Some(path))
    } else {
        (open_file(&args.file)?, None)
    };
    let tokenizer = args
        .file
        .tokenizer(file.header())
        .with_context(|| format!("{}: cannot build the tokenizer", file.source))?;
    let settings = LoadSettings {
        backend: args.kernels.backend.into(),
        threads: args.threads(),
        head: args.lm_head.into(),
        layers,
        head_place,
        repack: !args.kernels.no_repack,
        cpu_isa: args.kernels.cpu_kernels,
        hot_swap,
    };
    let mut bars = Bars::new(&file);
    let model = load_model(&file, &settings, &mut |p| bars.show(p), &mut |n| {
        note!("hesper: {n}")
    })?;
    if model.on_software_adapter() {
        crate::report::later(format!("hesper: {} is a software adapter, running on the CPU far slower than the CPU backend: use --backend cpu here", model.backend_name()));
    }
    // Said once the model loaded, so a file that cannot run gets only its error line.
    for w in tokenizer.iter().flat_map(Tokenizer::warnings) {
        note!("hesper: tokenizer metadata: {w}");
    }
    let (sampled, rows) = (model.sampled_vocab(), model.config().n_vocab);
    if sampled < rows {
        note!("hesper: the tokenizer has {sampled} tokens and the LM head {rows} rows: ids {sampled} and above have no text and are never picked");
    }
    Ok(Loaded {
        model,
        tokenizer,
        load_ms: start.elapsed().as_secs_f64() * 1e3,
    })
}

/// Progress bars for a large file (hidden when stderr is not a terminal).
struct Bars {
    source: String,
    big: bool,
    bar: Option<ProgressBar>,
}

impl Bars {
    fn new(file: &ModelFile) -> Self {
        Self {
            source: file.source.clone(),
            big: file.len() > PROGRESS_BYTES,
            bar: None,
        }
    }

    fn show(&mut self, p: Progress) {
        if !self.big {
            return;
        }
        let (template, done, total) = match p {
            Progress::PagingIn { done, total } => (
                "loading {msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})",
                done,
                total,
            ),
            Progress::Tensors { done, total } => (
                "preparing {msg} [{bar:40}] {pos}/{len} tensors",
                done as u64,
                total as u64,
            ),
            Progress::Done => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                return;
            }
        };
        let source = &self.source;
        let bar = self.bar.get_or_insert_with(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.set_message(source.clone());
            bar
        });
        bar.set_length(total);
        bar.set_position(done);
    }
}
