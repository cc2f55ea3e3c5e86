//! Loading a model piece by piece: where a tensor's bytes come from ([`Fetch`]), the pieces a
//! model is made of ([`Part`]), and the [`Loader`] that prepares each piece on a backend. A
//! first load and a hot-swap (`reload`) take this one path, so a swapped piece is exactly
//! what a fresh load of the new file makes.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use super::layer::{Ffn, LayerPart, Piece};
use super::tensors::{role_of, Global, Role};
use super::{HeadFormat, ModelError};
use crate::backend::{Backend, Expert, GateUp, MatrixUse, Moe, Qkv};
use crate::config::{Config, RopePairs};
use crate::file::ModelFile;
use crate::gguf::{Gguf, TensorError, TensorInfo};
use crate::source::TensorSource;
use crate::weights::{read_f32_vector, requantize, MatrixDesc, WeightError};

/// A piece of a model loaded, and swapped, as one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Part {
    /// The token embedding table (also the LM head when tied and kept as stored).
    Embedding,
    /// A piece of layer `.0`.
    Layer(usize, LayerPart),
    /// `rope_freqs.weight`.
    RopeFactors,
    /// The final norm.
    OutputNorm,
    /// An LM head held on its own (`output.weight`, or a re-quantized copy of the embedding).
    Output,
}

/// What a model instance holds and how, decided from the file's header and the load options.
pub(super) struct Plan {
    /// The hyperparameters.
    pub config: Config,
    /// The layers held.
    pub layers: Range<usize>,
    /// LM head storage.
    pub head: HeadFormat,
    /// Whether this instance runs the final norm and LM head.
    pub holds_head: bool,
    /// No `output.weight`: the embedding table is the LM head.
    pub tied: bool,
    /// Which held layers have Q/K/V biases.
    biases: Vec<bool>,
    /// The file's RoPE frequency-factor tensors: `rope_freqs.weight`, or LongRoPE's short
    /// and long ones.
    rope_freqs: bool,
    rope_short: bool,
    rope_long: bool,
    /// Rows of Q and K (and their biases) in the order NeoX RoPE rotates them.
    q_order: Option<Vec<usize>>,
    k_order: Option<Vec<usize>>,
    /// Tensors a load of this plan reads.
    tensor_count: usize,
}

impl Plan {
    /// The plan for holding `layers` of the model `g` describes, and its final norm and LM
    /// head where `holds_head`.
    pub fn new(
        config: Config,
        g: &Gguf,
        layers: Range<usize>,
        head: HeadFormat,
        holds_head: bool,
    ) -> Self {
        // A layer with any of the three biases is read with all three (a missing one is
        // named, not left out).
        let biases = layers
            .clone()
            .map(|il| {
                ["attn_q", "attn_k", "attn_v"]
                    .iter()
                    .any(|p| g.tensor(&format!("blk.{il}.{p}.bias")).is_some())
            })
            .collect();
        let mut plan = Self {
            q_order: rope_row_order(&config, config.n_head),
            k_order: rope_row_order(&config, config.n_head_kv),
            tied: g.tensor("output.weight").is_none(),
            rope_freqs: g.tensor("rope_freqs.weight").is_some(),
            rope_short: g.tensor("rope_factors_short.weight").is_some(),
            rope_long: g.tensor("rope_factors_long.weight").is_some(),
            config,
            layers,
            head,
            holds_head,
            biases,
            tensor_count: 0,
        };
        plan.tensor_count = g
            .tensors()
            .iter()
            .map(|t| plan.parts_of(&t.name).len())
            .sum();
        plan
    }

    fn first(&self) -> bool {
        self.layers.start == 0
    }

    fn runs_head(&self) -> bool {
        self.holds_head
    }

    /// Whether the embedding table is held: to embed tokens, or as the tied head.
    fn holds_embedding(&self) -> bool {
        self.first() || (self.runs_head() && self.tied)
    }

    /// Whether an LM head is held apart from the embedding table.
    fn holds_output(&self) -> bool {
        self.runs_head() && (!self.tied || self.head != HeadFormat::AsStored)
    }

    /// Whether the embedding table is read whole per token, as the LM head.
    pub fn head_is_embedding(&self) -> bool {
        self.runs_head() && self.tied && self.head == HeadFormat::AsStored
    }

    fn has_bias(&self, il: usize) -> bool {
        self.biases[il - self.layers.start]
    }

