//! hesper-ring: what carries hidden states between ring nodes (see the crate README).
//!
//! * [`frame`]: the checked frame layout every transport carries;
//! * [`wire`]: hidden states as f32, f16 or Q8_0 payloads;
//! * [`link`]: a link to one neighbour, with heartbeats and loss detection;
//! * [`Net`]: a node's links over the transport it was given, and their one inbox.

mod auth;
pub mod frame;
pub mod link;
mod tcp;
mod throttle;
mod udp;
#[cfg(target_os = "linux")]
mod uring;
pub mod wire;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use thiserror::Error;

pub use auth::{hmac, RingKey, MAC_LEN};
pub use frame::{Dtype, Frame, FrameError, Header, Kind};
pub use link::{From, Incoming, Link, LinkStats, Side, Timing};
pub use udp::{Chaos, DATAGRAM};

use link::{spawn_link, FrameRead, FrameWrite, LinkContext, LinkError};

/// Which transport carries a node's links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// TCP (tokio).
    Tcp,
    /// UDP datagrams with reassembly and retransmission.
    Udp,
    /// TCP connections driven through io_uring (Linux; the same frames as `Tcp`, so the two
    /// interoperate). Where io_uring is unavailable, `Net::new` falls back to `Tcp` and says so.
    Uring,
}

/// What a node's links need to know.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConfig {
    /// The transport.
    pub transport: TransportKind,
    /// Heartbeats and loss detection.
    pub timing: Timing,
    /// The longest payload accepted (longer frames are refused from their header).
    pub max_payload: u32,
    /// Loss injected into outgoing UDP datagrams (a test hook; `None` in use).
    pub chaos: Option<Chaos>,
    /// The ring key every link is authenticated with (`None`: links are not authenticated).
    pub key: Option<RingKey>,
}

impl NetConfig {
    /// The longest payload a transport must read: a MAC rides after an authenticated one.
    fn wire_max(&self) -> u32 {
        let mac = if self.key.is_some() {
            MAC_LEN as u32
        } else {
            0
        };
        self.max_payload.saturating_add(mac)
    }
}

/// Why a link could not be made.
#[derive(Debug, Error)]
pub enum NetError {
    /// The I/O runtime could not start.
    #[error("cannot start the network runtime: {0}")]
    Runtime(std::io::Error),
    /// The listening address cannot be used.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The next node did not answer in time.
    #[error("cannot connect to {addr} within {secs:.0} s: {last}")]
    Connect {
        /// The address.
        addr: SocketAddr,
        /// How long it was tried.
        secs: f64,
        /// The last error.
        last: String,
    },
    /// No predecessor connected in time.
    #[error("no node connected to {addr} within {secs:.0} s{refused}")]
    Accept {
        /// The listening address.
        addr: String,
        /// How long it waited.
        secs: f64,
        /// The last connection refused meanwhile, if any ("; " and the reason).
        refused: String,
    },
}

/// A node's network side: the I/O runtime, its links and their inbox.
pub struct Net {
    rt: tokio::runtime::Runtime,
    config: NetConfig,
    cx: LinkContext,
    inbox: mpsc::Receiver<Incoming>,
    pending: VecDeque<Incoming>,
    listening: Option<SocketAddr>,
}

