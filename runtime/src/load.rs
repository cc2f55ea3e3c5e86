//! Choosing a backend and loading a model onto it.

use std::sync::Arc;

#[cfg(feature = "cpu")]
use hesper_cpu::CpuBackend;
use hesper_engine::backend::{Backend, BackendError};
use hesper_engine::config::Config;
use hesper_engine::file::ModelFile;
use hesper_engine::model::{LoadOptions, Model, ModelError};
use hesper_gpu_backend::GpuBackend;
use thiserror::Error;

/// Where to run a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// A hardware GPU when there is one, otherwise the CPU.
    Auto,
    /// The CPU backend.
    Cpu,
    /// WebGPU on whatever adapter exists (also a software one such as lavapipe).
    Gpu,
}

/// A model on whichever backend was chosen.
// One per process: the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum AnyModel {
    /// On the CPU.
    #[cfg(feature = "cpu")]
    Cpu(Model<CpuBackend>),
    /// On a WebGPU adapter.
    Gpu(Model<GpuBackend>),
}

impl AnyModel {
    /// The file the model was loaded from.
    pub fn file(&self) -> &Arc<ModelFile> {
        crate::with_model!(self, |m| &m.file)
    }

    /// The model's hyperparameters.
    pub fn config(&self) -> &Config {
        crate::with_model!(self, |m| &m.config)
    }

    /// The backend, with its adapter or kernels and threads.
    pub fn backend_name(&self) -> String {
        crate::with_model!(self, |m| m.backend.name())
    }

    /// Whether the model runs on a software GPU adapter (lavapipe, llvmpipe, SwiftShader):
    /// far slower than the CPU backend on the same cores.
    pub fn on_software_adapter(&self) -> bool {
        match self {
            Self::Gpu(m) => !m.backend.is_hardware(),
            #[cfg(feature = "cpu")]
            Self::Cpu(_) => false,
        }
    }

    /// Ids a prediction may pick ([`hesper_engine::model::Model::sampled_vocab`]).
    pub fn sampled_vocab(&self) -> usize {
        crate::with_model!(self, |m| m.sampled_vocab())
    }

    /// Swaps in the tensors that changed on disk
    /// ([`hesper_engine::model::Model::reload_changed`]).
    #[cfg(unix)]
    pub fn reload_changed(
        &mut self,
    ) -> Result<hesper_engine::model::Reload, hesper_engine::model::ReloadError> {
        crate::with_model!(self, |m| m.reload_changed())
    }
}

/// Runs `$body` with `$m` bound to the model inside an [`AnyModel`], whatever its backend.
#[cfg(feature = "cpu")]
#[macro_export]
macro_rules! with_model {
    ($any:expr, |$m:ident| $body:expr) => {
        match $any {
            $crate::load::AnyModel::Cpu($m) => $body,
            $crate::load::AnyModel::Gpu($m) => $body,
        }
    };
}

/// Runs `$body` with `$m` bound to the model inside an [`AnyModel`], whatever its backend.
#[cfg(not(feature = "cpu"))]
#[macro_export]
macro_rules! with_model {
    ($any:expr, |$m:ident| $body:expr) => {
        match $any {
            $crate::load::AnyModel::Gpu($m) => $body,
        }
    };
}

/// Like [`with_model!`] for work that runs the model: on the CPU, `$body` runs on one of the
/// backend's own threads (see `CpuBackend::install`), so each operation splits its work from
/// inside the thread pool instead of waking it from outside.
#[cfg(feature = "cpu")]
#[macro_export]
macro_rules! run_model {
    ($any:expr, |$m:ident| $body:expr) => {
        match $any {
            $crate::load::AnyModel::Cpu($m) => $m.backend.install(|| $body),
            $crate::load::AnyModel::Gpu($m) => $body,
        }
    };
}

/// Like [`with_model!`] for work that runs the model.
#[cfg(not(feature = "cpu"))]
#[macro_export]
macro_rules! run_model {
    ($any:expr, |$m:ident| $body:expr) => {
        $crate::with_model!($any, |$m| $body)
    };
}

/// Why a model could not be loaded.
#[derive(Debug, Error)]
pub enum LoadError {
    /// `--backend gpu` found no usable adapter.
    #[error("--backend gpu: cannot open a WebGPU device: {0}")]
    NoGpu(BackendError),
    /// The CPU backend could not start.
    #[error("cannot start the CPU backend: {0}")]
    Cpu(BackendError),
    /// The model itself is unusable (or too large for the backend).
    #[error("{file}: cannot load the model: {source}")]
    Model {
        /// Where the model came from.
        file: String,
        /// Why.
        source: ModelError,
    },
}

/// How to load a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadSettings {
    /// Where to run it.
    pub backend: BackendChoice,
    /// CPU worker threads.
    pub threads: usize,
    /// LM head storage.
    pub head: hesper_engine::model::HeadFormat,
    /// The layers to hold (`None`: all).
    pub layers: Option<std::ops::Range<usize>>,
    /// Which instance of a split model runs the LM head.
    pub head_place: hesper_engine::model::HeadPlace,
    /// Repack weights at load into the layout the CPU's kernels read best (see
    /// `hesper_cpu::CpuBackend::with_repack`); no effect on the GPU.
    pub repack: bool,
    /// The CPU kernels to use (`None`: the best this CPU runs).
    #[cfg(feature = "cpu")]
    pub cpu_isa: Option<hesper_cpu::Isa>,
    /// Load the model at this path for hot-swap ([`Model::load_hot_swap`]: read into memory,
    /// every tensor hashed) instead of from the mapped file.
    #[cfg(unix)]
    pub hot_swap: Option<std::path::PathBuf>,
}

