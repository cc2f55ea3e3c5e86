//! A worker node's loop: hidden states in from the previous node, through this node's layers,
//! out to the next (or, on the last node, the prediction back to the master).

use hesper_engine::backend::Backend;
use hesper_engine::model::{ReloadError, Session};
use std::time::Duration;

use hesper_ring::{wire, Frame, Header, Incoming, Kind, Link, Net, NetError, Side};

use super::hello::{self, NodeRecord};
use super::protocol::{encode_prediction, readout_of};
use super::reload::{self, Found};
use super::{NodeSettings, RingError, FLUSH};
use crate::evaluator::ModelRef;

/// Serves `model` (a layer range) as a worker until the master ends the ring (`Ok`), or a
/// neighbour is lost or the master ends it for a reason (`Err`). `batch` bounds the tokens
/// per step of this node's session. The node waits for its predecessor first and connects
/// to the next node when the master's Hello comes; a `standby` waits for its predecessor
/// without a time limit (it joins only when a master fails over to it).
pub fn serve<B: Backend, M: ModelRef<B>>(
    model: M,
    settings: &NodeSettings,
    batch: usize,
    standby: bool,
) -> Result<(), RingError> {
    let mut net = Net::new(settings.net.clone())?;
    let bound = net.listen(settings.listen)?;
    (settings.log)(&format!("listening on {bound}"));
    // Hashed before the Hello arrives, so the Hello goes on round at once.
    let me = NodeRecord::of(model.get(), bound)?;
    let wait = if standby {
        Duration::from_secs(u32::MAX.into())
    } else {
        settings.form_wait
    };
    let (prev, hello) = accept_predecessor(&mut net, bound, wait, settings.log)?;
    let mut pending = Some(Incoming::Frame(
        hesper_ring::From {
            id: prev.id(),
            side: Side::Prev,
        },
        hello,
    ));
    let mut next: Option<Link> = None;
    let mut node = Worker {
        model,
        me,
        batch,
        n_ctx: 0,
        session: None,
        log: settings.log,
    };
    loop {
        let Some(event) = pending.take().or_else(|| net.recv(Duration::from_secs(1))) else {
            continue;
        };
        match event {
            Incoming::Note(n) => (settings.log)(&n),
            Incoming::Joined(extra) => (settings.log)(&format!(
                "refused a connection from {}: this node already has a predecessor",
                extra.peer()
            )),
            Incoming::Lost(from, why)
                if from.id == prev.id() || next.as_ref().is_some_and(|n| n.id() == from.id) =>
            {
                let (lost, peer, other) = if from.side == Side::Next {
                    ("next", next.as_ref().map_or("", Link::peer), Some(&prev))
                } else {
                    ("previous", prev.peer(), next.as_ref())
                };
                let msg = format!("node {} lost its {lost} node: {why}", node.me.name());
                if let Some(other) = other {
                    other.send(Frame::text(Kind::Fault, &msg));
                    std::thread::sleep(FLUSH);
                }
                return Err(RingError::Lost {
                    node: peer.to_string(),
                    why: msg,
                });
            }
            Incoming::Lost(..) => {}
            // A connection that is neither neighbour (one refused above) is never read.
            Incoming::Frame(from, _)
                if from.id != prev.id() && next.as_ref().is_none_or(|n| n.id() != from.id) => {}
            Incoming::Frame(from, frame) => {
                // Faults travel toward the master whichever way they came; every other frame
                // comes from the previous node.
                if frame.header.kind == Kind::Fault {
                    match (from.side, &next) {
                        (Side::Next, _) => prev.send(frame),
                        (Side::Prev, Some(n)) => n.send(frame),
                        (Side::Prev, None) => false,
                    };
                    continue;
                }
                if from.side != Side::Prev {
                    continue;
                }
                if frame.header.kind == Kind::Shutdown {
                    if let Some(n) = &next {
                        n.send(frame.clone());
                        std::thread::sleep(FLUSH);
                    }
                    let why = frame.message();
                    return if why.is_empty() {
                        Ok(())
                    } else {
                        Err(RingError::Shutdown(why))
                    };
                }
                if frame.header.kind == Kind::Hello && next.is_none() {
                    next = Some(net.connect(settings.next, settings.form_wait)?);
                }
                match (node.handle(frame), &next) {
                    (Ok(Some(out)), Some(n)) => {
                        n.send(out);
                    }
                    (Ok(_), _) => {}
                    (Err(e), n) => {
                        let msg = format!("node {}: {e}", node.me.name());
                        (settings.log)(&msg);
                        if let Some(n) = n {
                            n.send(Frame::text(Kind::Fault, &msg));
                        }
                    }
                }
            }
        }
    }
}

