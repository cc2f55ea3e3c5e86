//! `hesper-rs`: run BitNet b1.58 GGUF models.

mod args;
mod attention;
mod bench;
mod chat_template;
mod cpu_layout;
mod generate;
mod info;
mod list;
mod load;
mod logits;
mod node;
mod output;
mod perplexity;
mod pull;
mod quantize;
mod report;
mod ring_args;
mod ring_plan;
mod serve;
mod tokenize;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Run ternary BitNet b1.58 GGUF models on WebGPU (any Vulkan/Metal/DX12 adapter) or the CPU.
#[derive(Parser)]
#[command(name = "hesper-rs", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print no notes on stderr (loading, timings, warnings); errors still print.
    #[arg(long = "log-disable", global = true)]
    log_disable: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (`--chat`: chat interactively).
    Generate(generate::GenerateArgs),
    /// Chat interactively with the model's chat template (`generate --chat`).
    #[command(
        mut_arg("chat", |a| a.hide(true)),
        mut_arg("context_shift", |a| a.hide(true)),
        mut_arg("keep", |a| a.hide(true))
    )]
    Chat(generate::GenerateArgs),
    /// Print a model's metadata, tensor table, config and tokenizer.
    Info(info::InfoArgs),
    /// Evaluate token ids and write the logits of every position (float32 LE [n_tokens][n_vocab]).
    Logits(logits::LogitsArgs),
    /// Perplexity over a text file, and KL divergence against a base model (llama-perplexity's flags).
    Perplexity(perplexity::PerplexityArgs),
    /// Measure prompt processing (pp) and text generation (tg) speed.
    Bench(bench::BenchArgs),
    /// Run as one node of a ring that splits a model layer-wise across processes or machines.
    #[command(
        mut_arg("context_shift", |a| a.hide(true)),
        mut_arg("keep", |a| a.hide(true)),
        mut_arg("kv_type", |a| a.hide(true)),
        mut_arg("cache_type_k", |a| a.hide(true)),
        mut_arg("cache_type_v", |a| a.hide(true)),
        mut_arg("attn", |a| a.hide(true)),
        mut_arg("window", |a| a.hide(true)),
        mut_arg("globals", |a| a.hide(true)),
        mut_arg("block", |a| a.hide(true)),
        mut_arg("log_stride", |a| a.hide(true)),
        mut_arg("landmarks", |a| a.hide(true))
    )]
    Node(Box<node::NodeArgs>),
    /// Write a model with its weight matrices in another type (llama-quantize's choices).
    Quantize(quantize::QuantizeArgs),
    /// Print the tokens of a text (llama-tokenize's `ID -> 'piece'`, or `--ids`).
    Tokenize(tokenize::TokenizeArgs),
    /// Print the text of token ids.
    Detokenize(tokenize::DetokenizeArgs),
    /// Print a shell completion script: `hesper-rs completions bash > ~/.local/share/bash-completion/completions/hesper-rs`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Download a GGUF model from the Hugging Face Hub into its cache and print its path.
    Pull(pull::PullArgs),
    /// Serve the model over HTTP: OpenAI's chat and completion API (llama-server's endpoints),
    /// many requests batched together.
    Serve(Box<serve::ServeArgs>),
}

fn main() -> ExitCode {
    quiet_mesa();
    let parsed = Cli::command()
        .long_version(long_version())
        .try_get_matches_from(args::help_of_help(args::llama_spellings(
            std::env::args_os(),
        )))
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => return report::usage_error(e),
    };
    if cli.log_disable {
        report::QUIET.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let result = match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => generate::run(a.into_chat()),
        Command::Info(a) => info::run(a),
        Command::Logits(a) => logits::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Node(a) => node::run(*a),
        Command::Serve(a) => serve::run(*a),
        Command::Pull(a) => pull::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Tokenize(a) => tokenize::tokenize(a),
        Command::Detokenize(a) => tokenize::detokenize(a),
        Command::Completions { shell } => completions(shell),
    };
    match result {
        Ok(()) => {
            report::flush_later();
            ExitCode::SUCCESS
        }
        Err(e) => report::failure(&e),
    }
}

/// Mesa's Vulkan drivers print `error: XDG_RUNTIME_DIR is invalid or not set in the
/// environment` twice on every GPU run where it is unset (a container, a cron job, ssh without
/// a login session); a private directory for this user keeps them quiet. Set before any
/// thread starts.
fn quiet_mesa() {
    if !cfg!(target_os = "linux") {
        return;
    }
    let valid =
        std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir());
    if valid {
        return;
    }
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Uid:")
                    .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
            })
        })
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("hesper-runtime-{uid}"));
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    if builder.create(&dir).is_ok() || dir.is_dir() {
        std::env::set_var("XDG_RUNTIME_DIR", dir);
    }
}

/// `--version`: the version, the commit it was built from, and the CPU kernels this machine
/// runs.
fn long_version() -> String {
    let best = hesper_cpu::Isa::detect();
    let runs: Vec<&str> = hesper_cpu::Isa::supported()
        .into_iter()
        .map(hesper_cpu::Isa::name)
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "{} (commit {})\nCPU kernels: {} (this CPU runs {}), {cores} cores\nGPU: WebGPU through wgpu; `hesper-rs info --backend gpu` names the adapter",
        env!("CARGO_PKG_VERSION"),
        env!("HESPER_COMMIT"),
        best.name(),
        runs.join(", ")
    )
}

/// Writes `shell`'s completion script on stdout (built in memory first: a closed pipe is an
/// error value, not a panic).
fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "hesper-rs", &mut script);
    std::io::stdout().write_all(&script)?;
    Ok(())
}
