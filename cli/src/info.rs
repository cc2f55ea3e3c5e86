//! `hesper-rs info`: metadata, tensor table, model config and tokenizer of a GGUF file.

use std::io::Write;

use anyhow::Result;
use clap::Args;
use hesper_engine::chat::ChatTemplate;
use hesper_engine::config::{Config, RopePairs};
use hesper_engine::gguf::{Array, Value};
use hesper_engine::model::cache_slots;
use hesper_runtime::load::gpu_backend;

use crate::args::{BackendChoice, FileArgs, KernelArgs};
use crate::attention::AttentionArgs;
use crate::load::open_file;

/// Flags of `info`.
#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    model: FileArgs,
    #[command(flatten)]
    kernels: KernelArgs,
    /// Print every tensor (default: the first 40 and a summary).
    #[arg(long = "all-tensors")]
    all_tensors: bool,
    #[command(flatten)]
    attention: AttentionArgs,
}

/// Runs `info`.
pub fn run(args: InfoArgs) -> Result<()> {
    let attention = args.attention.config()?;
    let file = open_file(&args.model)?;
    let g = file.header();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "file:      {} ({} bytes, GGUF v{}, alignment {})",
        file.source,
        file.len(),
        g.version,
        g.alignment
    )?;
    writeln!(out, "\nmetadata ({} keys):", g.metadata().len())?;
    for (key, value) in g.metadata() {
        writeln!(out, "  {key:<45} {}", show(value))?;
    }
    let tensors = g.tensors();
    let total: u64 = tensors.iter().filter_map(|t| t.nbytes).sum();
    writeln!(
        out,
        "\ntensors ({}, {:.2} MiB):",
        tensors.len(),
        total as f64 / (1 << 20) as f64
    )?;
    let shown = if args.all_tensors {
        tensors.len()
    } else {
        tensors.len().min(40)
    };
    for t in &tensors[..shown] {
        let dims: Vec<String> = t.dims().iter().map(u64::to_string).collect();
        let bytes = t.nbytes.map_or("?".into(), |n| n.to_string());
        writeln!(
            out,
            "  {:<36} {:<8} [{:<14}] {:>12} bytes",
            t.name,
            t.ty.to_string(),
            dims.join(", "),
            bytes
        )?;
    }
    if shown < tensors.len() {
        writeln!(
            out,
            "  … {} more (--all-tensors lists them)",
            tensors.len() - shown
        )?;
    }
    let n_vocab = g.tensor("token_embd.weight").map(|t| t.ne[1] as usize);
    match Config::from_gguf(g, n_vocab) {
        Ok(c) => {
            writeln!(out, "\nmodel:     {}, {} layers, n_embd {}, n_ff {}, heads {}/{} (head dim {}), vocab {}, ctx {}", c.arch, c.n_layer, c.n_embd, c.n_ff, c.n_head, c.n_head_kv, c.head_dim, c.n_vocab, c.n_ctx_train)?;
            if let Err(e) = hesper_engine::model::check_tensor_table(g, &c) {
                writeln!(out, "refused:   {e} (hesper-rs does not load this file)")?;
            }
            let pairs = match c.family.rope_pairs {
                RopePairs::Neox => "NeoX",
                RopePairs::Adjacent => "adjacent-pair",
            };
            let extras: String = [
                (g.tensor("blk.0.attn_q.bias").is_some(), ", Q/K/V biases"),
                (
                    c.family.biases,
                    ", biases on the attention's output, the router and every expert",
                ),
                (c.family.sinks, ", attention sinks"),
                (c.family.qk_norm, ", Q/K head norms"),
                (g.tensor("rope_freqs.weight").is_some(), ", rope_freqs"),
                (
                    c.rope_scale != 1.0 && c.rope_yarn.is_none(),
                    ", linear RoPE scaling",
                ),
                (c.rope_yarn.is_some(), ", YaRN RoPE scaling"),
                (c.family.post_norms, ", post-attention and post-FFN norms"),
                (c.family.embed_scale, ", embeddings times √n_embd"),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, what)| what.to_string())
            .chain(c.experts.map(|x| {
                // Parameters a token reads: all but the share of the experts it does not use.
                let count = |experts: bool| -> u64 {
                    g.tensors()
                        .iter()
                        .filter(|t| t.name.contains("_exps.") == experts)
                        .map(|t| t.n_elements())
                        .sum()
                };
                let (dense, stacked) = (count(false), count(true));
                let active = dense + stacked * x.n_used as u64 / x.n_expert as u64;
                let routing = match (x.normalize, x.scale) {
                    (true, 1.0) => "softmax routing renormalized".to_string(),
                    (false, 1.0) => "softmax routing".to_string(),
                    (true, s) => format!("softmax routing renormalized, weights ×{s}"),
                    (false, s) => format!("softmax routing, weights ×{s}"),
                };
                format!(
                    ", {} experts of n_ff {} ({} used a token, {routing}: {} of {} parameters active)",
                    x.n_expert,
                    x.n_ff,
                    x.n_used,
                    parameters(active),
                    parameters(dense + stacked)
                )
            }))
            .chain(c.window.map(|w| {
                let windowed = c.windowed.iter().filter(|&&on| on).count();
                format!(
                    ", a sliding window of {w} on {windowed} of {} layers (RoPE base {} there)",
                    c.n_layer, c.rope_base_window
                )
            }))
            .collect();
            writeln!(
                out,
                "numerics:  {} FFN{}, RMSNorm eps {}, {pairs} RoPE base {} over {} dims{extras}",
                c.activation.name(),
                if c.family.sub_norms {
                    ", BitNet sub-norms"
                } else {
                    ""
                },
                c.eps,
                c.rope_base,
                c.rope_dim
            )?;
            // One layer's keys and values of a position; every layer's cache at the training
            // context, sliding-window layers holding their window and one step.
            let layer_bytes = 2 * c.kv_dim() * attention.kv_type.bytes();
            let mib = |positions: usize| (positions * layer_bytes) as f64 / (1 << 20) as f64;
            let slots = cache_slots(&c, c.n_ctx_train, 1, attention.swa_full);
            let full = c.n_layer * c.n_ctx_train;
            let held: usize = slots.iter().sum();
            let windows = match slots.iter().min() {
                Some(&least) if held < full => format!(
                    ", its sliding-window layers holding {least} positions each; {:.1} MiB with --swa-full",
                    mib(full)
                ),
                _ => String::new(),
            };
            writeln!(
                out,
                "attention: {}; KV cache {} bytes per position ({:.1} MiB at the training context{windows})",
                attention.describe(),
                c.n_layer * layer_bytes,
                mib(held)
            )?;
        }
        Err(e) => writeln!(out, "\nmodel:     not runnable by hesper-rs: {e}")?,
    }
    match args.model.tokenizer(g) {
        Ok(Some(t)) => {
            writeln!(out, "tokenizer: {}", t.describe())?;
            for w in t.warnings() {
                writeln!(out, "  warning: {w}")?;
            }
            match ChatTemplate::from_gguf(g, &t) {
                Ok(template) => writeln!(out, "chat:      {}", template.origin())?,
                Err(e) => writeln!(out, "chat:      unusable: {e}")?,
            }
        }
        Ok(None) => writeln!(out, "tokenizer: none (feed token ids)")?,
        Err(e) => writeln!(out, "tokenizer: unusable: {e}")?,
    }
    match args.kernels.backend {
        BackendChoice::Cpu => writeln!(
            out,
            "\nbackend:   cpu: {}",
            crate::cpu_layout::describe(&args.kernels, g, true)
        )?,
        choice => match gpu_backend(choice.into())? {
            Some(gpu) => writeln!(out, "\n{}", gpu.describe())?,
            None => writeln!(
                out,
                "\nbackend:   cpu: {} (no hardware GPU adapter; --backend gpu uses any)",
                crate::cpu_layout::describe(&args.kernels, g, true)
            )?,
        },
    }
    Ok(())
}

fn show(v: &Value) -> String {
    match v {
        Value::Array(Array::String(items)) => {
            let head: Vec<String> = items.iter().take(4).map(|s| format!("{s:?}")).collect();
            format!(
                "[str × {}] {}{}",
                items.len(),
                head.join(", "),
                if items.len() > 4 { ", …" } else { "" }
            )
        }
        Value::String(s) if s.len() > 80 => format!(
            "{:?}… ({} bytes)",
            s.chars().take(60).collect::<String>(),
            s.len()
        ),
        other => other.to_string(),
    }
}

/// A parameter count as model cards give it (`30.53B`, `3.34M`).
fn parameters(n: u64) -> String {
    match n as f64 {
        n if n >= 1e9 => format!("{:.2}B", n / 1e9),
        n => format!("{:.2}M", n / 1e6),
    }
}
