//! The master's side of a ring: its own layers, then the rest of the ring, as an
//! [`Evaluator`] a completion or a chat runs on. With a standby node, a lost ring is
//! re-formed through it and the token history replayed in the same steps, so generation goes
//! on with the very numbers an unbroken ring computes.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hesper_engine::backend::Backend;
use hesper_engine::model::{Model, ModelError, Prediction, Readout, Session};
#[cfg(unix)]
use hesper_engine::model::{Reload, ReloadError};
use hesper_ring::{wire, Dtype, Frame, Header, Incoming, Kind, Link, Net};

use super::hello::{self, NodeRecord};
use super::protocol::{decode_prediction, readout_code};
#[cfg(unix)]
use super::reload::{self, Found};
use super::{NodeSettings, RingError, FLUSH, MAX_FRAME_ROWS};
use crate::evaluator::ModelRef;
use crate::{Evaluator, RuntimeError};

/// The master of a formed ring.
pub struct RingEvaluator<B: Backend, M: ModelRef<B>> {
    /// The master's layers (mutable where they were loaded for hot-swap).
    model: M,
    session: Session<B>,
    net: Net,
    me: NodeRecord,
    links: Links,
    run: u64,
    seq: u64,
    wire: Dtype,
    form_wait: Duration,
    log: fn(&str),
    /// Where to re-form the ring when it breaks; taken when used.
    standby: Option<SocketAddr>,
    /// Every token in the context, and the steps they were sent in (first position, count).
    history: Vec<u32>,
    steps: Vec<(usize, usize)>,
    /// Why the ring cannot run: a hot-swap left its nodes holding different files (cleared by
    /// a later check that finds them the same again).
    split: Option<String>,
}

/// The master's two links and what the ring's nodes said of themselves.
struct Links {
    next: Link,
    prev: Link,
    records: Vec<NodeRecord>,
}

