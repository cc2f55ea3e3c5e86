//! A worker node's loop: steps in from the previous node, through this node's layers, out to
//! the next (or, on the last node, the predictions back to the master). A worker keeps a KV
//! cache for each of the master's sequences (a slot), made and freed when the master says so.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use hesper_engine::backend::Backend;
use hesper_engine::model::{
    BatchScratch, Prediction, ReloadError, SeqRows, Session, StepInput, StepOutput,
};
use hesper_ring::{wire, Dtype, Frame, Header, Incoming, Kind, Link, Net, NetError, Side};

use super::hello::{self, NodeRecord};
use super::plan::{self, Offer};
use super::probe::measure;
use super::protocol::{
    decode_entries, decode_ops, encode_entries, encode_prediction, CacheOp, Entry,
};
use super::reload::{self, Found};
use super::{send_last, NodeSettings, RingError, HELLO_PLAN, HELLO_PRIVATE, HELLO_SERVES};
use crate::evaluator::ModelRef;

/// Serves `model` (a layer range) as a worker until the master ends the ring (`Ok`), or a
/// neighbour is lost or the master ends it for a reason (`Err`). `batch` bounds the rows this
/// node runs at once (a longer step is run in pieces). The node waits for its predecessor
/// first and connects to the next node when the master's Hello comes; a `standby` waits for
/// its predecessor without a time limit (it joins only when a master fails over to it). In a
/// ring whose master serves requests (`hesper-rs serve --ring`), a lost neighbour does not end
/// the worker: it waits, without a time limit, for the master to form the ring again.
pub fn serve<B: Backend, M: ModelRef<B>>(
    model: M,
    settings: &NodeSettings,
    batch: usize,
    standby: bool,
) -> Result<(), RingError> {
    let mut node = RingNode::listen(settings, standby)?;
    let mut model = model;
    loop {
        let m = model.get();
        node.wait_for_ring(&mut || {
            let (ms_layer, ms_head) = measure(m)?;
            Ok(Offer {
                listen: String::new(),
                backend: m.backend.name(),
                memory: None,
                ms_layer,
                ms_head,
                layers: Some(m.layer_range()),
            })
        })?;
        let (m, ended) = node.run(model, batch)?;
        if ended {
            return Ok(());
        }
        model = m;
    }
}

/// A wait without a limit.
const FOREVER: Duration = Duration::from_secs(u32::MAX as u64);

/// A worker's place in rings: its listening socket, kept while it holds one model or another
/// (under `--layers auto` a ring formed again may give it other layers).
pub struct RingNode {
    net: Net,
    bound: SocketAddr,
    settings: NodeSettings,
    /// Whether a wait has no limit (a standby, or a node that was in a ring before).
    patient: bool,
    /// The ring formed by the last Hello, not yet run.
    formed: Option<Formed>,
}

/// A ring's Hello as it reached this node, with the links it came over and goes on by.
struct Formed {
    prev: Link,
    next: Option<Link>,
    hello: Frame,
    /// The layers the master assigns, when it assigns them.
    assigned: Option<Range<usize>>,
}

impl RingNode {
    /// Listens for predecessors. A `standby` waits for its ring without a time limit.
    pub fn listen(settings: &NodeSettings, standby: bool) -> Result<Self, RingError> {
        let mut net = Net::new(settings.net.clone())?;
        let bound = net.listen(settings.listen)?;
        (settings.log)(&format!("listening on {bound}"));
        Ok(Self {
            net,
            bound,
            settings: settings.clone(),
            patient: standby,
            formed: None,
        })
    }

    /// The address this node listens on.
    pub fn bound(&self) -> SocketAddr {
        self.bound
    }

    /// Whether the ring the last Hello formed keeps its output on the master: this node
    /// then needs no LM head, even with the last layer.
    pub fn private(&self) -> bool {
        self.formed
            .as_ref()
            .is_some_and(|f| f.hello.header.pos0 & HELLO_PRIVATE != 0)
    }