    /// The held parts made from tensor `name` (none for a tensor of another node's layers,
    /// or one the family's graph does not read).
    pub fn parts_of(&self, name: &str) -> Vec<Part> {
        let moe = self.config.experts.is_some();
        match role_of(name, &self.config.family, moe) {
            Some(Role::Global(Global::Embedding)) => {
                let mut parts = Vec::new();
                if self.holds_embedding() {
                    parts.push(Part::Embedding);
                }
                if self.tied && self.holds_output() {
                    parts.push(Part::Output);
                }
                parts
            }
            Some(Role::Global(Global::Output)) if self.holds_output() => vec![Part::Output],
            Some(Role::Global(Global::OutputNorm)) if self.runs_head() => vec![Part::OutputNorm],
            Some(Role::Global(Global::RopeFactors)) => vec![Part::RopeFactors],
            Some(Role::Layer(il, part)) if self.layers.contains(&il) => {
                vec![Part::Layer(il, part)]
            }
            _ => Vec::new(),
        }
    }

    /// Weight bytes a decoded token reads, from the bytes of each part's matrices: every
    /// matrix, the embedding table only where it is the LM head.
    pub fn bytes_per_token(&self, part_bytes: &BTreeMap<Part, u64>) -> u64 {
        part_bytes
            .iter()
            .filter(|(part, _)| **part != Part::Embedding || self.head_is_embedding())
            .map(|(_, bytes)| bytes)
            .sum()
    }

    /// Tensors a load reads, for progress: each once for every held part made from it.
    pub fn tensor_count(&self) -> usize {
        self.tensor_count
    }
}

/// A part prepared on a backend, ready to take its place in a model.
#[cfg_attr(not(unix), allow(dead_code))]
pub(super) enum Prepared<B: Backend> {
    Embedding(Option<B::Matrix>),
    /// A piece of layer `.0`.
    Layer(usize, Piece<B>),
    RopeFactors(RopeFactors),
    OutputNorm(Option<B::Vector>),
    Output(Option<B::Matrix>),
}

/// How the loader gets a tensor's bytes: borrowed from the file, or read from a source.
pub(super) trait Fetch {
    /// The bytes of `info`, or `None` when they are in the file.
    fn fetch(
        &mut self,
        info: &TensorInfo,
    ) -> impl std::future::Future<Output = Result<Option<Vec<u8>>, ModelError>>;
}

/// Tensors borrowed from a file held whole.
pub(super) struct InFile;

impl Fetch for InFile {
    async fn fetch(&mut self, _: &TensorInfo) -> Result<Option<Vec<u8>>, ModelError> {
        Ok(None)
    }
}

/// Tensors read one by one from a source.
pub(super) struct Streamed<'s, S>(pub &'s mut S);

impl<S: TensorSource> Fetch for Streamed<'_, S> {
    async fn fetch(&mut self, info: &TensorInfo) -> Result<Option<Vec<u8>>, ModelError> {
        let len = tensor_len(info)?;
        Ok(Some(self.0.read(info.start, len).await?))
    }
}

/// The size of `info`'s data, as this target addresses it.
pub(super) fn tensor_len(info: &TensorInfo) -> Result<usize, ModelError> {
    let nbytes = info.nbytes.ok_or_else(|| {
        WeightError::from(TensorError::UnknownType {
            name: info.name.clone(),
            id: info.ty.id(),
        })
    })?;
    // The header checked the range against the file's length; a 32-bit target may still
    // not address it.
    usize::try_from(nbytes).map_err(|_| ModelError::TooLarge {
        name: info.name.clone(),
        bytes: nbytes,
    })
}

/// `info` as if its data began at offset 0 (for bytes read on their own).
fn at_zero(info: &TensorInfo) -> TensorInfo {
    TensorInfo {
        start: 0,
        ..info.clone()
    }
}

/// Prepares a model's parts on a backend, from one file.
pub(super) struct Loader<'a, 'p, B: Backend, F> {
    pub backend: &'a B,
    pub file: &'a Arc<ModelFile>,
    pub plan: &'a Plan,
    pub fetch: &'a mut F,
    done: usize,
    total: usize,
    progress: Option<&'p mut dyn FnMut(usize, usize)>,
    /// The part being prepared.
    current: Part,
    /// Bytes of the matrices of each part prepared (what a decoded token reads).
    pub part_bytes: BTreeMap<Part, u64>,
}