impl Net {
    /// Starts the I/O runtime (one thread; the node computes on its own).
    pub fn new(mut config: NetConfig) -> Result<Self, NetError> {
        let mut pending = VecDeque::new();
        if config.transport == TransportKind::Uring {
            if let Err(why) = uring_available() {
                pending.push_back(Incoming::Note(format!(
                    "io_uring is unavailable here ({why}); using plain TCP sockets (the same frames: the other nodes need not change)"
                )));
                config.transport = TransportKind::Tcp;
            }
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("hesper-ring-io")
            .enable_all()
            .build()
            .map_err(NetError::Runtime)?;
        let (tx, inbox) = mpsc::channel();
        Ok(Self {
            rt,
            cx: LinkContext {
                next_id: Arc::new(AtomicU64::new(1)),
                inbox: tx,
                timing: config.timing,
            },
            config,
            inbox,
            pending,
            listening: None,
        })
    }

    /// The settings this node runs with.
    pub fn config(&self) -> &NetConfig {
        &self.config
    }

    /// Listens on `addr` for predecessors: each one whose first frame is well-formed arrives
    /// as [`Incoming::Joined`]; any other is refused with an [`Incoming::Note`] saying why.
    /// Returns the bound address (port 0 picks one).
    pub fn listen(&mut self, addr: SocketAddr) -> Result<SocketAddr, NetError> {
        let bound = match self.config.transport {
            TransportKind::Tcp | TransportKind::Uring => self.listen_tcp(addr)?,
            TransportKind::Udp => self.listen_udp(addr)?,
        };
        self.listening = Some(bound);
        Ok(bound)
    }

    fn listen_tcp(&mut self, addr: SocketAddr) -> Result<SocketAddr, NetError> {
        let listener = {
            let _guard = self.rt.enter();
            tcp::listen(addr).map_err(|source| NetError::Listen { addr, source })?
        };
        let bound = listener
            .local_addr()
            .map_err(|source| NetError::Listen { addr, source })?;
        let (cx, max) = (self.cx.clone(), self.config.wire_max());
        let (key, kind) = (self.config.key.clone(), self.config.transport);
        let handle = self.rt.handle().clone();
        self.rt.spawn(async move {
            while let Ok((stream, peer)) = listener.accept().await {
                let (cx, handle, key) = (cx.clone(), handle.clone(), key.clone());
                tokio::spawn(async move {
                    let refuse = |why: String| {
                        let _ = cx.inbox.send(Incoming::Note(format!(
                            "refused a connection from {peer}: {why}"
                        )));
                    };
                    let stats = Arc::new(LinkStats::default());
                    let admitted = match kind {
                        #[cfg(target_os = "linux")]
                        TransportKind::Uring => match stream.into_std() {
                            Ok(s) => match uring::split(s, max) {
                                Ok(rw) => {
                                    first_then_admit(&handle, &cx, key, peer, rw, stats).await
                                }
                                Err(e) => Err(e.to_string()),
                            },
                            Err(e) => Err(e.to_string()),
                        },
                        _ => match tcp::split(stream, max) {
                            Ok(rw) => first_then_admit(&handle, &cx, key, peer, rw, stats).await,
                            Err(e) => Err(e.to_string()),
                        },
                    };
                    if let Err(why) = admitted {
                        refuse(why);
                    }
                });
            }
        });
        Ok(bound)
    }

    fn listen_udp(&mut self, addr: SocketAddr) -> Result<SocketAddr, NetError> {
        let (cx, max, chaos) = (self.cx.clone(), self.config.wire_max(), self.config.chaos);
        let key = self.config.key.clone();
        let handle = self.rt.handle().clone();
        // Bound here, so a port in use is this call's error.
        let probe =
            std::net::UdpSocket::bind(addr).map_err(|source| NetError::Listen { addr, source })?;
        let bound = probe
            .local_addr()
            .map_err(|source| NetError::Listen { addr, source })?;
        drop(probe);
        // Each predecessor gets its own socket on the listening address, connected to it (the
        // kernel hands a connected socket its peer's datagrams); a fresh one waits for the next.
        self.rt.spawn(async move {
            // A flood of stray datagrams is one line a second, with a count.
            let throttle = std::sync::Mutex::new(throttle::Throttle::new(Duration::from_secs(1)));
            loop {
                let stats = Arc::new(LinkStats::default());
                let refuse = |peer: SocketAddr, why: &str| {
                    let admitted = throttle
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .admit(Instant::now());
                    let more = match admitted {
                        None => return,
                        Some(0) => String::new(),
                        Some(n) => format!(" ({n} more refused since the last report)"),
                    };
                    let _ = cx.inbox.send(Incoming::Note(format!(
                        "refused a datagram from {peer}: {why}{more}"
                    )));
                };
                match udp::accept(bound, Arc::clone(&stats), chaos, max, refuse).await {
                    Ok((reader, writer, peer)) => {
                        let (cx, handle, key) = (cx.clone(), handle.clone(), key.clone());
                        tokio::spawn(async move {
                            let rw = (reader, writer);
                            if let Err(why) =
                                first_then_admit(&handle, &cx, key, peer, rw, stats).await
                            {
                                let _ = cx.inbox.send(Incoming::Note(format!(
                                    "refused a link from {peer}: {why}"
                                )));
                            }
                        });
                    }
                    Err(e) => {
                        let _ = cx
                            .inbox
                            .send(Incoming::Note(format!("cannot listen on {bound}: {e}")));
                        return;
                    }
                }
            }
        });
        Ok(bound)
    }

    /// Connects to the node at `addr`, retrying with back-off (0.05 s doubling to 1 s) while
    /// the ring forms, for at most `wait`.
    pub fn connect(&self, addr: SocketAddr, wait: Duration) -> Result<Link, NetError> {
        let stats = Arc::new(LinkStats::default());
        let failed = |last: String| NetError::Connect {
            addr,
            secs: wait.as_secs_f64(),
            last,
        };
        let max = self.config.wire_max();
        match self.config.transport {
            TransportKind::Tcp => {
                let stream = self.rt.block_on(tcp::connect_with_backoff(addr, wait));
                let stream = stream.map_err(|e| failed(e.to_string()))?;
                let _guard = self.rt.enter();
                let rw = tcp::split(stream, max).map_err(|e| failed(e.to_string()))?;
                self.start_next(addr, rw, stats).map_err(failed)
            }
            #[cfg(target_os = "linux")]
            TransportKind::Uring => {
                let stream = self.rt.block_on(tcp::connect_with_backoff(addr, wait));
                let stream = stream
                    .and_then(|s| s.into_std())
                    .map_err(|e| failed(e.to_string()))?;
                let rw = uring::split(stream, max).map_err(|e| failed(e.to_string()))?;
                self.start_next(addr, rw, stats).map_err(failed)
            }
            #[cfg(not(target_os = "linux"))]
            TransportKind::Uring => unreachable!("Net::new falls back to TCP off Linux"),
            TransportKind::Udp => {
                let chaos = self.config.chaos;
                let rw = self
                    .rt
                    .block_on(udp::connect(addr, wait, Arc::clone(&stats), chaos, max))
                    .map_err(|e| failed(e.to_string()))?;
                self.start_next(addr, rw, stats).map_err(failed)
            }
        }
    }

    /// Starts the link to the next node, after the key handshake when the ring has a key.
    fn start_next<R: FrameRead, W: FrameWrite>(
        &self,
        addr: SocketAddr,
        (r, w): (R, W),
        stats: Arc<LinkStats>,
    ) -> Result<Link, String> {
        let handle = self.rt.handle();
        let peer = addr.to_string();
        let Some(key) = &self.config.key else {
            return Ok(spawn_link(handle, Side::Next, peer, r, w, &self.cx, stats));
        };
        let shake = async { tokio::time::timeout(HANDSHAKE, auth::connector(r, w, key)).await };
        match self.rt.block_on(shake) {
            Ok(Ok((r, w))) => Ok(spawn_link(handle, Side::Next, peer, r, w, &self.cx, stats)),
            Ok(Err(e @ LinkError::Auth(_))) => Err(e.to_string()),
            // A node without the key refuses the handshake by closing the connection.
            Ok(Err(_)) | Err(_) => Err("the next node did not answer the key handshake (is it started with the same --ring-key?)".into()),
        }
    }

    /// Waits at most `wait` for a predecessor ([`Net::listen`] first); events that come
    /// before it are kept for [`Net::recv`].
    pub fn accept(&mut self, wait: Duration) -> Result<Link, NetError> {
        let deadline = Instant::now() + wait;
        let mut held = VecDeque::new();
        let result = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.recv(left) {
                Some(Incoming::Joined(link)) => break Ok(link),
                Some(other) => held.push_back(other),
                None => {
                    let refused = held.iter().rev().find_map(|e| match e {
                        Incoming::Note(n) => Some(format!("; {n}")),
                        _ => None,
                    });
                    break Err(NetError::Accept {
                        addr: self.listening.map_or_else(|| "-".into(), |a| a.to_string()),
                        secs: wait.as_secs_f64(),
                        refused: refused.unwrap_or_default(),
                    });
                }
            }
        };
        held.extend(self.pending.drain(..));
        self.pending = held;
        result
    }