    /// Waits for the master's Hello (answering its Probe rounds with what `offer` gives the
    /// first time one comes; this node fills in its address) and returns the layers it assigns
    /// this node; `None` where it assigns none (every node's layers were given by hand).
    pub fn wait_for_ring(
        &mut self,
        offer: &mut dyn FnMut() -> Result<Offer, RingError>,
    ) -> Result<Option<Range<usize>>, RingError> {
        if self.formed.is_none() {
            let wait = if self.patient {
                FOREVER
            } else {
                self.settings.form_wait
            };
            self.formed = Some(self.accept(wait, offer)?);
        }
        Ok(self.formed.as_ref().and_then(|f| f.assigned.clone()))
    }

    /// Waits at most `wait` for the predecessor: the first connection whose first frame is a
    /// Hello this node can read. A Probe round is answered with `offer` (and the next node
    /// connected) on the way. Connections that open with anything else (a stranger's bytes, a
    /// malformed Hello) are closed with a log line, and the node goes on waiting; the others
    /// are refused once one is chosen.
    fn accept(
        &mut self,
        wait: Duration,
        offer: &mut dyn FnMut() -> Result<Offer, RingError>,
    ) -> Result<Formed, RingError> {
        let log = self.settings.log;
        let mut mine: Option<Offer> = None;
        let deadline = std::time::Instant::now() + wait;
        let mut candidates: Vec<Link> = Vec::new();
        let mut next: Option<Link> = None;
        // The predecessor whose Probe this node answered: its Hello, or its Shutdown, follows.
        let mut probed_by: Option<u64> = None;
        let mut refused: Option<String> = None;
        let say = |refused: &mut Option<String>, line: String| {
            log(&line);
            *refused = Some(line);
        };
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(RingError::Net(NetError::Accept {
                    addr: self.bound.to_string(),
                    secs: wait.as_secs_f64(),
                    refused: refused.map(|r| format!("; {r}")).unwrap_or_default(),
                }));
            }
            match self.net.recv(left.min(Duration::from_secs(1))) {
                Some(Incoming::Joined(link)) => candidates.push(link),
                Some(Incoming::Frame(from, frame)) => {
                    let Some(i) = candidates.iter().position(|c| c.id() == from.id) else {
                        continue;
                    };
                    let h = frame.header;
                    let why = match h.kind {
                        Kind::Probe => match plan::decode(&frame.payload) {
                            Ok(mut offers) if !offers.is_empty() => {
                                if next.is_none() {
                                    next = Some(
                                        self.net
                                            .connect(self.settings.next, self.settings.form_wait)?,
                                    );
                                }
                                if mine.is_none() {
                                    mine = Some(Offer {
                                        listen: self.bound.to_string(),
                                        ..offer()?
                                    });
                                }
                                offers.extend(mine.clone());
                                let out = Frame::new(h, plan::encode(&offers));
                                next.as_ref().expect("connected above").send(out);
                                probed_by = Some(from.id);
                                continue;
                            }
                            Ok(_) => "a Probe without the master's offer".into(),
                            Err(e) => format!("a malformed Probe ({e})"),
                        },
                        Kind::Hello => {
                            match hello::decode_hello(h.pos0 & HELLO_PLAN != 0, &frame.payload) {
                                Ok((_, records)) if records.is_empty() => {
                                    "a Hello without the master's record".into()
                                }
                                Ok((plan, records)) => {
                                    let index = records.len();
                                    let assigned = match plan {
                                        None => None,
                                        Some(p) => Some(p.get(index).cloned().ok_or_else(|| {
                                            RingError::Protocol(format!(
                                                "a Hello's plan of {} nodes names no layers for node {index}",
                                                p.len()
                                            ))
                                        })?),
                                    };
                                    let prev = candidates.swap_remove(i);
                                    for other in candidates {
                                        log(&format!(
                                            "refused a connection from {}: this node already has a predecessor",
                                            other.peer()
                                        ));
                                    }
                                    self.patient = true;
                                    return Ok(Formed {
                                        prev,
                                        next,
                                        hello: frame,
                                        assigned,
                                    });
                                }
                                Err(e) => format!("a malformed Hello ({e})"),
                            }
                        }
                        Kind::Shutdown if probed_by == Some(from.id) => {
                            if let Some(n) = &next {
                                send_last(n, frame.clone());
                            }
                            return Err(RingError::Shutdown(frame.message()));
                        }
                        kind => format!("it opened with a {kind:?} frame, not a Hello"),
                    };
                    let link = candidates.swap_remove(i);
                    say(
                        &mut refused,
                        format!("closed a connection from {}: {why}", link.peer()),
                    );
                }
                Some(Incoming::Lost(from, _)) => {
                    candidates.retain(|c| c.id() != from.id);
                    if next.as_ref().is_some_and(|n| n.id() == from.id) {
                        next = None;
                    }
                }
                Some(Incoming::Note(n)) => say(&mut refused, n),
                None => {}
            }
        }
    }

    /// Runs `model` in the ring the last Hello formed ([`RingNode::wait_for_ring`]) and hands
    /// it back with `true` when the master ends the ring, or with `false` when the master
    /// serves requests and the ring broke (wait for it to form again). Otherwise a lost
    /// neighbour or a reason the master gives ends the node (`Err`).
    pub fn run<B: Backend, M: ModelRef<B>>(
        &mut self,
        model: M,
        batch: usize,
    ) -> Result<(M, bool), RingError> {
        let Some(formed) = self.formed.take() else {
            return Err(RingError::Config("no ring has formed".into()));
        };
        let holds = model.get().layer_range();
        if let Some(assigned) = formed.assigned.as_ref().filter(|a| **a != holds) {
            let why = format!(
                "the master assigns this node layers {}..{}, but it holds {}..{}",
                assigned.start, assigned.end, holds.start, holds.end
            );
            let mut f = Frame::text(Kind::Fault, &why);
            f.header.session = formed.hello.header.session;
            if let Some(n) = &formed.next {
                send_last(n, f);
            }
            return Err(RingError::Config(why));
        }
        let me = NodeRecord::of(model.get(), self.bound)?;
        let mut node = Worker {
            model,
            me,
            batch: batch.max(1),
            run: 0,
            slots: HashMap::new(),
            refused: HashMap::new(),
            scratch: None,
            serving: false,
            private: false,
            log: self.settings.log,
        };
        let ended = node.run_ring(&mut self.net, formed, &self.settings);
        let serving = node.serving;
        let model = node.model;
        match ended {
            Ok(()) => Ok((model, true)),
            Err(broke @ (RingError::Lost { .. } | RingError::Shutdown(_))) if serving => {
                (self.settings.log)(&format!(
                    "{broke}; waiting for the master to form the ring again"
                ));
                Ok((model, false))
            }
            Err(e) => Err(e),
        }
    }
}

