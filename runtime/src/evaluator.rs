//! What turns input tokens into a next-token prediction for a completion: a model with its
//! session in this process ([`Local`]), or a ring of nodes that each hold some layers.

use std::future::Future;

use hesper_engine::backend::Backend;
use hesper_engine::model::{Model, Prediction, Readout, Session};
#[cfg(unix)]
use hesper_engine::model::{Reload, ReloadError};

use crate::RuntimeError;

/// Evaluates tokens at a context's next positions and predicts the token after them.
pub trait Evaluator {
    /// Positions evaluated so far (the next position).
    fn pos(&self) -> usize;

    /// Context size.
    fn n_ctx(&self) -> usize;

    /// Forgets every position from `pos` on, or every position where a sliding-window cache
    /// no longer holds what `pos` attends ([`Evaluator::pos`] tells what was kept).
    fn truncate(&mut self, pos: usize);

    /// Whether one more token can be evaluated: a free position, or a context that shifts.
    fn has_room(&self) -> bool {
        self.pos() < self.n_ctx()
    }

    /// Evaluates `input` at the next positions and hands back what `readout` asks of the
    /// last position's logits.
    fn predict(
        &mut self,
        input: &[u32],
        readout: Readout,
    ) -> impl Future<Output = Result<Prediction, RuntimeError>>;

    /// Swaps in the tensors that changed on disk, for a model loaded for hot-swap
    /// ([`Model::load_hot_swap`]). The context still holds what the old weights computed: a
    /// caller that swapped evaluates it again.
    #[cfg(unix)]
    fn reload(&mut self) -> Result<Reload, RuntimeError> {
        Err(ReloadError::NotEnabled.into())
    }
}

/// How an evaluator holds its model: shared (`&Model`), or owned for the time being so that
/// it can swap tensors in (`&mut Model`, see [`Evaluator::reload`]).
pub trait ModelRef<B: Backend> {
    /// The model.
    fn get(&self) -> &Model<B>;
    /// The model, where it may be changed.
    fn get_mut(&mut self) -> Option<&mut Model<B>>;
}

impl<B: Backend> ModelRef<B> for &Model<B> {
    fn get(&self) -> &Model<B> {
        self
    }

    fn get_mut(&mut self) -> Option<&mut Model<B>> {
        None
    }
}

impl<B: Backend> ModelRef<B> for &mut Model<B> {
    fn get(&self) -> &Model<B> {
        self
    }

    fn get_mut(&mut self) -> Option<&mut Model<B>> {
        Some(self)
    }
}

/// A model holding every layer, with its session, in this process.
pub struct Local<'a, B: Backend, M: ModelRef<B> = &'a Model<B>> {
    /// The model.
    pub model: M,
    /// Its session (KV cache and position).
    pub session: &'a mut Session<B>,
}

impl<B: Backend, M: ModelRef<B>> Evaluator for Local<'_, B, M> {
    fn pos(&self) -> usize {
        self.session.pos()
    }

    fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    fn truncate(&mut self, pos: usize) {
        self.session.truncate(pos);
    }

    fn has_room(&self) -> bool {
        self.session.has_room()
    }

    async fn predict(
        &mut self,
        input: &[u32],
        readout: Readout,
    ) -> Result<Prediction, RuntimeError> {
        Ok(self
            .model
            .get()
            .predict_async(self.session, input, readout)
            .await?)
    }

    #[cfg(unix)]
    fn reload(&mut self) -> Result<Reload, RuntimeError> {
        match self.model.get_mut() {
            Some(model) => Ok(model.reload_changed()?),
            None => Err(ReloadError::NotEnabled.into()),
        }
    }
}
