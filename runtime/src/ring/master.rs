//! The master's side of a ring: a [`StepRunner`] whose steps run the master's layers here and
//! the rest round the ring. Several steps are kept in flight (micro-batches): while the last
//! node computes one, the master computes the next. Each sequence has a cache slot, made and
//! freed on every worker by Cache frames sent before the steps that use it. A lost node is a
//! [`StepError::Reformed`] where a standby re-forms the ring, else a [`StepError::Down`] until
//! [`StepRunner::recover`] forms it again.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use hesper_engine::attention::AttentionConfig;
use hesper_engine::backend::Backend;
use hesper_engine::model::{
    BatchScratch, Model, ModelError, Prediction, Readout, Reload, ReloadError, SeqRows, Session,
    StepInput, StepOutput,
};
use hesper_ring::{wire, Dtype, Frame, Header, Kind, Link, Net};

use super::form::{join, join_over, run_id, shut_down, verify, Formation, Hello, Links};
use super::hello::{self, NodeRecord};
use super::protocol::{
    decode_prediction, encode_entries, encode_ops, prediction_len, CacheOp, Entry,
};
use super::reload::{self, Found};
use super::{
    send_last, NodeSettings, RingError, FLUSH, HELLO_PRIVATE, HELLO_SERVES, MAX_FRAME_ROWS,
};
use crate::evaluator::ModelRef;
use crate::scheduler::{Landed, RunStep, SeqCache, StepError, StepRunner};
use crate::RuntimeError;

/// How a master runs its ring.
#[derive(Debug, Clone)]
pub struct RingOptions {
    /// A node to re-form the ring through if it breaks (it must hold every layer after the
    /// master's); used once.
    pub standby: Option<SocketAddr>,
    /// Whether the master serves requests: workers then outlive a lost neighbour and wait
    /// for the ring to form again, and so does the master ([`StepRunner::recover`]).
    pub serving: bool,
    /// The longest sequence (told to the nodes in the Hello).
    pub n_ctx: usize,
    /// Most rows of a step.
    pub batch: usize,
    /// Steps kept in flight at once (`None`: one per node of the ring).
    pub in_flight: Option<usize>,
    /// Whether the master keeps the output to itself: it holds the LM head and samples, and
    /// the other nodes see hidden states only, never a token.
    pub private: bool,
}

/// A sequence's cache in a ring: the master's session for its own layers, and the slot that
/// names the workers' caches.
pub struct RingCache<B: Backend> {
    slot: u32,
    session: Session<B>,
}

impl<B: Backend> SeqCache for RingCache<B> {
    fn pos(&self) -> usize {
        self.session.pos()
    }

    fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    fn truncate(&mut self, pos: usize) {
        // The next step's entry starts at `pos`: every worker forgets the rest then.
        self.session.truncate(pos);
    }
}

/// A step sent round the ring whose predictions have not all come back.
struct Pending {
    seq: u64,
    /// The readouts asked for, in entry order, with the position of each one's row.
    readouts: Vec<(Readout, usize)>,
    /// The predictions come so far, by index.
    got: Vec<Option<Prediction>>,
    /// The hidden states of the rows read out, where the master keeps the output to itself,
    /// or of every row of an embedding's step.
    states: Option<Vec<f32>>,
    /// Rows whose final states the step asks for (an embedding's), or 0.
    state_rows: usize,
    /// Each entry's index among the readouts, or `None` for an entry that asked for none.
    entries: Vec<Option<usize>>,
    /// A node's report that the step failed.
    failed: Option<String>,
}

impl Pending {
    fn complete(&self) -> bool {
        // An embedding's step asks for no readout: it is complete when its states are here.
        self.failed.is_some()
            || self.states.is_some()
            || (self.state_rows == 0 && self.got.iter().all(Option::is_some))
    }
}

