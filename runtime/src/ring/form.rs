//! Forming a ring: the master's Hello goes round once, each node appends what it holds, and
//! the master checks that the nodes make one model (see [`super::hello`]).

use std::net::SocketAddr;
use std::ops::Range;
use std::time::{Duration, Instant};

use hesper_engine::backend::Backend;
use hesper_engine::model::Model;
use hesper_ring::{Frame, Header, Incoming, Kind, Link, Net};

use super::hello::{self, NodeRecord};
use super::plan::{self, Offer};
use super::{NodeSettings, RingError, CLOSE_WAIT, HELLO_PLAN};

/// The master's two links and what the ring's nodes said of themselves.
pub(super) struct Links {
    /// To the next node.
    pub next: Link,
    /// From the last node.
    pub prev: Link,
    /// Every node's record, the master's first.
    pub records: Vec<NodeRecord>,
}

/// Checks the records of a ring whose master holds `master`: one model in every node
/// ([`hello::check`]), down to each tensor's bytes ([`hello::check_data`]).
pub(super) fn verify<B: Backend>(master: &Model<B>, records: &[NodeRecord]) -> Result<(), String> {
    hello::check(records)?;
    let reference = hello::reference_hashes(master, records)
        .map_err(|e| format!("the master could not hash its own file's tensors: {e}"))?;
    hello::check_data(records, &reference)
}

/// Connects to `next`, sends the Hello round with `me` (for run `run` with a context of
/// `n_ctx`, and the Hello's `flags`), and waits for it to come back over a predecessor's
/// link; checks the records with `verify`.
pub(super) fn join(
    net: &mut Net,
    me: &NodeRecord,
    next: SocketAddr,
    hello: Hello<'_>,
    wait: Duration,
    log: fn(&str),
    verify: &dyn Fn(&[NodeRecord]) -> Result<(), String>,
) -> Result<Links, RingError> {
    let next = net.connect(next, wait)?;
    join_over(net, me, (next, Vec::new()), hello, wait, log, verify)
}

/// What a master's Hello carries besides its record.
#[derive(Debug, Clone, Copy)]
pub(super) struct Hello<'a> {
    /// The master's run.
    pub run: u64,
    /// The longest sequence.
    pub n_ctx: usize,
    /// The Hello's flags (`HELLO_*`).
    pub flags: u32,
    /// The layers each node is to hold, when the master assigns them.
    pub plan: Option<&'a [Range<usize>]>,
}

/// [`join`] over a link to the next node made already, with the predecessors connected so
/// far (a Probe round's).
pub(super) fn join_over(
    net: &mut Net,
    me: &NodeRecord,
    (next, candidates): (Link, Vec<Link>),
    hello: Hello<'_>,
    wait: Duration,
    log: fn(&str),
    verify: &dyn Fn(&[NodeRecord]) -> Result<(), String>,
) -> Result<Links, RingError> {
    let mut h = Header::new(Kind::Hello);
    h.session = hello.run;
    h.pos0 = hello.flags | if hello.plan.is_some() { HELLO_PLAN } else { 0 };
    h.aux = u32::try_from(hello.n_ctx).unwrap_or(u32::MAX);
    let frame = Frame::new(h, hello::encode_hello(hello.plan, std::slice::from_ref(me)));
    let (prev, back) = round(net, &next, candidates, frame, wait, log)?;
    let records = hello::decode_hello(hello.plan.is_some(), &back.payload)
        .map_err(|e| RingError::Config(format!("the Hello came back malformed: {e}")))?
        .1;
    if let Err(why) = verify(&records) {
        shut_down(net, &next, &prev, &why);
        return Err(RingError::Config(why));
    }
    Ok(Links {
        next,
        prev,
        records,
    })
}