/// Waits at most `wait` for the predecessor: the first connection whose first frame is a
/// Hello this node can read. Connections that open with anything else (a stranger's bytes, a
/// malformed Hello) are closed with a log line, and the node goes on waiting; the others are
/// refused once one is chosen. Returns the link and its Hello.
fn accept_predecessor(
    net: &mut Net,
    bound: std::net::SocketAddr,
    wait: Duration,
    log: fn(&str),
) -> Result<(Link, Frame), RingError> {
    let deadline = std::time::Instant::now() + wait;
    let mut candidates: Vec<Link> = Vec::new();
    let mut refused: Option<String> = None;
    let say = |refused: &mut Option<String>, line: String| {
        log(&line);
        *refused = Some(line);
    };
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(RingError::Net(NetError::Accept {
                addr: bound.to_string(),
                secs: wait.as_secs_f64(),
                refused: refused.map(|r| format!("; {r}")).unwrap_or_default(),
            }));
        }
        match net.recv(left.min(Duration::from_secs(1))) {
            Some(Incoming::Joined(link)) => candidates.push(link),
            Some(Incoming::Frame(from, frame)) => {
                let Some(i) = candidates.iter().position(|c| c.id() == from.id) else {
                    continue;
                };
                let link = candidates.swap_remove(i);
                let why = match frame.header.kind {
                    Kind::Hello => match hello::decode(&frame.payload) {
                        Ok(records) if records.is_empty() => {
                            "a Hello without the master's record".into()
                        }
                        Ok(_) => {
                            for other in candidates {
                                log(&format!(
                                    "refused a connection from {}: this node already has a predecessor",
                                    other.peer()
                                ));
                            }
                            return Ok((link, frame));
                        }
                        Err(e) => format!("a malformed Hello ({e})"),
                    },
                    kind => format!("it opened with a {kind:?} frame, not a Hello"),
                };
                say(
                    &mut refused,
                    format!("closed a connection from {}: {why}", link.peer()),
                );
            }
            Some(Incoming::Lost(from, _)) => candidates.retain(|c| c.id() != from.id),
            Some(Incoming::Note(n)) => say(&mut refused, n),
            None => {}
        }
    }
}

/// A worker's state.
struct Worker<B: Backend, M: ModelRef<B>> {
    /// The model (mutable where it was loaded for hot-swap).
    model: M,
    me: NodeRecord,
    batch: usize,
    /// Context size, from the master's Hello.
    n_ctx: usize,
    /// The master's run and this node's session for it.
    session: Option<(u64, Session<B>)>,
    log: fn(&str),
}

impl<B: Backend, M: ModelRef<B>> Worker<B, M> {
    /// What one frame from the previous node makes this node send on.
    fn handle(&mut self, frame: Frame) -> Result<Option<Frame>, RingError> {
        let h = frame.header;
        match h.kind {
            Kind::Hello => {
                let mut records = hello::decode(&frame.payload).map_err(RingError::Protocol)?;
                records.push(self.me.clone());
                self.n_ctx = h.aux as usize;
                self.session = None;
                (self.log)(&format!(
                    "joined the ring as node {} (context {})",
                    records.len() - 1,
                    self.n_ctx
                ));
                Ok(Some(Frame::new(h, hello::encode(&records))))
            }
            Kind::Forward => self.forward(h, &frame.payload),
            Kind::Reload => self.reload(h, &frame.payload),
            // A prediction on its way to the master passes through.
            Kind::Prediction => Ok(Some(frame)),
            _ => Ok(None),
        }
    }

    /// Swaps in what changed in this node's file and appends what it found to the Reload
    /// frame. After a swap the session is dropped: the master evaluates the context again.
    fn reload(&mut self, h: Header, payload: &[u8]) -> Result<Option<Frame>, RingError> {
        let mut nodes = reload::decode(payload).map_err(RingError::Protocol)?;
        let check = match self.model.get_mut() {
            Some(m) => m.reload_changed(),
            None => Err(ReloadError::NotEnabled),
        };
        let found = Found::of(&check);
        match &check {
            Ok(hesper_engine::model::Reload::Swapped(s)) => {
                self.session = None;
                (self.log)(&format!("hot-swap: {} swapped in", s.describe()));
                // Only a swap changes the tensors' bytes: a worker without --hot-swap is
                // not hashed again on every check.
                self.me.refresh_tensors(self.model.get())?;
            }
            Err(e) => (self.log)(&format!("hot-swap: {e}; the weights loaded before stay")),
            Ok(_) => {}
        }
        self.me.refresh_file(self.model.get());
        nodes.push((self.me.clone(), found));
        Ok(Some(Frame::new(h, reload::encode(&nodes))))
    }

    /// Runs this node's layers on a Forward frame's rows.
    fn forward(&mut self, h: Header, payload: &[u8]) -> Result<Option<Frame>, RingError> {
        let model = self.model.get();
        let d = model.config.n_embd;
        let readout = readout_of(h.aux).map_err(RingError::Protocol)?;
        let hidden = wire::decode(h.dtype, payload, h.n_tokens as usize * d)
            .map_err(|e| RingError::Protocol(e.to_string()))?;
        if self.n_ctx == 0 {
            return Err(RingError::Protocol(
                "a Forward frame before the Hello".into(),
            ));
        }
        if self.session.as_ref().is_none_or(|(id, _)| *id != h.session) {
            self.session = Some((h.session, model.new_session(self.n_ctx, self.batch)?));
        }
        let Some((_, session)) = self.session.as_mut() else {
            unreachable!("the session was just made")
        };
        let pos0 = h.pos0 as usize;
        let last = model.layer_range().end == model.config.n_layer;
        match (last, readout) {
            (true, Some(r)) => {
                let p = model.predict_from_hidden(session, pos0, &hidden, r)?;
                let mut out = Header::new(Kind::Prediction);
                (out.session, out.seq, out.aux) = (h.session, h.seq, h.aux);
                Ok(Some(Frame::new(out, encode_prediction(&p))))
            }
            // A prefill chunk before the last: the cache fills, nothing goes back.
            (true, None) => {
                model.forward_hidden_at(session, pos0, &hidden)?;
                Ok(None)
            }
            (false, _) => {
                let out = model.forward_hidden_at(session, pos0, &hidden)?;
                Ok(Some(Frame::new(h, wire::encode(h.dtype, &out))))
            }
        }
    }
}