/// The master of a formed ring.
pub struct RingRunner<B: Backend, M: ModelRef<B>> {
    /// The master's layers (mutable where they were loaded for hot-swap).
    model: M,
    net: Net,
    me: NodeRecord,
    links: Links,
    run: u64,
    seq: u64,
    settings: NodeSettings,
    opts: RingOptions,
    scratch: BatchScratch<B>,
    next_slot: u32,
    /// Every slot made and not freed, with its positions (made again on a new ring).
    live: BTreeMap<u32, usize>,
    /// Cache operations for the workers, sent before the next step.
    ops: Vec<CacheOp>,
    /// Steps in flight, oldest first.
    pending: VecDeque<Pending>,
    /// Why the ring is down (a node was lost and no standby took its place).
    down: Option<String>,
    /// Why the ring cannot run: a hot-swap left its nodes holding different files (cleared by
    /// a later check that finds them the same again).
    split: Option<String>,
    /// Each node's layers when the master assigned them (`--layers auto`).
    plan: Option<Vec<Range<usize>>>,
    /// Scratch for the LM head where the master keeps the output to itself, grown to the
    /// readouts a step asks for.
    head_scratch: Option<BatchScratch<B>>,
}

/// Refuses a master whose layers do not start the ring, or that keeps the output to itself
/// without the LM head.
fn check_master<B: Backend>(m: &Model<B>, opts: &RingOptions) -> Result<(), RingError> {
    if opts.private && !m.holds_head() {
        return Err(RingError::Config(
            "a master that keeps the output to itself must hold the LM head".into(),
        ));
    }
    if m.layer_range().start != 0 || m.layer_range().end >= m.config.n_layer {
        return Err(RingError::Config(format!(
            "the master holds the embedding and the ring's first layers, so its layers must start at 0 and end before the last (it holds {}..{} of {})",
            m.layer_range().start,
            m.layer_range().end,
            m.config.n_layer
        )));
    }
    Ok(())
}

impl<B: Backend, M: ModelRef<B>> RingRunner<B, M> {
    /// Forms the ring: listens, connects to the next node, sends the Hello round and checks
    /// what comes back ([`hello::check`]). A ring that fails the check is ended with the
    /// reason (every worker prints it) and the same reason is returned.
    pub fn form(model: M, settings: &NodeSettings, opts: RingOptions) -> Result<Self, RingError> {
        check_master(model.get(), &opts)?;
        let mut net = Net::new(settings.net.clone())?;
        let bound = net.listen(settings.listen)?;
        let me = NodeRecord::of(model.get(), bound)?;
        let run = run_id();
        let hello = Hello {
            run,
            n_ctx: opts.n_ctx,
            flags: hello_flags(&opts),
            plan: None,
        };
        let links = join(
            &mut net,
            &me,
            settings.next,
            hello,
            settings.form_wait,
            settings.log,
            &|records| verify(model.get(), records),
        )?;
        Self::formed(model, (net, me, links, run), settings, opts, None)
    }

    /// Forms the ring a Probe round linked ([`Formation::probe`]), each node holding the
    /// layers of `plan` (in ring order; `model` holds the master's): the Hello carries the
    /// plan, so a node that waits for one loads its layers then. The plan is kept for the
    /// ring's later formations.
    pub fn form_planned(
        model: M,
        formation: Formation,
        settings: &NodeSettings,
        opts: RingOptions,
        plan: Vec<Range<usize>>,
    ) -> Result<Self, RingError> {
        check_master(model.get(), &opts)?;
        if plan.first() != Some(&model.get().layer_range()) {
            return Err(RingError::Config(format!(
                "the plan gives the master layers {:?}, it holds {:?}",
                plan.first(),
                model.get().layer_range()
            )));
        }
        let Formation {
            mut net,
            bound,
            next,
            prev,
            ..
        } = formation;
        let me = NodeRecord::of(model.get(), bound)?;
        let run = run_id();
        let hello = Hello {
            run,
            n_ctx: opts.n_ctx,
            flags: hello_flags(&opts),
            plan: Some(&plan),
        };
        let links = join_over(
            &mut net,
            &me,
            (next, vec![prev]),
            hello,
            settings.form_wait,
            settings.log,
            &|records| verify(model.get(), records),
        )?;
        Self::formed(model, (net, me, links, run), settings, opts, Some(plan))
    }

    /// The runner of a ring formed with `links`.
    fn formed(
        model: M,
        (net, me, links, run): (Net, NodeRecord, Links, u64),
        settings: &NodeSettings,
        opts: RingOptions,
        plan: Option<Vec<Range<usize>>>,
    ) -> Result<Self, RingError> {
        let batch = opts.batch.clamp(1, MAX_FRAME_ROWS);
        let scratch = model.get().new_batch_scratch(batch, 1)?;
        Ok(Self {
            model,
            net,
            me,
            links,
            run,
            seq: 0,
            settings: settings.clone(),
            opts: RingOptions { batch, ..opts },
            scratch,
            next_slot: 0,
            live: BTreeMap::new(),
            ops: Vec::new(),
            pending: VecDeque::new(),
            down: None,
            split: None,
            plan,
            head_scratch: None,
        })
    }

