//! The operations a backend provides; the forward pass in [`crate::model`] is written once
//! over this trait and runs on every backend (CPU, wgpu, a ring node's share of layers).
//!
//! Buffers hold f32 activations laid out `[n_tokens][width]`. Every operation is given the
//! number of tokens `n` it works on; buffers may be larger (they are sized for a batch).

use std::future::Future;
use std::sync::Arc;

use thiserror::Error;

use crate::attention::AttentionConfig;
use crate::config::{Activation, Yarn};
use crate::file::ModelFile;
use crate::memory::MemoryLimits;
use crate::weights::MatrixDesc;

/// Errors a backend can raise.
#[derive(Debug, Error)]
pub enum BackendError {
    /// The backend cannot compute with this weight layout.
    #[error("backend {backend} cannot use tensor {tensor:?}: {why}")]
    Unsupported {
        /// Backend name.
        backend: String,
        /// Tensor name.
        tensor: String,
        /// Why.
        why: String,
    },
    /// An allocation failed or exceeds a device limit.
    #[error("cannot allocate {bytes} bytes for {what}: {why}")]
    Allocation {
        /// What was being allocated.
        what: String,
        /// Requested size.
        bytes: u64,
        /// Why it failed.
        why: String,
    },
    /// The device failed.
    #[error("device error: {0}")]
    Device(String),
}

/// Geometry of attention for one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape<'a> {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads; query head `h` reads kv head `h / (n_head / n_head_kv)`.
    pub n_head_kv: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// A sliding window: the query at position `i` attends positions
    /// `i + 1 − window ..= i` only (llama.cpp's standard SWA); `None`: every earlier position.
    pub window: Option<usize>,
    /// Each scaled score `s` becomes `cap · tanh(s / cap)` before the softmax (Gemma 2's
    /// `attn_logit_softcapping`); `None`: as it is.
    pub softcap: Option<f32>,
    /// One logit per query head that joins its softmax's denominator (unscaled) and weighs
    /// no value: ggml's `soft_max_ext` sinks (gpt-oss's `attn_sinks`). Only a backend that runs
    /// experts is handed them (gpt-oss, a mixture, is refused by the others at load).
    pub sinks: Option<&'a [f32]>,
}

/// The RMSNorm of each query and key head before RoPE (Qwen3, Gemma 3), a part of
/// [`HeadPrep`].
pub struct HeadNorms<'a, V> {
    /// The gains of the query heads' norm, then of the key heads' (a head wide each).
    pub gains: [&'a V; 2],
    /// The norms' epsilon.
    pub eps: f32,
}

// Hand-written: a derive would ask `V: Copy`, which a backend's vectors are not.
impl<V> Clone for HeadNorms<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V> Copy for HeadNorms<'_, V> {}

/// What a layer does to its step's queries, keys and values between their products and the
/// rotations, in this order: the biases added, the queries scaled, each query and key head
/// normalized. Handed to [`Backend::rope_attention`] by a backend that applies it there
/// ([`Backend::prepares_heads_in_attention`]); else the caller applies it first.
pub struct HeadPrep<'a, V> {
    /// The query, key and value biases (Qwen2, gpt-oss).
    pub bias: Option<&'a [V; 3]>,
    /// The queries' factor (Gemma 2's `query_pre_attn_scalar`), 1 where there is none.
    pub query_scale: f32,
    /// Each query and key head's RMSNorm (Qwen3, Gemma 3).
    pub norms: Option<HeadNorms<'a, V>>,
}

// Hand-written for the same reason as `HeadNorms`'.
impl<V> Clone for HeadPrep<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V> Copy for HeadPrep<'_, V> {}

/// Rotary embedding parameters (NeoX "rotate half" pairing: `i` with `i + rope_dim/2`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeShape<'a> {
    /// Heads in the buffer.
    pub n_head: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Leading dims of each head that rotate.
    pub rope_dim: usize,
    /// Base frequency θ.
    pub base: f32,
    /// Position scale (linear RoPE scaling; 1 without).
    pub scale: f32,
    /// Per-pair divisors of the angle (`rope_freqs.weight`: Llama 3.1's long-context
    /// frequencies; LongRoPE's short or long factors), `rope_dim/2` of them.
    pub freq_factors: Option<&'a [f32]>,
    /// What the rotated dims are multiplied by (`rope.scaling.attn_factor`: LongRoPE's
    /// `√(1 + ln s / ln n_ctx_orig)`; 1 without), as ggml scales its cos and sin.
    pub attn_factor: f32,
    /// YaRN's blend of scaled and unscaled angles, where the model's scaling is YaRN.
    pub yarn: Option<Yarn>,
}