    /// The next event, waiting at most `wait`.
    pub fn recv(&mut self, wait: Duration) -> Option<Incoming> {
        if let Some(e) = self.pending.pop_front() {
            return Some(e);
        }
        self.inbox.recv_timeout(wait).ok()
    }
}

/// Whether io_uring can carry links here (`Err`: why not).
fn uring_available() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    return uring::available();
    #[cfg(not(target_os = "linux"))]
    return Err("io_uring is Linux's".into());
}

/// Reads a new predecessor's first frame, then [`admit`]s it; `Err` says why it was refused.
async fn first_then_admit<R: FrameRead, W: FrameWrite>(
    handle: &tokio::runtime::Handle,
    cx: &LinkContext,
    key: Option<RingKey>,
    peer: SocketAddr,
    (mut reader, writer): (R, W),
    stats: Arc<LinkStats>,
) -> Result<(), String> {
    let first = match tokio::time::timeout(cx.timing.dead_after, reader.read_frame()).await {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err("it sent no frame".into()),
    };
    admit(handle, cx, key, peer, (reader, writer), first, stats).await;
    Ok(())
}

/// How long a link's key handshake may take.
const HANDSHAKE: Duration = Duration::from_secs(5);

/// Admits a predecessor whose first frame is `first` (after the key handshake when the ring
/// has a key): its link goes to the node, then that frame unless it was a heartbeat or the
/// handshake's. One that fails is refused with a note saying why.
async fn admit<R: FrameRead, W: FrameWrite>(
    handle: &tokio::runtime::Handle,
    cx: &LinkContext,
    key: Option<RingKey>,
    peer: SocketAddr,
    (reader, writer): (R, W),
    first: Frame,
    stats: Arc<LinkStats>,
) {
    let refuse = |why: &str| {
        let _ = cx.inbox.send(Incoming::Note(format!(
            "refused a connection from {peer}: {why}"
        )));
    };
    let (link, first) = match key {
        None if first.header.kind == Kind::Auth => {
            return refuse("it opened with a key handshake, and this node has no --ring-key")
        }
        None => (
            spawn_link(
                handle,
                Side::Prev,
                peer.to_string(),
                reader,
                writer,
                cx,
                stats,
            ),
            Some(first),
        ),
        Some(key) => {
            // A UDP link opens with a heartbeat (its probe); the handshake comes next.
            let (mut reader, mut first) = (reader, first);
            while first.header.kind == Kind::Heartbeat {
                first = match tokio::time::timeout(HANDSHAKE, reader.read_frame()).await {
                    Ok(Ok(f)) => f,
                    Ok(Err(e)) => return refuse(&e.to_string()),
                    Err(_) => return refuse("the key handshake timed out"),
                };
            }
            let shake = auth::acceptor(first, reader, writer, &key);
            match tokio::time::timeout(HANDSHAKE, shake).await {
                Ok(Ok((r, w))) => (
                    spawn_link(handle, Side::Prev, peer.to_string(), r, w, cx, stats),
                    None,
                ),
                Ok(Err(e)) => return refuse(&e.to_string()),
                Err(_) => return refuse("the key handshake timed out"),
            }
        }
    };
    let from = From {
        id: link.id(),
        side: Side::Prev,
    };
    let _ = cx.inbox.send(Incoming::Joined(link));
    if let Some(f) = first.filter(|f| f.header.kind != Kind::Heartbeat) {
        let _ = cx.inbox.send(Incoming::Frame(from, f));
    }
}
