//! Flags shared by several sub-commands, spelled like llama.cpp's.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use hesper_cpu::Isa;
use hesper_engine::gguf::Gguf;
use hesper_engine::model::HeadFormat;
use hesper_engine::tokenizer::{PreTokenizer, Tokenizer};

use crate::attention::AttentionArgs;
use crate::list::{parse_list, List};
use crate::report::note;

/// `--lm-head` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LmHead {
    /// As stored in the file.
    Exact,
    /// Re-quantized to Q8_0 at load.
    #[value(name = "q8_0")]
    Q8_0,
    /// Re-quantized to Q6_K at load.
    #[value(name = "q6_k")]
    Q6K,
}

impl LmHead {
    /// The flag value as typed.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::Q8_0 => "q8_0",
            Self::Q6K => "q6_k",
        }
    }
}

impl From<LmHead> for HeadFormat {
    fn from(h: LmHead) -> Self {
        match h {
            LmHead::Exact => HeadFormat::AsStored,
            LmHead::Q8_0 => HeadFormat::Q8_0,
            LmHead::Q6K => HeadFormat::Q6K,
        }
    }
}

/// `--backend` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// A hardware GPU through WebGPU when there is one, otherwise the CPU.
    Auto,
    /// The CPU backend.
    Cpu,
    /// The WebGPU backend on whatever adapter exists (also a software one such as lavapipe).
    Gpu,
}

impl BackendChoice {
    /// The flag's spelling of this choice.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cpu => "cpu",
            Self::Gpu => "gpu",
        }
    }
}

impl From<BackendChoice> for hesper_runtime::load::BackendChoice {
    fn from(b: BackendChoice) -> Self {
        match b {
            BackendChoice::Auto => Self::Auto,
            BackendChoice::Cpu => Self::Cpu,
            BackendChoice::Gpu => Self::Gpu,
        }
    }
}

/// Which model file, and how its text is split into tokens: what every command that reads a
/// model takes.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Model")]
pub struct FileArgs {
    /// GGUF model file (default: hesper-kjv, the tiny model built into hesper-rs).
    #[arg(
        long = "gguf",
        short = 'm',
        visible_alias = "model",
        value_name = "FILE"
    )]
    pub gguf: Option<PathBuf>,
    /// A model on the Hugging Face Hub (also -hf), downloaded on first use.
    ///
    /// A model on the Hugging Face Hub (also -hf, -hfr), downloaded into its cache on first
    /// use: `owner/name` (its only GGUF file, else the Q4_K_M one), `owner/name:QUANT` or
    /// `owner/name:FILE.gguf` (as `hesper-rs pull`).
    #[arg(long = "hf-repo", value_name = "REPO[:QUANT]", conflicts_with = "gguf")]
    pub hf_repo: Option<String>,
    /// The file of --hf-repo to use (also -hff), instead of :QUANT.
    #[arg(long = "hf-file", value_name = "FILE", requires = "hf_repo")]
    pub hf_file: Option<String>,
    /// Override the tokenizer's pre-tokenizer split (llama3, default, qwen2, gpt-4o).
    ///
    /// Override the tokenizer's pre-tokenizer split: `llama3` (Llama-3, what the 2B4T model was
    /// trained with), `default` (llama.cpp's fallback when tokenizer.ggml.pre is missing).
    #[arg(long = "tokenizer-pre", value_name = "NAME")]
    pub tokenizer_pre: Option<String>,
}

