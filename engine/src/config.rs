//! Model hyper-parameters and numeric flavour, read from GGUF metadata.

use thiserror::Error;

use crate::gguf::{Array, Gguf};

/// The architectures hesper-rs runs, as its messages name them.
pub const ARCHITECTURES: &str = "bitnet, bitnet-b1.58, bitnet-25, llama, qwen2, qwen3, qwen3moe, \
     gemma2, gemma3, phi3 and gpt-oss";

/// How RoPE pairs the dims of a head (llama.cpp's rope types, by architecture).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopePairs {
    /// NeoX: dim `i` with `i + rope_dim/2` (`bitnet*`, `qwen2`, `qwen3`, `gemma3`, `phi3`); what
    /// every backend rotates.
    Neox,
    /// ggml's normal mode: dim `2i` with `2i + 1` (`llama`). The loader reorders the rows of
    /// Q and K (and their biases) inside each head so that NeoX pairing rotates the same
    /// pairs by the same angles: attention scores are unchanged, and one kernel serves both.
    Adjacent,
}

/// What an architecture fixes about the graph: the rows of llama.cpp's tables, as data.
#[derive(Debug, Clone, Copy, PartialEq)]
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
    /// RMSNorms of the attention's and the FFN's outputs before each joins the residual
    /// stream (`post_attention_norm`, `post_ffw_norm`: Gemma).
    pub post_norms: bool,
    /// The token embeddings scaled by √n_embd as they enter the first layer (Gemma).
    pub embed_scale: bool,
    /// Of every this many layers, all but the last attend a sliding window when the file names
    /// `attention.sliding_window` (Gemma 3: five of six), unless the file's
    /// `attention.sliding_window_pattern` says otherwise; `None`: the family has no window.
    pub window_period: Option<usize>,
    /// The window of a family with one when the file names no `attention.sliding_window`
    /// (Gemma 2: 4096, as llama.cpp assumes); `None`: no window then (Gemma 3).
    pub window_default: Option<usize>,
    /// Whether the sliding-window layers scale their RoPE positions as the global layers do
    /// (`rope.scaling.factor`: Gemma 2), or rotate unscaled (Gemma 3, whose 4B–27B files
    /// scale only the global layers' positions, by 8).
    pub window_rope_scaled: bool,
    /// The layer count of the variant whose queries are scaled by `1/√(n_embd/n_head)` instead
    /// of `1/√head_dim` (Gemma 2 27B: 46, Gemma 3 27B: 62; llama.cpp's rule, after
    /// gemma_pytorch's configs).
    pub query_scale_by_width_at: Option<usize>,
    /// The RoPE base of the sliding-window layers when the file has no `rope.freq_base_swa`
    /// (Gemma 3: 10000, as llama.cpp reads it); `None`: the global layers' base (Gemma 2).
    pub window_rope_base: Option<f32>,
    /// The soft cap `cap · tanh(x / cap)` of the attention scores (`attn_logit_softcapping`).
    pub attn_softcap: Softcap,
    /// The soft cap of the logits (`final_logit_softcapping`).
    pub final_softcap: Softcap,
    /// Whether the FFN is a mixture of experts (`ffn_gate_inp`, `ffn_{gate,up,down}_exps`), its
    /// routing weights renormalized over the chosen experts.
    pub moe: Mixture,
    /// The name of the norm before the FFN (`ffn_norm`; gpt-oss: `post_attention_norm`).
    pub ffn_norm: &'static str,
    /// A learned logit per query head that joins each softmax's denominator and weighs no
    /// value (`attn_sinks`: gpt-oss).
    pub sinks: bool,
    /// Biases on the attention's output and on the router's and every expert's products
    /// (`attn_output.bias`, `ffn_gate_inp.bias`, `ffn_{gate,up,down}_exps.bias`: gpt-oss).
    pub biases: bool,
}

