//! `--kv-type` and `--attn*`: how a session stores its KV cache and which positions attention
//! reads.

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use hesper_engine::attention::{AttentionConfig, KvType, SparsePattern};
// Most global positions a sparse pattern may name: the GPU kernel's limit.
use hesper_gpu_backend::MAX_GLOBALS;

/// `--kv-type` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvTypeArg {
    /// 4 bytes a value: exact.
    F32,
    /// 2 bytes a value: half the KV memory; keys and values rounded to f16 when stored.
    F16,
}

impl KvTypeArg {
    /// The value's spelling.
    fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
        }
    }
}

/// `--attn` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnMode {
    /// Every earlier position (exact).
    Dense,
    /// A window of recent positions, globals, log-stride positions and block landmarks: cost
    /// per token grows with log T instead of T; an approximation (see BENCHMARKS.md).
    Sparse,
}

/// `on`/`off` switches.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// Flags of the KV cache and of attention.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Context and attention")]
pub struct AttentionArgs {
    /// KV cache element type (keys and values): f16 halves KV memory [default: f32].
    #[arg(long = "kv-type", value_enum)]
    pub kv_type: Option<KvTypeArg>,
    /// llama.cpp's key cache type (also -ctk); keys and values share one type here.
    #[arg(long = "cache-type-k", value_enum, value_name = "TYPE")]
    pub cache_type_k: Option<KvTypeArg>,
    /// llama.cpp's value cache type (also -ctv); keys and values share one type here.
    #[arg(long = "cache-type-v", value_enum, value_name = "TYPE")]
    pub cache_type_v: Option<KvTypeArg>,
    /// A sliding-window layer's KV cache holds the whole context, not its window and one step
    /// (llama.cpp's --swa-full): more memory, and a prompt's cached prefix is always reused.
    #[arg(long = "swa-full")]
    pub swa_full: bool,
    /// Attention: dense (every earlier position) or sparse (opt-in approximation).
    #[arg(long = "attn", value_enum, default_value = "dense")]
    pub attn: AttnMode,
    /// Sparse: most recent positions attended, the query's own included [default: 128].
    #[arg(long = "attn-window", value_name = "N")]
    pub window: Option<usize>,
    /// Sparse: positions always attended, comma-separated, or `none` [default: 0].
    #[arg(long = "attn-globals", value_name = "LIST")]
    pub globals: Option<String>,
    /// Sparse: positions a landmark (mean key and value) summarises [default: 64].
    #[arg(long = "attn-block", value_name = "N")]
    pub block: Option<usize>,
    /// Sparse: also attend positions i − 2^k outside the window [default: on].
    #[arg(long = "attn-log-stride", value_enum, value_name = "on|off")]
    pub log_stride: Option<Switch>,
    /// Sparse: also attend landmarks of whole blocks before the window [default: on].
    #[arg(long = "attn-landmarks", value_enum, value_name = "on|off")]
    pub landmarks: Option<Switch>,
}

impl AttentionArgs {
    /// The one KV type that --kv-type, -ctk and -ctv name (f32 when none does).
    fn kv_type(&self) -> Result<KvTypeArg> {
        let given = [
            ("--kv-type", self.kv_type),
            ("-ctk/--cache-type-k", self.cache_type_k),
            ("-ctv/--cache-type-v", self.cache_type_v),
        ];
        let mut named = given.iter().filter_map(|(flag, t)| t.map(|t| (flag, t)));
        let Some((first_flag, first)) = named.next() else {
            return Ok(KvTypeArg::F32);
        };
        if let Some((flag, other)) = named.find(|(_, t)| *t != first) {
            bail!(
                "{first_flag} {} and {flag} {}: keys and values share one cache type here",
                first.name(),
                other.name()
            );
        }
        Ok(first)
    }