/// Sends `frame` (a Hello or a Probe) on `next` and waits for it to come back round the ring:
/// the link it comes over (among `candidates` and the predecessors that connect meanwhile),
/// and the frame as the last node sent it. Connections that open with anything else are
/// closed; the other candidates are refused.
fn round(
    net: &mut Net,
    next: &Link,
    mut candidates: Vec<Link>,
    frame: Frame,
    wait: Duration,
    log: fn(&str),
) -> Result<(Link, Frame), RingError> {
    let (kind, run) = (frame.header.kind, frame.header.session);
    next.send(frame);
    let deadline = Instant::now() + wait;
    let mut closed: Option<String> = None;
    let (prev, back) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RingError::Config(format!(
                "the {kind:?} frame did not come back round the ring within {:.0} s{}",
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
                if f.header.kind == kind && f.header.session == run {
                    break (candidates.swap_remove(i), f);
                }
                let link = candidates.swap_remove(i);
                // Not yet the last node: even a fault is only reported (a stranger's would
                // end the ring otherwise).
                let why = match f.header.kind {
                    Kind::Fault => format!("it reported: {}", f.message()),
                    k if k == kind => format!("a {kind:?} of another run"),
                    other => {
                        format!("it opened with a {other:?} frame, not the returning {kind:?}")
                    }
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
    Ok((prev, back))
}

/// A master's ring before its own layers are known: listening, linked round the ring by a
/// Probe round, with what every node offered (`--layers auto`).
pub struct Formation {
    pub(super) net: Net,
    pub(super) bound: SocketAddr,
    pub(super) next: Link,
    pub(super) prev: Link,
    /// What each node offered, in ring order (the master's first).
    pub offers: Vec<Offer>,
}

impl Formation {
    /// Listens, connects to the next node and sends a Probe round with the master's `offer`
    /// (its address filled in); waits for every node's offer to come back.
    pub fn probe(settings: &NodeSettings, offer: Offer) -> Result<Self, RingError> {
        let mut net = Net::new(settings.net.clone())?;
        let bound = net.listen(settings.listen)?;
        let next = net.connect(settings.next, settings.form_wait)?;
        let mut h = Header::new(Kind::Probe);
        h.session = run_id();
        let mine = Offer {
            listen: bound.to_string(),
            ..offer
        };
        let frame = Frame::new(h, plan::encode(&[mine]));
        let (prev, back) = round(
            &mut net,
            &next,
            Vec::new(),
            frame,
            settings.form_wait,
            settings.log,
        )?;
        let offers = plan::decode(&back.payload)
            .map_err(|e| RingError::Config(format!("the Probe came back malformed: {e}")))?;
        Ok(Self {
            net,
            bound,
            next,
            prev,
            offers,
        })
    }

    /// Ends the forming ring with `why` (no plan fits): every node that answered the Probe
    /// is told.
    pub fn refuse(mut self, why: &str) {
        shut_down(&mut self.net, &self.next, &self.prev, why);
    }
}

/// Ends a ring the master has linked round (`next` to the first worker, `prev` from the last)
/// with `why` (empty: a normal end). Each worker passes the Shutdown on before it exits, and
/// the master waits until it comes back over `prev`, `prev` is lost, or [`CLOSE_WAIT`] passes:
/// a master that left at once could be found gone by the last worker before the Shutdown
/// reached it, which would then report a lost node instead of the reason.
pub(super) fn shut_down(net: &mut Net, next: &Link, prev: &Link, why: &str) {
    next.send(Frame::text(Kind::Shutdown, why));
    let end = Instant::now() + CLOSE_WAIT;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        match net.recv(left) {
            Some(Incoming::Frame(from, f))
                if from.id == prev.id() && f.header.kind == Kind::Shutdown =>
            {
                return
            }
            Some(Incoming::Lost(from, _)) if from.id == prev.id() => return,
            Some(_) => {}
            None => return,
        }
    }
}

/// A number for this run of the master (workers start a fresh session when it changes).
pub(super) fn run_id() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}