/// Whether a family's FFN is a mixture of experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mixture {
    /// Never: one gated FFN.
    Never,
    /// Always (Qwen3-MoE).
    Always,
    /// Where the file names `expert_count` (Mixtral's files are `llama` with experts).
    WhereNamed,
}

impl Family {
    /// The family of `general.architecture` = `arch`, if hesper-rs runs it. bitnet.cpp's
    /// official files (`bitnet-b1.58`, `bitnet-25`) default to ReLU², as 2B4T was trained;
    /// mainline llama.cpp's `bitnet` graph computes SiLU.
    pub fn of(arch: &str) -> Option<Self> {
        let plain = Self {
            sub_norms: false,
            qk_norm: false,
            rope_pairs: RopePairs::Neox,
            activation: Activation::Silu,
            post_norms: false,
            embed_scale: false,
            window_period: None,
            window_default: None,
            window_rope_scaled: false,
            query_scale_by_width_at: None,
            window_rope_base: None,
            attn_softcap: Softcap::Refused,
            final_softcap: Softcap::Refused,
            moe: Mixture::Never,
            ffn_norm: "ffn_norm",
            sinks: false,
            biases: false,
        };
        Some(match arch {
            "bitnet-b1.58" | "bitnet-25" => Self {
                sub_norms: true,
                activation: Activation::Relu2,
                ..plain
            },
            "bitnet" => Self {
                sub_norms: true,
                ..plain
            },
            // Mixtral: Llama's graph with a mixture of experts.
            "llama" => Self {
                rope_pairs: RopePairs::Adjacent,
                moe: Mixture::WhereNamed,
                ..plain
            },
            // Phi-3/4: the plain graph; its fused `attn_qkv` and `ffn_up` (gate and up in one
            // tensor) are split by the loader, whichever family a file with them is of.
            "qwen2" | "phi3" => plain,
            "qwen3" => Self {
                qk_norm: true,
                ..plain
            },
            "qwen3moe" => Self {
                qk_norm: true,
                moe: Mixture::Always,
                ..plain
            },
            "gemma2" => Self {
                activation: Activation::GeluTanh,
                post_norms: true,
                embed_scale: true,
                window_period: Some(2),
                window_default: Some(4096),
                window_rope_scaled: true,
                query_scale_by_width_at: Some(46),
                attn_softcap: Softcap::Default(50.0),
                final_softcap: Softcap::Default(30.0),
                ..plain
            },
            "gemma3" => Self {
                qk_norm: true,
                activation: Activation::GeluTanh,
                post_norms: true,
                embed_scale: true,
                window_period: Some(6),
                query_scale_by_width_at: Some(62),
                window_rope_base: Some(10000.0),
                final_softcap: Softcap::IfNamed,
                ..plain
            },
            // gpt-oss: a mixture of experts with biases everywhere, attention sinks, a window of
            // 128 on every other layer (the first of each pair, its positions scaled as the
            // others') and a clamped SwiGLU.
            "gpt-oss" => Self {
                activation: Activation::SwigluClamped,
                window_period: Some(2),
                window_default: Some(128),
                window_rope_scaled: true,
                moe: Mixture::Always,
                ffn_norm: "post_attention_norm",
                sinks: true,
                biases: true,
                ..plain
            },
            _ => return None,
        })
    }
}

/// Whether a family soft-caps a set of values (`cap · tanh(x / cap)`), as llama.cpp's graph of
/// it does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Softcap {
    /// Never: a file that names a cap is refused (its graph would run without it).
    Refused,
    /// With the file's cap, where it names one (Gemma 3's logits).
    IfNamed,
    /// Always: the file's cap, else this one (Gemma 2's 50 on the scores, 30 on the logits).
    Default(f32),
}