impl<'a, 'p, B: Backend, F: Fetch> Loader<'a, 'p, B, F> {
    /// A loader reporting each prepared tensor to `progress`, out of `total`.
    pub fn new(
        backend: &'a B,
        file: &'a Arc<ModelFile>,
        plan: &'a Plan,
        fetch: &'a mut F,
        progress: Option<&'p mut dyn FnMut(usize, usize)>,
    ) -> Self {
        Self {
            backend,
            file,
            plan,
            fetch,
            done: 0,
            total: plan.tensor_count(),
            progress,
            current: Part::Embedding,
            part_bytes: BTreeMap::new(),
        }
    }

    /// Prepares `part`.
    #[cfg_attr(not(unix), allow(dead_code))]
    pub async fn prepare(&mut self, part: Part) -> Result<Prepared<B>, ModelError> {
        Ok(match part {
            Part::Embedding => Prepared::Embedding(self.embedding().await?),
            Part::Layer(il, lp) => Prepared::Layer(il, self.piece(il, lp).await?),
            Part::RopeFactors => Prepared::RopeFactors(self.rope_factors().await?),
            Part::OutputNorm => Prepared::OutputNorm(self.output_norm().await?),
            Part::Output => Prepared::Output(self.output().await?),
        })
    }

    /// Starts preparing `part`: its matrices' bytes are counted from here.
    pub(super) fn start(&mut self, part: Part) {
        self.current = part;
        self.part_bytes.insert(part, 0);
    }

    /// The embedding table, where this instance holds it.
    pub async fn embedding(&mut self) -> Result<Option<B::Matrix>, ModelError> {
        self.start(Part::Embedding);
        if !self.plan.holds_embedding() {
            return Ok(None);
        }
        let c = &self.plan.config;
        let (n_vocab, d) = (c.n_vocab, c.n_embd);
        let usage = if self.plan.runs_head() && !self.plan.holds_output() {
            MatrixUse::TiedHead
        } else {
            MatrixUse::Embedding
        };
        Ok(Some(
            self.matrix("token_embd.weight", n_vocab, d, usage).await?,
        ))
    }

    // A layer's pieces, one method each, named as the layer's field they fill
    // (`layer.rs` calls them; `start` has marked the piece).

    pub(super) async fn attn_norm(&mut self, il: usize) -> Result<B::Vector, ModelError> {
        self.vector(&blk(il, "attn_norm.weight"), self.plan.config.n_embd)
            .await
    }

    pub(super) async fn qkv(&mut self, il: usize) -> Result<Qkv<B::Matrix>, ModelError> {
        let plan = self.plan;
        let c = &plan.config;
        let (d, qd, kv) = (c.n_embd, c.q_dim(), c.kv_dim());
        let (q_order, k_order) = (plan.q_order.as_deref(), plan.k_order.as_deref());
        let fused = blk(il, "attn_qkv.weight");
        if self.file.header().tensor(&fused).is_some() {
            // Phi-3's one tensor: Q's rows, then K's, then V's.
            let parts = [
                (0..qd, q_order),
                (qd..qd + kv, k_order),
                (qd + kv..qd + 2 * kv, None),
            ];
            let [q, k, v] = self.split_rows(&fused, d, parts).await?;
            return Ok(self.backend.join_qkv(q, k, v)?);
        }
        let q = self
            .matrix_in_order(&blk(il, "attn_q.weight"), qd, d, q_order)
            .await?;
        let k = self
            .matrix_in_order(&blk(il, "attn_k.weight"), kv, d, k_order)
            .await?;
        let v = self
            .matrix(&blk(il, "attn_v.weight"), kv, d, MatrixUse::Product)
            .await?;
        Ok(self.backend.join_qkv(q, k, v)?)
    }

    pub(super) async fn qkv_bias(
        &mut self,
        il: usize,
    ) -> Result<Option<[B::Vector; 3]>, ModelError> {
        let plan = self.plan;
        if !plan.has_bias(il) {
            return Ok(None);
        }
        let c = &plan.config;
        let (qd, kv) = (c.q_dim(), c.kv_dim());
        Ok(Some([
            self.vector_in_order(&blk(il, "attn_q.bias"), qd, plan.q_order.as_deref())
                .await?,
            self.vector_in_order(&blk(il, "attn_k.bias"), kv, plan.k_order.as_deref())
                .await?,
            self.vector(&blk(il, "attn_v.bias"), kv).await?,
        ]))
    }

