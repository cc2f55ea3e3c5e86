//! Model hyper-parameters and numeric flavour, read from GGUF metadata.

use thiserror::Error;

use crate::gguf::Gguf;

/// Which BitNet family a file belongs to; decides the FFN activation and, with the weight
/// types, how activations are quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// The official BitNet b1.58 2B4T files (`bitnet-b1.58`, `bitnet-25`): I2_S weights,
    /// ReLU², per-token int8 activations (bitnet.cpp's and the model's semantics).
    Official,
    /// llama.cpp mainline's `bitnet` architecture: TQ1_0/TQ2_0/float weights, optional
    /// `*.scale` tensors, SiLU.
    Mainline,
}

/// The gated FFN's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up` (llama.cpp mainline's hard-coded choice for `bitnet`).
    Silu,
    /// `relu(gate)² * up` (BitNet b1.58 2B4T as trained).
    Relu2,
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `general.architecture`.
    pub arch: String,
    /// Family.
    pub flavour: Flavour,
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
    /// Width of one head.
    pub head_dim: usize,
    /// FFN width.
    pub n_ff: usize,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE base frequency.
    pub rope_base: f32,
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
    #[error("unsupported architecture {0:?} (hesper-rs runs bitnet, bitnet-b1.58 and bitnet-25)")]
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
        let flavour = match arch.as_str() {
            "bitnet-b1.58" | "bitnet-25" => Flavour::Official,
            "bitnet" => Flavour::Mainline,
            _ => return Err(ConfigError::Architecture(arch)),
        };
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
        if n_embd % n_head != 0 {
            return Err(invalid(
                "attention.head_count",
                n_head,
                "must divide embedding_length",
            ));
        }
        if n_head % n_head_kv != 0 {
            return Err(invalid(
                "attention.head_count_kv",
                n_head_kv,
                "must divide attention.head_count",
            ));
        }
        let head_dim = n_embd / n_head;
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
            let v = g.get_f64(&key(k)).unwrap_or(default) as f32;
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
        let activation = match (g.get_str(&key("hidden_activation")), flavour) {
            (Some("relu2" | "relu_squared" | "squared_relu"), _) => Activation::Relu2,
            (Some("silu" | "swish"), _) => Activation::Silu,
            (Some(other), _) => {
                return Err(ConfigError::Invalid {
                    key: key("hidden_activation"),
                    value: other.into(),
                    why: "hesper-rs knows relu2 and silu".into(),
                })
            }
            (None, Flavour::Official) => Activation::Relu2,
            (None, Flavour::Mainline) => Activation::Silu,
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
            rope_dim,
            activation,
            flavour,
            arch,
        })
    }

    /// Width of the K and V projections.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
