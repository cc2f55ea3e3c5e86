//! Steps that run several sessions at once, as a server's continuous batching does: the rows
//! of every session go through each matrix together (the weights are read once per step), and
//! attention runs per session over its own KV cache. Each row's arithmetic is what the session
//! alone would do, so on a backend whose products are bit-identical across batch sizes (the
//! CPU's) a session's logits do not depend on what runs beside it.
//!
//! [`Model::step_rows_async`] is the general form, over whatever layer range the instance
//! holds: rows come in as tokens (the first layers) or hidden states (a ring node's), and go
//! out as hidden states or, where the instance holds the LM head, as the predictions each
//! session asked for. [`Model::step_async`] is the whole model's form a local server runs.

use crate::backend::{Backend, NON_FINITE};
use crate::model::{Model, ModelError, Prediction, Readout, Scratch, Session};
use crate::sampler::{argmax, top_candidates};

/// Scratch space for [`Model::step_async`]: one step of up to `tokens` rows over up to `seqs`
/// sessions.
pub struct BatchScratch<B: Backend> {
    s: Scratch<B>,
    /// One session's queries, keys, values and attention output, at the front.
    one: [B::Buffer; 4],
    /// The last row of each session whose logits are asked for.
    last: B::Buffer,
    tokens: usize,
    seqs: usize,
}

impl<B: Backend> BatchScratch<B> {
    /// Most rows one step takes.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Most sessions one step takes.
    pub fn seqs(&self) -> usize {
        self.seqs
    }
}

/// One session's share of a batched step: `tokens` evaluated at its next positions.
pub struct SeqStep<'a, B: Backend> {
    /// The session (its KV cache and position; its own scratch is not used).
    pub session: &'a mut Session<B>,
    /// Tokens to evaluate (at least one).
    pub tokens: &'a [u32],
    /// Whether the logits of the last token are wanted.
    pub logits: bool,
}

/// One session's share of a step over a layer range ([`Model::step_rows_async`]): `n` rows at
/// positions from `pos0`.
pub struct SeqRows<'a, B: Backend> {
    /// The session (its KV cache and position; its own scratch is not used).
    pub session: &'a mut Session<B>,
    /// The first row's position: the session forgets the positions from here on first; one
    /// past the session's position is a gap ([`ModelError::PositionGap`]).
    pub pos0: usize,
    /// Rows (at least one).
    pub n: usize,
    /// What the LM head hands back for the last row, where the instance runs it.
    pub readout: Option<Readout>,
}