    pub(super) async fn qk_norm(
        &mut self,
        il: usize,
    ) -> Result<Option<[B::Vector; 2]>, ModelError> {
        let c = &self.plan.config;
        if !c.family.qk_norm {
            return Ok(None);
        }
        // One head's gains, its dims in the order the loader put Q's and K's rows in; the
        // queries' times the family's query scale (RoPE is linear, so scaling before it is
        // scaling the scores).
        let order = rope_row_order(c, 1);
        let (hd, query_scale) = (c.head_dim, c.query_scale);
        Ok(Some([
            self.scaled_vector_in_order(
                &blk(il, "attn_q_norm.weight"),
                hd,
                order.as_deref(),
                query_scale,
            )
            .await?,
            self.vector_in_order(&blk(il, "attn_k_norm.weight"), hd, order.as_deref())
                .await?,
        ]))
    }

    pub(super) async fn attn_sub_norm(
        &mut self,
        il: usize,
    ) -> Result<Option<B::Vector>, ModelError> {
        let c = &self.plan.config;
        if !c.family.sub_norms {
            return Ok(None);
        }
        let qd = c.q_dim();
        Ok(Some(
            self.vector(&blk(il, "attn_sub_norm.weight"), qd).await?,
        ))
    }

    pub(super) async fn sinks(&mut self, il: usize) -> Result<Option<Vec<f32>>, ModelError> {
        let c = &self.plan.config;
        if !c.family.sinks {
            return Ok(None);
        }
        let n_head = c.n_head;
        Ok(Some(
            self.vector_data(&blk(il, "attn_sinks.weight"), n_head)
                .await?,
        ))
    }

    /// The attention's output matrix.
    pub(super) async fn wo(&mut self, il: usize) -> Result<B::Matrix, ModelError> {
        let c = &self.plan.config;
        let (d, qd) = (c.n_embd, c.q_dim());
        self.matrix(&blk(il, "attn_output.weight"), d, qd, MatrixUse::Product)
            .await
    }

    /// The bias of the attention's output, where the family has one.
    pub(super) async fn wo_bias(&mut self, il: usize) -> Result<Option<B::Vector>, ModelError> {
        let c = &self.plan.config;
        if !c.family.biases {
            return Ok(None);
        }
        let d = c.n_embd;
        Ok(Some(self.vector(&blk(il, "attn_output.bias"), d).await?))
    }

    pub(super) async fn ffn_norm(&mut self, il: usize) -> Result<B::Vector, ModelError> {
        let c = &self.plan.config;
        let name = format!("{}.weight", c.family.ffn_norm);
        self.vector(&blk(il, &name), c.n_embd).await
    }

    /// Layer `il`'s FFN: the router and experts where the config has them, else one gated FFN.
    pub(super) async fn ffn(&mut self, il: usize) -> Result<Ffn<B::Matrix, B::Vector>, ModelError> {
        Ok(match self.plan.config.experts {
            Some(_) => Ffn::Experts(self.experts(il).await?),
            None => Ffn::Dense {
                gate_up: self.gate_up(il).await?,
                down: self.down(il).await?,
            },
        })
    }

    async fn gate_up(&mut self, il: usize) -> Result<GateUp<B::Matrix>, ModelError> {
        let c = &self.plan.config;
        let (d, ff) = (c.n_embd, c.n_ff);
        let header = self.file.header();
        let up_rows = header.tensor(&blk(il, "ffn_up.weight")).map(|t| t.ne[1]);
        if header.tensor(&blk(il, "ffn_gate.weight")).is_none() && up_rows == Some(2 * ff as u64) {
            // Phi-3's one `ffn_up` of 2·n_ff rows: the gate's, then the up projection's.
            let parts = [(0..ff, None), (ff..2 * ff, None)];
            let [gate, up] = self.split_rows(&blk(il, "ffn_up.weight"), d, parts).await?;
            return Ok(self.backend.join_gate_up(gate, up)?);
        }
        let gate = self
            .matrix(&blk(il, "ffn_gate.weight"), ff, d, MatrixUse::Product)
            .await?;
        let up = self
            .matrix(&blk(il, "ffn_up.weight"), ff, d, MatrixUse::Product)
            .await?;
        Ok(self.backend.join_gate_up(gate, up)?)
    }