impl RopeShape<'_> {
    /// `(cos, sin)` of every rotated pair for positions `pos0..pos0+n`, interleaved as
    /// `[n][rope_dim/2][2]`, each times `attn_factor` (and YaRN's magnitude). Angle of pair `i`
    /// at position `p` is `scale · p · base^(−2i/rope_dim) / factor_i` (with YaRN, blended with
    /// the unscaled angle by its ramp), the power built by repeated f32 multiplication as ggml
    /// does; every backend uses this table so they all rotate by the same angles.
    pub fn angles(&self, pos0: usize, n: usize) -> Vec<f32> {
        // ggml's `rope_yarn`: the magnitude grows with the scaling.
        let yarn_magnitude = match self.yarn {
            Some(_) => 1.0 + 0.1 * (1.0 / self.scale).ln(),
            None => 1.0,
        };
        self.table(pos0, n, self.attn_factor * yarn_magnitude)
    }

    /// [`RopeShape::angles`] with the cos and sin times `magnitude`.
    fn table(&self, pos0: usize, n: usize, magnitude: f32) -> Vec<f32> {
        let half = self.rope_dim / 2;
        let theta_scale = self.base.powf(-2.0 / self.rope_dim as f32);
        let ramp = self.yarn.map(|y| y.ramp(self.rope_dim, self.base));
        let mut out = Vec::with_capacity(n * half * 2);
        for p in pos0..pos0 + n {
            let mut theta = p as f32;
            for i in 0..half {
                let factor = self.freq_factors.map_or(1.0, |f| f[i]);
                let unscaled = theta / factor;
                let scaled = self.scale * unscaled;
                let angle = match ramp {
                    None => scaled,
                    Some([low, high]) => {
                        let y = (i as f32 - low) / (high - low).max(0.001);
                        let mix = 1.0 - y.clamp(0.0, 1.0);
                        scaled * (1.0 - mix) + unscaled * mix
                    }
                };
                out.push(angle.cos() * magnitude);
                out.push(angle.sin() * magnitude);
                theta *= theta_scale;
            }
        }
        out
    }

    /// `(cos, sin)` per rotated pair, `[rope_dim/2][2]`, that rotate a key stored at position
    /// `p` to `p − delta`: the angles of position `delta` with the sine negated (rotations
    /// compose, every angle being linear in the position; the forward formula of the rotation
    /// applies them), without any magnitude (the stored key has it already).
    pub fn shift_angles(&self, delta: usize) -> Vec<f32> {
        let mut cs = self.table(delta, 1, 1.0);
        cs.iter_mut().skip(1).step_by(2).for_each(|s| *s = -*s);
        cs
    }

    /// Rotates every head of one row (`n_head × head_dim` values) by the table `cs`
    /// (`[rope_dim/2][2]`, as [`RopeShape::angles`] gives for one position): pair `i` with
    /// `i + rope_dim/2`, `(a, b) → (a·cos − b·sin, a·sin + b·cos)`.
    pub fn rotate_row(&self, row: &mut [f32], cs: &[f32]) {
        let half = self.rope_dim / 2;
        for head in row.chunks_exact_mut(self.head_dim).take(self.n_head) {
            for (i, c) in cs.chunks_exact(2).take(half).enumerate() {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c[0] - b * c[1];
                head[i + half] = a * c[1] + b * c[0];
            }
        }
    }
}

/// What a loaded matrix is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixUse {
    /// Multiplied with activations (a layer's weight, an LM head of its own).
    Product,
    /// The token embedding table: its rows are looked up per token.
    Embedding,
    /// The token embedding table that is also the LM head, as stored (a tied head): looked up
    /// per token and multiplied every step.
    TiedHead,
}

