//! The forward pass of every family (BitNet b1.58, `llama`, `qwen2`, `qwen3`, `qwen3moe`,
//! `gemma2`, `gemma3`, `phi3`, `gpt-oss`),
//! written once over [`Backend`]; what differs between families is data in [`Config`].
//!
//! ```text
//! x = E[tokens]                              (Gemma: times √n_embd)
//! per layer: h = norm(x)·g_attn; q,k,v = W·h (+ b); q,k = norm(q,k)·g_qk (Qwen3, Gemma 3)
//!            rope(q,k); o = attn(q,k,v)      (Gemma 3: a sliding window on most layers;
//!                                             gpt-oss: a sink in each head's softmax)
//!            x += Wo · (norm(o)·g_attn_sub)           (BitNet; others: Wo · o (+ b);
//!                                                      Gemma: norm(Wo · o)·g_post_attn)
//!            h = norm(x)·g_ffn; a = act(Wgate·h) ⊙ (Wup·h)
//!            x += Wdown · (norm(a)·g_ffn_sub)         (BitNet; others: Wdown · a;
//!                                                      Gemma: norm(Wdown · a)·g_post_ffn)
//!            (Qwen3-MoE, gpt-oss: x += Σ w_e · FFN_e(h) over the experts the router
//!             chooses)
//! logits = E_out · (norm(x)·g_out)          (E_out = E when the head is tied)
//! ```
//! A [`Model`] may hold only a layer range `[start, end)` (a ring node's share); it then
//! runs [`Model::forward_hidden`] on hidden states it is handed.

use std::ops::Range;
use std::sync::Arc;

use thiserror::Error;

use std::future::Future;
use std::task::{Context, Poll, Waker};

use crate::attention::AttentionConfig;
use crate::backend::{AttentionShape, Backend, BackendError, HeadNorms, HeadPrep, RopeShape};
use crate::config::{Config, ConfigError};
use crate::file::ModelFile;
use crate::memory::{SessionShape, SizeError};
use crate::source::{ReadError, TensorSource};
use crate::weights::{read_f32_vector, Format, MatrixDesc, WeightError};

mod batch;
#[cfg(unix)]
mod identity;
mod layer;
mod load;
#[cfg(unix)]
mod reload;
mod tensors;
mod windowed_cache;
pub use batch::{BatchScratch, SeqRows, SeqStep, StepInput, StepOutput};
use layer::{Ffn, Layer};
use load::{Fetch, InFile, Loader, Part, Plan, RopeFactors, Streamed};
#[cfg(unix)]
pub use reload::{Reload, ReloadError, Swap};
pub use windowed_cache::cache_slots;
use windowed_cache::WindowedCache;

/// Errors raised while loading or running a model.
#[derive(Debug, Error)]
pub enum ModelError {
    /// The metadata does not describe a supported model.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A weight tensor is unusable.
    #[error(transparent)]
    Weight(#[from] WeightError),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The file holds metadata only (a tokenizer's vocabulary file, say).
    #[error("the file holds no tensors: a vocabulary or metadata file, not a model")]
    NoTensors,
    /// A tensor the model needs is not in the file.
    #[error("tensor {0:?} is missing from the file")]
    MissingTensor(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary (size {n_vocab})")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// The context window is full.
    #[error(
        "context full: {needed} positions needed, the context holds {n_ctx} (raise -c/--ctx-size)"
    )]
    ContextFull {
        /// Positions needed.
        needed: usize,
        /// Context size.
        n_ctx: usize,
    },
    /// Nothing to evaluate.
    #[error("no tokens to evaluate")]
    Empty,
    /// A batched step holds more rows or sessions than its scratch was made for.
    #[error("a step of {tokens} tokens over {seqs} sessions exceeds its scratch ({max_tokens} tokens, {max_seqs} sessions)")]
    BatchTooLarge {
        /// Rows asked for.
        tokens: usize,
        /// Sessions whose logits are asked for.
        seqs: usize,
        /// Rows the scratch holds.
        max_tokens: usize,
        /// Logit rows the scratch holds.
        max_seqs: usize,
    },
    /// A layer's tensor past the layer count the metadata gives.
    #[error("tensor {name:?} belongs to a layer past the file's block_count ({n_layer}): the metadata and the tensors disagree")]
    LayerPastCount {
        /// The tensor.
        name: String,
        /// The layer count of the metadata.
        n_layer: usize,
    },
    /// Two tensors whose data overlap.
    #[error("tensor {first:?}'s data runs into tensor {second:?}'s: their declared sizes overlap")]
    OverlappingTensors {
        /// The tensor that starts first.
        first: String,
        /// The tensor it runs into.
        second: String,
    },
    /// A logit that is NaN or infinite: the row is not sampled.
    #[error("the logits at position {pos} are not finite ({value} for token {token}): the model's weights or activations hold NaN or overflowed")]
    NonFiniteLogits {
        /// Position of the row in the context.
        pos: usize,
        /// The first token whose logit is not finite.
        token: u32,
        /// Its logit.
        value: f32,
    },
    /// A layer range outside the model.
    #[error(
        "layer range {start}..{end} is not inside this model's layers {have_start}..{have_end}"
    )]
    LayerRange {
        /// Requested start.
        start: usize,
        /// Requested end.
        end: usize,
        /// Loaded start.
        have_start: usize,
        /// Loaded end.
        have_end: usize,
    },
    /// A session too large for the backend (context or batch).
    #[error(transparent)]
    Size(#[from] SizeError),
    /// A streamed load could not read a tensor.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A streamed load could not read a file's header.
    #[error(transparent)]
    Header(#[from] crate::source::HeaderError),
    /// A tensor changed on disk between the check that found it unchanged and its load (a
    /// hot-swap while the file is being written).
    #[error("tensor {0:?} changed on disk while it was being loaded")]
    ChangedWhileLoading(String),
    /// A tensor larger than this target can address (a 32-bit browser build).
    #[error("tensor {name:?} holds {bytes} bytes, more than this build can address")]
    TooLarge {
        /// Tensor name.
        name: String,
        /// Its size.
        bytes: u64,
    },
    /// Hidden states sent for a position after the session's next one (a ring frame that
    /// skips positions: its sender and this node disagree about the history).
    #[error("hidden states for position {pos0}, but this session holds only {pos} positions")]
    PositionGap {
        /// The first position the states are for.
        pos0: usize,
        /// Positions this session holds.
        pos: usize,
    },
    /// Hidden states of the wrong size.
    #[error("hidden states hold {got} floats, expected {n_tokens} × {n_embd}")]
    HiddenSize {
        /// Floats given.
        got: usize,
        /// Tokens.
        n_tokens: usize,
        /// Width.
        n_embd: usize,
    },
    /// A tensor that would change what the graph computes, which hesper-rs's graph of this
    /// architecture does not read: running without it would be a wrong answer.
    #[error("tensor {name:?} is not part of the {arch} graph hesper-rs computes, which would run the model wrong without it")]
    UnreadTensor {
        /// Tensor name.
        name: String,
        /// The file's architecture.
        arch: String,
    },
    /// A context shift this session cannot do.
    #[error("context shift: {0}")]
    ContextShift(String),
    /// A step at a position whose window the sliding-window layers' caches no longer hold
    /// (its sender truncated further back than this session can).
    #[error("position {pos0}: this session's sliding-window caches no longer hold the positions its window attends (evaluate again from 0, or hold full-size caches: --swa-full)")]
    WindowLost {
        /// The first position of the step.
        pos0: usize,
    },
    /// Sparse attention asked of a model whose layers attend a sliding window.
    #[error("sparse attention is not computed for a model with sliding-window layers (its windows are the model's own): run it dense")]
    SparseWithWindow,
}

/// Which logits [`Model::eval`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position's (generation).
    Last,
    /// Every position's, `[n_tokens][n_vocab]`.
    All,
}