    pub(super) async fn ffn_sub_norm(
        &mut self,
        il: usize,
    ) -> Result<Option<B::Vector>, ModelError> {
        let c = &self.plan.config;
        if !c.family.sub_norms {
            return Ok(None);
        }
        let ff = c.n_ff;
        Ok(Some(
            self.vector(&blk(il, "ffn_sub_norm.weight"), ff).await?,
        ))
    }

    async fn down(&mut self, il: usize) -> Result<B::Matrix, ModelError> {
        let c = &self.plan.config;
        let (d, ff) = (c.n_embd, c.n_ff);
        self.matrix(&blk(il, "ffn_down.weight"), d, ff, MatrixUse::Product)
            .await
    }

    /// Layer `il`'s router and experts; the bytes counted are what a token reads (the router,
    /// and the experts' share a token uses).
    async fn experts(&mut self, il: usize) -> Result<Moe<B::Matrix, B::Vector>, ModelError> {
        let part = self.current;
        let c = &self.plan.config;
        let (d, Some(x)) = (c.n_embd, c.experts) else {
            unreachable!("experts are loaded for a config with them")
        };
        let router = self
            .matrix(
                &blk(il, "ffn_gate_inp.weight"),
                x.n_expert,
                d,
                MatrixUse::Product,
            )
            .await?;
        let biased = c.family.biases;
        let router_bias = match biased {
            true => Some(
                self.vector(&blk(il, "ffn_gate_inp.bias"), x.n_expert)
                    .await?,
            ),
            false => None,
        };
        let router_bytes = self.part_bytes[&part];
        let stack = |me: &Self, name: &str, rows: usize, cols: usize| {
            let info = me.info(&blk(il, name))?;
            let whole = [cols as u64, rows as u64, x.n_expert as u64, 1];
            let nbytes = info.nbytes.unwrap_or(0);
            if info.ne != whole || !nbytes.is_multiple_of(x.n_expert as u64) {
                return Err(ModelError::Weight(WeightError::Shape {
                    name: info.name.clone(),
                    got: info.dims().to_vec(),
                    expected: whole[..3].to_vec(),
                }));
            }
            Ok(info)
        };
        let gates = stack(self, "ffn_gate_exps.weight", x.n_ff, d)?;
        let ups = stack(self, "ffn_up_exps.weight", x.n_ff, d)?;
        let downs = stack(self, "ffn_down_exps.weight", d, x.n_ff)?;
        let gates = self.stacked(gates, x.n_expert).await?;
        let ups = self.stacked(ups, x.n_expert).await?;
        let downs = self.stacked(downs, x.n_expert).await?;
        // Each expert's biases: row `e` of `[rows, n_expert]` tensors.
        let mut biases = Vec::with_capacity(x.n_expert);
        if biased {
            let mut rows_of = async |name: &str, rows: usize| {
                let all = self.vector_data(&blk(il, name), rows * x.n_expert).await?;
                Ok::<_, ModelError>(all.chunks_exact(rows).map(<[f32]>::to_vec).collect())
            };
            let gate_b: Vec<Vec<f32>> = rows_of("ffn_gate_exps.bias", x.n_ff).await?;
            let up_b: Vec<Vec<f32>> = rows_of("ffn_up_exps.bias", x.n_ff).await?;
            let down_b: Vec<Vec<f32>> = rows_of("ffn_down_exps.bias", d).await?;
            for ((g, u), dn) in gate_b.into_iter().zip(up_b).zip(down_b) {
                let b = self.backend;
                biases.push(Some([
                    b.load_vector(g)?,
                    b.load_vector(u)?,
                    b.load_vector(dn)?,
                ]));
            }
        } else {
            biases.resize_with(x.n_expert, || None);
        }
        let mut experts = Vec::with_capacity(x.n_expert);
        for (((gate, up), down), biases) in gates.into_iter().zip(ups).zip(downs).zip(biases) {
            experts.push(Expert {
                gate_up: GateUp::Apart { gate, up },
                down,
                biases,
            });
        }
        let all = self.part_bytes[&part] - router_bytes;
        self.part_bytes.insert(
            part,
            router_bytes + all * x.n_used as u64 / x.n_expert as u64,
        );
        let (experts, stacked) = self.backend.stack_experts(experts)?;
        Ok(Moe {
            router,
            router_bias,
            experts,
            stacked,
        })
    }