impl MatrixUse {
    /// Whether the matrix's rows are looked up per token (the embedding table, tied or not).
    pub fn looked_up(self) -> bool {
        matches!(self, Self::Embedding | Self::TiedHead)
    }
}

/// An FFN's gate and up projections, as [`Backend::join_gate_up`] prepared them.
pub enum GateUp<M> {
    /// Two matrices, multiplied one after the other.
    Apart {
        /// The gate projection.
        gate: M,
        /// The up projection.
        up: M,
    },
    /// One matrix of both (the backend's own layout), multiplied in one pass.
    Joined(M),
}

impl<M> GateUp<M> {
    /// The matrix that reads the pair's input first (the gate, or the joined matrix).
    pub fn first(&self) -> &M {
        match self {
            GateUp::Apart { gate, .. } => gate,
            GateUp::Joined(m) => m,
        }
    }
}

/// Set in the index [`Backend::argmax`] returns when the value there is NaN or infinite (a
/// row that must not be sampled).
pub const NON_FINITE: u32 = 1 << 31;

/// An attention block's Q, K and V projections, as [`Backend::join_qkv`] prepared them.
pub enum Qkv<M> {
    /// Three matrices that read the same input ([`Backend::matmul_many`]).
    Apart {
        /// The query projection.
        q: M,
        /// The key projection.
        k: M,
        /// The value projection.
        v: M,
    },
    /// One matrix of all three (the backend's own layout), multiplied in one pass.
    Joined(M),
    /// Q and K in one matrix (the backend's own layout) and V apart, where V cannot join them
    /// (llama.cpp's Q4_K_M keeps some layers' V in Q6_K): two products of one input.
    JoinedQk {
        /// The query and key projections, multiplied in one pass.
        qk: M,
        /// The value projection.
        v: M,
    },
}

impl<M> Qkv<M> {
    /// The matrix that reads the input first (the query projection, or the joined matrix).
    pub fn first(&self) -> &M {
        match self {
            Qkv::Apart { q, .. } => q,
            Qkv::Joined(m) | Qkv::JoinedQk { qk: m, .. } => m,
        }
    }
}

/// One expert of a mixture-of-experts FFN: a gated FFN of its own.
pub struct Expert<M, V> {
    /// Its gate and up projections.
    pub gate_up: GateUp<M>,
    /// Its down projection.
    pub down: M,
    /// The biases added to its gate, up and down products (gpt-oss), all or none.
    pub biases: Option<[V; 3]>,
}

/// A mixture-of-experts FFN: the router (`n_expert` rows) and the experts, routed as
/// [`crate::config::Experts`] says.
pub struct Moe<M, V> {
    /// The router's matrix (`ffn_gate_inp`).
    pub router: M,
    /// The bias added to the router's logits (gpt-oss).
    pub router_bias: Option<V>,
    /// The experts, by id.
    pub experts: Vec<Expert<M, V>>,
    /// The experts' matrices and biases stacked, expert `e`'s rows after expert `e − 1`'s,
    /// where the backend multiplies a step's chosen experts through them
    /// ([`Backend::stack_experts`]).
    pub stacked: Option<Expert<M, V>>,
}

/// A compute backend.
pub trait Backend {
    /// f32 activations `[n][width]`.
    type Buffer;
    /// A weight matrix prepared for this backend.
    type Matrix;
    /// An f32 vector (norm gains).
    type Vector;
    /// The KV cache of all layers a model instance runs.
    type Cache;