    /// What each node holds, the master's record first.
    pub fn nodes(&self) -> &[NodeRecord] {
        &self.links.records
    }

    /// The master's links: to the next node, and from the last one.
    pub fn links(&self) -> [&Link; 2] {
        [&self.links.next, &self.links.prev]
    }

    /// The master's layers.
    pub fn model(&self) -> &Model<B> {
        self.model.get()
    }

    /// Ends the ring: every worker gets the reason (empty: a normal end) and exits; an
    /// unused standby is told too. Returns once the reason has come back round (see
    /// [`shut_down`]).
    pub fn close(mut self, why: &str) {
        if let Some(addr) = self.opts.standby {
            if let Ok(link) = self.net.connect(addr, Duration::from_secs(2)) {
                send_last(&link, Frame::text(Kind::Shutdown, why));
            }
        }
        if self.down.is_some() {
            // Whoever still listens of a broken ring is told; nothing comes back round.
            send_last(&self.links.next, Frame::text(Kind::Shutdown, why));
        } else {
            shut_down(&mut self.net, &self.links.next, &self.links.prev, why);
        }
    }

    /// Why the ring cannot run a step now, if it cannot.
    fn refusal(&self) -> Option<String> {
        self.down.clone().or_else(|| self.split.clone())
    }

    /// Starts a step over `steps` (each a cache, its tokens at the cache's next positions,
    /// and what the last node hands back for the last one): the master's layers run now, the
    /// rest of the ring after. Its predictions come from [`RingRunner::finish_predictions`].
    pub fn start_entries(
        &mut self,
        steps: &mut [(&mut RingCache<B>, &[u32], Option<Readout>)],
    ) -> Result<(), StepError> {
        self.start_step(steps, false)
    }

    /// [`RingRunner::start_entries`]; with `states`, the last node hands back every row's final
    /// state instead of readouts (an embedding's step).
    fn start_step(
        &mut self,
        steps: &mut [(&mut RingCache<B>, &[u32], Option<Readout>)],
        states: bool,
    ) -> Result<(), StepError> {
        if let Some(why) = self.refusal() {
            return Err(StepError::Failed(why));
        }
        let all: Vec<u32> = steps.iter().flat_map(|s| s.1.iter().copied()).collect();
        let entries: Vec<Entry> = steps
            .iter()
            .map(|(c, tokens, readout)| Entry {
                slot: c.slot,
                pos0: c.session.pos(),
                n: tokens.len(),
                readout: readout.filter(|_| !states),
                states,
            })
            .collect();
        let mut rows: Vec<SeqRows<'_, B>> = steps
            .iter_mut()
            .map(|(c, tokens, _)| SeqRows {
                pos0: c.session.pos(),
                n: tokens.len(),
                readout: None,
                session: &mut c.session,
            })
            .collect();
        let out = self
            .model
            .get()
            .step_rows(&mut self.scratch, &mut rows, StepInput::Tokens(&all))
            .map_err(|e| StepError::Failed(e.to_string()))?;
        let StepOutput::Hidden(hidden) = out else {
            unreachable!("the master's layers end before the last")
        };
        self.flush_ops();
        self.seq += 1;
        let mut h = Header::new(Kind::Forward);
        h.dtype = self.settings.wire;
        h.session = self.run;
        h.seq = self.seq;
        h.n_tokens = all.len() as u32;
        h.aux = entries.len() as u32;
        let mut payload = encode_entries(&entries);
        payload.extend(wire::encode(self.settings.wire, &hidden));
        self.links.next.send(Frame::new(h, payload));
        let mut index = 0;
        let slots = entries
            .iter()
            .map(|e| {
                e.readout.map(|_| {
                    index += 1;
                    index - 1
                })
            })
            .collect();
        let readouts: Vec<(Readout, usize)> = entries
            .iter()
            .filter_map(|e| e.readout.map(|r| (r, e.pos0 + e.n - 1)))
            .collect();
        self.pending.push_back(Pending {
            seq: self.seq,
            got: vec![None; readouts.len()],
            readouts,
            states: None,
            state_rows: if states { all.len() } else { 0 },
            entries: slots,
            failed: None,
        });
        Ok(())
    }

