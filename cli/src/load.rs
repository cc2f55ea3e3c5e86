//! Opening a model: the file (or the built-in demo model), the backend `--backend` picks, a
//! progress bar on long work, and the tokenizer.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use hesper_cpu::CpuBackend;
use hesper_engine::backend::Backend;
use hesper_engine::file::ModelFile;
use hesper_engine::model::{LoadOptions, Model};
use hesper_engine::tokenizer::Tokenizer;
use hesper_gpu_backend::{hardware_gpu_possible, GpuBackend};
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::{BackendChoice, ModelArgs};
use crate::report::{note, one_line};

/// The demo model built into the binary (random weights; see models/README.md).
const BUILTIN_MODEL: &[u8] = include_bytes!("../../models/hesper-tiny.gguf");
/// Label shown for the built-in model.
pub const BUILTIN_LABEL: &str = "built-in hesper-tiny.gguf (random weights, demo only)";
/// Files above this size get a progress bar while they are paged in or uploaded.
const PROGRESS_BYTES: usize = 64 << 20;

/// A model on whichever backend was chosen.
// One per process: the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum AnyModel {
    /// On the CPU.
    Cpu(Model<CpuBackend>),
    /// On a WebGPU adapter.
    Gpu(Model<GpuBackend>),
}

impl AnyModel {
    /// The file the model was loaded from.
    pub fn file(&self) -> &Arc<ModelFile> {
        with_model!(self, |m| &m.file)
    }
}

/// Runs `$body` with `$m` bound to the model, whatever its backend.
macro_rules! with_model {
    ($any:expr, |$m:ident| $body:expr) => {
        match $any {
            $crate::load::AnyModel::Cpu($m) => $body,
            $crate::load::AnyModel::Gpu($m) => $body,
        }
    };
}
pub(crate) use with_model;

/// Like [`with_model!`] for work that runs the model: on the CPU, `$body` runs on one of the
/// backend's own threads (see `CpuBackend::install`), so each operation splits its work from
/// inside the thread pool instead of waking it from outside.
macro_rules! run_model {
    ($any:expr, |$m:ident| $body:expr) => {
        match $any {
            $crate::load::AnyModel::Cpu($m) => $m.backend.install(|| $body),
            $crate::load::AnyModel::Gpu($m) => $body,
        }
    };
}
pub(crate) use run_model;

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
pub fn open_file(args: &ModelArgs) -> Result<Arc<ModelFile>> {
    match &args.gguf {
        Some(path) => Ok(ModelFile::open(path)?),
        None => Ok(ModelFile::from_bytes(
            BUILTIN_MODEL.to_vec(),
            BUILTIN_LABEL,
        )?),
    }
}

/// Opens the GPU backend `--backend` asks for: `Ok(None)` means run on the CPU (`auto`
/// without a hardware adapter: software ones such as lavapipe are slower than the CPU backend).
pub fn gpu_backend(choice: BackendChoice) -> Result<Option<GpuBackend>> {
    match choice {
        BackendChoice::Cpu => Ok(None),
        BackendChoice::Gpu => Ok(Some(
            GpuBackend::new().context("--backend gpu: cannot open a WebGPU device")?,
        )),
        // The banner of `generate` and the table of `bench` name the backend chosen. Where
        // no GPU device exists, wgpu is not asked: that would take a second and print the
        // Vulkan loader's warnings, only to find a software adapter `auto` does not use.
        BackendChoice::Auto if !hardware_gpu_possible() => Ok(None),
        BackendChoice::Auto => Ok(GpuBackend::new().ok().filter(GpuBackend::is_hardware)),
    }
}

/// Loads the model named by `args` onto the backend `--backend` picks, holding `layers`
/// (all when `None`).
pub fn load(args: &ModelArgs, layers: Option<Range<usize>>) -> Result<Loaded> {
    let start = Instant::now();
    args.note_thread_cap();
    let file = open_file(args)?;
    let tokenizer = args
        .tokenizer(file.header())
        .with_context(|| format!("{}: cannot build the tokenizer", file.source))?;
    let big = file.len() > PROGRESS_BYTES;
    let model = match gpu_backend(args.backend)? {
        Some(gpu) => {
            let bar = big.then(|| progress_bar("uploading", &file.source, 0));
            let model = load_on(gpu, &file, args, layers.clone(), bar.as_ref());
            match (model, args.backend) {
                (Ok(m), _) => AnyModel::Gpu(m),
                // `auto` falls back to the CPU instead of failing (e.g. a layout without a
                // GPU kernel, or a model larger than the adapter allows).
                (Err(e), BackendChoice::Auto) => {
                    note!(
                        "hesper: backend auto: the GPU cannot run this model ({}); using the CPU",
                        one_line(&e)
                    );
                    AnyModel::Cpu(load_cpu(&file, args, layers, big)?)
                }
                (Err(e), _) => return Err(e),
            }
        }
        None => AnyModel::Cpu(load_cpu(&file, args, layers, big)?),
    };
    // Said once the model loaded, so a file that cannot run gets only its error line.
    for w in tokenizer.iter().flat_map(Tokenizer::warnings) {
        note!("hesper: tokenizer metadata: {w}");
    }
    Ok(Loaded {
        model,
        tokenizer,
        load_ms: start.elapsed().as_secs_f64() * 1e3,
    })
}

fn load_cpu(
    file: &Arc<ModelFile>,
    args: &ModelArgs,
    layers: Option<Range<usize>>,
    big: bool,
) -> Result<Model<CpuBackend>> {
    if big {
        page_in(file);
    }
    load_on(CpuBackend::new(args.threads())?, file, args, layers, None)
}

fn load_on<B: Backend>(
    backend: B,
    file: &Arc<ModelFile>,
    args: &ModelArgs,
    layers: Option<Range<usize>>,
    bar: Option<&ProgressBar>,
) -> Result<Model<B>> {
    let mut tick = |done: usize, total: usize| {
        if let Some(bar) = bar {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
    };
    let model = Model::load(
        backend,
        file.clone(),
        LoadOptions {
            layers,
            head: args.lm_head.into(),
            progress: Some(&mut tick),
        },
    )
    .with_context(|| format!("{}: cannot load the model", file.source));
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    model
}

fn progress_bar(verb: &str, source: &str, len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{verb} {{msg}} [{{bar:40}}] {{pos}}/{{len}} tensors"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(source.to_string());
    bar
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
