//! Model hyper-parameters and numeric flavour, read from GGUF metadata.

use thiserror::Error;

use crate::gguf::Gguf;

/// The architectures hesper-rs runs, as its messages name them.
pub const ARCHITECTURES: &str = "bitnet, bitnet-b1.58, bitnet-25, llama, qwen2 and qwen3";

/// How RoPE pairs the dims of a head (llama.cpp's rope types, by architecture).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopePairs {
    /// NeoX: dim `i` with `i + rope_dim/2` (`bitnet*`, `qwen2`, `qwen3`); what every backend
    /// rotates.
    Neox,
    /// ggml's normal mode: dim `2i` with `2i + 1` (`llama`). The loader reorders the rows of
    /// Q and K (and their biases) inside each head so that NeoX pairing rotates the same
    /// pairs by the same angles: attention scores are unchanged, and one kernel serves both.
    Adjacent,
}

/// What an architecture fixes about the graph: the rows of llama.cpp's tables, as data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    /// RMSNorms before `attn_output` and `ffn_down` (`attn_sub_norm`, `ffn_sub_norm`: BitNet).
    pub sub_norms: bool,
    /// An RMSNorm of each head's query and key before RoPE (`attn_q_norm`, `attn_k_norm`:
    /// Qwen3).
    pub qk_norm: bool,
    /// RoPE pairing.
    pub rope_pairs: RopePairs,
    /// The FFN activation when the file does not name one (`<arch>.hidden_activation`).
    pub activation: Activation,
}

impl Family {
    /// The family of `general.architecture` = `arch`, if hesper-rs runs it. bitnet.cpp's
    /// official files (`bitnet-b1.58`, `bitnet-25`) default to ReLU², as 2B4T was trained;
    /// mainline llama.cpp's `bitnet` graph computes SiLU.
    pub fn of(arch: &str) -> Option<Self> {
        let (sub_norms, qk_norm, rope_pairs, activation) = match arch {
            "bitnet-b1.58" | "bitnet-25" => (true, false, RopePairs::Neox, Activation::Relu2),
            "bitnet" => (true, false, RopePairs::Neox, Activation::Silu),
            "llama" => (false, false, RopePairs::Adjacent, Activation::Silu),
            "qwen2" => (false, false, RopePairs::Neox, Activation::Silu),
            "qwen3" => (false, true, RopePairs::Neox, Activation::Silu),
            _ => return None,
        };
        Some(Self {
            sub_norms,
            qk_norm,
            rope_pairs,
            activation,
        })
    }
}

/// The gated FFN's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up` (llama.cpp mainline's hard-coded choice for `bitnet`).
    Silu,
    /// `relu(gate)² * up` (BitNet b1.58 2B4T as trained).
    Relu2,
}

impl Activation {
    /// The name users know it by.
    pub fn name(self) -> &'static str {
        match self {
            Self::Silu => "SiLU",
            Self::Relu2 => "ReLU²",
        }
    }
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `general.architecture`.
    pub arch: String,
    /// What the architecture fixes about the graph.
    pub family: Family,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Hidden width.
    pub n_embd: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA).
    pub n_head_kv: usize,
    /// Width of one head (`attention.key_length`, else `n_embd / n_head`).
    pub head_dim: usize,
    /// FFN width.
    pub n_ff: usize,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// RoPE position scale (`1 / rope.scaling.factor` for linear scaling, else 1).
    pub rope_scale: f32,
    /// Dims rotated by RoPE per head.
    pub rope_dim: usize,
    /// FFN activation.
    pub activation: Activation,
}

/// Why the metadata does not describe a model hesper-rs can run.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// `general.architecture` is missing.
    #[error("general.architecture is missing: not a model file")]
    NoArchitecture,
    /// The architecture is not BitNet.
    #[error("unsupported architecture {0:?} (hesper-rs runs {ARCHITECTURES})")]
    Architecture(String),
    /// A required key is missing or has the wrong type.
    #[error("metadata key {0} is missing or not a number")]
    Missing(String),
    /// A value is out of range or inconsistent.
    #[error("metadata {key} = {value}: {why}")]
    Invalid {
        /// Key.
        key: String,
        /// Stored value.
        value: String,
        /// What is wrong.
        why: String,
    },
}