    /// Sends the cache operations made since the last step.
    fn flush_ops(&mut self) {
        if self.ops.is_empty() {
            return;
        }
        let mut h = Header::new(Kind::Cache);
        h.session = self.run;
        let ops = std::mem::take(&mut self.ops);
        self.links.next.send(Frame::new(h, encode_ops(&ops)));
    }

    /// Waits for the oldest step in flight: each entry's prediction, for those that asked.
    pub fn finish_predictions(&mut self) -> Result<Vec<Option<Prediction>>, StepError> {
        let p = self.land_front()?;
        let mut got = match &p.states {
            Some(states) => self.head(states, &p.readouts)?,
            None => p.got,
        };
        Ok(p.entries
            .iter()
            .map(|i| i.and_then(|i| got[i].take()))
            .collect())
    }

    /// Waits for the oldest step in flight, an embedding's ([`RingRunner::start_step`]): the
    /// final state of every row it evaluated.
    fn finish_states(&mut self) -> Result<Vec<f32>, StepError> {
        let p = self.land_front()?;
        let Some(states) = p.states else {
            return Err(StepError::Failed("the ring sent no hidden states".into()));
        };
        if !self.opts.private {
            return Ok(states);
        }
        // The last node hands raw states to a master that keeps the output to itself.
        let failed = |e: ModelError| StepError::Failed(e.to_string());
        let model = self.model.get();
        let d = model.config.n_embd;
        let sc = match &mut self.head_scratch {
            Some(sc) if sc.tokens() * d >= states.len() => sc,
            slot => slot.insert(
                model
                    .new_batch_scratch(states.len() / d, 1)
                    .map_err(failed)?,
            ),
        };
        model.final_norm(sc, &states).map_err(failed)
    }

    /// Waits for the oldest step in flight to come back whole and takes it; a node's report
    /// that it failed is its error, a lost node breaks the ring.
    fn land_front(&mut self) -> Result<Pending, StepError> {
        loop {
            let Some(front) = self.pending.front() else {
                return Err(StepError::Failed("no step is in flight".into()));
            };
            if front.complete() {
                let p = self.pending.pop_front().expect("a step in flight");
                return match p.failed {
                    Some(why) => Err(StepError::Failed(why)),
                    None => Ok(p),
                };
            }
            let frame = match self.recv_frame(Duration::from_secs(1)) {
                Ok(Some(f)) => f,
                Ok(None) => continue,
                Err(broke) => return Err(self.broken(broke)),
            };
            if let Err(broke) = self.take_frame(frame) {
                return Err(self.broken(broke));
            }
        }
    }

    /// The master's own readouts of the states its last node handed back (it keeps the
    /// output to itself).
    fn head(
        &mut self,
        states: &[f32],
        asked: &[(Readout, usize)],
    ) -> Result<Vec<Option<Prediction>>, StepError> {
        if asked.is_empty() {
            return Ok(Vec::new());
        }
        let model = self.model.get();
        let fits = self
            .head_scratch
            .as_ref()
            .is_some_and(|s| s.seqs() >= asked.len());
        if !fits {
            let n = asked.len();
            self.head_scratch = None;
            self.head_scratch = Some(
                model
                    .new_batch_scratch(n, n)
                    .map_err(|e| StepError::Failed(e.to_string()))?,
            );
        }
        let sc = self.head_scratch.as_mut().expect("made above");
        let predictions = model
            .head_rows(sc, states, asked)
            .map_err(|e| StepError::Failed(e.to_string()))?;
        Ok(predictions.into_iter().map(Some).collect())
    }