    /// The configuration the flags name; a sparse-only flag without `--attn sparse`, a zero
    /// window or block, or an unreadable list of globals is an error naming the flag.
    pub fn config(&self) -> Result<AttentionConfig> {
        let kv_type = match self.kv_type()? {
            KvTypeArg::F32 => KvType::F32,
            KvTypeArg::F16 => KvType::F16,
        };
        let sparse_flags = [
            ("--attn-window", self.window.is_some()),
            ("--attn-globals", self.globals.is_some()),
            ("--attn-block", self.block.is_some()),
            ("--attn-log-stride", self.log_stride.is_some()),
            ("--attn-landmarks", self.landmarks.is_some()),
        ];
        if self.attn == AttnMode::Dense {
            if let Some((flag, _)) = sparse_flags.iter().find(|(_, set)| *set) {
                bail!("{flag} shapes sparse attention: add --attn sparse");
            }
            return Ok(AttentionConfig {
                swa_full: self.swa_full,
                kv_type,
                sparse: None,
            });
        }
        let d = SparsePattern::default();
        let window = self.window.unwrap_or(d.window);
        let block = self.block.unwrap_or(d.block);
        if window == 0 {
            bail!("--attn-window 0: the window holds at least the query's own position");
        }
        if block == 0 {
            bail!("--attn-block 0: a landmark summarises at least one position");
        }
        let globals = match &self.globals {
            None => d.globals,
            Some(list) => parse_globals(list)?,
        };
        Ok(AttentionConfig {
            swa_full: self.swa_full,
            kv_type,
            sparse: Some(SparsePattern {
                window,
                globals,
                block,
                log_stride: self.log_stride != Some(Switch::Off),
                landmarks: self.landmarks != Some(Switch::Off),
            }),
        })
    }
}

/// `none` or comma-separated positions, sorted and deduplicated.
fn parse_globals(list: &str) -> Result<Vec<usize>> {
    if list.trim() == "none" {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for item in list.split(',') {
        match item.trim().parse::<usize>() {
            Ok(p) => out.push(p),
            Err(_) => bail!(
                "--attn-globals {list:?}: {:?} is not a position (use e.g. 0,1,2 or none)",
                item.trim()
            ),
        }
    }
    out.sort_unstable();
    out.dedup();
    if out.len() > MAX_GLOBALS {
        bail!(
            "--attn-globals: {} positions, at most {MAX_GLOBALS}",
            out.len()
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: AttentionArgs,
    }

    fn config(args: &[&str]) -> Result<AttentionConfig> {
        let mut all = vec!["t"];
        all.extend(args);
        Cli::try_parse_from(all)?.a.config()
    }

    #[test]
    fn defaults_are_dense_f32_and_sparse_takes_the_seed_defaults() {
        assert_eq!(config(&[]).unwrap(), AttentionConfig::default());
        let s = config(&["--attn", "sparse", "--kv-type", "f16"]).unwrap();
        assert_eq!(s.kv_type, KvType::F16);
        assert_eq!(s.sparse, Some(SparsePattern::default()));
        let s = config(&[
            "--attn",
            "sparse",
            "--attn-globals",
            "4, 0,4",
            "--attn-landmarks",
            "off",
            "--attn-window",
            "32",
        ])
        .unwrap()
        .sparse
        .unwrap();
        assert_eq!((s.globals, s.landmarks, s.window), (vec![0, 4], false, 32));
    }

    #[test]
    fn bad_attention_flags_name_themselves() {
        let err = |args: &[&str]| config(args).unwrap_err().to_string();
        assert!(err(&["--attn-window", "64"]).contains("add --attn sparse"));
        assert!(err(&["--attn", "sparse", "--attn-window", "0"]).contains("--attn-window 0"));
        assert!(err(&["--attn", "sparse", "--attn-block", "0"]).contains("--attn-block 0"));
        assert!(err(&["--attn", "sparse", "--attn-globals", "0,x"]).contains("\"x\""));
        let many: Vec<String> = (0..97).map(|i| i.to_string()).collect();
        let many = many.join(",");
        assert!(err(&["--attn", "sparse", "--attn-globals", &many]).contains("at most 96"));
        assert!(err(&["--kv-type", "q8_0"]).contains("q8_0"));
    }
}