impl Experts {
    /// The experts one row's router `logits` choose, with their weights, most probable first
    /// (the definition every backend computes; see the type's docs).
    pub fn route(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
        let sum: f64 = exps.iter().map(|&e| f64::from(e)).sum();
        let inv = (1.0 / sum) as f32;
        let mut order: Vec<usize> = (0..logits.len()).collect();
        // Stable: of equal probabilities the lower id comes first.
        order.sort_by(|&a, &b| exps[b].total_cmp(&exps[a]));
        let mut chosen: Vec<(usize, f32)> = order[..self.n_used.min(order.len())]
            .iter()
            .map(|&e| (e, exps[e] * inv))
            .collect();
        if self.normalize {
            let total = chosen
                .iter()
                .map(|&(_, w)| w)
                .sum::<f32>()
                .max(6.103_515_6e-5);
            chosen.iter_mut().for_each(|(_, w)| *w /= total);
        }
        if self.scale != 1.0 {
            chosen.iter_mut().for_each(|(_, w)| *w *= self.scale);
        }
        chosen
    }

    /// The routes of a step's rows, whose router logits are `logits` (`n_expert` a row).
    pub fn routes(&self, logits: &[f32]) -> Routes {
        let chosen: Vec<Vec<(usize, f32)>> = logits
            .chunks_exact(self.n_expert)
            .map(|row| self.route(row))
            .collect();
        let mut rows_of = vec![Vec::new(); self.n_expert];
        for (t, route) in chosen.iter().enumerate() {
            for (rank, &(e, _)) in route.iter().enumerate() {
                rows_of[e].push((t, rank));
            }
        }
        Routes { chosen, rows_of }
    }
}

/// A step's rows routed to their experts ([`Experts::routes`]): what every backend's
/// mixture computes from, so that each chosen expert's matrices are read once for all its rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Routes {
    /// Each row's experts and weights, in the order of choice ([`Experts::route`]).
    pub chosen: Vec<Vec<(usize, f32)>>,
    /// Each expert's rows, with the expert's rank among the row's choices.
    pub rows_of: Vec<Vec<(usize, usize)>>,
}

/// Which of `n_layer` layers attend the sliding window: the file's
/// `attention.sliding_window_pattern` (one bool a layer, or a period), else the family's period
/// (all but the last layer of each period windowed, as llama.cpp's `set_swa_pattern`).
fn windowed_layers(
    g: &Gguf,
    key: &str,
    family: &Family,
    window: Option<usize>,
    n_layer: usize,
) -> Result<Vec<bool>, ConfigError> {
    let (Some(_), Some(default_period)) = (window, family.window_period) else {
        return Ok(vec![false; n_layer]);
    };
    let invalid = |value: String, why: &str| ConfigError::Invalid {
        key: key.into(),
        value,
        why: why.into(),
    };
    if let Some(values) = g.get_array(key) {
        return match values {
            Array::Bool(flags) if flags.len() == n_layer => Ok(flags.clone()),
            other => Err(invalid(
                format!("an array of {} {}", other.len(), other.type_name()),
                &format!("must hold one bool per layer ({n_layer})"),
            )),
        };
    }
    let period = match g.get_u64(key) {
        Some(p) => usize::try_from(p).map_err(|_| invalid(p.to_string(), "too large"))?,
        None => default_period,
    };
    Ok((0..n_layer)
        .map(|il| period == 0 || il % period < period - 1)
        .collect())
}

/// The gated FFN's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up` (llama.cpp mainline's hard-coded choice for `bitnet`).
    Silu,
    /// `relu(gate)² * up` (BitNet b1.58 2B4T as trained).
    Relu2,
    /// `gelu(gate) * up` with GELU's tanh approximation (Gemma's `gelu_pytorch_tanh`),
    /// computed as `x / (1 + exp(−2u))`, `u = √(2/π)·(x + 0.044715·x³)` (the same function:
    /// `(1 + tanh u) / 2` is the logistic of `2u`).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: `g · σ(1.702 · g) · (u + 1)` with the gate `g` capped at 7
    /// and the up projection `u` clamped to ±7 (llama.cpp's `swiglu_oai`).
    SwigluClamped,
}