    /// Files a frame that came while steps are in flight: a step's predictions (or, where
    /// the master keeps the output to itself, the states it reads them out of), or a node's
    /// report that a step failed. A fault about no step in flight breaks the ring.
    fn take_frame(&mut self, f: Frame) -> Result<(), RingError> {
        let h = f.header;
        match h.kind {
            Kind::Prediction if h.session == self.run && h.dtype != Dtype::None => {
                let d = self.model.get().config.n_embd;
                let Some(p) = self.pending.iter_mut().find(|p| p.seq == h.seq) else {
                    return Ok(());
                };
                let rows = match p.state_rows {
                    0 if self.opts.private => p.readouts.len(),
                    0 => 0,
                    n => n,
                };
                if h.n_tokens as usize != rows {
                    return Err(RingError::Protocol(format!(
                        "{} hidden states for a step that asked for {} predictions and {} states",
                        h.n_tokens,
                        p.readouts.len(),
                        p.state_rows
                    )));
                }
                if rows == 0 {
                    // A step that asked for nothing (a prompt's middle, kept private).
                    return Ok(());
                }
                let states = wire::decode(h.dtype, &f.payload, rows * d)
                    .map_err(|e| RingError::Protocol(e.to_string()))?;
                p.states = Some(states);
                Ok(())
            }
            Kind::Prediction if h.session == self.run => {
                let n_vocab = self.model.get().sampled_vocab();
                let Some(p) = self.pending.iter_mut().find(|p| p.seq == h.seq) else {
                    return Ok(());
                };
                let (first, count) = (h.pos0 as usize, h.n_tokens as usize);
                if h.aux as usize != p.readouts.len() || first + count > p.readouts.len() {
                    return Err(RingError::Protocol(format!(
                        "predictions {first}..{} of {} for a step that asked for {}",
                        first + count,
                        h.aux,
                        p.readouts.len()
                    )));
                }
                let mut at = 0;
                for i in first..first + count {
                    let len = prediction_len(p.readouts[i].0, n_vocab);
                    let bytes = f.payload.get(at..at + len).ok_or_else(|| {
                        RingError::Protocol("a Prediction frame ends inside a prediction".into())
                    })?;
                    p.got[i] = Some(
                        decode_prediction(p.readouts[i].0, bytes, n_vocab)
                            .map_err(RingError::Protocol)?,
                    );
                    at += len;
                }
                Ok(())
            }
            Kind::Fault => match self.pending.iter_mut().find(|p| p.seq == h.seq) {
                Some(p) if h.session == self.run && h.seq != 0 => {
                    p.failed = Some(f.message());
                    Ok(())
                }
                _ => Err(RingError::Fault(f.message())),
            },
            _ => Ok(()),
        }
    }

    /// The next frame from this ring's neighbours within `wait` (`Ok(None)`: none came); a
    /// lost neighbour is an error.
    fn recv_frame(&mut self, wait: Duration) -> Result<Option<Frame>, RingError> {
        let Some(event) = self.net.recv(wait) else {
            return Ok(None);
        };
        let l = &self.links;
        Ok(match event {
            hesper_ring::Incoming::Frame(from, f)
                if from.id == l.prev.id() || from.id == l.next.id() =>
            {
                Some(f)
            }
            hesper_ring::Incoming::Lost(from, why) if from.id == l.next.id() => {
                let node = l
                    .records
                    .get(1)
                    .map_or_else(|| l.next.peer().into(), NodeRecord::name);
                return Err(RingError::Lost { node, why });
            }
            hesper_ring::Incoming::Lost(from, why) if from.id == l.prev.id() => {
                let node = l
                    .records
                    .last()
                    .map_or_else(|| l.prev.peer().into(), NodeRecord::name);
                return Err(RingError::Lost { node, why });
            }
            hesper_ring::Incoming::Joined(extra) => {
                (self.settings.log)(&format!(
                    "refused a connection from {}: the ring is formed",
                    extra.peer()
                ));
                None
            }
            hesper_ring::Incoming::Note(n) => {
                (self.settings.log)(&n);
                None
            }
            _ => None,
        })
    }

    /// The ring broke (`broke`): every step in flight is lost. Re-forms it through the standby
    /// ([`StepError::Reformed`]), or marks it down ([`StepError::Down`]).
    fn broken(&mut self, broke: RingError) -> StepError {
        self.pending.clear();
        // The old ring is told to stop (whoever still listens).
        self.links
            .next
            .send(Frame::text(Kind::Shutdown, &broke.to_string()));
        let Some(addr) = self.opts.standby.take() else {
            self.links.next.flush(FLUSH);
            let why = broke.to_string();
            (self.settings.log)(&why);
            self.down = Some(why.clone());
            return StepError::Down(why);
        };
        (self.settings.log)(&format!(
            "{broke}; re-forming the ring through the standby {addr}"
        ));
        // The standby takes every layer after the master's.
        let m = self.model.get();
        let plan = self.plan.as_ref().map(|_| {
            let own = m.layer_range();
            vec![own.clone(), own.end..m.config.n_layer]
        });
        match self.rejoin(addr, self.settings.form_wait, plan) {
            Ok(()) => StepError::Reformed(broke.to_string()),
            Err(e) => {
                let why = format!("{broke}; the standby {addr} failed too: {e}");
                self.down = Some(why.clone());
                StepError::Down(why)
            }
        }
    }

