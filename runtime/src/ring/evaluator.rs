//! One sequence on a ring, as an [`Evaluator`] a completion or a chat runs on (the CLI's
//! `hesper-rs node --role master`): a [`RingRunner`] with one cache. A long input goes round
//! in steps of the batch, all in flight at once. With a standby, a lost ring is re-formed
//! through it and the token history replayed in the same steps, so generation goes on with the
//! very numbers an unbroken ring computes.

use hesper_engine::backend::Backend;
use hesper_engine::model::{Model, ModelError, Prediction, Readout, Reload};
use hesper_ring::Link;

use super::hello::NodeRecord;
use super::master::{RingCache, RingOptions, RingRunner};
use super::{NodeSettings, RingError};
use crate::evaluator::ModelRef;
use crate::scheduler::{SeqCache, StepError, StepRunner};
use crate::{Evaluator, RuntimeError};

/// The master of a formed ring, running one sequence.
pub struct RingEvaluator<B: Backend, M: ModelRef<B>> {
    ring: RingRunner<B, M>,
    cache: RingCache<B>,
    batch: usize,
    /// Every token in the context, and the steps they were sent in (first position, count).
    history: Vec<u32>,
    steps: Vec<(usize, usize)>,
}

impl<B: Backend, M: ModelRef<B>> RingEvaluator<B, M> {
    /// Forms the ring ([`RingRunner::form`]) for one sequence of up to `n_ctx` positions,
    /// sent in steps of at most `batch` tokens. `standby`: a node to re-form the ring through
    /// if it breaks (it must hold the layers after the master's).
    pub fn form(
        model: M,
        settings: &NodeSettings,
        n_ctx: usize,
        batch: usize,
        standby: Option<std::net::SocketAddr>,
    ) -> Result<Self, RingError> {
        let ring = RingRunner::form(model, settings, Self::options(n_ctx, batch, standby))?;
        Self::on(ring, n_ctx, batch)
    }

    /// How [`RingEvaluator::form`] runs its ring: one sequence of up to `n_ctx` positions in
    /// steps of `batch`, re-formed through `standby` if it breaks.
    pub fn options(
        n_ctx: usize,
        batch: usize,
        standby: Option<std::net::SocketAddr>,
    ) -> RingOptions {
        RingOptions {
            standby,
            serving: false,
            n_ctx,
            batch,
            in_flight: None,
            private: false,
        }
    }

    /// One sequence of up to `n_ctx` positions, in steps of at most `batch` tokens, on a ring
    /// formed already (with [`RingEvaluator::options`]).
    pub fn on(mut ring: RingRunner<B, M>, n_ctx: usize, batch: usize) -> Result<Self, RingError> {
        let cache = ring.new_cache(n_ctx)?;
        Ok(Self {
            batch: batch.clamp(1, super::MAX_FRAME_ROWS),
            ring,
            cache,
            history: Vec::new(),
            steps: Vec::new(),
        })
    }

    /// What each node holds, the master's record first.
    pub fn nodes(&self) -> &[NodeRecord] {
        self.ring.nodes()
    }

    /// The master's links: to the next node, and from the last one.
    pub fn links(&self) -> [&Link; 2] {
        self.ring.links()
    }

    /// Ends the ring (see [`RingRunner::close`]).
    pub fn close(self, why: &str) {
        self.ring.close(why);
    }

    /// The master's layers.
    pub fn model(&self) -> &Model<B> {
        self.ring.model()
    }

    /// Sends the steps from `first` on, all in flight at once (the last one asking for
    /// `readout`), and waits for the prediction.
    fn run_steps(&mut self, first: usize, readout: Readout) -> Result<Prediction, StepError> {
        let last = self.steps.len() - 1;
        for i in first..=last {
            let (pos0, n) = self.steps[i];
            let tokens = &self.history[pos0..pos0 + n];
            let wants = (i == last).then_some(readout);
            self.ring
                .start_entries(&mut [(&mut self.cache, tokens, wants)])?;
        }
        let mut prediction = None;
        for _ in first..=last {
            prediction = self.ring.finish_predictions()?.pop().flatten();
        }
        prediction.ok_or_else(|| StepError::Failed("the ring sent no prediction".into()))
    }
}

/// A step's failure as the CLI reports it.
fn ring_error(e: StepError) -> RuntimeError {
    match e {
        StepError::Failed(why) | StepError::Reformed(why) | StepError::Down(why) => {
            RingError::Fault(why).into()
        }
    }
}

impl<B: Backend, M: ModelRef<B>> Evaluator for RingEvaluator<B, M> {
    fn pos(&self) -> usize {
        self.cache.pos()
    }

    fn n_ctx(&self) -> usize {
        self.cache.n_ctx()
    }

    fn truncate(&mut self, pos: usize) {
        // The next step starts at `pos` (or at what the cache kept): every worker forgets the
        // rest then.
        self.cache.truncate(pos);
        let pos = self.cache.pos();
        self.history.truncate(pos);
        self.steps.retain(|&(p, _)| p < pos);
        if let Some((p, n)) = self.steps.last_mut() {
            *n = (*n).min(pos - *p);
        }
    }

    async fn predict(
        &mut self,
        input: &[u32],
        readout: Readout,
    ) -> Result<Prediction, RuntimeError> {
        if input.is_empty() {
            return Err(ModelError::Empty.into());
        }
        let pos = self.cache.pos();
        if pos + input.len() > self.cache.n_ctx() {
            return Err(ModelError::ContextFull {
                needed: pos + input.len(),
                n_ctx: self.cache.n_ctx(),
            }
            .into());
        }
        let first = self.steps.len();
        self.history.extend_from_slice(input);
        for (i, chunk) in input.chunks(self.batch).enumerate() {
            self.steps.push((pos + i * self.batch, chunk.len()));
        }
        match self.run_steps(first, readout) {
            Err(StepError::Reformed(_)) => {
                // Every step again, in the same chunks: the new ring's caches (and the
                // master's) hold what the old ones did.
                self.cache.truncate(0);
                self.run_steps(0, readout).map_err(ring_error)
            }
            other => other.map_err(ring_error),
        }
    }

    #[cfg(unix)]
    fn reload(&mut self) -> Result<Reload, RuntimeError> {
        self.ring.reload_ring()
    }
}
