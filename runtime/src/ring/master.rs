//! The master's side of a ring: its own layers, then the rest of the ring, as an
//! [`Evaluator`] a completion or a chat runs on.

use std::time::{Duration, Instant};

use hesper_engine::backend::Backend;
use hesper_engine::model::{Model, Prediction, Readout, Session};
use hesper_ring::{wire, Dtype, Frame, Header, Incoming, Kind, Link, Net, Side};

use super::hello::{self, model_id, NodeRecord};
use super::protocol::{decode_prediction, readout_code};
use super::{NodeSettings, RingError, FLUSH, MAX_FRAME_ROWS};
use crate::{Evaluator, RuntimeError};

/// The master of a formed ring.
pub struct RingEvaluator<'a, B: Backend> {
    model: &'a Model<B>,
    session: Session<B>,
    net: Net,
    next: Link,
    prev: Link,
    records: Vec<NodeRecord>,
    run: u64,
    seq: u64,
    wire: Dtype,
    log: fn(&str),
}

impl<'a, B: Backend> RingEvaluator<'a, B> {
    /// Forms the ring: listens, connects to the next node, sends the Hello round and checks
    /// what comes back ([`hello::check`]). A ring that fails the check is ended with the
    /// reason (every worker prints it) and the same reason is returned.
    pub fn form(
        model: &'a Model<B>,
        session: Session<B>,
        settings: &NodeSettings,
    ) -> Result<Self, RingError> {
        if model.layer_range().start != 0 {
            return Err(RingError::Config(format!(
                "the master holds the embedding, so its layers must start at 0 (it holds {}..{})",
                model.layer_range().start,
                model.layer_range().end
            )));
        }
        let mut net = Net::new(settings.net)?;
        let bound = net.listen(settings.listen)?;
        let next = net.connect(settings.next, settings.form_wait)?;
        let me = NodeRecord {
            layers: model.layer_range(),
            n_layer: model.config.n_layer,
            model: model_id(&model.file),
            file_len: model.file.len(),
            backend: model.backend.name(),
            listen: bound.to_string(),
        };
        let run = run_id();
        let mut h = Header::new(Kind::Hello);
        h.session = run;
        h.aux = u32::try_from(session.n_ctx()).unwrap_or(u32::MAX);
        next.send(Frame::new(h, hello::encode(std::slice::from_ref(&me))));
        let prev = net.accept(settings.form_wait)?;
        let deadline = Instant::now() + settings.form_wait;
        let records = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match net.recv(left.min(Duration::from_millis(100))) {
                Some(Incoming::Frame(_, f)) if f.header.kind == Kind::Hello => {
                    break hello::decode(&f.payload).map_err(RingError::Protocol)?
                }
                Some(Incoming::Frame(_, f)) if f.header.kind == Kind::Fault => {
                    return Err(RingError::Fault(f.message()))
                }
                Some(Incoming::Lost(_, why)) => {
                    return Err(RingError::Lost {
                        node: "while the ring formed".into(),
                        why,
                    })
                }
                Some(Incoming::Note(n)) => (settings.log)(&n),
                _ if left.is_zero() => {
                    return Err(RingError::Config(format!(
                        "the Hello frame did not come back round the ring within {:.0} s",
                        settings.form_wait.as_secs_f64()
                    )))
                }
                _ => {}
            }
        };
        let ring = Self {
            model,
            session,
            net,
            next,
            prev,
            records,
            run,
            seq: 0,
            wire: settings.wire,
            log: settings.log,
        };
        if let Err(why) = hello::check(&ring.records) {
            ring.close(&why);
            return Err(RingError::Config(why));
        }
        Ok(ring)
    }

    /// What each node holds, the master's record first.
    pub fn nodes(&self) -> &[NodeRecord] {
        &self.records
    }

    /// Ends the ring: every worker gets the reason (empty: a normal end) and exits.
    pub fn close(self, why: &str) {
        self.next.send(Frame::text(Kind::Shutdown, why));
        std::thread::sleep(FLUSH);
    }

    /// The master's links: to the next node, and from the last one.
    pub fn links(&self) -> [&Link; 2] {
        [&self.next, &self.prev]
    }

    /// Runs `tokens` through the master's layers and sends the rows on; `readout` says
    /// what the last node hands back (nothing for a prefill chunk before the last).
    async fn send_step(
        &mut self,
        tokens: &[u32],
        readout: Option<Readout>,
    ) -> Result<(), RuntimeError> {
        let pos0 = self.session.pos();
        let x = self.model.embed_async(&mut self.session, tokens).await?;
        let rows = self
            .model
            .forward_hidden_at_async(&mut self.session, pos0, &x)
            .await?;
        self.seq += 1;
        let mut h = Header::new(Kind::Forward);
        h.dtype = self.wire;
        h.session = self.run;
        h.seq = self.seq;
        h.pos0 = pos0 as u32;
        h.n_tokens = tokens.len() as u32;
        h.aux = readout_code(readout);
        self.next
            .send(Frame::new(h, wire::encode(self.wire, &rows)));
        Ok(())
    }

    /// Waits for the prediction of step `self.seq`; a lost node or a fault ends the ring.
    fn wait_prediction(&mut self, readout: Readout) -> Result<Prediction, RingError> {
        loop {
            let Some(event) = self.net.recv(Duration::from_secs(1)) else {
                continue;
            };
            match event {
                Incoming::Frame(from, f) => match f.header.kind {
                    Kind::Prediction
                        if from.side == Side::Prev
                            && f.header.session == self.run
                            && f.header.seq == self.seq =>
                    {
                        return decode_prediction(readout, &f.payload, self.model.config.n_vocab)
                            .map_err(|e| self.fail(RingError::Protocol(e)));
                    }
                    Kind::Fault => return Err(self.fail(RingError::Fault(f.message()))),
                    Kind::Shutdown => {
                        return Err(self.fail(RingError::Fault(format!(
                            "the ring was ended while the master waited: {}",
                            f.message()
                        ))))
                    }
                    _ => {}
                },
                Incoming::Lost(from, why) if from.id == self.next.id() => {
                    let node = self
                        .records
                        .get(1)
                        .map_or_else(|| self.next.peer().into(), NodeRecord::name);
                    return Err(self.fail(RingError::Lost { node, why }));
                }
                Incoming::Lost(from, why) if from.id == self.prev.id() => {
                    let node = self
                        .records
                        .last()
                        .map_or_else(|| self.prev.peer().into(), NodeRecord::name);
                    return Err(self.fail(RingError::Lost { node, why }));
                }
                Incoming::Lost(..) => {}
                Incoming::Joined(extra) => (self.log)(&format!(
                    "refused a connection from {}: the ring is formed",
                    extra.peer()
                )),
                Incoming::Note(n) => (self.log)(&n),
            }
        }
    }

    /// Tells the nodes still reachable that the ring is over, and hands back `e`.
    fn fail(&self, e: RingError) -> RingError {
        let why = e.to_string();
        self.next.send(Frame::text(Kind::Shutdown, &why));
        std::thread::sleep(FLUSH);
        e
    }
}

impl<B: Backend> Evaluator for RingEvaluator<'_, B> {
    fn pos(&self) -> usize {
        self.session.pos()
    }

    fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    fn truncate(&mut self, pos: usize) {
        // The next Forward frame starts at `pos`: every worker forgets the rest then.
        self.session.truncate(pos);
    }

    async fn predict(
        &mut self,
        input: &[u32],
        readout: Readout,
    ) -> Result<Prediction, RuntimeError> {
        if input.is_empty() {
            return Err(hesper_engine::model::ModelError::Empty.into());
        }
        let chunks: Vec<&[u32]> = input.chunks(MAX_FRAME_ROWS).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            self.send_step(chunk, last.then_some(readout)).await?;
        }
        Ok(self.wait_prediction(readout)?)
    }
}

/// A number for this run of the master (workers start a fresh session when it changes).
fn run_id() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}