impl Activation {
    /// [`Activation::SwigluClamped`]'s slope inside the logistic.
    pub const CLAMPED_ALPHA: f32 = 1.702;
    /// [`Activation::SwigluClamped`]'s bound on the gate and the up projection.
    pub const CLAMPED_LIMIT: f32 = 7.0;
}

impl Activation {
    /// The name users know it by.
    pub fn name(self) -> &'static str {
        match self {
            Self::Silu => "SiLU",
            Self::Relu2 => "ReLU²",
            Self::GeluTanh => "GELU (tanh)",
            Self::SwigluClamped => "SwiGLU (clamped)",
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
    /// RoPE position scale (`1 / rope.scaling.factor`; 1 without).
    pub rope_scale: f32,
    /// YaRN's blend of the scaled and unscaled frequencies (`rope.scaling.type` = `yarn`: Qwen3's
    /// and Qwen2.5's long-context files); `None`: every pair scaled alike.
    pub rope_yarn: Option<Yarn>,
    /// Dims rotated by RoPE per head.
    pub rope_dim: usize,
    /// What RoPE multiplies the rotated dims by (`rope.scaling.attn_factor`; 1 when absent).
    pub rope_attn_factor: f32,
    /// The context the model was trained with before its RoPE was stretched
    /// (`rope.scaling.original_context_length`; `n_ctx_train` when absent): a session longer
    /// than this rotates with LongRoPE's long factors, a shorter one with its short factors.
    pub n_ctx_orig: usize,
    /// FFN activation.
    pub activation: Activation,
    /// Positions a sliding-window layer attends, itself included
    /// (`attention.sliding_window`); `None`: every layer attends every earlier position.
    pub window: Option<usize>,
    /// Which layers attend the sliding window (every `false` without one).
    pub windowed: Vec<bool>,
    /// RoPE base frequency of the sliding-window layers (`rope.freq_base_swa`; when absent the
    /// family's default, as llama.cpp reads it).
    pub rope_base_window: f32,
    /// RoPE position scale of the sliding-window layers (`rope_scale` or 1, by the family).
    pub rope_scale_window: f32,
    /// What the queries are multiplied by besides `1/√head_dim` before attention (Gemma 2 and 3
    /// 27B scale by `1/√(n_embd/n_head)` instead): folded into the query's head norm at load
    /// where the family has one, else applied to the queries.
    pub query_scale: f32,
    /// The attention scores' soft cap (`attn_logit_softcapping`: Gemma 2).
    pub attn_softcap: Option<f32>,
    /// The logits' soft cap (`final_logit_softcapping`: Gemma 2).
    pub final_softcap: Option<f32>,
    /// The mixture of experts of a family whose FFN is one.
    pub experts: Option<Experts>,
}

/// YaRN RoPE scaling (llama.cpp's `rope_yarn`, extrapolation factor 1): pair `i`'s angle blends
/// the scaled one (`scale · θ`) and the unscaled one (`θ`) by a ramp over the pairs that turn
/// between `beta_fast` and `beta_slow` times in the original context — pairs turning faster
/// keep their angle, slower ones are scaled — and the rotated dims are multiplied by
/// `1 + 0.1 · ln(1/scale)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    /// The context the model was trained with before scaling
    /// (`rope.scaling.original_context_length`).
    pub n_ctx_orig: usize,
    /// Turns over the original context above which a pair keeps its angle (32).
    pub beta_fast: f32,
    /// Turns below which a pair is fully scaled (1).
    pub beta_slow: f32,
}