    /// Forms the ring anew through `next`, within `wait`, with each node's layers as `plan`
    /// says (where the master assigns them); every live slot is made again on the new ring
    /// (empty), and the master's caches are emptied.
    fn rejoin(
        &mut self,
        next: SocketAddr,
        wait: Duration,
        plan: Option<Vec<Range<usize>>>,
    ) -> Result<(), RingError> {
        let run = run_id();
        let model = &self.model;
        let hello = Hello {
            run,
            n_ctx: self.opts.n_ctx,
            flags: hello_flags(&self.opts),
            plan: plan.as_deref(),
        };
        let links = join(
            &mut self.net,
            &self.me,
            next,
            hello,
            wait,
            self.settings.log,
            &|records| verify(model.get(), records),
        )?;
        self.links = links;
        self.plan = plan;
        self.run = run;
        self.down = None;
        self.pending.clear();
        self.ops = self
            .live
            .iter()
            .map(|(&slot, &n_ctx)| CacheOp::Alloc { slot, n_ctx })
            .collect();
        Ok(())
    }

    /// Processes what came while no step was in flight: a lost neighbour breaks the ring.
    fn poll(&mut self) -> Result<(), StepError> {
        if self.down.is_some() || !self.pending.is_empty() {
            return Ok(());
        }
        loop {
            match self.recv_frame(Duration::ZERO) {
                Ok(Some(f)) if f.header.kind == Kind::Fault => {
                    return Err(self.broken(RingError::Fault(f.message())))
                }
                Ok(Some(_)) => {}
                Ok(None) => return Ok(()),
                Err(broke) => return Err(self.broken(broke)),
            }
        }
    }

    /// Waits for the frame of `kind` of step `self.seq` from the last node (nothing else in
    /// flight); a lost node or a fault breaks the ring.
    fn wait_frame(&mut self, kind: Kind) -> Result<Frame, RingError> {
        loop {
            let Some(f) = self.recv_frame(Duration::from_secs(1))? else {
                continue;
            };
            let h = f.header;
            if h.kind == kind && h.session == self.run && h.seq == self.seq {
                return Ok(f);
            }
            if h.kind == Kind::Fault {
                return Err(RingError::Fault(f.message()));
            }
        }
    }

    /// A hot-swap over the ring (nothing in flight): the master swaps in what changed in its
    /// own file, then a Reload frame goes round for every node to do the same; the records
    /// that come back must show one file again (as when the ring formed). A node that refused
    /// leaves the ring holding two files: it then refuses to run until a check finds them the
    /// same, rather than compute with mixed weights.
    pub fn reload_ring(&mut self) -> Result<Reload, RuntimeError> {
        if let Some(why) = &self.down {
            return Err(RingError::Config(why.clone()).into());
        }
        let own = match self.model.get_mut() {
            Some(m) => m.reload_changed(),
            None => return Err(ReloadError::NotEnabled.into()),
        };
        self.me.refresh_file(self.model.get());
        if matches!(own, Ok(Reload::Swapped(_))) {
            self.me
                .refresh_tensors(self.model.get())
                .map_err(RingError::from)?;
        }
        self.seq += 1;
        let mut h = Header::new(Kind::Reload);
        h.session = self.run;
        h.seq = self.seq;
        let mine = vec![(self.me.clone(), Found::of(&own))];
        self.links.next.send(Frame::new(h, reload::encode(&mine)));
        let back = self.wait_frame(Kind::Reload)?;
        let nodes = reload::decode(&back.payload).map_err(RingError::Protocol)?;
        let records: Vec<NodeRecord> = nodes.iter().map(|(r, _)| r.clone()).collect();
        let refused: Vec<String> = nodes
            .iter()
            .filter_map(|(r, f)| match f {
                Found::Refused(why) => Some(format!("node {} refused: {why}", r.name())),
                _ => None,
            })
            .collect();
        // Tensor data is compared again when a node swapped something in or the ring is split
        // (the master reads the other nodes' tensors from its file to compare).
        let changed = nodes.iter().any(|(_, f)| *f != Found::Unchanged);
        let checked = if changed || self.split.is_some() {
            verify(self.model.get(), &records)
        } else {
            hello::check(&records)
        };
        let split = match checked {
            Err(why) => Some(why),
            Ok(()) if !refused.is_empty() => Some(refused.join("; ")),
            Ok(()) => None,
        };
        if let Some(why) = split {
            let why = format!("after a hot-swap the ring's nodes hold different files ({why}); it runs again once a check finds one file everywhere");
            self.split = Some(why.clone());
            return Err(RingError::Config(why).into());
        }
        self.split = None;
        self.links.records = records;
        let tensors: Vec<(String, String, String)> = nodes
            .into_iter()
            .flat_map(|(_, f)| match f {
                Found::Swapped(t) => t,
                _ => Vec::new(),
            })
            .collect();
        let bytes_read = match own {
            Ok(Reload::Swapped(s)) => s.bytes_read,
            _ => 0,
        };
        Ok(Reload::of(tensors, bytes_read))
    }
}