impl Config {
    /// Reads the config from a parsed header. `n_vocab_fallback` is used when the file has no
    /// `<arch>.vocab_size` (the embedding's row count).
    pub fn from_gguf(g: &Gguf, n_vocab_fallback: Option<usize>) -> Result<Self, ConfigError> {
        let arch = g
            .get_str("general.architecture")
            .ok_or(ConfigError::NoArchitecture)?
            .to_string();
        let family = Family::of(&arch).ok_or_else(|| ConfigError::Architecture(arch.clone()))?;
        let key = |k: &str| format!("{arch}.{k}");
        let int = |k: &str| -> Result<usize, ConfigError> {
            let v = g
                .get_u64(&key(k))
                .ok_or_else(|| ConfigError::Missing(key(k)))?;
            match usize::try_from(v) {
                Ok(v) if v > 0 && v <= 1 << 24 => Ok(v),
                _ => Err(ConfigError::Invalid {
                    key: key(k),
                    value: v.to_string(),
                    why: "must be between 1 and 2^24".into(),
                }),
            }
        };
        let n_embd = int("embedding_length")?;
        let n_head = int("attention.head_count")?;
        let n_head_kv = match g.get_u64(&key("attention.head_count_kv")) {
            Some(_) => int("attention.head_count_kv")?,
            None => n_head,
        };
        let invalid = |k: &str, v: usize, why: &str| ConfigError::Invalid {
            key: key(k),
            value: v.to_string(),
            why: why.into(),
        };
        let head_dim =
            match g.get_u64(&key("attention.key_length")) {
                Some(_) => int("attention.key_length")?,
                None if n_embd % n_head != 0 => return Err(invalid(
                    "attention.head_count",
                    n_head,
                    "must divide embedding_length (or attention.key_length name the head width)",
                )),
                None => n_embd / n_head,
            };
        if g.get_u64(&key("attention.value_length")).is_some() {
            let value_length = int("attention.value_length")?;
            if value_length != head_dim {
                return Err(invalid(
                    "attention.value_length",
                    value_length,
                    &format!("must equal the key width {head_dim}"),
                ));
            }
        }
        if n_head % n_head_kv != 0 {
            return Err(invalid(
                "attention.head_count_kv",
                n_head_kv,
                "must divide attention.head_count",
            ));
        }
        let rope_dim = match g.get_u64(&key("rope.dimension_count")) {
            Some(_) => int("rope.dimension_count")?,
            None => head_dim,
        };
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(invalid(
                "rope.dimension_count",
                rope_dim,
                "must be even and at most the head width",
            ));
        }
        let n_vocab = match g.get_u64(&key("vocab_size")) {
            Some(_) => int("vocab_size")?,
            None => n_vocab_fallback.ok_or_else(|| ConfigError::Missing(key("vocab_size")))?,
        };
        let float = |k: &str, default: f64| -> Result<f32, ConfigError> {
            let v = match (g.get(&key(k)), g.get_f64(&key(k))) {
                (None, _) => default as f32,
                (Some(_), Some(v)) => v as f32,
                (Some(other), None) => {
                    return Err(ConfigError::Invalid {
                        key: key(k),
                        value: format!("{other:?}"),
                        why: "must be a number".into(),
                    })
                }
            };
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(ConfigError::Invalid {
                    key: key(k),
                    value: v.to_string(),
                    why: "must be a positive number".into(),
                })
            }
        };
        let activation = match g.get_str(&key("hidden_activation")) {
            Some("relu2" | "relu_squared" | "squared_relu") => Activation::Relu2,
            Some("silu" | "swish") => Activation::Silu,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: key("hidden_activation"),
                    value: other.into(),
                    why: "hesper-rs knows relu2 and silu".into(),
                })
            }
            None => family.activation,
        };
        let rope_scale = match g.get_str(&key("rope.scaling.type")) {
            None | Some("none") => 1.0,
            Some("linear") => 1.0 / float("rope.scaling.factor", 1.0)?,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: key("rope.scaling.type"),
                    value: other.into(),
                    why: "hesper-rs computes no and linear RoPE scaling".into(),
                })
            }
        };
        Ok(Self {
            n_vocab,
            n_embd,
            n_layer: int("block_count")?,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: int("feed_forward_length")?,
            n_ctx_train: int("context_length")?,
            eps: float("attention.layer_norm_rms_epsilon", 1e-5)?,
            rope_base: float("rope.freq_base", 10000.0)?,
            rope_scale,
            rope_dim,
            activation,
            family,
            arch,
        })
    }

    /// Width of the Q projection (all query heads).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the K and V projections.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