    /// Short name shown to users, e.g. `cpu (avx2, 2 threads)`.
    fn name(&self) -> String;
    /// Prepares a weight matrix stored in `file`; `scale` multiplies every output
    /// (mainline's optional `*.scale` tensors).
    fn load_matrix(
        &self,
        file: &Arc<ModelFile>,
        desc: MatrixDesc,
        scale: Option<f32>,
        usage: MatrixUse,
    ) -> Result<Self::Matrix, BackendError>;
    /// Prepares a weight matrix whose bytes are handed over: read on their own by a streamed
    /// load, or made by hesper-rs (a re-quantized LM head); `desc.range` indexes `data`.
    fn load_owned_matrix(
        &self,
        desc: MatrixDesc,
        data: Vec<u8>,
        scale: Option<f32>,
        usage: MatrixUse,
    ) -> Result<Self::Matrix, BackendError>;
    /// Prepares a vector.
    fn load_vector(&self, data: Vec<f32>) -> Result<Self::Vector, BackendError>;
    /// What a session on this backend may allocate; sessions are sized against it before
    /// anything is allocated (the default knows no limit).
    fn memory_limits(&self) -> MemoryLimits {
        MemoryLimits::default()
    }
    /// A zeroed buffer of `len` floats.
    fn alloc(&self, len: usize) -> Result<Self::Buffer, BackendError>;
    /// A KV cache of one layer for each of `slots`, layer `i` holding `slots[i]` positions of
    /// `kv_dim` keys and values, stored and read by [`Backend::attention`] as `config` says.
    /// Position `p` sits in slot `p % slots[i]`: a layer of fewer slots than the context (a
    /// sliding window's) keeps its latest positions, and its attention never reaches further
    /// back than them.
    fn new_cache(
        &self,
        slots: &[usize],
        kv_dim: usize,
        config: &AttentionConfig,
    ) -> Result<Self::Cache, BackendError>;
    /// Copies host data into the front of `dst`.
    fn write(&self, dst: &mut Self::Buffer, data: &[f32]) -> Result<(), BackendError>;
    /// Copies the front of `src` to the host, once everything recorded before it has run.
    /// The work is submitted when this is called; the future delivers the values (natively
    /// it is ready once polled; a GPU in a browser resolves it from the page's event loop).
    fn read(
        &self,
        src: &Self::Buffer,
        out: &mut [f32],
    ) -> impl Future<Output = Result<(), BackendError>>;
    /// The index of the largest of the first `len` values of `x` (the first on ties); where
    /// any is NaN or infinite, the index of the first such value with [`NON_FINITE`] set.
    /// Backends that can find it without reading `x` back (a GPU reads back 4 bytes)
    /// override this.
    fn argmax(
        &self,
        x: &Self::Buffer,
        len: usize,
    ) -> impl Future<Output = Result<u32, BackendError>> {
        async move {
            let mut v = vec![0.0; len];
            self.read(x, &mut v).await?;
            Ok(match v.iter().position(|x| !x.is_finite()) {
                Some(i) => i as u32 | NON_FINITE,
                None => crate::sampler::argmax(v),
            })
        }
    }
    /// The `k` largest of the first `len` values of `x` as `(index, value)`, largest first,
    /// equal values by lower index (as [`crate::sampler::top_candidates`] orders them); where
    /// any is NaN or infinite, the first such value comes first. Backends that can find them
    /// without reading `x` back override this (a GPU reads back 8 bytes per candidate instead
    /// of the row); they may overwrite `x` doing so.
    fn top_k(
        &self,
        x: &mut Self::Buffer,
        len: usize,
        k: usize,
    ) -> impl Future<Output = Result<Vec<(u32, f32)>, BackendError>> {
        async move {
            let mut v = vec![0.0; len];
            self.read(&*x, &mut v).await?;
            Ok(match v.iter().position(|x| !x.is_finite()) {
                Some(i) => vec![(i as u32, v[i])],
                None => crate::sampler::top_candidates(&v, k),
            })
        }
    }
    /// `out[i] = table[tokens[i]]` as f32 (ids are checked by the caller).
    fn embed(&self, table: &Self::Matrix, tokens: &[u32], out: &mut Self::Buffer);
    /// RMSNorm of each of `n` rows of `w.len()` values, times the gains `w`.
    fn rms_norm(
        &self,
        x: &Self::Buffer,
        w: &Self::Vector,
        n: usize,
        eps: f32,
        out: &mut Self::Buffer,
    );
    /// [`Backend::rms_norm`] of the query heads `x[0]` (`n[0]` rows) and the key heads `x[1]`
    /// (`n[1]` rows), each with its gains `w`, into `out`: a backend may normalize both in one
    /// pass.
    fn rms_norm_qk(
        &self,
        x: [&Self::Buffer; 2],
        w: [&Self::Vector; 2],
        n: [usize; 2],
        eps: f32,
        out: [&mut Self::Buffer; 2],
    ) {
        for (((x, w), n), out) in x.into_iter().zip(w).zip(n).zip(out) {
            self.rms_norm(x, w, n, eps, out);
        }
    }
    /// [`Backend::rms_norm`] whose output is multiplied next by `next` (and by the matrices
    /// that read their input as `next` does, as K and V read Q's): a backend may quantize `out`
    /// for `next` in the same pass and let that product use it. `out` holds the normalized rows
    /// either way.
    fn rms_norm_for(
        &self,
        x: &Self::Buffer,
        w: &Self::Vector,
        n: usize,
        eps: f32,
        out: &mut Self::Buffer,
        next: &Self::Matrix,
    ) {
        let _ = next;
        self.rms_norm(x, w, n, eps, out);
    }
    /// `out += rms_norm(x)·w` over `n` rows of `w.len()` values (Gemma's normalized attention
    /// and FFN outputs added to the residual stream). By default the norm goes to `scratch`
    /// and is added; a backend may add it as it writes (the same products, then the same add,
    /// so the same bits).
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_add(
        &self,
        x: &Self::Buffer,
        w: &Self::Vector,
        n: usize,
        width: usize,
        eps: f32,
        out: &mut Self::Buffer,
        scratch: &mut Self::Buffer,
    ) {
        self.rms_norm(x, w, n, eps, scratch);
        self.add(out, scratch, n * width);
    }
    /// [`Backend::rms_norm_add`] of `y` with `w_add` into the residual stream `x`, then
    /// [`Backend::rms_norm_for`] of `x` with `w` into `out` for `next` (Gemma's normalized
    /// sublayer output added, then the stream's norm before the next sublayer). A backend may
    /// do both in one pass where it gives the same bits.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_add_norm_for(
        &self,
        y: &Self::Buffer,
        w_add: &Self::Vector,
        x: &mut Self::Buffer,
        w: &Self::Vector,
        n: usize,
        width: usize,
        eps: f32,
        out: &mut Self::Buffer,
        next: &Self::Matrix,
    ) {
        self.rms_norm_add(y, w_add, n, width, eps, x, out);
        self.rms_norm_for(x, w, n, eps, out, next);
    }
    /// `out[i] = W · x[i]` for `n` rows, with the activation quantization the weight layout
    /// implies (per-token int8 for I2_S, Q8_K blocks for TQ, f16 rounding for F16, none for F32).
    fn matmul(&self, w: &Self::Matrix, x: &Self::Buffer, n: usize, out: &mut Self::Buffer);
    /// `outs[j][i] = ws[j] · x[i]` for matrices that read the same input (Q/K/V, gate/up): a
    /// backend may quantize the input once and run all of them in one parallel pass.
    fn matmul_many(
        &self,
        ws: &[&Self::Matrix],
        x: &Self::Buffer,
        n: usize,
        outs: &mut [&mut Self::Buffer],
    ) {
        matmul_each(self, ws, x, n, outs);
    }
    /// `out[i] += W · x[i]` for `n` rows of `width` outputs: a product, then the residual add.
    /// By default the product goes to `scratch` and is added; a backend may add it as it
    /// writes (same sums, same order, so the same bits).
    fn matmul_add(
        &self,
        w: &Self::Matrix,
        x: &Self::Buffer,
        n: usize,
        width: usize,
        out: &mut Self::Buffer,
        scratch: &mut Self::Buffer,
    ) {
        self.matmul(w, x, n, scratch);
        self.add(out, scratch, n * width);
    }
    /// Prepares an attention block's Q, K and V projections for [`Backend::qkv`]. By default
    /// they stay apart; a backend that multiplies them in fewer passes joins them here.
    fn join_qkv(
        &self,
        q: Self::Matrix,
        k: Self::Matrix,
        v: Self::Matrix,
    ) -> Result<Qkv<Self::Matrix>, BackendError> {
        Ok(Qkv::Apart { q, k, v })
    }
    /// `outs = [Wq·x[i], Wk·x[i], Wv·x[i]]` for `n` rows. By default the three products of
    /// [`Backend::matmul_many`]; a backend that joined them overrides this.
    fn qkv(&self, w: &Qkv<Self::Matrix>, x: &Self::Buffer, n: usize, outs: [&mut Self::Buffer; 3]) {
        match w {
            Qkv::Apart { q, k, v } => {
                let [oq, ok, ov] = outs;
                self.matmul_many(&[q, k, v], x, n, &mut [oq, ok, ov]);
            }
            Qkv::Joined(_) | Qkv::JoinedQk { .. } => {
                unreachable!("a backend that joins Q, K and V multiplies them itself")
            }
        }
    }
    /// The FFN's gate and up projections as this backend multiplies them in
    /// [`Backend::gate_up`]. By default they stay apart; a backend that fuses the pair (one
    /// pass over the activations, `act(g)·u` as it writes) joins them here.
    fn join_gate_up(
        &self,
        gate: Self::Matrix,
        up: Self::Matrix,
    ) -> Result<GateUp<Self::Matrix>, BackendError> {
        Ok(GateUp::Apart { gate, up })
    }
    /// `out = act(gate · x[i]) ⊙ (up · x[i])` for `n` rows of `width` outputs. By default the
    /// two products go to `scratch` (both read the same input, [`Backend::matmul_many`]) and
    /// [`Backend::glu`] joins them; a backend that joined the pair overrides this.
    #[allow(clippy::too_many_arguments)]
    fn gate_up(
        &self,
        w: &GateUp<Self::Matrix>,
        x: &Self::Buffer,
        n: usize,
        width: usize,
        act: Activation,
        scratch: [&mut Self::Buffer; 2],
        out: &mut Self::Buffer,
    ) {
        match w {
            GateUp::Apart { gate, up } => {
                let [g, u] = scratch;
                self.matmul_many(&[gate, up], x, n, &mut [&mut *g, &mut *u]);
                self.glu(g, u, n * width, act, out);
            }
            GateUp::Joined(_) => {
                unreachable!("a backend that joins gate and up multiplies them itself")
            }
        }
    }
    /// Rotates `n` rows of `shape.n_head` heads in place; row `i` is at position `pos0 + i`.
    fn rope(&self, x: &mut Self::Buffer, n: usize, pos0: usize, shape: &RopeShape);
    /// Writes `k`, `v` for positions `pos0..pos0+n` into layer `layer` of the cache, then
    /// computes causal softmax attention of the `n` query rows over positions `0..=pos0+i`
    /// (dense), or over the keys [`crate::attention::SparsePattern::keys`] names for
    /// position `pos0+i` (sparse), as the cache was configured.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        cache: &mut Self::Cache,
        layer: usize,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        n: usize,
        pos0: usize,
        shape: &AttentionShape,
        out: &mut Self::Buffer,
    );
    /// Whether [`Backend::rope_attention`] applies a layer's [`HeadPrep`] itself when handed
    /// it (else the caller applies it first: [`Backend::add_qkv_bias`], [`Backend::scale`],
    /// [`Backend::rms_norm_qk`]).
    fn prepares_heads_in_attention(&self) -> bool {
        false
    }
    /// [`Backend::rope`] of the queries `q` (`rope_q`) and of the new keys `k` (`rope_k`),
    /// then [`Backend::attention`]. A backend may rotate both and write the cache in one pass;
    /// `k` is then left as it was (callers do not read it afterwards). Where the caller names
    /// `next`, the product that alone reads `out`, a backend may leave `out` in the form that
    /// product reads (as [`Backend::rms_norm_for`] leaves its rows), and nothing else may read
    /// it. `prep`, only for a backend that [`Backend::prepares_heads_in_attention`], is what
    /// the layer does to `q`, `k` and `v` before the rotations (a backend may apply it in
    /// place).
    #[allow(clippy::too_many_arguments)]
    fn rope_attention(
        &self,
        cache: &mut Self::Cache,
        layer: usize,
        q: &mut Self::Buffer,
        k: &mut Self::Buffer,
        v: &mut Self::Buffer,
        n: usize,
        pos0: usize,
        rope_q: &RopeShape,
        rope_k: &RopeShape,
        shape: &AttentionShape,
        out: &mut Self::Buffer,
        next: Option<&Self::Matrix>,
        prep: Option<HeadPrep<'_, Self::Vector>>,
    ) {
        let _ = next;
        if prep.is_some() {
            unreachable!("only a backend that prepares heads in attention is handed a HeadPrep")
        }
        self.rope(q, n, pos0, rope_q);
        self.rope(k, n, pos0, rope_k);
        self.attention(cache, layer, q, k, v, n, pos0, shape, out);
    }
    /// Drops positions `keep..keep + discard` from every layer of the cache (llama.cpp's
    /// context shift): positions `keep + discard..used` move down by `discard`, each key
    /// rotated by [`RopeShape::shift_angles`] (back by `discard` positions, as if computed
    /// there), values unchanged; a layer of fewer slots moves those of its latest positions it
    /// holds. Only dense caches are shifted.
    fn shift_cache(
        &self,
        cache: &mut Self::Cache,
        keep: usize,
        discard: usize,
        used: usize,
        rope: &RopeShape,
    );
    /// `out = act(gate) * up` over `len` values.
    fn glu(
        &self,
        gate: &Self::Buffer,
        up: &Self::Buffer,
        len: usize,
        act: Activation,
        out: &mut Self::Buffer,
    );
    /// Prepares a mixture's experts (each gate and up apart, as loaded) for
    /// [`Backend::moe_ffn`]: returns them and, for a backend whose products can each pick
    /// their expert of one stacked matrix, the stack ([`Moe::stacked`]). By default each
    /// expert's gate and up are joined as [`Backend::join_gate_up`] joins a dense pair, where
    /// the expert has no biases (those are added to the gate and up products apart, before the
    /// activation), and nothing is stacked.
    #[allow(clippy::type_complexity)]
    fn stack_experts(
        &self,
        experts: Vec<Expert<Self::Matrix, Self::Vector>>,
    ) -> Result<
        (
            Vec<Expert<Self::Matrix, Self::Vector>>,
            Option<Expert<Self::Matrix, Self::Vector>>,
        ),
        BackendError,
    > {
        let joined = experts.into_iter().map(|e| {
            let gate_up = match (e.gate_up, &e.biases) {
                (GateUp::Apart { gate, up }, None) => self.join_gate_up(gate, up)?,
                (gate_up, _) => gate_up,
            };
            Ok(Expert { gate_up, ..e })
        });
        Ok((joined.collect::<Result<_, BackendError>>()?, None))
    }
    /// Whether [`Backend::moe_ffn`] is computed (a model with mixture-of-experts layers is
    /// refused at load by a backend that does not).
    fn runs_experts(&self) -> bool {
        false
    }
    /// The mixture-of-experts FFN of `n` rows of `x` (already normalized) into `out` (`n` rows
    /// of `x`'s width), routed as `routing` says with activation `act`: each row's chosen
    /// experts, weighted. Only called on a backend whose [`Backend::runs_experts`] is true.
    fn moe_ffn(
        &self,
        moe: &Moe<Self::Matrix, Self::Vector>,
        routing: &crate::config::Experts,
        act: Activation,
        x: &Self::Buffer,
        n: usize,
        out: &mut Self::Buffer,
    ) {
        let _ = (moe, routing, act, x, n, out);
        unreachable!("a backend that does not run experts refuses their models at load")
    }
    /// `x += ` the mixture of experts of `n` rows of `h` (`width` wide; see
    /// [`Backend::moe_ffn`]): the residual add after it. By default the mixture goes to
    /// `scratch` and is added; a backend may add its weighted sum as it writes (the same sum
    /// added, so the same bits).
    #[allow(clippy::too_many_arguments)]
    fn moe_ffn_add(
        &self,
        moe: &Moe<Self::Matrix, Self::Vector>,
        routing: &crate::config::Experts,
        act: Activation,
        h: &Self::Buffer,
        n: usize,
        width: usize,
        x: &mut Self::Buffer,
        scratch: &mut Self::Buffer,
    ) {
        self.moe_ffn(moe, routing, act, h, n, scratch);
        self.add(x, scratch, n * width);
    }
    /// `x *= s` over `len` values.
    fn scale(&self, x: &mut Self::Buffer, len: usize, s: f32);
    /// `x = cap · tanh(x / cap)` over `len` values (Gemma 2's soft-capped logits).
    fn softcap(&self, x: &mut Self::Buffer, len: usize, cap: f32);
    /// `x += y` over `len` values.
    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, len: usize);
    /// `x[i] += bias` for each of `n` rows of `bias`'s length (a projection's bias).
    fn add_bias(&self, x: &mut Self::Buffer, bias: &Self::Vector, n: usize);
    /// [`Backend::add_bias`] of the queries, keys and values (`outs`, `n` rows each) with their
    /// biases `[bq, bk, bv]`; a backend may add all three in one pass.
    fn add_qkv_bias(&self, outs: [&mut Self::Buffer; 3], bias: &[Self::Vector; 3], n: usize) {
        for (x, b) in outs.into_iter().zip(bias) {
            self.add_bias(x, b, n);
        }
    }
    /// The first two steps of `prep` applied to the queries, keys and values (`qkv`, `n` rows
    /// each, the queries `q_width` wide): the biases added, then the queries scaled. The head
    /// norms are the caller's, whose destinations differ.
    fn add_bias_and_scale_queries(
        &self,
        prep: &HeadPrep<'_, Self::Vector>,
        qkv: [&mut Self::Buffer; 3],
        n: usize,
        q_width: usize,
    ) {
        let [q, k, v] = qkv;
        if let Some(bias) = prep.bias {
            self.add_qkv_bias([&mut *q, k, v], bias, n);
        }
        if prep.query_scale != 1.0 {
            self.scale(q, n * q_width, prep.query_scale);
        }
    }
    /// Copies `n_rows` rows of `width` floats starting at row `row0` of `src` to `dst` from
    /// its row `dst_row0`.
    fn copy_rows(
        &self,
        src: &Self::Buffer,
        row0: usize,
        n_rows: usize,
        width: usize,
        dst: &mut Self::Buffer,
        dst_row0: usize,
    );
}

