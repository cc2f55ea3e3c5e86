//! Steps that run several sessions at once, as a server's continuous batching does: the rows
//! of every session go through each matrix together (the weights are read once per step), and
//! attention runs per session over its own KV cache. Each row's arithmetic is what the session
//! alone would do, so on a backend whose products are bit-identical across batch sizes (the
//! CPU's) a session's logits do not depend on what runs beside it.

use crate::backend::Backend;
use crate::model::{Model, ModelError, Scratch, Session};

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
        let (Some(embedding), Some(norm)) = (&self.embedding, &self.output_norm) else {
            return Err(self.range_error(0..c.n_layer));
        };
        let head = self.output.as_ref().unwrap_or(embedding);
        if self.layer_range != (0..c.n_layer) {
            return Err(self.range_error(0..c.n_layer));
        }
        let n: usize = steps.iter().map(|s| s.tokens.len()).sum();
        let m = steps.iter().filter(|s| s.logits).count();
        if steps.iter().any(|s| s.tokens.is_empty()) {
            return Err(ModelError::Empty);
        }
        if n > sc.tokens || m > sc.seqs {
            return Err(ModelError::BatchTooLarge {
                tokens: n,
                seqs: m,
                max_tokens: sc.tokens,
                max_seqs: sc.seqs,
            });
        }
        for st in steps.iter() {
            self.check_tokens(st.tokens)?;
            let s = &st.session;
            if s.pos + st.tokens.len() > s.n_ctx {
                return Err(ModelError::ContextFull {
                    needed: s.pos + st.tokens.len(),
                    n_ctx: s.n_ctx,
                });
            }
        }
        let b = &self.backend;
        let all: Vec<u32> = steps
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        b.embed(embedding, &all, &mut sc.s.x);
        let (qd, kv) = (c.q_dim(), c.kv_dim());
        let mut segs: Vec<(&mut B::Cache, usize, usize, usize)> = Vec::with_capacity(steps.len());
        let mut row = 0;
        for st in steps.iter_mut() {
            let len = st.tokens.len();
            segs.push((&mut st.session.cache, row, len, st.session.pos));
            row += len;
        }
        let one = &mut sc.one;
        self.layers_over(&mut sc.s, n, &mut |b, li, [q, k, v, att], rope, attn| {
            if let [(cache, _, len, pos0)] = &mut segs[..] {
                b.rope_attention(
                    cache, li, q, k, v, *len, *pos0, &rope[0], &rope[1], attn, att,
                );
                return;
            }
            let [oq, ok, ov, oatt] = one;
            for (cache, row0, len, pos0) in segs.iter_mut() {
                let (row0, len) = (*row0, *len);
                b.copy_rows(q, row0, len, qd, oq, 0);
                b.copy_rows(k, row0, len, kv, ok, 0);
                b.copy_rows(v, row0, len, kv, ov, 0);
                b.rope_attention(
                    cache, li, oq, ok, ov, len, *pos0, &rope[0], &rope[1], attn, oatt,
                );
                b.copy_rows(oatt, 0, len, qd, att, row0);
            }
        });
        drop(segs);
        let mut row = 0;
        let mut j = 0;
        for st in steps.iter_mut() {
            let len = st.tokens.len();
            if st.logits {
                b.copy_rows(&sc.s.x, row + len - 1, 1, c.n_embd, &mut sc.last, j);
                j += 1;
            }
            row += len;
            st.session.pos += len;
        }
        if m == 0 {
            return Ok(steps.iter().map(|_| None).collect());
        }
        b.rms_norm(&sc.last, norm, m, c.eps, &mut sc.s.h);
        b.matmul(head, &sc.s.h, m, &mut sc.s.logits);
        let mut rows = vec![0.0; m * c.n_vocab];
        b.read(&sc.s.logits, &mut rows).await?;
        let mut rows = rows.chunks_exact(c.n_vocab);
        steps
            .iter()
            .map(|st| {
                if !st.logits {
                    return Ok(None);
                }
                let row = rows.next().expect("one logit row per step that asked");
                self.check_finite(row, st.session.pos - 1)?;
                Ok(Some(row[..self.n_sampled].to_vec()))
            })
            .collect()
    }
}
