//! A link to one neighbour: frames out through a writer task that also sends heartbeats when
//! the link is idle, frames in through a reader task that drops heartbeats and reports the
//! link lost when nothing arrives for [`Timing::dead_after`] (and stops the writer then). Both
//! tasks hand what happens to the node's one inbox, which the node's own thread reads while it
//! computes or waits.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use thiserror::Error;
use tokio::sync::mpsc as tmpsc;

use crate::frame::{Frame, FrameError, Kind};

/// Which neighbour a link leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The node before this one in the ring (frames come from it).
    Prev,
    /// The node after this one (frames go to it).
    Next,
}

/// Which link an event comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct From {
    /// The link's number, unique in its node ([`Link::id`]).
    pub id: u64,
    /// Which neighbour it leads to.
    pub side: Side,
}

/// What the links hand their node.
#[derive(Debug)]
pub enum Incoming {
    /// A frame from a neighbour.
    Frame(From, Frame),
    /// A link is gone: closed, failed, or silent for too long; the text says which and why.
    Lost(From, String),
    /// A predecessor connected and sent a well-formed first frame (handed on as a
    /// [`Incoming::Frame`] after this, unless it was a heartbeat).
    Joined(Link),
    /// Something the node should log (a refused connection).
    Note(String),
}

/// Heartbeat and failure-detection timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// A heartbeat goes out when nothing else has for this long.
    pub heartbeat: Duration,
    /// A link that brings nothing (not even a heartbeat) for this long is lost.
    pub dead_after: Duration,
    /// Each frame leaves this long after it was sent (a test and benchmark hook that emulates
    /// a network's one-way latency on loopback; zero in use). Frames sent meanwhile are
    /// delayed alike, not behind one another, as on a real link.
    pub delay: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_millis(250),
            dead_after: Duration::from_millis(1500),
            delay: Duration::ZERO,
        }
    }
}

/// Why a link could not carry a frame.
#[derive(Debug, Error)]
pub enum LinkError {
    /// The peer sent bytes that are not a frame.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The connection failed or closed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The peer closed the connection.
    #[error("the connection was closed")]
    Closed,
    /// The peer failed the ring key's checks.
    #[error("{0}")]
    Auth(String),
}

/// Counters of one link.
#[derive(Debug, Default)]
pub struct LinkStats {
    /// Frames sent (heartbeats not counted).
    pub frames: AtomicU64,
    /// Bytes sent, headers included (heartbeats not counted).
    pub bytes: AtomicU64,
    /// Datagrams sent again after a loss (UDP).
    pub retransmits: AtomicU64,
}

/// Reads whole frames from a connection.
pub trait FrameRead: Send + 'static {
    /// The next frame (heartbeats included).
    fn read_frame(&mut self) -> impl Future<Output = Result<Frame, LinkError>> + Send;
}

/// Writes whole frames to a connection.
pub trait FrameWrite: Send + 'static {
    /// Sends `frame`.
    fn write_frame(&mut self, frame: Frame) -> impl Future<Output = Result<(), LinkError>> + Send;

    /// Returns once every frame written so far is on its way: handed to the kernel (TCP), or
    /// acknowledged by the peer (UDP). By default `write_frame` has already waited for that.
    fn flush(&mut self) -> impl Future<Output = Result<(), LinkError>> + Send {
        std::future::ready(Ok(()))
    }
}

/// What a link's writer task is asked to do, in order.
enum Out {
    /// Send a frame queued at this instant.
    Frame(tokio::time::Instant, Frame),
    /// Answer once every frame queued before is on its way.
    Flush(mpsc::SyncSender<()>),
}

/// The sending end of a link, held by the node; dropping it closes the link.
#[derive(Debug)]
pub struct Link {
    id: u64,
    side: Side,
    peer: String,
    out: tmpsc::UnboundedSender<Out>,
    stats: Arc<LinkStats>,
}

impl Link {
    /// Queues `frame` for the peer; `false` when the link is already gone (its loss has been
    /// or will be reported to the inbox).
    pub fn send(&self, frame: Frame) -> bool {
        self.stats.frames.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes.fetch_add(
            (crate::frame::HEADER_LEN + frame.payload.len()) as u64,
            Ordering::Relaxed,
        );
        self.out
            .send(Out::Frame(tokio::time::Instant::now(), frame))
            .is_ok()
    }