/// What a prediction hands back from the last position's logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readout {
    /// The most likely token (4 bytes read back from a GPU).
    Argmax,
    /// The `k` most likely tokens with their logits, most likely first.
    Top(usize),
    /// The whole row of logits.
    Logits,
}

/// The next-token prediction a [`Readout`] asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Prediction {
    /// The most likely token.
    Token(u32),
    /// The most likely candidates, most likely first.
    Top(Vec<(u32, f32)>),
    /// The last position's logits.
    Logits(Vec<f32>),
}

/// How the LM head is stored in memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HeadFormat {
    /// As in the file (exact; the default).
    #[default]
    AsStored,
    /// Re-quantized to Q8_0 at load: about half the bytes of an F16 head per token, at a
    /// small, measured quality cost (see BENCHMARKS.md).
    Q8_0,
    /// Re-quantized to Q6_K at load: 6.56 bits per weight, 41 % of an F16 head's bytes, at a
    /// measured quality cost (see BENCHMARKS.md).
    Q6K,
}

impl HeadFormat {
    /// The weight layout the head is re-quantized to (`None`: kept as stored).
    pub fn target(self) -> Option<Format> {
        match self {
            Self::AsStored => None,
            Self::Q8_0 => Some(Format::Q8_0),
            Self::Q6K => Some(Format::Q6K),
        }
    }
}

/// Which instance of a model split by layers runs its final norm and LM head.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HeadPlace {
    /// The one that holds the last layer (a ring's last node).
    #[default]
    LastLayer,
    /// This one, whatever its layers (a ring's master that keeps the output to itself).
    Here,
    /// Not this one, even with the last layer.
    Elsewhere,
}

/// Options for [`Model::load`].
#[derive(Default)]
pub struct LoadOptions<'a> {
    /// The layers to hold; `None` = all.
    pub layers: Option<Range<usize>>,
    /// LM head storage.
    pub head: HeadFormat,
    /// Which instance runs the final norm and LM head.
    pub head_place: HeadPlace,
    /// Called after each loaded tensor with (done, total).
    pub progress: Option<&'a mut dyn FnMut(usize, usize)>,
}

/// A loaded model (or a layer range of one) on a backend.
pub struct Model<B: Backend> {
    /// Shape and flavour.
    pub config: Config,
    /// The backend that runs it.
    pub backend: B,
    /// The file the weights come from.
    pub file: Arc<ModelFile>,
    layers: Vec<Layer<B>>,
    layer_range: Range<usize>,
    embedding: Option<B::Matrix>,
    output: Option<B::Matrix>,
    output_norm: Option<B::Vector>,
    /// The file's RoPE frequency factors.
    rope_factors: RopeFactors,
    bytes_per_token: u64,
    /// Bytes of each part's matrices (what [`Model::bytes_per_token`] sums; a hot-swap
    /// updates it).
    #[cfg_attr(not(unix), allow(dead_code))]
    part_bytes: std::collections::BTreeMap<Part, u64>,
    /// Ids a prediction may pick: the file's token list, where it is shorter than the LM
    /// head (rows past it have no text).
    n_sampled: usize,
    /// What a hot-swap compares the file with (a model loaded with [`Model::load_hot_swap`]).
    #[cfg(unix)]
    swap: Option<Box<reload::HotSwap>>,
}

/// Per-conversation state: KV cache, position and scratch buffers.
pub struct Session<B: Backend> {
    cache: B::Cache,
    pos: usize,
    n_ctx: usize,
    batch: usize,
    attention: AttentionConfig,
    /// Positions kept at the start when the context shifts (`None`: it does not).
    shift_keep: Option<usize>,
    /// Positions discarded by context shifts so far.
    discarded: usize,
    /// Whether its layers rotate keys with more than one RoPE base (the cache's shift
    /// rotates every layer alike).
    mixed_rope: bool,
    /// The sliding-window layers' caches, where they hold less than the context.
    windows: Option<WindowedCache>,
    s: Scratch<B>,
}

/// A layer's attention over one session or a batch's ([`Model::layers_over`]): the backend,
/// the layer, its queries, keys, values and output, the RoPE of queries and keys, the heads.
type Attend<'a, B> = dyn FnMut(
        &B,
        usize,
        [&mut <B as Backend>::Buffer; 4],
        &[RopeShape<'_>; 2],
        &AttentionShape,
        Option<&<B as Backend>::Matrix>,
        Option<HeadPrep<'_, <B as Backend>::Vector>>,
    ) + 'a;

struct Scratch<B: Backend> {
    x: B::Buffer,
    h: B::Buffer,
    q: B::Buffer,
    k: B::Buffer,
    v: B::Buffer,
    att: B::Buffer,
    gate: B::Buffer,
    up: B::Buffer,
    act: B::Buffer,
    logits: B::Buffer,
}

impl<B: Backend> Session<B> {
    /// Tokens evaluated so far (the next position).
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Context size.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Forgets every position from `pos` on (e.g. to start a new prompt). Where the
    /// sliding-window layers' caches no longer hold what the query at `pos` attends, it forgets
    /// everything: [`Session::pos`] tells what was kept.
    pub fn truncate(&mut self, pos: usize) {
        let pos = self.pos.min(pos);
        self.pos = match &mut self.windows {
            Some(w) => w.truncate(pos),
            None => pos,
        };
    }

    /// Records `n` more positions evaluated.
    fn advance(&mut self, n: usize) {
        self.pos += n;
        if let Some(w) = &mut self.windows {
            w.wrote(self.pos);
        }
    }

    /// The most tokens one step may evaluate: a sliding-window layer's cache holds its window
    /// and one step.
    fn max_step(&self) -> usize {
        self.windows
            .as_ref()
            .map_or(usize::MAX, WindowedCache::step)
    }

