//! What turns input tokens into a next-token prediction for a completion: a model with its
//! session in this process ([`Local`]), or a ring of nodes that each hold some layers.

use std::future::Future;

use hesper_engine::backend::Backend;
use hesper_engine::model::{Model, Prediction, Readout, Session};

use crate::RuntimeError;

/// Evaluates tokens at a context's next positions and predicts the token after them.
pub trait Evaluator {
    /// Positions evaluated so far (the next position).
    fn pos(&self) -> usize;

    /// Context size.
    fn n_ctx(&self) -> usize;

    /// Forgets every position from `pos` on.
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
}

/// A model holding every layer, with its session, in this process.
pub struct Local<'a, B: Backend> {
    /// The model.
    pub model: &'a Model<B>,
    /// Its session (KV cache and position).
    pub session: &'a mut Session<B>,
}

impl<B: Backend> Evaluator for Local<'_, B> {
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
            .predict_async(self.session, input, readout)
            .await?)
    }
}