    /// Waits until every frame queued so far is on its way to the peer (see
    /// [`FrameWrite::flush`]), the link is gone, or `limit` has passed; `true` in the first
    /// case. A node calls it before it moves on from its last frames (a Shutdown, a Fault), so
    /// that they are not lost with it: over UDP a frame dropped on the way is sent again only
    /// while its sender lives.
    pub fn flush(&self, limit: Duration) -> bool {
        let (done, wait) = mpsc::sync_channel(1);
        self.out.send(Out::Flush(done)).is_ok() && wait.recv_timeout(limit).is_ok()
    }

    /// The peer's address, as shown in messages.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Which neighbour this link leads to.
    pub fn side(&self) -> Side {
        self.side
    }

    /// This link's number, unique in its node: events name it ([`From::id`]).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The link's counters.
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }
}

/// What every link of a node shares: its inbox and timing.
#[derive(Clone)]
pub(crate) struct LinkContext {
    /// Numbers the node's links.
    pub next_id: Arc<AtomicU64>,
    /// Where events go.
    pub inbox: mpsc::Sender<Incoming>,
    /// Heartbeat timing.
    pub timing: Timing,
}

/// Why a peer that never sent a frame most likely went quiet: a node refuses a link whose
/// key setting differs from its own (closing it at once over TCP, ignoring it over UDP) and
/// says so only on its side.
const REFUSED: &str =
    ": it may have refused this link (does every node have the same --ring-key, or none?)";

/// Starts the reader and writer tasks of a connection on `rt` and returns its link.
pub(crate) fn spawn_link(
    rt: &tokio::runtime::Handle,
    side: Side,
    peer: String,
    mut reader: impl FrameRead,
    mut writer: impl FrameWrite,
    cx: &LinkContext,
    stats: Arc<LinkStats>,
) -> Link {
    let (inbox, timing) = (cx.inbox.clone(), cx.timing);
    let id = cx.next_id.fetch_add(1, Ordering::Relaxed);
    let from = From { id, side };
    let (out, mut queue) = tmpsc::unbounded_channel::<Out>();
    let lost = inbox.clone();
    let who = peer.clone();
    // The reader's word to the writer that the link is lost: the writer stops (a UDP frame to
    // a peer that is gone would be offered again for ever) and so does any flush.
    let gone = Arc::new(tokio::sync::Notify::new());
    let reader_gone = Arc::clone(&gone);
    rt.spawn(async move {
        // Whether the peer sent anything: a peer that admitted the link sends heartbeats.
        let mut heard = false;
        loop {
            let frame = match tokio::time::timeout(timing.dead_after, reader.read_frame()).await {
                Ok(Ok(f)) if f.header.kind == Kind::Heartbeat => {
                    heard = true;
                    continue;
                }
                Ok(Ok(f)) => f,
                Ok(Err(e)) => {
                    let hint = if matches!(e, LinkError::Closed) && !heard {
                        format!(" before it sent anything{REFUSED}")
                    } else {
                        String::new()
                    };
                    reader_gone.notify_one();
                    let _ = lost.send(Incoming::Lost(from, format!("{who}: {e}{hint}")));
                    return;
                }
                Err(_) => {
                    reader_gone.notify_one();
                    let _ = lost.send(Incoming::Lost(
                        from,
                        format!(
                            "{who}: nothing received for {:.1} s (not even a heartbeat){}",
                            timing.dead_after.as_secs_f64(),
                            if heard { "" } else { REFUSED }
                        ),
                    ));
                    return;
                }
            };
            heard = true;
            if inbox.send(Incoming::Frame(from, frame)).is_err() {
                return;
            }
        }
    });
    rt.spawn(async move {
        let beat = Frame::empty(Kind::Heartbeat);
        loop {
            let frame = tokio::select! {
                biased;
                () = gone.notified() => return,
                f = queue.recv() => match f {
                    Some(Out::Frame(sent, f)) => {
                        if !timing.delay.is_zero() {
                            tokio::time::sleep_until(sent + timing.delay).await;
                        }
                        f
                    }
                    Some(Out::Flush(done)) => {
                        if writer.flush().await.is_err() {
                            return;
                        }
                        let _ = done.send(());
                        continue;
                    }
                    None => return,
                },
                () = tokio::time::sleep(timing.heartbeat) => beat.clone(),
            };
            let written = tokio::select! {
                biased;
                () = gone.notified() => false,
                r = writer.write_frame(frame) => r.is_ok(),
            };
            if !written {
                // The reader reports the loss (a failed connection fails both ways).
                return;
            }
        }
    });
    Link {
        id,
        side,
        peer,
        out,
        stats,
    }
}