/// A worker's state.
struct Worker<B: Backend, M: ModelRef<B>> {
    /// The model (mutable where it was loaded for hot-swap).
    model: M,
    me: NodeRecord,
    /// Most rows run at once.
    batch: usize,
    /// The master's run the slots belong to.
    run: u64,
    /// The KV cache of each of the master's sequences, by slot.
    slots: HashMap<u32, Session<B>>,
    /// Slots whose cache could not be made, and why.
    refused: HashMap<u32, String>,
    /// Scratch for steps, grown to the readouts a step asks for.
    scratch: Option<BatchScratch<B>>,
    /// Whether the master serves requests (its Hello says so): a lost ring is then awaited
    /// again.
    serving: bool,
    /// Whether the master keeps the output to itself (its Hello says so): the last node then
    /// hands back hidden states, not predictions.
    private: bool,
    log: fn(&str),
}

/// A piece of an entry run in one pass: rows `row..row + n` of the step, at positions from
/// `pos0` of slot `slot`, with the entry's readout where it is the entry's last piece.
#[derive(Debug, Clone, Copy)]
struct Piece {
    slot: u32,
    pos0: usize,
    n: usize,
    row: usize,
    readout: Option<hesper_engine::model::Readout>,
}

impl<B: Backend, M: ModelRef<B>> Worker<B, M> {
    /// Runs one formed ring from its predecessor's Hello until it ends: `Ok` or a Shutdown's
    /// reason when the master ends it, `Err(Lost)` when a neighbour is lost.
    fn run_ring(
        &mut self,
        net: &mut Net,
        formed: Formed,
        settings: &NodeSettings,
    ) -> Result<(), RingError> {
        let Formed {
            prev, next, hello, ..
        } = formed;
        let mut next = next;
        let mut pending = Some(Incoming::Frame(
            hesper_ring::From {
                id: prev.id(),
                side: Side::Prev,
            },
            hello,
        ));
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
                    let msg = format!("node {} lost its {lost} node: {why}", self.me.name());
                    if let Some(other) = other {
                        send_last(other, self.fault(0, &msg));
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
                    // Faults travel toward the master whichever way they came; every other
                    // frame comes from the previous node.
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
                            send_last(n, frame.clone());
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
                    let (session, seq) = (frame.header.session, frame.header.seq);
                    match self.handle(frame) {
                        Ok(out) => {
                            if let Some(n) = &next {
                                for f in out {
                                    n.send(f);
                                }
                            }
                        }
                        Err(e) => {
                            let msg = format!("node {}: {e}", self.me.name());
                            (settings.log)(&msg);
                            if let Some(n) = &next {
                                let mut f = self.fault(seq, &msg);
                                f.header.session = session;
                                n.send(f);
                            }
                        }
                    }
                }
            }
        }
    }

    /// A Fault frame of this ring's run about step `seq` (0: about the ring).
    fn fault(&self, seq: u64, msg: &str) -> Frame {
        let mut f = Frame::text(Kind::Fault, msg);
        f.header.session = self.run;
        f.header.seq = seq;
        f
    }

    /// What one frame from the previous node makes this node send on.
    fn handle(&mut self, frame: Frame) -> Result<Vec<Frame>, RingError> {
        let h = frame.header;
        match h.kind {
            Kind::Hello => {
                let (plan, mut records) =
                    hello::decode_hello(h.pos0 & HELLO_PLAN != 0, &frame.payload)
                        .map_err(RingError::Protocol)?;
                records.push(self.me.clone());
                self.run = h.session;
                self.slots.clear();
                self.refused.clear();
                self.serving = h.pos0 & HELLO_SERVES != 0;
                self.private = h.pos0 & HELLO_PRIVATE != 0;
                (self.log)(&format!(
                    "joined the ring as node {} (context {})",
                    records.len() - 1,
                    h.aux
                ));
                Ok(vec![Frame::new(
                    h,
                    hello::encode_hello(plan.as_deref(), &records),
                )])
            }
            Kind::Cache if h.session == self.run => {
                self.cache_ops(&frame.payload)?;
                let last = self.model.get().layer_range().end == self.model.get().config.n_layer;
                Ok(if last { Vec::new() } else { vec![frame] })
            }
            Kind::Forward if h.session == self.run => self.forward(h, &frame.payload),
            Kind::Reload => self.reload(h, &frame.payload).map(|f| vec![f]),
            // A prediction on its way to the master passes through.
            Kind::Prediction => Ok(vec![frame]),
            _ => Ok(Vec::new()),
        }
    }

    /// Makes and frees slots' caches as a Cache frame says. A cache that cannot be made is
    /// remembered with the reason, which a step that uses it then reports.
    fn cache_ops(&mut self, payload: &[u8]) -> Result<(), RingError> {
        for op in decode_ops(payload).map_err(RingError::Protocol)? {
            match op {
                CacheOp::Alloc { slot, n_ctx } => {
                    self.refused.remove(&slot);
                    match self.model.get().new_session(n_ctx, 1) {
                        Ok(s) => {
                            self.slots.insert(slot, s);
                        }
                        Err(e) => {
                            self.slots.remove(&slot);
                            self.refused.insert(slot, e.to_string());
                        }
                    }
                }
                CacheOp::Free { slot } => {
                    self.slots.remove(&slot);
                    self.refused.remove(&slot);
                }
            }
        }
        Ok(())
    }

    /// Swaps in what changed in this node's file and appends what it found to the Reload
    /// frame. The slots stay: after a swap the master evaluates its sequences again from
    /// their start.
    fn reload(&mut self, h: Header, payload: &[u8]) -> Result<Frame, RingError> {
        let mut nodes = reload::decode(payload).map_err(RingError::Protocol)?;
        let check = match self.model.get_mut() {
            Some(m) => m.reload_changed(),
            None => Err(ReloadError::NotEnabled),
        };
        let found = Found::of(&check);
        match &check {
            Ok(hesper_engine::model::Reload::Swapped(s)) => {
                for s in self.slots.values_mut() {
                    s.truncate(0);
                }
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
        Ok(Frame::new(h, reload::encode(&nodes)))
    }

    /// Runs this node's layers on a Forward frame's rows: the step for the next node, or,
    /// on the last node, the predictions for the master.
    fn forward(&mut self, h: Header, payload: &[u8]) -> Result<Vec<Frame>, RingError> {
        let d = self.model.get().config.n_embd;
        let rows = h.n_tokens as usize;
        let (entries, body) =
            decode_entries(payload, h.aux as usize, rows).map_err(RingError::Protocol)?;
        let hidden = wire::decode(h.dtype, body, rows * d)
            .map_err(|e| RingError::Protocol(e.to_string()))?;
        for e in &entries {
            if !self.slots.contains_key(&e.slot) {
                return Err(RingError::Protocol(match self.refused.get(&e.slot) {
                    Some(why) => format!("slot {}'s cache could not be made: {why}", e.slot),
                    None => format!("a step for slot {}, which has no cache", e.slot),
                }));
            }
        }
        // An embedding's step hands back every row's state, not a readout.
        let states = entries.iter().any(|e| e.states);
        let (out, predictions) = self.run_pieces(&entries, &hidden, states || self.private)?;
        let model = self.model.get();
        if model.layer_range().end < model.config.n_layer {
            let mut payload = encode_entries(&entries);
            payload.extend(wire::encode(h.dtype, &out));
            return Ok(vec![Frame::new(h, payload)]);
        }
        if states {
            // The final norm here where this node holds it; else (a master that keeps the
            // output to itself) on the master.
            let rows = if self.private {
                out
            } else {
                let scratch = self.scratch.as_mut().expect("made by the step");
                let d = model.config.n_embd;
                let mut normed = Vec::with_capacity(out.len());
                for piece in out.chunks(scratch.tokens() * d) {
                    normed.extend(model.final_norm(scratch, piece)?);
                }
                normed
            };
            let mut f = Header::new(Kind::Prediction);
            (f.session, f.seq, f.dtype) = (h.session, h.seq, Dtype::F32);
            f.n_tokens = h.n_tokens;
            return Ok(vec![Frame::new(f, wire::encode(Dtype::F32, &rows))]);
        }
        if self.private {
            return Ok(vec![last_states(h, &entries, &out, model.config.n_embd)]);
        }
        if !model.runs_head() {
            return Err(RingError::Config(
                "this node holds the last layer but not the LM head, and the master does not keep the output to itself".into(),
            ));
        }
        Ok(self.prediction_frames(h, &predictions))
    }

    /// Runs a step's entries in pieces of at most the node's batch of rows: the hidden states
    /// leaving this node's layers (every row, in order), or where it runs the LM head (and not
    /// `hidden_only`), the predictions of the entries that asked (in order).
    fn run_pieces(
        &mut self,
        entries: &[Entry],
        hidden: &[f32],
        hidden_only: bool,
    ) -> Result<(Vec<f32>, Vec<Prediction>), RingError> {
        let d = self.model.get().config.n_embd;
        let cap = self.batch;
        let mut groups: Vec<Vec<Piece>> = vec![Vec::new()];
        let (mut filled, mut row) = (0, 0);
        for e in entries {
            let mut done = 0;
            while done < e.n {
                if filled == cap {
                    groups.push(Vec::new());
                    filled = 0;
                }
                let n = (e.n - done).min(cap - filled);
                let last_piece = done + n == e.n;
                groups.last_mut().expect("a group").push(Piece {
                    slot: e.slot,
                    pos0: e.pos0 + done,
                    n,
                    row,
                    readout: if last_piece { e.readout } else { None },
                });
                (filled, done, row) = (filled + n, done + n, row + n);
            }
        }
        let mut out_hidden = Vec::new();
        let mut out_predictions = Vec::new();
        for group in groups {
            let readouts = group.iter().filter(|p| p.readout.is_some()).count();
            let seqs = readouts.max(1);
            let fits = self
                .scratch
                .as_ref()
                .is_some_and(|s| s.tokens() >= cap && s.seqs() >= seqs);
            if !fits {
                let grown = self
                    .scratch
                    .as_ref()
                    .map_or(1, BatchScratch::seqs)
                    .max(seqs);
                self.scratch = None;
                self.scratch = Some(self.model.get().new_batch_scratch(cap, grown)?);
            }
            let scratch = self.scratch.as_mut().expect("made above");
            let mut sessions: Vec<(u32, Session<B>)> = group
                .iter()
                .map(|p| (p.slot, self.slots.remove(&p.slot).expect("checked")))
                .collect();
            let first = group[0].row;
            let n: usize = group.iter().map(|p| p.n).sum();
            let input = &hidden[first * d..(first + n) * d];
            let mut seq_rows: Vec<SeqRows<'_, B>> = sessions
                .iter_mut()
                .zip(&group)
                .map(|((_, s), p)| SeqRows {
                    session: s,
                    pos0: p.pos0,
                    n: p.n,
                    readout: p.readout,
                })
                .collect();
            let model = self.model.get();
            let input = StepInput::Hidden(input);
            // A master that keeps the output to itself reads it out of the states.
            let ran = if hidden_only {
                model
                    .step_rows_hidden(scratch, &mut seq_rows, input)
                    .map(StepOutput::Hidden)
            } else {
                model.step_rows(scratch, &mut seq_rows, input)
            };
            drop(seq_rows);
            for (slot, s) in sessions {
                self.slots.insert(slot, s);
            }
            match ran? {
                StepOutput::Hidden(rows) => out_hidden.extend(rows),
                StepOutput::Predictions(p) => out_predictions.extend(p.into_iter().flatten()),
            }
        }
        Ok((out_hidden, out_predictions))
    }

    /// A step's predictions as Prediction frames of at most the ring's payload (at least one
    /// frame, so the master hears that a step without readouts is done).
    fn prediction_frames(&self, h: Header, predictions: &[Prediction]) -> Vec<Frame> {
        let limit = (super::max_payload(&self.model.get().config) as usize) / 2;
        let total = predictions.len() as u32;
        let frame = |first: usize, count: usize, payload: Vec<u8>| {
            let mut out = Header::new(Kind::Prediction);
            (out.session, out.seq) = (h.session, h.seq);
            (out.pos0, out.n_tokens, out.aux) = (first as u32, count as u32, total);
            Frame::new(out, payload)
        };
        let mut frames = Vec::new();
        let (mut first, mut payload) = (0, Vec::new());
        for (i, p) in predictions.iter().enumerate() {
            let before = payload.len();
            encode_prediction(p, &mut payload);
            if payload.len() > limit && i > first {
                let rest = payload.split_off(before);
                frames.push(frame(
                    first,
                    i - first,
                    std::mem::replace(&mut payload, rest),
                ));
                first = i;
            }
        }
        frames.push(frame(first, predictions.len() - first, payload));
        frames
    }
}

/// The Prediction frame of a step whose master keeps the output to itself: the hidden state
/// leaving the last layer at the last row of each entry that asked for a readout (`out`
/// holds every row), in the step's wire format.
fn last_states(h: Header, entries: &[Entry], out: &[f32], d: usize) -> Frame {
    let mut rows = Vec::new();
    let mut end = 0;
    for e in entries {
        end += e.n;
        if e.readout.is_some() {
            rows.extend_from_slice(&out[(end - 1) * d..end * d]);
        }
    }
    let count = (rows.len() / d) as u32;
    let mut f = Header::new(Kind::Prediction);
    (f.session, f.seq, f.dtype) = (h.session, h.seq, h.dtype);
    (f.pos0, f.n_tokens, f.aux) = (0, count, count);
    Frame::new(f, wire::encode(h.dtype, &rows))
}