    /// Lets evaluation go on past a full context (llama.cpp's context shift): when tokens do
    /// not fit, the first `keep` positions stay (attention sinks), half of the rest (or as many
    /// as the new tokens need) are discarded, and the later ones move down, their keys rotated
    /// to their new positions. `None` turns it off (a full context is then an error). Sparse
    /// attention does not shift, and `keep` must leave room for a token.
    pub fn set_context_shift(&mut self, keep: Option<usize>) -> Result<(), ModelError> {
        if let Some(keep) = keep {
            if self.attention.sparse.is_some() {
                return Err(ModelError::ContextShift(
                    "sparse attention does not shift its context (its landmarks follow the positions)".into(),
                ));
            }
            if self.mixed_rope {
                return Err(ModelError::ContextShift(
                    "this model's sliding-window layers rotate keys with their own RoPE base or position scale, which a shift does not rotate back".into(),
                ));
            }
            if keep.saturating_add(2) > self.n_ctx {
                return Err(ModelError::ContextShift(format!(
                    "keeping {keep} positions leaves no room in a context of {}",
                    self.n_ctx
                )));
            }
        }
        self.shift_keep = keep;
        Ok(())
    }

    /// Positions discarded by context shifts so far.
    pub fn discarded(&self) -> usize {
        self.discarded
    }

    /// Whether evaluating one more token fits, or the context shifts to make room.
    pub fn has_room(&self) -> bool {
        self.pos < self.n_ctx || self.shift_keep.is_some()
    }
}

/// What [`Model::load`] refuses in a file's tensor table before reading any tensor: tensors
/// of layers past the metadata's count, data ranges that overlap, and tensors the family's
/// graph does not read (llama.cpp refuses both kinds of extra tensor too: "wrong number of
/// tensors") — each would be silently left out or read wrong. `info` reports it without loading.
pub fn check_tensor_table(g: &crate::gguf::Gguf, config: &Config) -> Result<(), ModelError> {
    let layer_of = |name: &str| {
        name.strip_prefix("blk.")?
            .split('.')
            .next()?
            .parse::<usize>()
            .ok()
    };
    if let Some(t) = g
        .tensors()
        .iter()
        .find(|t| layer_of(&t.name).is_some_and(|il| il >= config.n_layer))
    {
        return Err(ModelError::LayerPastCount {
            name: t.name.clone(),
            n_layer: config.n_layer,
        });
    }
    if let Some((a, b)) = g.first_overlap() {
        return Err(ModelError::OverlappingTensors {
            first: a.name.clone(),
            second: b.name.clone(),
        });
    }
    // Every tensor must be one the family's graph reads (the table in `tensors.rs`): a bias
    // on another product, head norms or post-norms in a family without them, another
    // family's FFN, a name no family has.
    let moe = config.experts.is_some();
    let unread = |name: &str| tensors::role_of(name, &config.family, moe).is_none();
    if let Some(t) = g.tensors().iter().find(|t| unread(&t.name)) {
        return Err(ModelError::UnreadTensor {
            name: t.name.clone(),
            arch: config.arch.clone(),
        });
    }
    Ok(())
}