impl Yarn {
    /// The ramp's first and last pair index for `rope_dim` rotated dims at base `base`
    /// (ggml's `ggml_rope_yarn_corr_dims`).
    pub fn ramp(&self, rope_dim: usize, base: f32) -> [f32; 2] {
        let n_dims = rope_dim as f32;
        let dim = |turns: f32| {
            n_dims * (self.n_ctx_orig as f32 / (turns * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        [
            dim(self.beta_fast).floor().max(0.0),
            dim(self.beta_slow).ceil().min(n_dims - 1.0),
        ]
    }
}

/// A mixture-of-experts FFN's shape and routing (llama.cpp's `build_moe_ffn` with softmax
/// gating): the router's logits over `n_expert` experts, their softmax, the `n_used` largest
/// (ties to the lower id), their probabilities renormalized to sum to 1 where `normalize` (the
/// sum at least 2⁻¹⁴) and times `scale`; the output is the weighted sum of the chosen experts'
/// gated FFNs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Experts {
    /// Experts per layer (`expert_count`).
    pub n_expert: usize,
    /// Experts each token uses (`expert_used_count`).
    pub n_used: usize,
    /// Each expert's FFN width (`expert_feed_forward_length`).
    pub n_ff: usize,
    /// Whether the chosen experts' probabilities are renormalized.
    pub normalize: bool,
    /// What the weights are multiplied by (`expert_weights_scale`; 1 when absent).
    pub scale: f32,
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
            Some("gelu" | "gelu_pytorch_tanh") => Activation::GeluTanh,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: key("hidden_activation"),
                    value: other.into(),
                    why: "hesper-rs knows relu2, silu and gelu".into(),
                })
            }
            None => family.activation,
        };
        let n_ctx_train = int("context_length")?;
        let n_ctx_orig = match g.get_u64(&key("rope.scaling.original_context_length")) {
            Some(_) => int("rope.scaling.original_context_length")?,
            None => n_ctx_train,
        };
        let factor_key = ["rope.scaling.factor", "rope.scale_linear"]
            .into_iter()
            .find(|k| g.get(&key(k)).is_some());
        let factor = match factor_key {
            Some(k) if g.get_f64(&key(k)) != Some(0.0) => float(k, 1.0)?,
            _ => 1.0,
        };
        // llama.cpp's default type is linear: a factor without a type scales too. LongRoPE's
        // factors are tensors; its positions scale as linear ones.
        let (rope_scale, rope_yarn) = match g.get_str(&key("rope.scaling.type")) {
            Some("none") => (1.0, None),
            None | Some("linear" | "longrope") => (1.0 / factor, None),
            Some("yarn") => (
                1.0 / factor,
                Some(Yarn {
                    n_ctx_orig,
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                }),
            ),
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: key("rope.scaling.type"),
                    value: other.into(),
                    why: "hesper-rs computes none, linear, longrope and yarn".into(),
                })
            }
        };
        let n_layer = int("block_count")?;
        let softcap = |k: &str, rule: Softcap| -> Result<Option<f32>, ConfigError> {
            let named = g.get_f64(&key(k)).is_some_and(|v| v != 0.0);
            match (rule, named) {
                (Softcap::Default(cap), _) => Ok(Some(float(k, cap.into())?)),
                (Softcap::IfNamed, true) => Ok(Some(float(k, 1.0)?)),
                (Softcap::Refused, true) => Err(ConfigError::Invalid {
                    key: key(k),
                    value: "set".into(),
                    why: format!("the {arch} graph hesper-rs computes does not soft-cap"),
                }),
                (_, false) => Ok(None),
            }
        };
        let attn_softcap = softcap("attn_logit_softcapping", family.attn_softcap)?;
        let final_softcap = softcap("final_logit_softcapping", family.final_softcap)?;
        let window = match (
            family.window_period,
            g.get_u64(&key("attention.sliding_window")),
        ) {
            (None, _) | (Some(_), Some(0)) => None,
            (Some(_), Some(_)) => Some(int("attention.sliding_window")?),
            (Some(_), None) => family.window_default,
        };
        let windowed = windowed_layers(
            g,
            &key("attention.sliding_window_pattern"),
            &family,
            window,
            n_layer,
        )?;
        let query_scale = if family.query_scale_by_width_at == Some(n_layer) {
            (head_dim as f32 / (n_embd / n_head) as f32).sqrt()
        } else {
            1.0
        };
        let rope_base = float("rope.freq_base", 10000.0)?;
        let moe = match family.moe {
            Mixture::Never => false,
            Mixture::Always => true,
            Mixture::WhereNamed => g.get_u64(&key("expert_count")).is_some_and(|n| n > 0),
        };
        let experts = if moe {
            let n_expert = int("expert_count")?;
            let n_used = int("expert_used_count")?;
            if n_used > n_expert {
                return Err(invalid(
                    "expert_used_count",
                    n_used,
                    &format!("must be at most expert_count ({n_expert})"),
                ));
            }
            let scale = match g.get_f64(&key("expert_weights_scale")) {
                Some(s) if s != 0.0 => float("expert_weights_scale", 1.0)?,
                _ => 1.0,
            };
            Some(Experts {
                n_expert,
                n_used,
                // Mixtral's experts are `feed_forward_length` wide (llama.cpp's `llama` graph).
                n_ff: match g.get_u64(&key("expert_feed_forward_length")) {
                    Some(_) => int("expert_feed_forward_length")?,
                    None => int("feed_forward_length")?,
                },
                normalize: true,
                scale,
            })
        } else {
            None
        };
        Ok(Self {
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            // A mixture of experts may name only its experts' width.
            n_ff: match (&experts, g.get_u64(&key("feed_forward_length"))) {
                (Some(x), None) => x.n_ff,
                _ => int("feed_forward_length")?,
            },
            n_ctx_train,
            n_ctx_orig,
            eps: float("attention.layer_norm_rms_epsilon", 1e-5)?,
            rope_base,
            rope_scale,
            rope_yarn,
            rope_dim,
            rope_attn_factor: float("rope.scaling.attn_factor", 1.0)?,
            activation,
            window,
            windowed,
            rope_scale_window: if family.window_rope_scaled {
                rope_scale
            } else {
                1.0
            },
            rope_base_window: float(
                "rope.freq_base_swa",
                family.window_rope_base.unwrap_or(rope_base).into(),
            )?,
            attn_softcap,
            final_softcap,
            query_scale,
            experts,
            family,
            arch,
        })
    }

    /// The window layer `il` attends, if it is a sliding-window layer.
    pub fn window_of(&self, il: usize) -> Option<usize> {
        self.window
            .filter(|_| self.windowed.get(il).copied().unwrap_or(false))
    }

    /// The RoPE base frequency of layer `il`.
    pub fn rope_base_of(&self, il: usize) -> f32 {
        if self.window_of(il).is_some() {
            self.rope_base_window
        } else {
            self.rope_base
        }
    }

    /// The RoPE position scale of layer `il`.
    pub fn rope_scale_of(&self, il: usize) -> f32 {
        if self.window_of(il).is_some() {
            self.rope_scale_window
        } else {
            self.rope_scale
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufBuilder, Value};

    /// A `gemma3` header of `n_layer` layers with `extra` keys.
    fn gemma3(n_layer: u32, extra: &[(&str, Value)]) -> Result<Config, ConfigError> {
        header("gemma3", n_layer, extra)
    }

    /// An `arch` header of `n_layer` small layers with `extra` keys.
    fn header(arch: &str, n_layer: u32, extra: &[(&str, Value)]) -> Result<Config, ConfigError> {
        let key = |k: &str| format!("{arch}.{k}");
        let mut b = GgufBuilder::new()
            .kv("general.architecture", Value::String(arch.into()))
            .kv(&key("embedding_length"), Value::U32(64))
            .kv(&key("block_count"), Value::U32(n_layer))
            .kv(&key("feed_forward_length"), Value::U32(128))
            .kv(&key("attention.head_count"), Value::U32(2))
            .kv(&key("context_length"), Value::U32(256))
            .kv(&key("vocab_size"), Value::U32(32));
        for (k, v) in extra {
            b = b.kv(k, v.clone());
        }
        Config::from_gguf(&Gguf::parse(&b.build()).expect("a header"), None)
    }

    #[test]
    fn gemma3_windows_five_layers_of_six_unless_the_file_says_otherwise() {
        let window = ("gemma3.attention.sliding_window", Value::U32(512));
        let base = ("gemma3.rope.freq_base", Value::F32(1e6));
        let c = gemma3(12, &[window.clone(), base]).expect("config");
        let windowed: Vec<usize> = (0..12).filter(|&il| c.window_of(il).is_some()).collect();
        assert_eq!(windowed, [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]);
        // The windowed layers rotate with llama.cpp's default base when the file names none.
        assert_eq!((c.rope_base_of(0), c.rope_base_of(5)), (10000.0, 1e6));
        // A period of 2 (Gemma 2's), and one bool per layer.
        let c = gemma3(
            4,
            &[
                window.clone(),
                ("gemma3.attention.sliding_window_pattern", Value::U32(2)),
            ],
        )
        .expect("config");
        assert_eq!(c.windowed, [true, false, true, false]);
        let flags = Value::Array(Array::Bool(vec![false, true, true]));
        let pattern = ("gemma3.attention.sliding_window_pattern", flags);
        let c = gemma3(3, &[window.clone(), pattern.clone()]).expect("config");
        assert_eq!(c.windowed, [false, true, true]);
        assert_eq!(c.window_of(1), Some(512));
        // Too few flags; no window named (none for Gemma 3, 4096 for Gemma 2, as llama.cpp
        // reads them); a window of 0, none.
        let e = gemma3(4, &[window, pattern.clone()]).expect_err("refused");
        assert!(e.to_string().contains("one bool per layer (4)"), "{e}");
        let c = gemma3(3, std::slice::from_ref(&pattern)).expect("config");
        assert_eq!((c.window, c.window_of(1)), (None, None));
        let c = header("gemma2", 2, &[]).expect("config");
        assert_eq!((c.window_of(0), c.window_of(1)), (Some(4096), None));
        let none = ("gemma3.attention.sliding_window", Value::U32(0));
        let c = gemma3(3, &[pattern, none]).expect("config");
        assert_eq!((c.window, c.window_of(1)), (None, None));
    }

    #[test]
    fn gemma3_scales_positions_on_its_global_layers_only() {
        // Gemma 3 4B–27B: linear scaling by 8 on the global layers, none on the windowed ones;
        // Gemma 2 scales both (llama.cpp's rope_freq_scale_train_swa).
        let scales = |arch: &str, n_layer: usize| {
            let keys = [
                (format!("{arch}.attention.sliding_window"), Value::U32(8)),
                (
                    format!("{arch}.rope.scaling.type"),
                    Value::String("linear".into()),
                ),
                (format!("{arch}.rope.scaling.factor"), Value::F32(8.0)),
            ];
            let extra: Vec<(&str, Value)> =
                keys.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            let c = header(arch, n_layer as u32, &extra).expect("config");
            (0..n_layer)
                .map(|il| c.rope_scale_of(il))
                .collect::<Vec<_>>()
        };
        assert_eq!(scales("gemma3", 6), [1.0, 1.0, 1.0, 1.0, 1.0, 0.125]);
        assert_eq!(scales("gemma2", 2), [0.125, 0.125]);
    }

    #[test]
    fn rope_scaling_reads_as_llama_cpp_reads_it() {
        let with = |extra: &[(&str, Value)]| header("qwen3", 2, extra).expect("config");
        let factor = ("qwen3.rope.scaling.factor", Value::F32(4.0));
        // A factor without a type is linear scaling (llama.cpp's default type), as is
        // LongRoPE's; `none` ignores the factor.
        let kind = |t: &str| ("qwen3.rope.scaling.type", Value::String(t.into()));
        for c in [
            with(std::slice::from_ref(&factor)),
            with(&[factor.clone(), kind("linear")]),
            with(&[factor.clone(), kind("longrope")]),
            with(&[("qwen3.rope.scale_linear", Value::F32(4.0))]),
        ] {
            assert_eq!((c.rope_scale, c.rope_yarn), (0.25, None));
        }
        assert_eq!(with(&[factor.clone(), kind("none")]).rope_scale, 1.0);
        // YaRN over the original context (the training context where none is named).
        let orig = ("qwen3.rope.scaling.original_context_length", Value::U32(32));
        let c = with(&[factor.clone(), kind("yarn"), orig]);
        let yarn = c.rope_yarn.expect("yarn");
        assert_eq!((c.rope_scale, yarn.n_ctx_orig), (0.25, 32));
        assert_eq!((yarn.beta_fast, yarn.beta_slow), (32.0, 1.0));
        let c = with(&[factor.clone(), kind("yarn")]);
        assert_eq!(c.rope_yarn.map(|y| y.n_ctx_orig), Some(256));
        let e = header("qwen3", 2, &[factor, kind("ntk")]).expect_err("refused");
        assert!(
            e.to_string().contains("none, linear, longrope and yarn"),
            "{e}"
        );
    }

    #[test]
    fn the_27b_variants_scale_their_queries_by_the_width_per_head() {
        // 64 wide, two heads of 64 (key_length): 1/√32 instead of 1/√64 at 46 layers (Gemma 2
        // 27B) and 62 (Gemma 3 27B), the head width's elsewhere.
        let head = |arch: &str| (format!("{arch}.attention.key_length"), Value::U32(64));
        let window = |arch: &str| (format!("{arch}.attention.sliding_window"), Value::U32(8));
        let scale = |arch: &str, n_layer| {
            let (k, w) = (head(arch), window(arch));
            header(arch, n_layer, &[(&k.0, k.1), (&w.0, w.1)])
                .expect("config")
                .query_scale
        };
        assert_eq!(scale("gemma2", 46), 2f32.sqrt());
        assert_eq!(scale("gemma3", 62), 2f32.sqrt());
        assert_eq!(scale("gemma2", 62), 1.0);
        assert_eq!(scale("gemma3", 46), 1.0);
        assert_eq!(scale("qwen3", 46), 1.0);
    }

    #[test]
    fn soft_caps_are_gemma2s_and_gemma3s_logits_where_named_and_refused_elsewhere() {
        let window = ("gemma3.attention.sliding_window", Value::U32(8));
        let cap = ("gemma3.final_logit_softcapping", Value::F32(30.0));
        let c = gemma3(2, &[window.clone(), cap]).expect("config");
        assert_eq!(c.final_softcap, Some(30.0));
        let c = gemma3(2, std::slice::from_ref(&window)).expect("config");
        assert_eq!(c.final_softcap, None);
        let cap = ("gemma3.attn_logit_softcapping", Value::F32(50.0));
        let e = gemma3(2, &[window, cap]).expect_err("refused");
        assert!(e.to_string().contains("does not soft-cap"), "{e}");
        let cap = ("qwen2.final_logit_softcapping", Value::F32(30.0));
        let e = header("qwen2", 2, &[cap]).expect_err("refused");
        assert!(e.to_string().contains("does not soft-cap"), "{e}");
        let extra = [
            ("gemma2.attention.sliding_window", Value::U32(8)),
            ("gemma2.rope.freq_base", Value::F32(5e4)),
            ("gemma2.final_logit_softcapping", Value::F32(10.0)),
        ];
        let c = header("gemma2", 4, &extra).expect("config");
        assert_eq!((c.attn_softcap, c.final_softcap), (Some(50.0), Some(10.0)));
        // Every other layer windowed, rotating with the global base.
        assert_eq!(c.windowed, [true, false, true, false]);
        assert_eq!((c.rope_base_of(0), c.rope_base_of(1)), (5e4, 5e4));
    }
}