/// Which backend and kernels would run the model: what `info` describes and every command
/// that runs a model takes.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Backend")]
pub struct KernelArgs {
    /// Where to run: auto, cpu or gpu.
    ///
    /// Where to run: `auto` (a hardware GPU if there is one, else the CPU; says which on
    /// stderr), `cpu`, or `gpu` (WebGPU on any adapter: Vulkan, Metal, DX12; `WGPU_BACKEND`
    /// restricts the choice).
    #[arg(long = "backend", value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// Compute from the file's weights as they are (no repacking at load).
    ///
    /// Compute from the file's weights as they are: by default the CPU backend repacks F16
    /// weights (every x86 CPU), Q8_0, Q4_0, Q4_K, Q5_K and Q6_K weights (AVX2, AVX-VNNI or
    /// AVX-512 VNNI kernels) and I2_S weights (AVX-512 or AVX-VNNI) at load into rows
    /// interleaved sixteen deep, which its kernels read faster (faster prompt processing, a few
    /// tenths of a second more load), and rewrites TQ1_0 weights as TQ2_0 (every x86 CPU: the
    /// same weights in 2 bits instead of 1.69, read about twice as fast).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// CPU kernels instead of the best this CPU runs (scalar, avx2, …).
    ///
    /// CPU kernels to use instead of the best this CPU runs: `scalar` (the reference), and on
    /// x86_64 `avx2`, `avx512bw`, `avx-vnni`, `avx512-vnni`, on aarch64 `neon`,
    /// `neon-dotprod` (to compare them, or to work around one).
    #[arg(long = "cpu-kernels", value_name = "NAME", value_parser = parse_isa)]
    pub cpu_kernels: Option<Isa>,
}

/// Which model to load and how to run it.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Backend")]
pub struct ModelArgs {
    /// The file.
    #[command(flatten)]
    pub file: FileArgs,
    /// The backend and its kernels.
    #[command(flatten)]
    pub kernels: KernelArgs,
    /// LM head storage: exact, q8_0 or q6_k.
    ///
    /// LM head storage: `exact` (as in the file), `q8_0` or `q6_k` (re-quantized at load: 53 % or
    /// 41 % of an F16 head's bytes per token, at a small quality cost measured in BENCHMARKS.md;
    /// q6_k runs on the CPU backend only).
    #[arg(long = "lm-head", value_enum, default_value_t = LmHead::Exact)]
    pub lm_head: LmHead,
    /// CPU threads (default: all cores).
    ///
    /// CPU threads (default or 0: all cores; at most 4 per core); `bench` also takes a list
    /// or range (`1,2,4`, `1-8*2`) and loads the model once per count.
    #[arg(short = 't', long = "threads", value_name = "N", value_parser = parse_list)]
    pub threads: Option<List>,
    /// llama.cpp's -ngl: accepted; every layer runs on --backend.
    ///
    /// llama.cpp's layer offload count (also -ngl): accepted for its scripts; every layer runs
    /// on the backend --backend picks (a ring, `hesper-rs node`, splits layers).
    #[arg(
        long = "n-gpu-layers",
        visible_alias = "gpu-layers",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub n_gpu_layers: Option<i64>,
    /// llama.cpp's -fa: accepted; changes nothing here.
    ///
    /// llama.cpp's flash attention switch (also -fa): accepted for its scripts; each backend has
    /// one attention implementation, so it changes nothing.
    #[arg(long = "flash-attn", value_name = "on|off|auto", num_args = 0..=1, default_missing_value = "on")]
    pub flash_attn: Option<String>,
}

/// `--cpu-kernels NAME`, naming the choices on a typo.
fn parse_isa(name: &str) -> Result<Isa, String> {
    Isa::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = Isa::all().into_iter().map(Isa::name).collect();
        format!("expected one of {}", names.join(", "))
    })
}

impl FileArgs {
    /// The tokenizer of `g`, with the `--tokenizer-pre` override applied.
    pub fn tokenizer(&self, g: &Gguf) -> anyhow::Result<Option<Tokenizer>> {
        let pre = match &self.tokenizer_pre {
            None => None,
            Some(name) => Some(PreTokenizer::from_name(name).ok_or_else(|| {
                anyhow::anyhow!(
                    "--tokenizer-pre {name:?}: expected llama3, llama-bpe, default, qwen2, gpt-4o or spm"
                )
            })?),
        };
        Ok(Tokenizer::from_gguf_with(g, pre)?)
    }
}

impl ModelArgs {
    /// Worker threads to use: `-t` (0 = default), else one per core; capped at
    /// [`MAX_THREADS_PER_CORE`] per core (each is an OS thread: a hundred thousand take minutes
    /// to start and then only contend).
    pub fn threads(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        match self.threads.as_ref().and_then(List::single) {
            None | Some(0) => cores,
            Some(t) => t.min(cores * MAX_THREADS_PER_CORE),
        }
    }