    /// The `n` matrices stacked in the tensor `stack` describes (`[cols, rows, n]`), read as one
    /// tensor (one read, one hash for a hot-swap) and prepared one by one.
    async fn stacked(&mut self, stack: TensorInfo, n: usize) -> Result<Vec<B::Matrix>, ModelError> {
        let (rows, cols) = (stack.ne[1] as usize, stack.ne[0] as usize);
        let bytes = self.fetch.fetch(&stack).await?;
        self.tick();
        let mut out = Vec::with_capacity(n);
        for e in 0..n {
            let one = expert(&stack, e, n);
            let (desc, data) = match &bytes {
                None => (MatrixDesc::new(&one, self.file.bytes(), rows, cols)?, None),
                Some(all) => {
                    let len = one.nbytes.unwrap_or(0) as usize;
                    let data = all[e * len..(e + 1) * len].to_vec();
                    (
                        MatrixDesc::new(&at_zero(&one), &data, rows, cols)?,
                        Some(data),
                    )
                }
            };
            out.push(self.described(desc, data, None, MatrixUse::Product)?);
        }
        Ok(out)
    }

    pub(super) async fn post_norms(
        &mut self,
        il: usize,
    ) -> Result<Option<[B::Vector; 2]>, ModelError> {
        let c = &self.plan.config;
        if !c.family.post_norms {
            return Ok(None);
        }
        let d = c.n_embd;
        Ok(Some([
            self.vector(&blk(il, "post_attention_norm.weight"), d)
                .await?,
            self.vector(&blk(il, "post_ffw_norm.weight"), d).await?,
        ]))
    }

    /// The file's RoPE frequency factors.
    pub async fn rope_factors(&mut self) -> Result<RopeFactors, ModelError> {
        self.start(Part::RopeFactors);
        let plan = self.plan;
        let half = plan.config.rope_dim / 2;
        let mut read = async |present: bool, name: &str| match present {
            true => self.vector_data(name, half).await.map(Some),
            false => Ok(None),
        };
        Ok(if plan.rope_freqs {
            RopeFactors {
                short: read(true, "rope_freqs.weight").await?,
                long: None,
            }
        } else {
            RopeFactors {
                short: read(plan.rope_short, "rope_factors_short.weight").await?,
                long: read(plan.rope_long, "rope_factors_long.weight").await?,
            }
        })
    }

    /// The final norm, where this instance runs the LM head.
    pub async fn output_norm(&mut self) -> Result<Option<B::Vector>, ModelError> {
        self.start(Part::OutputNorm);
        if !self.plan.runs_head() {
            return Ok(None);
        }
        let d = self.plan.config.n_embd;
        Ok(Some(self.vector("output_norm.weight", d).await?))
    }

    /// The LM head held apart from the embedding table, if any.
    pub async fn output(&mut self) -> Result<Option<B::Matrix>, ModelError> {
        self.start(Part::Output);
        if !self.plan.holds_output() {
            return Ok(None);
        }
        let c = &self.plan.config;
        let (n_vocab, d) = (c.n_vocab, c.n_embd);
        let head = if self.plan.tied {
            "token_embd.weight"
        } else {
            "output.weight"
        };
        Ok(Some(match self.plan.head {
            HeadFormat::AsStored => self.matrix(head, n_vocab, d, MatrixUse::Product).await?,
            format @ (HeadFormat::Q8_0 | HeadFormat::Q6K) => {
                self.requantized(head, n_vocab, d, format).await?
            }
        }))
    }

    fn tick(&mut self) {
        self.done += 1;
        if let Some(progress) = self.progress.as_mut() {
            progress(self.done, self.total);
        }
    }

    fn count_bytes(&mut self, bytes: usize) {
        *self.part_bytes.entry(self.current).or_default() += bytes as u64;
    }

    fn info(&self, name: &str) -> Result<TensorInfo, ModelError> {
        self.file
            .header()
            .tensor(name)
            .cloned()
            .ok_or_else(|| ModelError::MissingTensor(name.into()))
    }