/// A Hello's flags for a master run with `opts`.
fn hello_flags(opts: &RingOptions) -> u32 {
    let mut flags = 0;
    if opts.serving {
        flags |= HELLO_SERVES;
    }
    if opts.private {
        flags |= HELLO_PRIVATE;
    }
    flags
}

/// Longest wait of one attempt to form a lost ring again while serving.
const RECOVER_WAIT: Duration = Duration::from_secs(2);

impl<B: Backend, M: ModelRef<B>> StepRunner for RingRunner<B, M> {
    type Cache = RingCache<B>;

    fn in_flight(&self) -> usize {
        self.opts
            .in_flight
            .unwrap_or(self.links.records.len())
            .max(1)
    }

    fn new_cache(&mut self, n_ctx: usize) -> Result<RingCache<B>, ModelError> {
        let session = self
            .model
            .get()
            .new_session_with(n_ctx, 1, &AttentionConfig::default())?;
        let slot = self.next_slot;
        self.next_slot = self.next_slot.wrapping_add(1);
        self.live.insert(slot, n_ctx);
        self.ops.push(CacheOp::Alloc { slot, n_ctx });
        Ok(RingCache { slot, session })
    }

    fn free_cache(&mut self, cache: RingCache<B>) {
        self.live.remove(&cache.slot);
        self.ops.push(CacheOp::Free { slot: cache.slot });
    }

    fn start(&mut self, steps: &mut [RunStep<'_, RingCache<B>>]) -> Result<(), StepError> {
        let mut entries: Vec<(&mut RingCache<B>, &[u32], Option<Readout>)> = steps
            .iter_mut()
            .map(|s| (&mut *s.cache, s.tokens, s.readout))
            .collect();
        self.start_entries(&mut entries)
    }

    fn finish(&mut self) -> Result<Landed, StepError> {
        self.finish_predictions()
    }

    fn poll(&mut self) -> Result<(), StepError> {
        RingRunner::poll(self)
    }

    fn recover(&mut self) -> Result<(), String> {
        if self.down.is_none() {
            return Ok(());
        }
        let wait = RECOVER_WAIT.min(self.settings.form_wait);
        let plan = self.plan.clone();
        match self.rejoin(self.settings.next, wait, plan) {
            Ok(()) => {
                (self.settings.log)("the ring is formed again");
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    fn reload(&mut self) -> Result<Reload, String> {
        self.reload_ring().map_err(|e| e.to_string())
    }

    fn hidden_states(&mut self, tokens: &[u32]) -> Result<Vec<f32>, StepError> {
        let failed = |e: ModelError| StepError::Failed(e.to_string());
        let mut cache = self.new_cache(tokens.len()).map_err(failed)?;
        let mut result = Ok(Vec::with_capacity(
            tokens.len() * self.model.get().config.n_embd,
        ));
        let mut started = 0;
        for chunk in tokens.chunks(self.opts.batch) {
            match self.start_step(&mut [(&mut cache, chunk, None)], true) {
                Ok(()) => started += 1,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        // Every step started is landed (a broken ring drops them all), so none is left for
        // the scheduler's next step.
        for _ in 0..started {
            if self.pending.is_empty() {
                break;
            }
            match (self.finish_states(), &mut result) {
                (Ok(states), Ok(out)) => out.extend(states),
                (Err(e), Ok(_)) => result = Err(e),
                (_, Err(_)) => {}
            }
        }
        self.free_cache(cache);
        result
    }
}