/// [`Backend::matmul_many`] as one [`Backend::matmul`] per matrix: the default, and what a
/// backend that overrides it falls back to where batching gains nothing.
pub fn matmul_each<B: Backend + ?Sized>(
    b: &B,
    ws: &[&B::Matrix],
    x: &B::Buffer,
    n: usize,
    outs: &mut [&mut B::Buffer],
) {
    for (w, out) in ws.iter().zip(outs.iter_mut()) {
        b.matmul(w, x, n, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(scale: f32, yarn: Option<Yarn>) -> RopeShape<'static> {
        RopeShape {
            n_head: 1,
            head_dim: 128,
            rope_dim: 128,
            base: 1e6,
            scale,
            freq_factors: None,
            attn_factor: 1.0,
            yarn,
        }
    }

    #[test]
    fn yarn_keeps_fast_pairs_scales_slow_ones_and_grows_the_magnitude() {
        // Qwen3's 128K files: 4 × 32768. Pairs 0..=23 turn more than 32 times in 32768
        // positions and keep their angle; pairs from 40 on turn less than once and are scaled.
        let yarn = Yarn {
            n_ctx_orig: 32768,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        assert_eq!(yarn.ramp(128, 1e6), [23.0, 40.0]);
        let p = 1000;
        let (ours, unscaled, scaled) = (
            shape(0.25, Some(yarn)).angles(p, 1),
            shape(1.0, None).angles(p, 1),
            shape(0.25, None).angles(p, 1),
        );
        let magnitude = 1.0 + 0.1 * 4f32.ln();
        let pair = |t: &[f32], i: usize| [t[2 * i], t[2 * i + 1]];
        for i in [0, 10, 23] {
            let [c, s] = pair(&unscaled, i);
            assert_eq!(pair(&ours, i), [c * magnitude, s * magnitude], "pair {i}");
        }
        for i in [40, 50, 63] {
            let [c, s] = pair(&scaled, i);
            assert_eq!(pair(&ours, i), [c * magnitude, s * magnitude], "pair {i}");
        }
        // Between them a blend: neither angle.
        let [c, _] = pair(&ours, 31);
        assert!(c != pair(&unscaled, 31)[0] * magnitude && c != pair(&scaled, 31)[0] * magnitude);
        // A context shift rotates by the blended angle without the magnitude.
        let shift = shape(0.25, Some(yarn)).shift_angles(p);
        for i in 0..64 {
            let [c, s] = pair(&ours, i);
            let [sc, ss] = pair(&shift, i);
            assert!((sc * magnitude - c).abs() < 1e-6 && (ss * magnitude + s).abs() < 1e-6);
        }
    }
}
