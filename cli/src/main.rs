//! `hesper-rs`: run BitNet b1.58 GGUF models.

mod args;
mod attention;
mod bench;
mod generate;
mod info;
mod list;
mod load;
mod logits;
mod node;
mod output;
mod perplexity;
mod pull;
mod report;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    Node(Box<node::NodeArgs>),
    /// Download a GGUF model from the Hugging Face Hub into its cache and print its path.
    Pull(pull::PullArgs),
    /// Serve the model over HTTP: OpenAI's chat and completion API (llama-server's endpoints),
    /// many requests batched together.
    Serve(Box<serve::ServeArgs>),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse_from(args::llama_spellings(std::env::args_os())) {
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
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report::failure(&e),
    }
}