#[cfg(all(feature = "cpu", not(target_arch = "wasm32")))]
impl LoadSettings {
    /// Whether the load reads the file into memory instead of mapping it (hot-swap).
    fn reads_whole_file(&self) -> bool {
        #[cfg(unix)]
        return self.hot_swap.is_some();
        #[cfg(not(unix))]
        false
    }
}

/// Progress of long loading work, for a bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Bytes of the file paged in (CPU).
    PagingIn {
        /// Bytes done.
        done: u64,
        /// Bytes in all.
        total: u64,
    },
    /// Tensors prepared on the backend.
    Tensors {
        /// Tensors done.
        done: usize,
        /// Tensors in all.
        total: usize,
    },
    /// The work is over (hide the bar).
    Done,
}

/// Opens the GPU backend `choice` asks for: `Ok(None)` means run on the CPU (`auto`
/// without a hardware adapter: software ones such as lavapipe are slower than the CPU
/// backend).
#[cfg(not(target_arch = "wasm32"))]
pub fn gpu_backend(choice: BackendChoice) -> Result<Option<GpuBackend>, LoadError> {
    match choice {
        BackendChoice::Cpu => Ok(None),
        BackendChoice::Gpu => GpuBackend::new().map(Some).map_err(LoadError::NoGpu),
        // Where no GPU device exists, wgpu is not asked: that would take a fair part of a
        // second and print the Vulkan loader's warnings, only to find a software adapter
        // `auto` does not use.
        BackendChoice::Auto if !hesper_gpu_backend::hardware_gpu_possible() => Ok(None),
        BackendChoice::Auto => Ok(GpuBackend::new().ok().filter(GpuBackend::is_hardware)),
    }
}

/// Loads the model in `file` onto the backend `settings` picks. `auto` falls back to the CPU
/// when the GPU cannot hold or run the model, saying why through `note`.
#[cfg(all(feature = "cpu", not(target_arch = "wasm32")))]
pub fn load(
    file: &Arc<ModelFile>,
    settings: &LoadSettings,
    progress: &mut dyn FnMut(Progress),
    note: &mut dyn FnMut(&str),
) -> Result<AnyModel, LoadError> {
    match gpu_backend(settings.backend)? {
        Some(gpu) => match (load_on(gpu, file, settings, progress), settings.backend) {
            (Ok(m), _) => Ok(AnyModel::Gpu(m)),
            // `auto` falls back to the CPU instead of failing (e.g. a layout without a GPU
            // kernel, or a model larger than the adapter allows).
            (Err(e), BackendChoice::Auto) => {
                note(&format!(
                    "backend auto: the GPU cannot run this model ({e}); using the CPU"
                ));
                load_cpu(file, settings, progress).map(AnyModel::Cpu)
            }
            (Err(e), _) => Err(e),
        },
        None => load_cpu(file, settings, progress).map(AnyModel::Cpu),
    }
}

/// Files above this size are paged in with progress before the CPU uses them.
#[cfg(feature = "cpu")]
const PAGE_IN_BYTES: u64 = 64 << 20;

#[cfg(all(feature = "cpu", not(target_arch = "wasm32")))]
fn load_cpu(
    file: &Arc<ModelFile>,
    settings: &LoadSettings,
    progress: &mut dyn FnMut(Progress),
) -> Result<Model<CpuBackend>, LoadError> {
    // A node holding some layers touches only their pages (a ring node maps the file but
    // reads its own part).
    if file.len() > PAGE_IN_BYTES && settings.layers.is_none() && !settings.reads_whole_file() {
        page_in(file, progress);
    }
    let isa = settings.cpu_isa.unwrap_or_else(hesper_cpu::Isa::detect);
    let cpu = CpuBackend::with_isa(settings.threads, isa)
        .map_err(LoadError::Cpu)?
        .with_repack(settings.repack);
    load_on(cpu, file, settings, progress)
}

/// Loads `file` onto `backend`, reporting each prepared tensor.
pub fn load_on<B: Backend>(
    backend: B,
    file: &Arc<ModelFile>,
    settings: &LoadSettings,
    progress: &mut dyn FnMut(Progress),
) -> Result<Model<B>, LoadError> {
    let mut tick = |done: usize, total: usize| progress(Progress::Tensors { done, total });
    let opts = LoadOptions {
        layers: settings.layers.clone(),
        head: settings.head,
        head_place: settings.head_place,
        progress: Some(&mut tick),
    };
    #[cfg(unix)]
    let model = match &settings.hot_swap {
        Some(path) => Model::load_hot_swap(backend, path, opts),
        None => Model::load(backend, file.clone(), opts),
    };
    #[cfg(not(unix))]
    let model = Model::load(backend, file.clone(), opts);
    let model = model.map_err(|source| LoadError::Model {
        file: file.source.clone(),
        source,
    });
    progress(Progress::Done);
    model
}

/// Touches every page of the file so the first token does not pay for disk reads.
#[cfg(feature = "cpu")]
fn page_in(file: &ModelFile, progress: &mut dyn FnMut(Progress)) {
    let bytes = file.bytes();
    let total = bytes.len() as u64;
    let mut sink = 0u8;
    let mut done = 0u64;
    for chunk in bytes.chunks(16 << 20) {
        sink ^= chunk.iter().step_by(4096).fold(0u8, |a, &b| a ^ b);
        done += chunk.len() as u64;
        progress(Progress::PagingIn { done, total });
    }
    std::hint::black_box(sink);
    progress(Progress::Done);
}