impl<B: Backend> Model<B> {
    /// Loads the model held in `file` onto `backend`.
    pub fn load(
        backend: B,
        file: Arc<ModelFile>,
        opts: LoadOptions<'_>,
    ) -> Result<Self, ModelError> {
        let mut in_file = InFile;
        let load = std::pin::pin!(Self::load_from(backend, file, &mut in_file, opts));
        match load.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => result,
            // Every tensor is read from `file`, and backends load without waiting.
            Poll::Pending => unreachable!("a load from memory never waits"),
        }
    }

    /// Loads a model onto `backend`, reading each tensor from `source` when `file` holds
    /// only the header ([`ModelFile::from_header`]): a backend that copies weights to its own
    /// memory then needs one tensor in host memory at a time, not the file.
    pub async fn load_streamed<S: TensorSource>(
        backend: B,
        file: Arc<ModelFile>,
        source: &mut S,
        opts: LoadOptions<'_>,
    ) -> Result<Self, ModelError> {
        Self::load_from(backend, file, &mut Streamed(source), opts).await
    }

    async fn load_from<F: Fetch>(
        backend: B,
        file: Arc<ModelFile>,
        fetch: &mut F,
        opts: LoadOptions<'_>,
    ) -> Result<Self, ModelError> {
        let g = file.header();
        // The architecture is checked before any tensor, so a file of another one says so.
        let n_vocab = g.tensor("token_embd.weight").map(|t| t.ne[1] as usize);
        let config = Config::from_gguf(g, n_vocab)?;
        let n_sampled = g
            .get_array("tokenizer.ggml.tokens")
            .map_or(config.n_vocab, |tokens| {
                tokens.len().clamp(1, config.n_vocab.max(1))
            });
        if g.tensors().is_empty() {
            return Err(ModelError::NoTensors);
        }
        let all = 0..config.n_layer;
        let layer_range = opts.layers.clone().unwrap_or(all.clone());
        if layer_range.start > layer_range.end || layer_range.end > config.n_layer {
            return Err(ModelError::LayerRange {
                start: layer_range.start,
                end: layer_range.end,
                have_start: 0,
                have_end: config.n_layer,
            });
        }
        check_tensor_table(g, &config)?;
        if config.experts.is_some() && !backend.runs_experts() {
            return Err(ModelError::Backend(BackendError::Unsupported {
                backend: backend.name(),
                tensor: "blk.0.ffn_gate_exps.weight".into(),
                why: "mixture-of-experts layers run on the CPU and on a native GPU, not here (--backend cpu)".into(),
            }));
        }
        let holds_head = match opts.head_place {
            HeadPlace::LastLayer => layer_range.end == config.n_layer,
            HeadPlace::Here => true,
            HeadPlace::Elsewhere => false,
        };
        let plan = Plan::new(config, g, layer_range.clone(), opts.head, holds_head);
        let mut loader = Loader::new(&backend, &file, &plan, fetch, opts.progress);
        let embedding = loader.embedding().await?;
        let mut layers = Vec::with_capacity(layer_range.len());
        for il in layer_range.clone() {
            layers.push(loader.layer(il).await?);
        }
        let rope_factors = loader.rope_factors().await?;
        let output_norm = loader.output_norm().await?;
        let output = loader.output().await?;
        let part_bytes = std::mem::take(&mut loader.part_bytes);
        let bytes_per_token = plan.bytes_per_token(&part_bytes);
        Ok(Self {
            config: plan.config.clone(),
            backend,
            file,
            layers,
            layer_range,
            embedding,
            output,
            output_norm,
            rope_factors,
            bytes_per_token,
            part_bytes,
            n_sampled,
            #[cfg(unix)]
            swap: None,
        })
    }

    /// Ids a prediction ([`Model::predict`], greedy or top-k decoding) may pick: the LM head's
    /// rows, or fewer where the file's token list is shorter (the rows past it have no text;
    /// their logits are still in [`Model::eval`]'s rows).
    pub fn sampled_vocab(&self) -> usize {
        self.n_sampled
    }

    /// Weight bytes read for one decoded token (every matrix, the LM head included; the
    /// embedding table only when it doubles as the head).
    pub fn bytes_per_token(&self) -> u64 {
        self.bytes_per_token
    }

    /// The layers this instance holds.
    pub fn layer_range(&self) -> Range<usize> {
        self.layer_range.clone()
    }

    /// A new session with a KV cache of `n_ctx` positions, evaluating at most `batch`
    /// tokens per step (longer inputs are split; a batch larger than the context is clamped
    /// to it). Sizes are checked against [`Backend::memory_limits`] before anything is
    /// allocated.
    pub fn new_session(&self, n_ctx: usize, batch: usize) -> Result<Session<B>, ModelError> {
        self.new_session_with(n_ctx, batch, &AttentionConfig::default())
    }

    /// [`Model::new_session`] with attention stored and read as `attention` says (cache
    /// element type, dense or sparse).
    pub fn new_session_with(
        &self,
        n_ctx: usize,
        batch: usize,
        attention: &AttentionConfig,
    ) -> Result<Session<B>, ModelError> {
        if attention.sparse.is_some() && self.config.window.is_some() {
            return Err(ModelError::SparseWithWindow);
        }
        let kv = self.config.kv_dim();
        let windows = WindowedCache::new(&self.config, n_ctx, batch, attention.swa_full);
        let slots = cache_slots(&self.config, n_ctx, batch, attention.swa_full)
            [self.layer_range.clone()]
        .to_vec();
        let n_windowed = slots.iter().filter(|&&n| n < n_ctx).count();
        let shape = SessionShape {
            n_layer: self.layers.len(),
            windowed: windows.map(|w| (n_windowed, w.slots())),
            kv_dim: kv,
            kv_bytes: attention.kv_type.bytes(),
            row_widths: self.row_widths(),
        };
        let size = shape.size(n_ctx, batch, self.backend.memory_limits())?;
        let batch = size.batch;
        let s = self.scratch(batch, batch)?;
        let b = &self.backend;
        let cache = b.new_cache(&slots, kv, attention)?;
        Ok(Session {
            cache,
            pos: 0,
            n_ctx,
            batch,
            attention: attention.clone(),
            shift_keep: None,
            discarded: 0,
            mixed_rope: self.layer_range.clone().any(|il| {
                let c = &self.config;
                c.rope_base_of(il) != c.rope_base || c.rope_scale_of(il) != c.rope_scale
            }),
            windows,
            s,
        })
    }

    /// The width of one token's row in each scratch buffer, in [`Scratch`]'s order.
    fn row_widths(&self) -> [usize; 10] {
        let c = &self.config;
        let (d, kv, ff) = (c.n_embd, c.kv_dim(), c.n_ff);
        // `h`, `q` and `att` also hold rows of the other width (a sub-norm's output, a
        // product's), and `q` and `att` trade places where heads are normalized.
        let wide = c.q_dim().max(c.n_embd);
        let logits = if self.output_norm.is_some() {
            c.n_vocab
        } else {
            0
        };
        // `gate` holds the normalized keys of a layer with head norms.
        let gate = if c.family.qk_norm { ff.max(kv) } else { ff };
        [d, wide, wide, kv, kv, wide, gate, ff, ff, logits]
    }

    /// Scratch buffers for steps of up to `batch` tokens whose logits are computed for up to
    /// `logit_rows` of them.
    fn scratch(&self, batch: usize, logit_rows: usize) -> Result<Scratch<B>, ModelError> {
        let [d, wide, _, kv, _, att, gate, ff, _, logits] = self.row_widths();
        let b = &self.backend;
        Ok(Scratch {
            x: b.alloc(batch * d)?,
            h: b.alloc(batch * wide)?,
            q: b.alloc(batch * wide)?,
            k: b.alloc(batch * kv)?,
            v: b.alloc(batch * kv)?,
            att: b.alloc(batch * att)?,
            gate: b.alloc(batch * gate)?,
            up: b.alloc(batch * ff)?,
            act: b.alloc(batch * ff)?,
            logits: b.alloc((logit_rows * logits).max(1))?,
        })
    }

    /// Evaluates `tokens` at the session's next positions and returns logits. Needs a model
    /// holding every layer.
    pub async fn eval_async(
        &self,
        s: &mut Session<B>,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        if tokens.is_empty() {
            return Err(ModelError::Empty);
        }
        self.check_tokens(tokens)?;
        self.make_room(s, tokens.len())?;
        let (Some(embedding), Some(_)) = (&self.embedding, &self.output_norm) else {
            return Err(self.range_error(0..c.n_layer));
        };
        if self.layer_range != (0..c.n_layer) {
            return Err(self.range_error(0..c.n_layer));
        }
        let mut out = Vec::with_capacity(match want {
            Logits::Last => c.n_vocab,
            Logits::All => tokens.len() * c.n_vocab,
        });
        let chunks = tokens.chunks(s.batch);
        let n_chunks = chunks.len();
        for (i, chunk) in chunks.enumerate() {
            let n = chunk.len();
            self.embed_rows(embedding, chunk, &mut s.s.x);
            self.run_layers(s, n);
            match want {
                Logits::All => out.extend(self.head(s, n, 0).await?),
                Logits::Last if i + 1 == n_chunks => out.extend(self.head(s, 1, n - 1).await?),
                Logits::Last => {}
            }
            s.advance(n);
        }
        Ok(out)
    }

    /// Evaluates `tokens` like [`Model::eval_async`] and returns only the most likely next
    /// token (greedy decoding): the backend finds the argmax without handing back the logits.
    pub async fn eval_greedy_async(
        &self,
        s: &mut Session<B>,
        tokens: &[u32],
    ) -> Result<u32, ModelError> {
        self.eval_last(s, tokens)?;
        match self.read_prediction(s, Readout::Argmax).await? {
            Prediction::Token(t) => Ok(t),
            _ => unreachable!("an argmax readout"),
        }
    }

    /// Evaluates `tokens` like [`Model::eval_async`] and returns the `k` most likely next
    /// tokens with their logits, most likely first (for [`crate::sampler::Sampler::sample_top`]):
    /// a GPU hands back only those instead of the whole row.
    pub async fn eval_top_k_async(
        &self,
        s: &mut Session<B>,
        tokens: &[u32],
        k: usize,
    ) -> Result<Vec<(u32, f32)>, ModelError> {
        self.eval_last(s, tokens)?;
        match self.read_prediction(s, Readout::Top(k)).await? {
            Prediction::Top(top) => Ok(top),
            _ => unreachable!("a top-k readout"),
        }
    }

    /// Evaluates `tokens` like [`Model::eval_async`] and hands back what `readout` asks of
    /// the last position's logits.
    pub async fn predict_async(
        &self,
        s: &mut Session<B>,
        tokens: &[u32],
        readout: Readout,
    ) -> Result<Prediction, ModelError> {
        self.eval_last(s, tokens)?;
        self.read_prediction(s, readout).await
    }

    /// Runs this instance's layers on `hidden` at positions from `pos0`, then the final norm
    /// and LM head on the last row, and hands back what `readout` asks (needs the last layer
    /// here: what the last node of a ring computes). A `pos0` before the session's position
    /// first forgets the positions from `pos0` on.
    pub async fn predict_from_hidden_async(
        &self,
        s: &mut Session<B>,
        pos0: usize,
        hidden: &[f32],
        readout: Readout,
    ) -> Result<Prediction, ModelError> {
        let c = &self.config;
        if self.output_norm.is_none() || self.layer_range.end != c.n_layer {
            return Err(self.range_error(c.n_layer - 1..c.n_layer));
        }
        let n_tokens = self.hidden_rows(hidden)?;
        let d = c.n_embd;
        self.seek(s, pos0)?;
        self.make_room(s, n_tokens)?;
        let chunks = hidden.chunks(s.batch * d);
        let n_chunks = chunks.len();
        for (i, rows) in chunks.enumerate() {
            let n = rows.len() / d;
            self.backend.write(&mut s.s.x, rows)?;
            self.run_layers(s, n);
            if i + 1 == n_chunks {
                self.record_head(s, 1, n - 1)?;
            }
            s.advance(n);
        }
        self.read_prediction(s, readout).await
    }

    /// Reads what `readout` asks of the logits in the session's logits buffer.
    async fn read_prediction(
        &self,
        s: &mut Session<B>,
        readout: Readout,
    ) -> Result<Prediction, ModelError> {
        // The row of the last position evaluated.
        let pos = s.pos.saturating_sub(1);
        self.read_prediction_at(&mut s.s.logits, pos, readout).await
    }

    /// Moves the session to `pos0` for states that start there: positions from `pos0` on
    /// are forgotten; a `pos0` past the session's position is a gap.
    fn seek(&self, s: &mut Session<B>, pos0: usize) -> Result<(), ModelError> {
        if pos0 > s.pos {
            return Err(ModelError::PositionGap { pos0, pos: s.pos });
        }
        s.truncate(pos0);
        if s.pos != pos0 {
            return Err(ModelError::WindowLost { pos0 });
        }
        Ok(())
    }

    /// The number of rows in `hidden`, which must be a non-empty whole number of rows.
    fn hidden_rows(&self, hidden: &[f32]) -> Result<usize, ModelError> {
        let d = self.config.n_embd;
        if hidden.is_empty() || !hidden.len().is_multiple_of(d) {
            return Err(ModelError::HiddenSize {
                got: hidden.len(),
                n_tokens: hidden.len() / d,
                n_embd: d,
            });
        }
        Ok(hidden.len() / d)
    }

    /// Records the evaluation of `tokens` up to the last position's logits in the session's
    /// logits buffer, for a read-back that follows.
    fn eval_last(&self, s: &mut Session<B>, tokens: &[u32]) -> Result<(), ModelError> {
        let c = &self.config;
        if tokens.is_empty() {
            return Err(ModelError::Empty);
        }
        self.check_tokens(tokens)?;
        self.make_room(s, tokens.len())?;
        let (Some(embedding), Some(_)) = (&self.embedding, &self.output_norm) else {
            return Err(self.range_error(0..c.n_layer));
        };
        if self.layer_range != (0..c.n_layer) {
            return Err(self.range_error(0..c.n_layer));
        }
        let chunks = tokens.chunks(s.batch);
        let n_chunks = chunks.len();
        for (i, chunk) in chunks.enumerate() {
            let n = chunk.len();
            self.embed_rows(embedding, chunk, &mut s.s.x);
            self.run_layers(s, n);
            if i + 1 == n_chunks {
                self.record_head(s, 1, n - 1)?;
            }
            s.advance(n);
        }
        Ok(())
    }

    /// Runs this instance's layers on `hidden` (`[n_tokens][n_embd]`, the residual stream
    /// entering its first layer) at the session's next positions, and returns the residual
    /// stream leaving its last layer. This is what a ring node computes.
    pub async fn forward_hidden_async(
        &self,
        s: &mut Session<B>,
        hidden: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        let pos = s.pos;
        self.forward_hidden_at_async(s, pos, hidden).await
    }

    /// [`Model::forward_hidden_async`] at positions from `pos0` (a ring frame's): a `pos0`
    /// before the session's position first forgets the positions from `pos0` on; one past
    /// it is refused ([`ModelError::PositionGap`]).
    pub async fn forward_hidden_at_async(
        &self,
        s: &mut Session<B>,
        pos0: usize,
        hidden: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        let d = self.config.n_embd;
        let n_tokens = self.hidden_rows(hidden)?;
        self.seek(s, pos0)?;
        self.forward_rows(s, n_tokens, |b, rows, x| {
            b.write(x, &hidden[rows.start * d..rows.end * d])?;
            Ok(())
        })
        .await
    }

    /// Embeds `tokens` and runs this instance's layers on them at positions from `pos0` (as
    /// [`Model::forward_hidden_at_async`]), returning the residual stream leaving its last
    /// layer: what a ring's master computes (needs layer 0 here). The embeddings go straight
    /// into the layers, not through the host.
    pub async fn forward_tokens_at_async(
        &self,
        s: &mut Session<B>,
        pos0: usize,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        let embedding = self
            .embedding
            .as_ref()
            .filter(|_| self.layer_range.start == 0)
            .ok_or_else(|| self.range_error(0..1))?;
        if tokens.is_empty() {
            return Err(ModelError::Empty);
        }
        self.check_tokens(tokens)?;
        self.seek(s, pos0)?;
        self.forward_rows(s, tokens.len(), |_, rows, x| {
            self.embed_rows(embedding, &tokens[rows], x);
            Ok(())
        })
        .await
    }

    /// The final normalized hidden states `[n][n_embd]` of `tokens` evaluated from the
    /// session's start: every layer, then the final norm, without the LM head — what an
    /// embedding pools (llama.cpp's `result_norm`). Needs every layer in this instance.
    pub async fn hidden_states_async(
        &self,
        s: &mut Session<B>,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let whole = self.layer_range.start == 0 && self.layer_range.end == c.n_layer;
        let (Some(embedding), Some(norm), true) = (&self.embedding, &self.output_norm, whole)
        else {
            return Err(self.range_error(0..c.n_layer));
        };
        if tokens.is_empty() {
            return Err(ModelError::Empty);
        }
        self.check_tokens(tokens)?;
        self.seek(s, 0)?;
        self.make_room(s, tokens.len())?;
        let d = c.n_embd;
        let mut out = vec![0.0; tokens.len() * d];
        for (i, rows_out) in out.chunks_mut(s.batch * d).enumerate() {
            let (start, n) = (i * s.batch, rows_out.len() / d);
            self.embed_rows(embedding, &tokens[start..start + n], &mut s.s.x);
            self.run_layers(s, n);
            let sc = &mut s.s;
            self.backend.rms_norm(&sc.x, norm, n, c.eps, &mut sc.h);
            self.backend.read(&sc.h, rows_out).await?;
            s.advance(n);
        }
        Ok(out)
    }

    /// Runs this instance's layers over `n_tokens` positions from the session's, in chunks
    /// of at most the session's batch whose input rows `fill` puts in the residual buffer,
    /// and returns the residual stream leaving the last layer.
    async fn forward_rows(
        &self,
        s: &mut Session<B>,
        n_tokens: usize,
        mut fill: impl FnMut(&B, Range<usize>, &mut B::Buffer) -> Result<(), ModelError>,
    ) -> Result<Vec<f32>, ModelError> {
        let d = self.config.n_embd;
        self.make_room(s, n_tokens)?;
        let mut out = vec![0.0; n_tokens * d];
        for (i, rows_out) in out.chunks_mut(s.batch * d).enumerate() {
            let (start, n) = (i * s.batch, rows_out.len() / d);
            fill(&self.backend, start..start + n, &mut s.s.x)?;
            self.run_layers(s, n);
            self.backend.read(&s.s.x, rows_out).await?;
            s.advance(n);
        }
        Ok(out)
    }

    /// Token embeddings `[n][n_embd]` (needs layer 0 in this instance); uses the session's
    /// scratch space but not its position.
    pub async fn embed_async(
        &self,
        s: &mut Session<B>,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        let d = self.config.n_embd;
        let embedding = self
            .embedding
            .as_ref()
            .filter(|_| self.layer_range.start == 0)
            .ok_or_else(|| self.range_error(0..1))?;
        self.check_tokens(tokens)?;
        let mut out = vec![0.0; tokens.len() * d];
        for (chunk, rows) in tokens.chunks(s.batch).zip(out.chunks_mut(s.batch * d)) {
            self.embed_rows(embedding, chunk, &mut s.s.x);
            self.backend.read(&s.s.x, rows).await?;
        }
        Ok(out)
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), ModelError> {
        let n_vocab = self.config.n_vocab;
        match tokens.iter().find(|&&t| t as usize >= n_vocab) {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, n_vocab }),
            None => Ok(()),
        }
    }

    /// Final norm and LM head on hidden states `[n][n_embd]` (needs the last layer here).
    pub async fn logits_from_hidden_async(
        &self,
        s: &mut Session<B>,
        hidden: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        let d = self.config.n_embd;
        self.hidden_rows(hidden)?;
        let mut out = Vec::new();
        for rows in hidden.chunks(s.batch * d) {
            self.backend.write(&mut s.s.x, rows)?;
            out.extend(self.head(s, rows.len() / d, 0).await?);
        }
        Ok(out)
    }

    /// Makes room for `n` more positions: shifts the context where the session allows it
    /// ([`Session::set_context_shift`]), else refuses a context that would overflow.
    fn make_room(&self, s: &mut Session<B>, n: usize) -> Result<(), ModelError> {
        if s.pos + n <= s.n_ctx {
            return Ok(());
        }
        let full = ModelError::ContextFull {
            needed: s.pos + n,
            n_ctx: s.n_ctx,
        };
        let Some(keep) = s.shift_keep else {
            return Err(full);
        };
        let keep = keep.min(s.pos);
        if n > s.n_ctx - keep {
            return Err(full);
        }
        let needed = s.pos + n - s.n_ctx;
        let mut discard = ((s.pos - keep) / 2).max(needed);
        // A sliding-window layer's cache may have lost the kept positions: the next window must
        // not reach back to them.
        if let Some(most) = s.windows.and_then(|w| w.max_discard(keep, s.pos)) {
            if most < needed {
                return Err(ModelError::ContextShift(format!(
                    "the sliding-window caches hold too few positions to keep {keep} and make room for {n} (hold full-size caches: --swa-full)"
                )));
            }
            discard = discard.min(most);
        }
        let rope_k = RopeShape {
            n_head: self.config.n_head_kv,
            ..self.rope_shape(s.n_ctx)
        };
        self.backend
            .shift_cache(&mut s.cache, keep, discard, s.pos, &rope_k);
        s.pos -= discard;
        s.discarded += discard;
        if let Some(w) = &mut s.windows {
            w.shifted(keep, discard);
        }
        Ok(())
    }

    fn range_error(&self, need: Range<usize>) -> ModelError {
        ModelError::LayerRange {
            start: need.start,
            end: need.end,
            have_start: self.layer_range.start,
            have_end: self.layer_range.end,
        }
    }

    /// Norm + LM head on `n` rows of the residual stream starting at row `row0`.
    async fn head(
        &self,
        s: &mut Session<B>,
        n: usize,
        row0: usize,
    ) -> Result<Vec<f32>, ModelError> {
        self.record_head(s, n, row0)?;
        let mut out = vec![0.0; n * self.config.n_vocab];
        self.backend.read(&s.s.logits, &mut out).await?;
        self.check_finite(&out, s.pos + row0)?;
        Ok(out)
    }

    /// The first NaN or infinite value of `rows` (logit rows, the first at position `pos0`) as
    /// an error: such a row is never sampled or handed on.
    fn check_finite(&self, rows: &[f32], pos0: usize) -> Result<(), ModelError> {
        let n_vocab = self.config.n_vocab.max(1);
        match rows.iter().position(|v| !v.is_finite()) {
            None => Ok(()),
            Some(i) => Err(ModelError::NonFiniteLogits {
                pos: pos0 + i / n_vocab,
                token: (i % n_vocab) as u32,
                value: rows[i],
            }),
        }
    }

    /// Computes the logits of `n` rows from row `row0` into the session's logits buffer.
    fn record_head(&self, s: &mut Session<B>, n: usize, row0: usize) -> Result<(), ModelError> {
        let c = &self.config;
        let b = &self.backend;
        let (norm, head) = self.head_parts()?;
        let sc = &mut s.s;
        b.copy_rows(&sc.x, row0, n, c.n_embd, &mut sc.att, 0);
        b.rms_norm_for(&sc.att, norm, n, c.eps, &mut sc.h, head);
        self.logits_of(head, &sc.h, n, &mut sc.logits);
        Ok(())
    }

    /// The logits of `n` normalized rows `h` into `logits`: the LM head's product, soft-capped
    /// where the family caps them.
    fn logits_of(&self, head: &B::Matrix, h: &B::Buffer, n: usize, logits: &mut B::Buffer) {
        self.backend.matmul(head, h, n, logits);
        if let Some(cap) = self.config.final_softcap {
            self.backend.softcap(logits, n * self.config.n_vocab, cap);
        }
    }

    /// The final norm's gains and the LM head (needs the last layer here).
    fn head_parts(&self) -> Result<(&B::Vector, &B::Matrix), ModelError> {
        let c = &self.config;
        match (
            &self.output_norm,
            self.output.as_ref().or(self.embedding.as_ref()),
        ) {
            (Some(norm), Some(head)) => Ok((norm, head)),
            _ => Err(self.range_error(c.n_layer - 1..c.n_layer)),
        }
    }

    fn run_layers(&self, s: &mut Session<B>, n: usize) {
        let (pos0, n_ctx) = (s.pos, s.n_ctx);
        let cache = &mut s.cache;
        self.layers_over(
            &mut s.s,
            n,
            &mut |b, li, [q, k, v, att], rope, attn, next, prep| {
                let [rope_q, rope_k] = self.rope_in_context(rope, n_ctx);
                b.rope_attention(
                    cache, li, q, k, v, n, pos0, &rope_q, &rope_k, attn, att, next, prep,
                );
            },
        );
    }

    /// Runs this instance's layers on the `n` rows of `sc.x`; `attend` does each layer's
    /// attention (RoPE, the cache, softmax) on its queries, keys and values into `att`, given
    /// the RoPE of the queries and of the keys of a short session (each `attend` puts its
    /// session's through [`Model::rope_in_context`]): over one session, or over each of a
    /// batch's.
    fn layers_over(&self, sc: &mut Scratch<B>, n: usize, attend: &mut Attend<'_, B>) {
        let c = &self.config;
        let b = &self.backend;
        let Scratch {
            x,
            h,
            q,
            k,
            v,
            att,
            gate,
            up,
            act,
            ..
        } = sc;
        // Whether the layer before normalized the stream for this layer's attention (into `h`).
        let mut normed = false;
        for (li, l) in self.layers.iter().enumerate() {
            let (attn, rope) = self.layer_shapes(li, l);
            if !normed {
                b.rms_norm_for(x, &l.attn_norm, n, c.eps, h, l.qkv.first());
            }
            b.qkv(&l.qkv, h, n, [&mut *q, &mut *k, &mut *v]);
            // Between the products and the rotations: the biases, the query scale (where head
            // norms do not follow) and the head norms.
            let prep = HeadPrep {
                bias: l.qkv_bias.as_ref(),
                query_scale: if l.qk_norm.is_none() {
                    c.query_scale
                } else {
                    1.0
                },
                norms: l.qk_norm.as_ref().map(|[gq, gk]| HeadNorms {
                    gains: [gq, gk],
                    eps: c.eps,
                }),
            };
            // The attention's output is read by the output projection alone, but where BitNet
            // normalizes it first.
            let next = l.attn_sub_norm.is_none().then_some(&l.wo);
            // A backend that prepares the heads in attention is handed them; else they are
            // prepared here, the normalized queries into `att` and keys into `gate` (free
            // until the FFN), and the attention writes its output into `q`: the two buffers
            // (of one width) then trade places.
            let inside = b.prepares_heads_in_attention();
            if !inside {
                b.add_bias_and_scale_queries(&prep, [&mut *q, &mut *k, &mut *v], n, c.q_dim());
            }
            let normed_apart = match prep.norms {
                Some(norms) if !inside => {
                    b.rms_norm_qk(
                        [&*q, &*k],
                        norms.gains,
                        [n * c.n_head, n * c.n_head_kv],
                        norms.eps,
                        [&mut *att, &mut *gate],
                    );
                    true
                }
                _ => false,
            };
            let buffers = if normed_apart {
                [&mut *att, &mut *gate, &mut *v, &mut *q]
            } else {
                [&mut *q, &mut *k, &mut *v, &mut *att]
            };
            attend(b, li, buffers, &rope, &attn, next, inside.then_some(prep));
            if normed_apart {
                std::mem::swap(q, att);
            }
            // BitNet normalizes the attention output and the FFN activation once more before
            // their products; other families multiply them as they are.
            let wo_in = match &l.attn_sub_norm {
                Some(g) => {
                    b.rms_norm_for(att, g, n, c.eps, h, &l.wo);
                    &*h
                }
                None => &*att,
            };
            match (&l.post_norms, &l.wo_bias) {
                // Gemma normalizes the attention's output before the residual add (into `q`,
                // normalized into `h`: both free here), and the stream for the FFN in the same
                // pass.
                (Some([g, _]), _) => {
                    b.matmul(&l.wo, wo_in, n, q);
                    b.rms_norm_add_norm_for(
                        q,
                        g,
                        x,
                        &l.ffn_norm,
                        n,
                        c.n_embd,
                        c.eps,
                        h,
                        l.ffn.first(),
                    );
                }
                (None, Some(bias)) => {
                    b.matmul(&l.wo, wo_in, n, q);
                    b.add_bias(q, bias, n);
                    b.add(x, q, n * c.n_embd);
                    b.rms_norm_for(x, &l.ffn_norm, n, c.eps, h, l.ffn.first());
                }
                (None, None) => {
                    b.matmul_add(&l.wo, wo_in, n, c.n_embd, x, q);
                    b.rms_norm_for(x, &l.ffn_norm, n, c.eps, h, l.ffn.first());
                }
            }
            self.ffn(l, n, h, [&mut *gate, &mut *up, &mut *act], x, q);
            let post_norm = l.post_norms.as_ref().map(|[_, g]| g);
            // Gemma's normalized FFN output added; with a layer after it here, the stream
            // normalized for that layer's attention in the same pass.
            normed = match (post_norm, self.layers.get(li + 1)) {
                (Some(g), Some(after)) => {
                    b.rms_norm_add_norm_for(
                        q,
                        g,
                        x,
                        &after.attn_norm,
                        n,
                        c.n_embd,
                        c.eps,
                        h,
                        after.qkv.first(),
                    );
                    true
                }
                (Some(g), None) => {
                    b.rms_norm_add(q, g, n, c.n_embd, c.eps, x, h);
                    false
                }
                (None, _) => false,
            };
        }
    }

    /// The rows of `tokens` in `table` into `x`, as the first layer reads them (times
    /// √n_embd where the family scales its embeddings).
    fn embed_rows(&self, table: &B::Matrix, tokens: &[u32], x: &mut B::Buffer) {
        let c = &self.config;
        self.backend.embed(table, tokens, x);
        if c.family.embed_scale {
            self.backend
                .scale(x, tokens.len() * c.n_embd, (c.n_embd as f32).sqrt());
        }
    }

    /// Layer `li`'s attention and the RoPE of its queries and keys: a sliding-window layer
    /// attends its window with its own RoPE base.
    fn layer_shapes<'a>(
        &'a self,
        li: usize,
        l: &'a Layer<B>,
    ) -> (AttentionShape<'a>, [RopeShape<'a>; 2]) {
        let c = &self.config;
        let il = self.layer_range.start + li;
        let attn = AttentionShape {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            window: c.window_of(il),
            softcap: c.attn_softcap,
            sinks: l.sinks.as_deref(),
        };
        let rope_q = RopeShape {
            base: c.rope_base_of(il),
            scale: c.rope_scale_of(il),
            ..self.rope_shape(0)
        };
        let rope_k = RopeShape {
            n_head: c.n_head_kv,
            ..rope_q
        };
        (attn, [rope_q, rope_k])
    }

    /// Layer `l`'s FFN of the `n` normalized rows `h`, with `gate`, `up` and `act` as
    /// scratch: its output into `q` where the family normalizes it before the residual add
    /// (Gemma), else added to the residual stream `x`.
    fn ffn(
        &self,
        l: &Layer<B>,
        n: usize,
        h: &B::Buffer,
        [gate, up, act]: [&mut B::Buffer; 3],
        x: &mut B::Buffer,
        q: &mut B::Buffer,
    ) {
        let (c, b) = (&self.config, &self.backend);
        let post_norm = l.post_norms.is_some();
        match &l.ffn {
            Ffn::Dense { gate_up, down } => {
                b.gate_up(gate_up, h, n, c.n_ff, c.activation, [&mut *gate, up], act);
                // BitNet normalizes the activation once more before the down product.
                let down_in = match &l.ffn_sub_norm {
                    Some(g) => {
                        b.rms_norm_for(act, g, n, c.eps, gate, down);
                        &*gate
                    }
                    None => &*act,
                };
                if post_norm {
                    b.matmul(down, down_in, n, q);
                } else {
                    b.matmul_add(down, down_in, n, c.n_embd, x, q);
                }
            }
            // The experts' weighted sum into `q`.
            Ffn::Experts(moe) => {
                let Some(routing) = &c.experts else {
                    unreachable!("a layer of experts is loaded from a config with them")
                };
                if post_norm {
                    b.moe_ffn(moe, routing, c.activation, h, n, q);
                } else {
                    b.moe_ffn_add(moe, routing, c.activation, h, n, c.n_embd, x, q);
                }
            }
        }
    }

    /// The RoPE of this model's query heads in a session of `n_ctx` positions (LongRoPE's
    /// factors depend on it).
    fn rope_shape(&self, n_ctx: usize) -> RopeShape<'_> {
        let c = &self.config;
        RopeShape {
            n_head: c.n_head,
            head_dim: c.head_dim,
            rope_dim: c.rope_dim,
            base: c.rope_base,
            scale: c.rope_scale,
            freq_factors: self.rope_factors.for_context(n_ctx, c.n_ctx_orig),
            attn_factor: c.rope_attn_factor,
            yarn: c.rope_yarn,
        }
    }

    /// A layer's RoPE of queries and keys (`rope`, as [`Model::layers_over`] gives it) for a
    /// session of `n_ctx` positions.
    fn rope_in_context<'r>(
        &'r self,
        rope: &[RopeShape<'r>; 2],
        n_ctx: usize,
    ) -> [RopeShape<'r>; 2] {
        let freq_factors = self.rope_factors.for_context(n_ctx, self.config.n_ctx_orig);
        rope.map(|r| RopeShape { freq_factors, ..r })
    }
}

