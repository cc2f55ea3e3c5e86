//! `hesper-rs bench`: prompt-processing and generation speed with llama-bench's flags and
//! output — lists and ranges of sizes, thread counts and batch sizes, prompt-then-generation
//! tests, and a Markdown table, CSV, JSON or JSON lines.

mod gpu_profile;
mod measure;
mod op_profile;
mod output;
mod plan;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use hesper_gpu_backend::MatrixCores;
use hesper_runtime::load::AnyModel;

use crate::args::ModelArgs;
use crate::attention::AttentionArgs;
use crate::list::{parse_list, List};
use crate::load::load;
use crate::report::note;
use plan::{parse_prompt_gen, PromptGen, Test};

/// Flags of `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt lengths, each processed in batches (ppN tests; 0 = none): a count, a list
    /// (`128,512`) or a range (`64-512*2`, `100-400+100`). Default 512, or the model's
    /// context when smaller.
    #[arg(short = 'p', long = "n-prompt", value_name = "LIST", value_parser = parse_list)]
    n_prompt: Option<List>,
    /// Tokens generated one at a time (tgN tests; 0 = none), as a count, list or range.
    /// Default 128, or the model's context when smaller.
    #[arg(short = 'n', long = "n-gen", value_name = "LIST", value_parser = parse_list)]
    n_gen: Option<List>,
    /// A prompt of PP tokens, then TG generated after it (ppPP+tgTG; its t/s counts both),
    /// also -pg; repeat for several.
    #[arg(long = "prompt-gen", value_name = "PP,TG", value_parser = parse_prompt_gen)]
    prompt_gen: Vec<PromptGen>,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    repetitions: usize,
    /// Prompt batch sizes, as a count, list or range.
    #[arg(short = 'b', long = "batch-size", value_name = "LIST", value_parser = parse_list, default_value = "512")]
    batch_size: List,
    /// Output: `md` (a Markdown table and notes), `csv`, `json` (one array), `jsonl` (one
    /// object per line); CSV and JSON hold nothing else, so they can be parsed as they are.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Md)]
    output: Format,
    /// The same as `-o json`.
    #[arg(long = "json", conflicts_with = "output")]
    json: bool,
    /// Also measure the memory bandwidth that bounds decoding and give generation speed as a
    /// share of its roofline, bandwidth / bytes per token: on the CPU the host's read
    /// bandwidth (same threads, about 2 s), on the GPU the device's copy bandwidth (bytes read
    /// plus written by buffer-to-buffer copies, as CUDA's bandwidth test counts them).
    #[arg(long = "roofline")]
    roofline: bool,
    /// CPU backend: run the first prompt test (and 16 generated tokens) once more with every
    /// operation timed, and give each kind's share of the time (matmul, attention, ...).
    #[arg(long = "profile")]
    profile: bool,
    /// GPU backend: submit a step's recorded work each time it holds this many dispatches, so
    /// the GPU starts while the host records the rest (0: one submit per step, with its
    /// read-back).
    #[arg(long = "gpu-flush", value_name = "DISPATCHES", default_value_t = hesper_gpu_backend::FLUSH_DISPATCHES)]
    gpu_flush: usize,
    /// GPU backend: run I2_S, TQ, Q8_0 and K-quant prompts (Q4_0 and MXFP4 run as Q8_0) on the
    /// device's matrix cores (`on`: where it has them and they passed their check at start), on
    /// its shader cores (`off`), or through the matrix-core kernels' stand-ins (`stand-in`:
    /// slow, for checking them). The same bits either way.
    #[arg(long = "gpu-matrix-cores", value_enum, default_value_t = MatrixCoresArg::On)]
    gpu_matrix_cores: MatrixCoresArg,
    #[command(flatten)]
    attention: AttentionArgs,
}

/// `--gpu-matrix-cores` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixCoresArg {
    /// Where the device has them.
    On,
    /// Never.
    Off,
    /// The matrix-core kernels' stand-ins, on any device with halves and subgroups.
    StandIn,
}

/// `-o` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A Markdown table, then notes.
    Md,
    /// Comma-separated values with a header line.
    Csv,
    /// One JSON array.
    Json,
    /// One JSON object per line.
    Jsonl,
}

/// Runs `bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    if args.repetitions == 0 {
        bail!("nothing to measure: give -r 1 or more");
    }
    if args.batch_size.0.contains(&0) {
        bail!("-b/--batch-size 0: a batch holds at least one token");
    }
    args.attention.config()?;
    // The tests for a model's training context (the defaults fit it).
    let tests = |n_ctx_train| {
        plan::tests(
            args.n_prompt.as_ref(),
            args.n_gen.as_ref(),
            &args.prompt_gen,
            n_ctx_train,
        )
    };
    if tests(1).is_empty() {
        bail!("nothing to measure: give -p, -n or -pg above 0");
    }
    let format = if args.json { Format::Json } else { args.output };
    let threads: Vec<Option<usize>> = match &args.model.threads {
        None => vec![None],
        Some(list) => list.0.iter().map(|&t| Some(t)).collect(),
    };
    let mut runs = Vec::new();
    for t in threads {
        let model_args = args.model.with_threads(t);
        let loaded = load(&model_args, None)?;
        let tests = tests(loaded.model.config().n_ctx_train);
        let run = match &loaded.model {
            // On the backend's own threads: see `run_model!`.
            AnyModel::Cpu(model) => model.backend.install(|| {
                let mut run = measure::measure(&args, &model_args, &tests, model, None)?;
                if args.profile {
                    let first = |f: fn(&Test) -> usize| tests.iter().map(f).find(|&n| n > 0);
                    run.ops = op_profile::op_profile(
                        model,
                        |n| measure::token_ids(model.config.n_vocab, n),
                        first(Test::n_prompt).unwrap_or(0),
                        args.batch_size.0[0],
                        first(Test::n_gen).unwrap_or(0),
                    )?;
                }
                anyhow::Ok(run)
            }),
            AnyModel::Gpu(model) => {
                model.backend.set_flush_dispatches(match args.gpu_flush {
                    0 => usize::MAX,
                    n => n,
                });
                let wanted = match args.gpu_matrix_cores {
                    MatrixCoresArg::On => MatrixCores::On,
                    MatrixCoresArg::Off => MatrixCores::Off,
                    MatrixCoresArg::StandIn => MatrixCores::StandIn,
                };
                let chosen = model.backend.set_matrix_cores(wanted);
                if chosen != wanted && args.gpu_matrix_cores != MatrixCoresArg::On {
                    note!("hesper: --gpu-matrix-cores {wanted:?} is not available on this device; I2_S, TQ, Q8_0 and K-quant prompts run {chosen:?}");
                }
                if args.profile {
                    note!("hesper: --profile times the CPU backend's operations; the GPU gives its per-kernel times after tg");
                }
                measure::measure(&args, &model_args, &tests, model, Some(&model.backend))
            }
        }?;
        runs.push(run);
    }
    output::write(format, &runs)
}
