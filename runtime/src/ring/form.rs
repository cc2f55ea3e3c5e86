//! Forming a ring: the master's Hello goes round once, each node appends what it holds, and
//! the master checks that the nodes make one model (see [`super::hello`]).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hesper_engine::backend::Backend;
use hesper_engine::model::Model;
use hesper_ring::{Frame, Header, Incoming, Kind, Link, Net};

use super::hello::{self, NodeRecord};
use super::{RingError, FLUSH};

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
    (run, n_ctx, flags): (u64, usize, u32),
    wait: Duration,
    log: fn(&str),
    verify: &dyn Fn(&[NodeRecord]) -> Result<(), String>,
) -> Result<Links, RingError> {
    let next = net.connect(next, wait)?;
    let mut h = Header::new(Kind::Hello);
    h.session = run;
    h.pos0 = flags;
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
pub(super) fn run_id() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}