    /// A matrix's description, its bytes when read from a source, and its scale.
    async fn source(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<(MatrixDesc, Option<Vec<u8>>, Option<f32>), ModelError> {
        let info = self.info(name)?;
        let scale_name = name.replace(".weight", ".scale");
        let scale = match self.file.header().tensor(&scale_name) {
            Some(_) => Some(self.vector_data(&scale_name, 1).await?[0]),
            None => None,
        };
        let fetched = self.fetch.fetch(&info).await?;
        self.tick();
        Ok(match fetched {
            None => (
                MatrixDesc::new(&info, self.file.bytes(), rows, cols)?,
                None,
                scale,
            ),
            Some(bytes) => (
                MatrixDesc::new(&at_zero(&info), &bytes, rows, cols)?,
                Some(bytes),
                scale,
            ),
        })
    }

    async fn matrix(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        usage: MatrixUse,
    ) -> Result<B::Matrix, ModelError> {
        let (desc, bytes, scale) = self.source(name, rows, cols).await?;
        self.described(desc, bytes, scale, usage)
    }

    /// The matrix `desc` describes, handed to the backend: in the mapped file (`bytes` `None`)
    /// or in `bytes` read for it.
    fn described(
        &mut self,
        desc: MatrixDesc,
        bytes: Option<Vec<u8>>,
        scale: Option<f32>,
        usage: MatrixUse,
    ) -> Result<B::Matrix, ModelError> {
        self.count_bytes(desc.range.len());
        Ok(match bytes {
            None => self.backend.load_matrix(self.file, desc, scale, usage)?,
            Some(mut bytes) => {
                // I2_S descriptions cover the codes only; the scale after them was read.
                bytes.truncate(desc.range.end);
                self.backend.load_owned_matrix(desc, bytes, scale, usage)?
            }
        })
    }

    /// [`Loader::matrix`] of a product matrix whose rows are stored in `order` (row `i` of
    /// the loaded matrix is row `order[i]` of the file's); as stored when `order` is `None`.
    async fn matrix_in_order(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        order: Option<&[usize]>,
    ) -> Result<B::Matrix, ModelError> {
        if order.is_none() {
            return self.matrix(name, rows, cols, MatrixUse::Product).await;
        }
        let [m] = self.split_rows(name, cols, [(0..rows, order)]).await?;
        Ok(m)
    }

    /// The product matrices stacked by rows in the tensor `name` (`cols` wide): each of `parts`
    /// is a range of its rows, in `order` where one is given (row `i` of that matrix is row
    /// `order[i]` of the range; `None`: as stored). The tensor is read once; a range of a
    /// mapped file in stored order is described in place, any other is copied.
    async fn split_rows<const N: usize>(
        &mut self,
        name: &str,
        cols: usize,
        parts: [(Range<usize>, Option<&[usize]>); N],
    ) -> Result<[B::Matrix; N], ModelError> {
        let rows = parts.iter().map(|(r, _)| r.end).max().unwrap_or(0);
        let (desc, bytes, scale) = self.source(name, rows, cols).await?;
        let rb = desc.row_bytes();
        let file = self.file;
        let stored = match &bytes {
            None => &file.bytes()[desc.range.clone()],
            Some(bytes) => &bytes[desc.range.clone()],
        };
        let mut out = Vec::with_capacity(N);
        for (range, order) in parts {
            let part = MatrixDesc {
                rows: range.len(),
                ..desc.clone()
            };
            let m = match (order, &bytes) {
                (None, None) => {
                    let start = desc.range.start + range.start * rb;
                    let range = start..start + range.len() * rb;
                    self.described(
                        MatrixDesc { range, ..part },
                        None,
                        scale,
                        MatrixUse::Product,
                    )?
                }
                (order, _) => {
                    let mut data = Vec::with_capacity(range.len() * rb);
                    let mut row = |r: usize| {
                        let r = range.start + r;
                        data.extend_from_slice(&stored[r * rb..(r + 1) * rb]);
                    };
                    match order {
                        Some(order) => order.iter().for_each(|&r| row(r)),
                        None => (0..range.len()).for_each(row),
                    }
                    let range = 0..data.len();
                    self.described(
                        MatrixDesc { range, ..part },
                        Some(data),
                        scale,
                        MatrixUse::Product,
                    )?
                }
            };
            out.push(m);
        }
        Ok(out
            .try_into()
            .unwrap_or_else(|_| unreachable!("one matrix a part")))
    }

    async fn requantized(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        head: HeadFormat,
    ) -> Result<B::Matrix, ModelError> {
        let (desc, bytes, scale) = self.source(name, rows, cols).await?;
        let format = head.target().unwrap_or(desc.format);
        let (requantized, data) = match &bytes {
            None => {
                let out = requantize(&desc, self.file.bytes(), format)?;
                // The stored head is read once here; only embedding lookups (a row per token)
                // may touch it again.
                self.file.release(desc.range.clone());
                out
            }
            Some(bytes) => requantize(&desc, bytes, format)?,
        };
        drop(bytes);
        self.described(requantized, Some(data), scale, MatrixUse::Product)
    }

    async fn vector_data(&mut self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let info = self.info(name)?;
        let fetched = self.fetch.fetch(&info).await?;
        self.tick();
        Ok(match fetched {
            None => read_f32_vector(
                &info,
                self.file.tensor_bytes(&info).map_err(WeightError::from)?,
                len,
            )?,
            Some(bytes) => read_f32_vector(&info, &bytes, len)?,
        })
    }

    /// [`Loader::vector`] with its values in `order` (as [`Loader::matrix_in_order`]).
    async fn vector_in_order(
        &mut self,
        name: &str,
        len: usize,
        order: Option<&[usize]>,
    ) -> Result<B::Vector, ModelError> {
        self.scaled_vector_in_order(name, len, order, 1.0).await
    }

    /// [`Loader::vector_in_order`] times `scale`.
    async fn scaled_vector_in_order(
        &mut self,
        name: &str,
        len: usize,
        order: Option<&[usize]>,
        scale: f32,
    ) -> Result<B::Vector, ModelError> {
        let mut data = self.vector_data(name, len).await?;
        if let Some(order) = order {
            data = order.iter().map(|&i| data[i]).collect();
        }
        if scale != 1.0 {
            data.iter_mut().for_each(|g| *g *= scale);
        }
        Ok(self.backend.load_vector(data)?)
    }

    async fn vector(&mut self, name: &str, len: usize) -> Result<B::Vector, ModelError> {
        self.vector_in_order(name, len, None).await
    }
}

/// RoPE's per-pair frequency divisors from the file: `rope_freqs.weight` (Llama 3.1) for every
/// session as `short`, or LongRoPE's pair (Phi-3.5-mini, Phi-4-mini: `rope_factors_short` for a
/// session of up to `n_ctx_orig` positions, `rope_factors_long` for a longer one, as llama.cpp
/// chooses by the context's length).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct RopeFactors {
    short: Option<Vec<f32>>,
    long: Option<Vec<f32>>,
}