/// The blocking forms of the `*_async` methods, for native code: on the CPU the futures are
/// ready at once, and a native GPU waits on its device, so this costs nothing over calling
/// them directly.
#[cfg(not(target_arch = "wasm32"))]
impl<B: Backend> Model<B> {
    /// [`Model::eval_async`], waited for.
    pub fn eval(
        &self,
        s: &mut Session<B>,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        pollster::block_on(self.eval_async(s, tokens, want))
    }

    /// [`Model::hidden_states_async`], waited for.
    pub fn hidden_states(
        &self,
        s: &mut Session<B>,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        pollster::block_on(self.hidden_states_async(s, tokens))
    }

    /// [`Model::step_async`], waited for.
    pub fn step(
        &self,
        scratch: &mut BatchScratch<B>,
        steps: &mut [SeqStep<'_, B>],
    ) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        pollster::block_on(self.step_async(scratch, steps))
    }

    /// [`Model::step_rows_async`], waited for.
    pub fn step_rows(
        &self,
        scratch: &mut BatchScratch<B>,
        seqs: &mut [SeqRows<'_, B>],
        input: StepInput<'_>,
    ) -> Result<StepOutput, ModelError> {
        pollster::block_on(self.step_rows_async(scratch, seqs, input))
    }

    /// [`Model::step_rows_hidden_async`], waited for.
    pub fn step_rows_hidden(
        &self,
        scratch: &mut BatchScratch<B>,
        seqs: &mut [SeqRows<'_, B>],
        input: StepInput<'_>,
    ) -> Result<Vec<f32>, ModelError> {
        pollster::block_on(self.step_rows_hidden_async(scratch, seqs, input))
    }

    /// [`Model::final_norm_async`], waited for.
    pub fn final_norm(
        &self,
        scratch: &mut BatchScratch<B>,
        hidden: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        pollster::block_on(self.final_norm_async(scratch, hidden))
    }

    /// [`Model::head_rows_async`], waited for.
    pub fn head_rows(
        &self,
        scratch: &mut BatchScratch<B>,
        hidden: &[f32],
        asked: &[(Readout, usize)],
    ) -> Result<Vec<Prediction>, ModelError> {
        pollster::block_on(self.head_rows_async(scratch, hidden, asked))
    }

    /// [`Model::eval_greedy_async`], waited for.
    pub fn eval_greedy(&self, s: &mut Session<B>, tokens: &[u32]) -> Result<u32, ModelError> {
        pollster::block_on(self.eval_greedy_async(s, tokens))
    }

    /// [`Model::forward_hidden_async`], waited for.
    pub fn forward_hidden(
        &self,
        s: &mut Session<B>,
        hidden: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        pollster::block_on(self.forward_hidden_async(s, hidden))
    }

    /// [`Model::forward_hidden_at_async`], waited for.
    pub fn forward_hidden_at(
        &self,
        s: &mut Session<B>,
        pos0: usize,
        hidden: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        pollster::block_on(self.forward_hidden_at_async(s, pos0, hidden))
    }

    /// [`Model::predict_async`], waited for.
    pub fn predict(
        &self,
        s: &mut Session<B>,
        tokens: &[u32],
        readout: Readout,
    ) -> Result<Prediction, ModelError> {
        pollster::block_on(self.predict_async(s, tokens, readout))
    }

    /// [`Model::predict_from_hidden_async`], waited for.
    pub fn predict_from_hidden(
        &self,
        s: &mut Session<B>,
        pos0: usize,
        hidden: &[f32],
        readout: Readout,
    ) -> Result<Prediction, ModelError> {
        pollster::block_on(self.predict_from_hidden_async(s, pos0, hidden, readout))
    }

    /// [`Model::embed_async`], waited for.
    pub fn embed(&self, s: &mut Session<B>, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        pollster::block_on(self.embed_async(s, tokens))
    }

    /// [`Model::logits_from_hidden_async`], waited for.
    pub fn logits_from_hidden(
        &self,
        s: &mut Session<B>,
        hidden: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        pollster::block_on(self.logits_from_hidden_async(s, hidden))
    }
}

/// Locates weight matrix `name` (`rows × cols`) in `file`, with its optional `*.scale`
/// multiplier (mainline `bitnet` files).
pub fn matrix_source(
    file: &ModelFile,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<(MatrixDesc, Option<f32>), ModelError> {
    let info = file
        .header()
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    let desc = MatrixDesc::new(info, file.bytes(), rows, cols)?;
    let scale_name = name.replace(".weight", ".scale");
    let scale = match file.header().tensor(&scale_name) {
        Some(_) => Some(vector_source(file, &scale_name, 1)?[0]),
        None => None,
    };
    Ok((desc, scale))
}

/// Reads the f32 vector `name` (`len` values) from `file`.
pub fn vector_source(file: &ModelFile, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let info = file
        .header()
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    Ok(read_f32_vector(
        info,
        file.tensor_bytes(info).map_err(WeightError::from)?,
        len,
    )?)
}