    /// These flags with `-t` set to one count (`bench`'s lists run each).
    pub fn with_threads(&self, threads: Option<usize>) -> Self {
        Self {
            threads: threads.map(|t| List(vec![t])),
            ..self.clone()
        }
    }

    /// Refuses a list of thread counts where one is run.
    pub fn check_threads(&self) -> anyhow::Result<()> {
        match &self.threads {
            Some(list) if list.single().is_none() => {
                anyhow::bail!("-t/--threads: give one count here (lists and ranges are for bench)")
            }
            _ => Ok(()),
        }
    }

    /// Says on stderr what llama.cpp's -ngl and -fa mean here, when given.
    pub fn note_llama_flags(&self) {
        if let Some(n) = self.n_gpu_layers {
            note!("hesper: -ngl {n}: every layer runs on the backend --backend picks (now {}); to split layers use a ring (`hesper-rs node`)", self.kernels.backend.flag());
        }
        if let Some(fa) = &self.flash_attn {
            note!("hesper: -fa {fa}: hesper-rs has one attention implementation per backend; this changes nothing");
        }
    }

    /// Says on stderr when `-t` was capped.
    pub fn note_thread_cap(&self) {
        if let Some(t) = self
            .threads
            .as_ref()
            .and_then(List::single)
            .filter(|&t| t > self.threads())
        {
            note!(
                "hesper: -t {t}: more than {MAX_THREADS_PER_CORE} threads per core; using {}",
                self.threads()
            );
        }
    }
}

/// Threads per core beyond which `-t` is capped (oversubscribing a little can help where
/// cores have SMT siblings the OS does not report; far more only contends).
pub const MAX_THREADS_PER_CORE: usize = 4;

/// Context and batching.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Context and attention")]
pub struct ContextArgs {
    /// Context size in tokens (default or 0: the model's training context).
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<usize>,
    /// Tokens evaluated per step while processing a prompt (clamped to the context).
    #[arg(
        short = 'b',
        long = "batch-size",
        value_name = "N",
        default_value_t = 256
    )]
    pub batch_size: usize,
    #[command(flatten)]
    pub attention: AttentionArgs,
}

impl ContextArgs {
    /// The context size: `-c`, or the model's training context for none or 0 (as llama.cpp
    /// reads `-c 0`).
    pub fn n_ctx(&self, n_ctx_train: usize) -> usize {
        match self.ctx_size {
            None | Some(0) => n_ctx_train.max(1),
            Some(n) => n,
        }
    }

    /// Notes on stderr, as llama.cpp does, a context past the training one (said once the
    /// session exists, so a refused `-c` gets only its error line).
    pub fn note_past_training(n_ctx: usize, n_ctx_train: usize) {
        if n_ctx > n_ctx_train {
            note!("hesper: note: a context of {n_ctx} exceeds the model's training context {n_ctx_train}; text past it may degrade");
        }
    }
}

/// llama.cpp's flags of several letters after one dash, which clap would read as short flags
/// with a value (`-np 4` as `-n p`), in their long spelling.
const LLAMA_SPELLINGS: &[(&str, &str)] = &[
    ("-np", "--parallel"),
    ("-sys", "--system-prompt"),
    ("-cnv", "--conversation"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-ngl", "--n-gpu-layers"),
    ("-fa", "--flash-attn"),
    ("-hf", "--hf-repo"),
    ("-hfr", "--hf-repo"),
    ("-hff", "--hf-file"),
    ("-pg", "--prompt-gen"),
];

/// `hesper-rs help --help` (or `-h`) as `hesper-rs --help`: the help of `help` is the list of
/// commands it gives help on (clap would read `--help` as a command's name).
pub fn help_of_help(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let asks = |a: &std::ffi::OsString| a == "--help" || a == "-h";
    if args.len() == 3 && args[1] == "help" && asks(&args[2]) {
        args.remove(1);
    }
    args
}

/// The command line with llama.cpp's several-letter flags ([`LLAMA_SPELLINGS`]) rewritten.
pub fn llama_spellings(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    args.into_iter()
        .map(
            |a| match LLAMA_SPELLINGS.iter().find(|(short, _)| a == *short) {
                Some((_, long)) => long.into(),
                None => a,
            },
        )
        .collect()
}