impl<B: Backend, M: ModelRef<B>> RingEvaluator<B, M> {
    /// Forms the ring: listens, connects to the next node, sends the Hello round and checks
    /// what comes back ([`hello::check`]). A ring that fails the check is ended with the
    /// reason (every worker prints it) and the same reason is returned. `standby`: a node
    /// to re-form the ring through if it breaks (it must hold the layers after the master's).
    pub fn form(
        model: M,
        session: Session<B>,
        settings: &NodeSettings,
        standby: Option<SocketAddr>,
    ) -> Result<Self, RingError> {
        if model.get().layer_range().start != 0 {
            return Err(RingError::Config(format!(
                "the master holds the embedding, so its layers must start at 0 (it holds {}..{})",
                model.get().layer_range().start,
                model.get().layer_range().end
            )));
        }
        let mut net = Net::new(settings.net.clone())?;
        let bound = net.listen(settings.listen)?;
        let me = NodeRecord::of(model.get(), bound)?;
        let run = run_id();
        let n_ctx = session.n_ctx();
        let links = join(
            &mut net,
            &me,
            settings.next,
            (run, n_ctx),
            settings.form_wait,
            settings.log,
            &|records| verify(model.get(), records),
        )?;
        Ok(Self {
            model,
            session,
            net,
            me,
            links,
            run,
            seq: 0,
            wire: settings.wire,
            form_wait: settings.form_wait,
            log: settings.log,
            standby,
            history: Vec::new(),
            steps: Vec::new(),
            split: None,
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

    /// Ends the ring: every worker gets the reason (empty: a normal end) and exits; an
    /// unused standby is told too.
    pub fn close(self, why: &str) {
        self.links.next.send(Frame::text(Kind::Shutdown, why));
        if let Some(addr) = self.standby {
            if let Ok(link) = self.net.connect(addr, Duration::from_secs(2)) {
                link.send(Frame::text(Kind::Shutdown, why));
            }
        }
        std::thread::sleep(FLUSH);
    }

    /// Runs `tokens` (at positions from `pos0`, the session's) through the master's layers
    /// and sends the rows on; `readout` says what the last node hands back (nothing for a
    /// prefill chunk before the last).
    async fn send_step(
        &mut self,
        pos0: usize,
        n: usize,
        readout: Option<Readout>,
    ) -> Result<(), RuntimeError> {
        let tokens = &self.history[pos0..pos0 + n];
        let rows = self
            .model
            .get()
            .forward_tokens_at_async(&mut self.session, pos0, tokens)
            .await?;
        self.seq += 1;
        let mut h = Header::new(Kind::Forward);
        h.dtype = self.wire;
        h.session = self.run;
        h.seq = self.seq;
        h.pos0 = pos0 as u32;
        h.n_tokens = n as u32;
        h.aux = readout_code(readout);
        self.links
            .next
            .send(Frame::new(h, wire::encode(self.wire, &rows)));
        Ok(())
    }

    /// Waits for the prediction of step `self.seq`; a lost node or a fault breaks the ring.
    fn wait_prediction(&mut self, readout: Readout) -> Result<Prediction, RingError> {
        let f = self.wait_frame(Kind::Prediction)?;
        decode_prediction(readout, &f.payload, self.model.get().sampled_vocab())
            .map_err(RingError::Protocol)
    }

    /// Waits for the frame of `kind` of step `self.seq` from the last node; a lost node or a
    /// fault breaks the ring.
    fn wait_frame(&mut self, kind: Kind) -> Result<Frame, RingError> {
        loop {
            let Some(event) = self.net.recv(Duration::from_secs(1)) else {
                continue;
            };
            let l = &self.links;
            match event {
                Incoming::Frame(from, f) => match f.header.kind {
                    k if k == kind
                        && from.id == l.prev.id()
                        && f.header.session == self.run
                        && f.header.seq == self.seq =>
                    {
                        return Ok(f);
                    }
                    Kind::Fault if from.id == l.prev.id() || from.id == l.next.id() => {
                        return Err(RingError::Fault(f.message()))
                    }
                    _ => {}
                },
                Incoming::Lost(from, why) if from.id == l.next.id() => {
                    let node = l
                        .records
                        .get(1)
                        .map_or_else(|| l.next.peer().into(), NodeRecord::name);
                    return Err(RingError::Lost { node, why });
                }
                Incoming::Lost(from, why) if from.id == l.prev.id() => {
                    let node = l
                        .records
                        .last()
                        .map_or_else(|| l.prev.peer().into(), NodeRecord::name);
                    return Err(RingError::Lost { node, why });
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

    /// Sends the steps from `first` on (the last one asking for `readout`) and waits for the
    /// prediction.
    async fn run_steps(
        &mut self,
        first: usize,
        readout: Readout,
    ) -> Result<Prediction, RuntimeError> {
        let last = self.steps.len() - 1;
        for i in first..=last {
            let (pos0, n) = self.steps[i];
            self.send_step(pos0, n, (i == last).then_some(readout))
                .await?;
        }
        Ok(self.wait_prediction(readout)?)
    }

    /// Re-forms the ring through the standby after `broke`, or ends it with `broke`.
    fn fail_over(&mut self, broke: RingError) -> Result<(), RingError> {
        // The old ring is told to stop (whoever still listens).
        self.links
            .next
            .send(Frame::text(Kind::Shutdown, &broke.to_string()));
        let Some(addr) = self.standby.take() else {
            std::thread::sleep(FLUSH);
            return Err(broke);
        };
        (self.log)(&format!(
            "{broke}; re-forming the ring through the standby {addr}"
        ));
        self.run = run_id();
        let n_ctx = self.session.n_ctx();
        let model = &self.model;
        self.links = join(
            &mut self.net,
            &self.me,
            addr,
            (self.run, n_ctx),
            self.form_wait,
            self.log,
            &|records| verify(model.get(), records),
        )
        .map_err(|e| RingError::Fault(format!("{broke}; the standby {addr} failed too: {e}")))?;
        self.session.truncate(0);
        Ok(())
    }
}

impl<B: Backend, M: ModelRef<B>> RingEvaluator<B, M> {
    /// A hot-swap over the ring: the master swaps in what changed in its own file, then a
    /// Reload frame goes round for every node to do the same between two steps; the records
    /// that come back must show one file again (as when the ring formed). A node that refused
    /// leaves the ring holding two files: it then refuses to run until a check finds them the
    /// same, rather than compute with mixed weights.
    #[cfg(unix)]
    fn reload_ring(&mut self) -> Result<Reload, RuntimeError> {
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

impl<B: Backend, M: ModelRef<B>> Evaluator for RingEvaluator<B, M> {
    fn pos(&self) -> usize {
        self.session.pos()
    }

    fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    fn truncate(&mut self, pos: usize) {
        // The next Forward frame starts at `pos`: every worker forgets the rest then.
        self.session.truncate(pos);
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
        if let Some(why) = &self.split {
            return Err(RingError::Config(why.clone()).into());
        }
        let pos = self.session.pos();
        if pos + input.len() > self.session.n_ctx() {
            return Err(ModelError::ContextFull {
                needed: pos + input.len(),
                n_ctx: self.session.n_ctx(),
            }
            .into());
        }
        let first = self.steps.len();
        self.history.extend_from_slice(input);
        for (i, chunk) in input.chunks(MAX_FRAME_ROWS).enumerate() {
            self.steps.push((pos + i * MAX_FRAME_ROWS, chunk.len()));
        }
        match self.run_steps(first, readout).await {
            Err(RuntimeError::Ring(broke)) => {
                self.fail_over(broke)?;
                // Every step again, in the same chunks: the new ring's caches (and the
                // master's) hold what the old ones did.
                self.run_steps(0, readout).await
            }
            other => other,
        }
    }

    #[cfg(unix)]
    fn reload(&mut self) -> Result<Reload, RuntimeError> {
        self.reload_ring()
    }
}

/// Checks the records of a ring whose master holds `master`: one model in every node
/// ([`hello::check`]), down to each tensor's bytes ([`hello::check_data`]).
fn verify<B: Backend>(master: &Model<B>, records: &[NodeRecord]) -> Result<(), String> {
    hello::check(records)?;
    let reference = hello::reference_hashes(master, records)
        .map_err(|e| format!("the master could not hash its own file's tensors: {e}"))?;
    hello::check_data(records, &reference)
}

/// Connects to `next`, sends the Hello round with `me` (for run `run` with a context of
/// `n_ctx`), and waits for it to come back over a predecessor's link; checks the records
/// with `verify`.
fn join(
    net: &mut Net,
    me: &NodeRecord,
    next: SocketAddr,
    (run, n_ctx): (u64, usize),
    wait: Duration,
    log: fn(&str),
    verify: &dyn Fn(&[NodeRecord]) -> Result<(), String>,
) -> Result<Links, RingError> {
    let next = net.connect(next, wait)?;
    let mut h = Header::new(Kind::Hello);
    h.session = run;
    h.aux = u32::try_from(n_ctx).unwrap_or(u32::MAX);
    next.send(Frame::new(h, hello::encode(std::slice::from_ref(me))));
    let deadline = Instant::now() + wait;
    // Connections that may be the last node: the one whose Hello of this run comes back
    // readable takes the slot; one that opens with anything else is closed.
    let mut candidates: Vec<Link> = Vec::new();
    let mut closed: Option<String> = None;
    let (prev, records) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RingError::Config(format!(
                "the Hello frame did not come back round the ring within {:.0} s{}",
                wait.as_secs_f64(),
                closed.map(|c| format!("; {c}")).unwrap_or_default()
            )));
        }
        let candidate =
            |from: &hesper_ring::From| candidates.iter().position(|c| c.id() == from.id);
        match net.recv(left.min(Duration::from_millis(100))) {
            Some(Incoming::Joined(link)) => candidates.push(link),
            Some(Incoming::Frame(from, f))
                if from.id == next.id() && f.header.kind == Kind::Fault =>
            {
                return Err(RingError::Fault(f.message()))
            }
            Some(Incoming::Frame(from, f)) => {
                let Some(i) = candidate(&from) else { continue };
                let link = candidates.swap_remove(i);
                // Not yet the last node: even a fault is only reported (a stranger's would
                // end the ring otherwise).
                let why = match f.header.kind {
                    Kind::Fault => format!("it reported: {}", f.message()),
                    Kind::Hello if f.header.session == run => match hello::decode(&f.payload) {
                        Ok(records) => break (link, records),
                        Err(e) => format!("a malformed Hello ({e})"),
                    },
                    Kind::Hello => "a Hello of another run".to_string(),
                    kind => format!("it opened with a {kind:?} frame, not the returning Hello"),
                };
                let line = format!("closed a connection from {}: {why}", link.peer());
                log(&line);
                closed = Some(line);
            }
            Some(Incoming::Lost(from, why)) if from.id == next.id() => {
                return Err(RingError::Lost {
                    node: next.peer().to_string(),
                    why,
                })
            }
            Some(Incoming::Lost(from, _)) => candidates.retain(|c| c.id() != from.id),
            Some(Incoming::Note(n)) => log(&n),
            _ => {}
        }
    };
    for extra in candidates {
        log(&format!(
            "refused a connection from {}: the ring has its last node",
            extra.peer()
        ));
    }
    if let Err(why) = verify(&records) {
        next.send(Frame::text(Kind::Shutdown, &why));
        std::thread::sleep(FLUSH);
        return Err(RingError::Config(why));
    }
    Ok(Links {
        next,
        prev,
        records,
    })
}

/// A number for this run of the master (workers start a fresh session when it changes).
fn run_id() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}