/// Where a step's rows come from, every session's in order.
#[derive(Debug, Clone, Copy)]
pub enum StepInput<'a> {
    /// Token ids, embedded here (needs layer 0 in this instance).
    Tokens(&'a [u32]),
    /// The residual stream entering this instance's first layer, `[rows][n_embd]`.
    Hidden(&'a [f32]),
}

/// What a step over a layer range hands back ([`Model::step_rows_async`]).
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutput {
    /// The residual stream leaving this instance's last layer, `[rows][n_embd]`: what the next
    /// node of a ring takes.
    Hidden(Vec<f32>),
    /// Each session's prediction, for those that asked (the instance runs the LM head).
    Predictions(Vec<Option<Prediction>>),
}

impl<B: Backend> Model<B> {
    /// Scratch for steps of up to `tokens` rows over up to `seqs` sessions.
    pub fn new_batch_scratch(
        &self,
        tokens: usize,
        seqs: usize,
    ) -> Result<BatchScratch<B>, ModelError> {
        let c = &self.config;
        let (tokens, seqs) = (tokens.max(1), seqs.clamp(1, tokens.max(1)));
        let b = &self.backend;
        let (qd, kv) = (c.q_dim(), c.kv_dim());
        Ok(BatchScratch {
            s: self.scratch(tokens, seqs)?,
            one: [
                b.alloc(tokens * qd)?,
                b.alloc(tokens * kv)?,
                b.alloc(tokens * kv)?,
                b.alloc(tokens * qd)?,
            ],
            last: b.alloc(seqs * c.n_embd)?,
            tokens,
            seqs,
        })
    }

    /// Whether this instance runs the final norm and LM head after its layers (it holds them
    /// and the last layer): [`Model::step_rows_async`] then reads out predictions.
    pub fn runs_head(&self) -> bool {
        self.holds_head() && self.layer_range.end == self.config.n_layer
    }

    /// Whether this instance holds the final norm and LM head ([`Model::head_rows_async`]).
    pub fn holds_head(&self) -> bool {
        self.output_norm.is_some()
    }

    /// Evaluates each step's tokens at its session's next positions, all in one pass over the
    /// weights, and hands back the last token's logits (the sampled vocabulary) of each step
    /// that asked. Nothing runs unless every step fits: tokens in range, room in each context
    /// (sessions here do not shift), and the scratch's rows and sessions.
    pub async fn step_async(
        &self,
        sc: &mut BatchScratch<B>,
        steps: &mut [SeqStep<'_, B>],
    ) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        let c = &self.config;
        if self.layer_range != (0..c.n_layer) || !self.runs_head() {
            return Err(self.range_error(0..c.n_layer));
        }
        let all: Vec<u32> = steps
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        let mut rows: Vec<SeqRows<'_, B>> = steps
            .iter_mut()
            .map(|st| SeqRows {
                pos0: st.session.pos,
                n: st.tokens.len(),
                readout: st.logits.then_some(Readout::Logits),
                session: &mut *st.session,
            })
            .collect();
        match self
            .step_rows_async(sc, &mut rows, StepInput::Tokens(&all))
            .await?
        {
            StepOutput::Predictions(p) => Ok(p
                .into_iter()
                .map(|p| match p {
                    Some(Prediction::Logits(row)) => Some(row),
                    _ => None,
                })
                .collect()),
            StepOutput::Hidden(_) => unreachable!("the whole model runs its head"),
        }
    }

    /// Runs this instance's layers on every session's rows in one pass over the weights, each
    /// session's from its `pos0`; then, where the instance holds the LM head
    /// ([`Model::runs_head`]), hands back each session's readout of its last row, else the
    /// hidden states leaving its last layer. Nothing runs unless every session fits: rows and
    /// positions in range (sessions here do not shift), the input's size, and the scratch's
    /// rows and sessions.
    pub async fn step_rows_async(
        &self,
        sc: &mut BatchScratch<B>,
        seqs: &mut [SeqRows<'_, B>],
        input: StepInput<'_>,
    ) -> Result<StepOutput, ModelError> {
        self.step_rows_with(sc, seqs, input, true).await
    }

    /// [`Model::step_rows_async`] that hands back the hidden states leaving this instance's
    /// last layer even where it runs the LM head (a ring's last node whose master keeps the
    /// output to itself): the readouts are not computed.
    pub async fn step_rows_hidden_async(
        &self,
        sc: &mut BatchScratch<B>,
        seqs: &mut [SeqRows<'_, B>],
        input: StepInput<'_>,
    ) -> Result<Vec<f32>, ModelError> {
        match self.step_rows_with(sc, seqs, input, false).await? {
            StepOutput::Hidden(rows) => Ok(rows),
            StepOutput::Predictions(_) => unreachable!("no readout without the head"),
        }
    }

    /// [`Model::step_rows_async`], the head run only where `head` allows it.
    async fn step_rows_with(
        &self,
        sc: &mut BatchScratch<B>,
        seqs: &mut [SeqRows<'_, B>],
        input: StepInput<'_>,
        head: bool,
    ) -> Result<StepOutput, ModelError> {
        let c = &self.config;
        let d = c.n_embd;
        let n: usize = seqs.iter().map(|s| s.n).sum();
        let head = head && self.runs_head();
        let m = if head {
            seqs.iter().filter(|s| s.readout.is_some()).count()
        } else {
            0
        };
        if seqs.is_empty() || seqs.iter().any(|s| s.n == 0) {
            return Err(ModelError::Empty);
        }
        if n > sc.tokens || m > sc.seqs || seqs.len() > sc.tokens {
            return Err(ModelError::BatchTooLarge {
                tokens: n,
                seqs: m,
                max_tokens: sc.tokens,
                max_seqs: sc.seqs,
            });
        }
        for st in seqs.iter() {
            let s = &st.session;
            if st.pos0 > s.pos {
                return Err(ModelError::PositionGap {
                    pos0: st.pos0,
                    pos: s.pos,
                });
            }
            if st.pos0 + st.n > s.n_ctx {
                return Err(ModelError::ContextFull {
                    needed: st.pos0 + st.n,
                    n_ctx: s.n_ctx,
                });
            }
        }
        let b = &self.backend;
        match input {
            StepInput::Tokens(tokens) => {
                let embedding = self
                    .embedding
                    .as_ref()
                    .filter(|_| self.layer_range.start == 0)
                    .ok_or_else(|| self.range_error(0..1))?;
                if tokens.len() != n {
                    return Err(ModelError::HiddenSize {
                        got: tokens.len(),
                        n_tokens: n,
                        n_embd: 1,
                    });
                }
                self.check_tokens(tokens)?;
                self.embed_rows(embedding, tokens, &mut sc.s.x);
            }
            StepInput::Hidden(hidden) => {
                if hidden.len() != n * d {
                    return Err(ModelError::HiddenSize {
                        got: hidden.len(),
                        n_tokens: n,
                        n_embd: d,
                    });
                }
                b.write(&mut sc.s.x, hidden)?;
            }
        }
        for st in seqs.iter_mut() {
            st.session.truncate(st.pos0);
            if st.session.pos != st.pos0 {
                return Err(ModelError::WindowLost { pos0: st.pos0 });
            }
        }
        let (qd, kv) = (c.q_dim(), c.kv_dim());
        let mut segs: Vec<Segment<'_, B::Cache>> = Vec::with_capacity(seqs.len());
        let mut row = 0;
        for st in seqs.iter_mut() {
            segs.push(Segment {
                n_ctx: st.session.n_ctx,
                step: st.session.max_step(),
                cache: &mut st.session.cache,
                row0: row,
                len: st.n,
                pos0: st.pos0,
            });
            row += st.n;
        }
        let one = &mut sc.one;
        self.layers_over(
            &mut sc.s,
            n,
            &mut |b, li, [q, k, v, att], rope, attn, next, prep| {
                if let [seg] = &mut segs[..] {
                    if seg.len <= seg.step {
                        let [rope_q, rope_k] = self.rope_in_context(rope, seg.n_ctx);
                        let (len, pos0) = (seg.len, seg.pos0);
                        b.rope_attention(
                            seg.cache, li, q, k, v, len, pos0, &rope_q, &rope_k, attn, att, next,
                            prep,
                        );
                        return;
                    }
                }
                // Each segment's output is copied into `att` (as floats) for the product.
                let [oq, ok, ov, oatt] = one;
                for seg in segs.iter_mut() {
                    let [rope_q, rope_k] = self.rope_in_context(rope, seg.n_ctx);
                    for at in (0..seg.len).step_by(seg.step) {
                        let (row0, len) = (seg.row0 + at, (seg.len - at).min(seg.step));
                        b.copy_rows(q, row0, len, qd, oq, 0);
                        b.copy_rows(k, row0, len, kv, ok, 0);
                        b.copy_rows(v, row0, len, kv, ov, 0);
                        let pos0 = seg.pos0 + at;
                        b.rope_attention(
                            seg.cache, li, oq, ok, ov, len, pos0, &rope_q, &rope_k, attn, oatt,
                            None, prep,
                        );
                        b.copy_rows(oatt, 0, len, qd, att, row0);
                    }
                }
            },
        );
        drop(segs);
        for st in seqs.iter_mut() {
            st.session.advance(st.n);
        }
        if !head {
            let mut out = vec![0.0; n * d];
            b.read(&sc.s.x, &mut out).await?;
            return Ok(StepOutput::Hidden(out));
        }
        let mut row = 0;
        let mut j = 0;
        for st in seqs.iter() {
            if st.readout.is_some() {
                b.copy_rows(&sc.s.x, row + st.n - 1, 1, d, &mut sc.last, j);
                j += 1;
            }
            row += st.n;
        }
        if m == 0 {
            return Ok(StepOutput::Predictions(seqs.iter().map(|_| None).collect()));
        }
        let (norm, head) = self.head_parts()?;
        b.rms_norm_for(&sc.last, norm, m, c.eps, &mut sc.s.h, head);
        self.logits_of(head, &sc.s.h, m, &mut sc.s.logits);
        let asked: Vec<(Readout, usize)> = seqs
            .iter()
            .filter_map(|st| st.readout.map(|r| (r, st.pos0 + st.n - 1)))
            .collect();
        let mut read = self.read_predictions(&mut sc.s.logits, &asked).await?;
        read.reverse();
        Ok(StepOutput::Predictions(
            seqs.iter()
                .map(|st| st.readout.and_then(|_| read.pop()))
                .collect(),
        ))
    }

    /// The final norm and LM head on `hidden` (`[m][n_embd]`, the residual stream leaving the
    /// last layer, one row for each readout of `asked` with its position, for errors), and each
    /// readout: what a ring's master that keeps the output to itself computes from the states
    /// its last node hands back. Needs the head here ([`crate::model::HeadPlace::Here`]).
    pub async fn head_rows_async(
        &self,
        sc: &mut BatchScratch<B>,
        hidden: &[f32],
        asked: &[(Readout, usize)],
    ) -> Result<Vec<Prediction>, ModelError> {
        let (c, m) = (&self.config, asked.len());
        if m == 0 || hidden.len() != m * c.n_embd {
            return Err(ModelError::HiddenSize {
                got: hidden.len(),
                n_tokens: m,
                n_embd: c.n_embd,
            });
        }
        if m > sc.seqs {
            return Err(ModelError::BatchTooLarge {
                tokens: m,
                seqs: m,
                max_tokens: sc.tokens,
                max_seqs: sc.seqs,
            });
        }
        let (norm, head) = self.head_parts()?;
        let b = &self.backend;
        b.write(&mut sc.last, hidden)?;
        b.rms_norm_for(&sc.last, norm, m, c.eps, &mut sc.s.h, head);
        self.logits_of(head, &sc.s.h, m, &mut sc.s.logits);
        self.read_predictions(&mut sc.s.logits, asked).await
    }

    /// The final norm of each row of `hidden` (`[rows][n_embd]`, the residual stream leaving the
    /// last layer): the states an embedding pools, as [`Model::hidden_states_async`] gives them
    /// (llama.cpp's `result_norm`). Needs the head here ([`Model::holds_head`]).
    pub async fn final_norm_async(
        &self,
        sc: &mut BatchScratch<B>,
        hidden: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let n = self.hidden_rows(hidden)?;
        if n > sc.tokens {
            return Err(ModelError::BatchTooLarge {
                tokens: n,
                seqs: 1,
                max_tokens: sc.tokens,
                max_seqs: sc.seqs,
            });
        }
        let (norm, _) = self.head_parts()?;
        let b = &self.backend;
        b.write(&mut sc.s.x, hidden)?;
        b.rms_norm(&sc.s.x, norm, n, c.eps, &mut sc.s.h);
        let mut out = vec![0.0; hidden.len()];
        b.read(&sc.s.h, &mut out).await?;
        Ok(out)
    }

    /// Each readout of `asked` (with its row's position, for errors) from the logits rows at
    /// the front of `logits`, one per readout in order. One row's argmax or top k is found by
    /// the backend (a GPU reads back only those); several rows are read back whole.
    async fn read_predictions(
        &self,
        logits: &mut B::Buffer,
        asked: &[(Readout, usize)],
    ) -> Result<Vec<Prediction>, ModelError> {
        if let [(readout, pos)] = asked {
            return Ok(vec![self.read_prediction_at(logits, *pos, *readout).await?]);
        }
        let (n_vocab, n) = (self.config.n_vocab, self.n_sampled);
        let mut rows = vec![0.0; asked.len() * n_vocab];
        self.backend.read(logits, &mut rows).await?;
        asked
            .iter()
            .zip(rows.chunks_exact(n_vocab))
            .map(|(&(readout, pos), row)| {
                let row = &row[..n];
                self.check_finite(row, pos)?;
                Ok(match readout {
                    Readout::Argmax => Prediction::Token(argmax(row.iter().copied())),
                    Readout::Top(k) => Prediction::Top(top_candidates(row, k.min(n))),
                    Readout::Logits => Prediction::Logits(row.to_vec()),
                })
            })
            .collect()
    }

    /// What `readout` asks of the logits row at the front of `logits` (the row of position
    /// `pos`, for errors).
    pub(super) async fn read_prediction_at(
        &self,
        logits: &mut B::Buffer,
        pos: usize,
        readout: Readout,
    ) -> Result<Prediction, ModelError> {
        let n = self.n_sampled;
        let b = &self.backend;
        Ok(match readout {
            Readout::Argmax => {
                let t = b.argmax(logits, n).await?;
                if t & NON_FINITE != 0 {
                    let mut row = vec![0.0; n];
                    b.read(logits, &mut row).await?;
                    self.check_finite(&row, pos)?;
                    let token = t & !NON_FINITE;
                    let value = row.get(token as usize).copied().unwrap_or(f32::NAN);
                    return Err(ModelError::NonFiniteLogits { pos, token, value });
                }
                Prediction::Token(t)
            }
            Readout::Top(k) => {
                let top = b.top_k(logits, n, k.min(n)).await?;
                if let Some(&(token, value)) = top.iter().find(|(_, v)| !v.is_finite()) {
                    return Err(ModelError::NonFiniteLogits { pos, token, value });
                }
                Prediction::Top(top)
            }
            Readout::Logits => {
                let mut row = vec![0.0; n];
                b.read(logits, &mut row).await?;
                self.check_finite(&row, pos)?;
                Prediction::Logits(row)
            }
        })
    }
}

/// One sequence's rows of a step, as each layer's attention sees them.
struct Segment<'a, C> {
    /// The sequence's cache.
    cache: &'a mut C,
    /// Its first row in the step.
    row0: usize,
    /// Its rows.
    len: usize,
    /// The position of its first row.
    pos0: usize,
    /// Its session's context.
    n_ctx: usize,
    /// The most rows one attention call may write (a sliding-window cache holds its window
    /// and one step): longer runs are attended in pieces.
    step: usize,
}
