//! What runs a scheduler's steps: [`StepRunner`]. The scheduler decides which sequences'
//! tokens go into a step and samples what comes back; a runner evaluates the step — a model
//! in this process ([`LocalRunner`]), or a ring of processes that each hold some layers
//! (`crate::ring::RingRunner`), which keeps several steps in flight at once.

use hesper_engine::attention::AttentionConfig;
use hesper_engine::backend::Backend;
use hesper_engine::model::{
    BatchScratch, ModelError, Prediction, Readout, Reload, SeqRows, Session, StepInput, StepOutput,
};

use crate::evaluator::ModelRef;

/// A sequence's KV cache as the scheduler and its pool see it.
pub trait SeqCache {
    /// Positions it holds (the next position).
    fn pos(&self) -> usize;
    /// Positions it can hold.
    fn n_ctx(&self) -> usize;
    /// Forgets every position from `pos` on, or every position where a sliding-window cache
    /// no longer holds what `pos` attends ([`SeqCache::pos`] tells what was kept).
    fn truncate(&mut self, pos: usize);
}

impl<B: Backend> SeqCache for Session<B> {
    fn pos(&self) -> usize {
        Session::pos(self)
    }

    fn n_ctx(&self) -> usize {
        Session::n_ctx(self)
    }

    fn truncate(&mut self, pos: usize) {
        Session::truncate(self, pos);
    }
}

/// One sequence's share of a step: `tokens` at its cache's next positions.
pub struct RunStep<'a, C> {
    /// The sequence's cache.
    pub cache: &'a mut C,
    /// Tokens to evaluate (at least one).
    pub tokens: &'a [u32],
    /// What is wanted of the last token's logits (the sampled vocabulary), if anything: the
    /// whole row, or only the most likely token or tokens a sampler that needs no more draws
    /// from (a ring then sends a few bytes back, not a row).
    pub readout: Option<Readout>,
}

/// What came back of a step: each sequence's prediction, for those that asked, in order.
pub type Landed = Vec<Option<Prediction>>;

/// Why a step did not come back with its logits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepError {
    /// The step failed for its own sequences (the model refused it): they end with this
    /// error, and their caches are not reused. Other steps are unaffected.
    Failed(String),
    /// Every step in flight is lost and every cache was emptied, but the runner runs on (a
    /// ring re-formed through a standby): running sequences are evaluated again from their
    /// start, and the prefix cache forgets what it holds.
    Reformed(String),
    /// Every step in flight is lost and the runner cannot run until [`StepRunner::recover`]
    /// succeeds (a ring lost a node): running sequences end with this error.
    Down(String),
}

/// Evaluates a scheduler's steps. Steps come back in the order they were started.
pub trait StepRunner {
    /// One sequence's KV cache.
    type Cache: SeqCache;

    /// Steps that may be in flight at once: the scheduler splits its sequences into that
    /// many micro-batches (1: each step comes back before the next starts).
    fn in_flight(&self) -> usize {
        1
    }

    /// A cache of `n_ctx` positions for one sequence.
    fn new_cache(&mut self, n_ctx: usize) -> Result<Self::Cache, ModelError>;

    /// Frees a cache for good (the pool evicted it, or its step failed).
    fn free_cache(&mut self, cache: Self::Cache) {
        drop(cache);
    }

    /// Starts a step over `steps` (at most the scheduler's batch of tokens and its parallel
    /// sequences); its logits come from a later [`StepRunner::finish`]. Each cache's position
    /// has moved past its tokens when this returns.
    fn start(&mut self, steps: &mut [RunStep<'_, Self::Cache>]) -> Result<(), StepError>;

    /// Waits for the oldest step in flight: the readout of each of its sequences that asked,
    /// in the order they were given.
    fn finish(&mut self) -> Result<Landed, StepError>;

    /// Between steps, with nothing in flight: notices what happened meanwhile (a ring that
    /// lost a node), as the error a step would have met.
    fn poll(&mut self) -> Result<(), StepError> {
        Ok(())
    }

    /// After [`StepError::Down`]: tries once to run again (a ring forms anew). Every cache
    /// made before is usable, and empty.
    fn recover(&mut self) -> Result<(), String> {
        Ok(())
    }

    /// Swaps in the tensors that changed in the model file, between two steps (nothing in
    /// flight). After a swap the caches hold what the old weights computed.
    fn reload(&mut self) -> Result<Reload, String>;

    /// The final normalized hidden states `[n][n_embd]` of `tokens` evaluated alone from
    /// position 0, between two steps, in a cache of their own. A [`StepError::Reformed`] or
    /// [`StepError::Down`] concerns the running sequences as a step's would.
    fn hidden_states(&mut self, tokens: &[u32]) -> Result<Vec<f32>, StepError>;
}

/// A model holding every layer in this process: a step runs when it is started.
pub struct LocalRunner<B: Backend, M: ModelRef<B>> {
    model: M,
    scratch: BatchScratch<B>,
    attention: AttentionConfig,
    batch: usize,
    done: Option<Result<Landed, StepError>>,
}

impl<B: Backend, M: ModelRef<B>> LocalRunner<B, M> {
    /// A runner of steps of up to `batch` tokens over up to `parallel` sequences, whose caches
    /// store attention as `attention` says.
    pub fn new(
        model: M,
        batch: usize,
        parallel: usize,
        attention: AttentionConfig,
    ) -> Result<Self, ModelError> {
        let scratch = model.get().new_batch_scratch(batch, parallel)?;
        Ok(Self {
            model,
            scratch,
            attention,
            batch,
            done: None,
        })
    }
}

impl<B: Backend, M: ModelRef<B>> StepRunner for LocalRunner<B, M> {
    type Cache = Session<B>;

    fn new_cache(&mut self, n_ctx: usize) -> Result<Session<B>, ModelError> {
        self.model.get().new_session_with(n_ctx, 1, &self.attention)
    }

    fn start(&mut self, steps: &mut [RunStep<'_, Session<B>>]) -> Result<(), StepError> {
        let tokens: Vec<u32> = steps
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        let mut rows: Vec<SeqRows<'_, B>> = steps
            .iter_mut()
            .map(|s| SeqRows {
                pos0: s.cache.pos(),
                n: s.tokens.len(),
                readout: s.readout,
                session: &mut *s.cache,
            })
            .collect();
        let model = self.model.get();
        let done = match model.step_rows(&mut self.scratch, &mut rows, StepInput::Tokens(&tokens)) {
            Ok(StepOutput::Predictions(p)) => Ok(p),
            Ok(StepOutput::Hidden(_)) => Err(StepError::Failed(
                "the model does not hold every layer and its head".into(),
            )),
            Err(e) => Err(StepError::Failed(e.to_string())),
        };
        self.done = Some(done);
        Ok(())
    }

    fn finish(&mut self) -> Result<Landed, StepError> {
        self.done
            .take()
            .unwrap_or_else(|| Err(StepError::Failed("no step was started".into())))
    }

    fn reload(&mut self) -> Result<Reload, String> {
        match self.model.get_mut() {
            Some(m) => m.reload_changed().map_err(|e| e.to_string()),
            None => Err("the model was not loaded for hot-swap".into()),
        }
    }

    fn hidden_states(&mut self, tokens: &[u32]) -> Result<Vec<f32>, StepError> {
        let failed = |e: ModelError| StepError::Failed(e.to_string());
        let model = self.model.get();
        let mut s = model
            .new_session_with(tokens.len(), self.batch, &self.attention)
            .map_err(failed)?;
        model.hidden_states(&mut s, tokens).map_err(failed)
    }
}