impl RopeFactors {
    /// The factors a session of `n_ctx` positions rotates with.
    pub fn for_context(&self, n_ctx: usize, n_ctx_orig: usize) -> Option<&[f32]> {
        match &self.long {
            Some(long) if n_ctx > n_ctx_orig => Some(long),
            _ => self.short.as_deref(),
        }
    }
}

/// Expert `e` of the `n_expert` matrices stacked in `stack` (`[cols, rows, n_expert]`): its
/// rows, named `<stack>[e]` in messages.
fn expert(stack: &TensorInfo, e: usize, n_expert: usize) -> TensorInfo {
    let bytes = stack.nbytes.unwrap_or(0) / n_expert as u64;
    TensorInfo {
        name: format!("{}[{e}]", stack.name),
        ne: [stack.ne[0], stack.ne[1], 1, 1],
        n_dims: 2,
        start: stack.start + e as u64 * bytes,
        nbytes: Some(bytes),
        ..stack.clone()
    }
}

/// The name of layer `il`'s tensor `name`.
fn blk(il: usize, name: &str) -> String {
    format!("blk.{il}.{name}")
}

/// The order of the `n_head` heads' rows of a Q or K projection that makes NeoX RoPE rotate
/// what the file's pairing rotates (`None`: the file pairs as NeoX does). For adjacent pairs
/// (`2i`, `2i + 1`), row `i` of a head becomes row `2i` of the file's and row `i + rope_dim/2`
/// row `2i + 1`; dims past `rope_dim` stay.
fn rope_row_order(c: &Config, n_head: usize) -> Option<Vec<usize>> {
    if c.family.rope_pairs == RopePairs::Neox {
        return None;
    }
    let half = c.rope_dim / 2;
    let within = |j: usize| match j {
        j if j < half => 2 * j,
        j if j < c.rope_dim => 2 * (j - half) + 1,
        j => j,
    };
    Some(
        (0..n_head * c.head_dim)
            .map(|r| r - r % c.head_dim + within(r % c.head_dim))
            .collect(),
    )
}
