//! UDP links: each frame is cut into datagrams of at most [`DATAGRAM`] bytes and reassembled
//! with a bitmap; the receiver acknowledges each whole frame and asks again for the chunks it
//! is missing (a NACK), and the sender, waiting for the acknowledgement, probes when it hears
//! nothing — so frames arrive whole, once and in order despite loss, duplication and
//! reordering. One frame is in flight per direction: the next waits for its acknowledgement.
//!
//! ```text
//! datagram: magic "HSRU" | type u8 (1 data, 2 ack, 3 nack) | 3 zero bytes | frame id u64
//!           | data: chunk u32, chunks u32, bytes…   ack: -   nack: count u32, 0, chunk u32 × count
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::{mpsc as tmpsc, Notify};

use crate::frame::{Frame, FrameError, HEADER_LEN};
use crate::link::{FrameRead, FrameWrite, LinkError, LinkStats};

/// Largest datagram sent (fits an Ethernet MTU with IP and UDP headers).
pub const DATAGRAM: usize = 1400;
const MAGIC: [u8; 4] = *b"HSRU";
const HEAD: usize = 24;
/// Frame bytes per data datagram.
const CHUNK: usize = DATAGRAM - HEAD;
const DATA: u8 = 1;
const ACK: u8 = 2;
const NACK: u8 = 3;
/// Most chunk numbers in one NACK.
const NACK_MAX: usize = (DATAGRAM - HEAD) / 4;
/// Datagrams sent back to back before the sender lets the receiver catch up.
const BURST: usize = 32;
/// A receiver missing chunks asks for them after this long without a new one.
const NACK_AFTER: Duration = Duration::from_millis(15);
/// A sender without an acknowledgement probes after this long (doubling to 200 ms).
const PROBE_AFTER: Duration = Duration::from_millis(25);
/// Socket buffers asked of the kernel (it grants at most `net.core.[rw]mem_max`).
const SOCKET_BUFFER: usize = 8 << 20;

/// Loss, duplication and reordering injected into a link's outgoing datagrams (a test hook:
/// generation must stay exact under it).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Chaos {
    /// Probability that a datagram is dropped.
    pub drop: f64,
    /// Probability that a datagram is sent twice.
    pub duplicate: f64,
    /// Probability that a datagram is held back and sent after the next one.
    pub reorder: f64,
}

/// What the two halves of a link share: the socket, and what the peer acknowledged.
struct Shared {
    sock: UdpSocket,
    acks: Mutex<Acks>,
    wake: Notify,
    stats: Arc<LinkStats>,
    chaos: Option<Mutex<ChaosState>>,
}

#[derive(Default)]
struct Acks {
    /// Every frame id up to this one is acknowledged.
    acked: u64,
    /// Chunks the peer asked for again, for a frame id.
    nack: Option<(u64, Vec<u32>)>,
}

struct ChaosState {
    odds: Chaos,
    rng: u64,
    held: Option<Vec<u8>>,
}

impl ChaosState {
    /// The datagrams to send now in place of `d`: none (dropped, or held back to go after
    /// the next one), `d`, or `d` twice; a datagram held back follows.
    fn pass(&mut self, d: &[u8]) -> Vec<Vec<u8>> {
        let odds = self.odds;
        if self.roll() < odds.drop {
            return Vec::new();
        }
        if self.roll() < odds.reorder && self.held.is_none() {
            self.held = Some(d.to_vec());
            return Vec::new();
        }
        let mut out = vec![d.to_vec()];
        if self.roll() < odds.duplicate {
            out.push(d.to_vec());
        }
        out.extend(self.held.take());
        out
    }

    fn roll(&mut self) -> f64 {
        // xorshift64*: deterministic per link, good enough to pick datagrams.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Shared {
    /// Sends one datagram, through the chaos hook when there is one.
    async fn emit(&self, d: &[u8]) -> std::io::Result<()> {
        let out = match &self.chaos {
            None => return self.sock.send(d).await.map(drop),
            Some(c) => c.lock().unwrap_or_else(|e| e.into_inner()).pass(d),
        };
        for d in out {
            self.sock.send(&d).await?;
        }
        Ok(())
    }

    async fn control(&self, kind: u8, id: u64, chunks: &[u32]) -> std::io::Result<()> {
        let mut d = head(kind, id);
        if kind == NACK {
            d[16..20].copy_from_slice(&(chunks.len() as u32).to_le_bytes());
            d.extend(chunks.iter().flat_map(|c| c.to_le_bytes()));
        }
        self.emit(&d).await
    }
}

fn head(kind: u8, id: u64) -> Vec<u8> {
    let mut d = Vec::with_capacity(DATAGRAM);
    d.extend_from_slice(&MAGIC);
    d.extend_from_slice(&[kind, 0, 0, 0]);
    d.extend_from_slice(&id.to_le_bytes());
    d.extend_from_slice(&[0; 8]);
    d
}

/// A datagram's fields.
struct Datagram<'a> {
    kind: u8,
    id: u64,
    a: u32,
    b: u32,
    body: &'a [u8],
}

fn parse(d: &[u8]) -> Option<Datagram<'_>> {
    if d.len() < HEAD || d[..4] != MAGIC || !(DATA..=NACK).contains(&d[4]) {
        return None;
    }
    let u32_at = |i: usize| u32::from_le_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]]);
    Some(Datagram {
        kind: d[4],
        id: u64::from_le_bytes(d[8..16].try_into().ok()?),
        a: u32_at(16),
        b: u32_at(20),
        body: &d[HEAD..],
    })
}

/// A frame being reassembled.
struct Partial {
    id: u64,
    have: Vec<bool>,
    missing: usize,
    bytes: Vec<u8>,
}

/// Reads frames from a UDP link (and handles the peer's acknowledgements of ours).
pub(crate) struct UdpReader {
    sh: Arc<Shared>,
    max_payload: u32,
    /// The next frame id to deliver.
    expected: u64,
    partial: Option<Partial>,
    /// Data datagrams, from the pump.
    data: tmpsc::UnboundedReceiver<Vec<u8>>,
    /// A datagram received before the link existed (the acceptor's first).
    first: Option<Vec<u8>>,
}

impl UdpReader {
    /// Handles one data datagram; a whole frame when it completes one.
    async fn take(&mut self, d: &[u8]) -> Result<Option<Frame>, LinkError> {
        let Some(g) = parse(d).filter(|g| g.kind == DATA) else {
            return Ok(None);
        };
        if g.id < self.expected {
            // A chunk of a frame already delivered: its acknowledgement was lost.
            self.sh.control(ACK, g.id, &[]).await?;
            return Ok(None);
        }
        if g.id > self.expected {
            return Ok(None);
        }
        self.chunk(g).await
    }

    async fn chunk(&mut self, g: Datagram<'_>) -> Result<Option<Frame>, LinkError> {
        let (index, n) = (g.a as usize, g.b as usize);
        let max_chunks = (HEADER_LEN + self.max_payload as usize).div_ceil(CHUNK);
        if n == 0 || n > max_chunks {
            return Err(FrameError::TooLong {
                len: (n * CHUNK) as u32,
                max: self.max_payload,
            }
            .into());
        }
        let p = self.partial.get_or_insert_with(|| Partial {
            id: g.id,
            have: vec![false; n],
            missing: n,
            bytes: vec![0; n * CHUNK],
        });
        let full = index + 1 < n;
        if p.have.len() != n
            || index >= n
            || (full && g.body.len() != CHUNK)
            || g.body.len() > CHUNK
        {
            return Ok(None);
        }
        if !p.have[index] {
            p.have[index] = true;
            p.missing -= 1;
            p.bytes[index * CHUNK..index * CHUNK + g.body.len()].copy_from_slice(g.body);
            if index + 1 == n {
                p.bytes.truncate(index * CHUNK + g.body.len());
            }
        }
        if p.missing > 0 {
            return Ok(None);
        }
        let Some(p) = self.partial.take() else {
            return Ok(None);
        };
        self.expected += 1;
        self.sh.control(ACK, p.id, &[]).await?;
        Ok(Some(Frame::decode(&p.bytes, self.max_payload)?))
    }

    /// Asks again for the chunks of the frame being reassembled that have not come.
    async fn nack(&self) -> Result<(), LinkError> {
        if let Some(p) = &self.partial {
            let missing: Vec<u32> = (0..p.have.len() as u32)
                .filter(|&i| !p.have[i as usize])
                .take(NACK_MAX)
                .collect();
            self.sh.control(NACK, p.id, &missing).await?;
        }
        Ok(())
    }
}

impl FrameRead for UdpReader {
    async fn read_frame(&mut self) -> Result<Frame, LinkError> {
        if let Some(d) = self.first.take() {
            if let Some(f) = self.take(&d).await? {
                return Ok(f);
            }
        }
        loop {
            let got = if self.partial.is_some() {
                match tokio::time::timeout(NACK_AFTER, self.data.recv()).await {
                    Ok(d) => d,
                    Err(_) => {
                        self.nack().await?;
                        continue;
                    }
                }
            } else {
                self.data.recv().await
            };
            let Some(d) = got else {
                return Err(LinkError::Closed);
            };
            if let Some(f) = self.take(&d).await? {
                return Ok(f);
            }
        }
    }
}

/// Receives every datagram of a link: acknowledgements go straight to the writer (so a frame
/// is acknowledged whether or not anyone reads), data to the reader. `heard`: whether the peer
/// has sent a datagram already. Ends (and the reader finds the link closed) when the link
/// fails, or when the kernel says that nothing listens at the peer's port any more.
async fn pump(sh: Arc<Shared>, data: tmpsc::UnboundedSender<Vec<u8>>, mut heard: bool) {
    let mut buf = vec![0u8; DATAGRAM + 64];
    loop {
        let n = match sh.sock.recv(&mut buf).await {
            Ok(n) => n,
            // An ICMP error, not a datagram: the peer's port is closed. Before the peer has
            // answered it may not be open yet; after, the peer is gone (a process that ended
            // closes its socket), which this says at once where silence takes `dead_after`.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                if heard {
                    return;
                }
                tokio::time::sleep(PROBE_AFTER).await;
                continue;
            }
            Err(_) => return,
        };
        let Some(g) = parse(&buf[..n]) else {
            continue;
        };
        heard = true;
        match g.kind {
            ACK => {
                let mut acks = sh.acks.lock().unwrap_or_else(|e| e.into_inner());
                acks.acked = acks.acked.max(g.id);
            }
            NACK => {
                let n = (g.a as usize).min(g.body.len() / 4);
                let chunks = g.body[..n * 4]
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                sh.acks.lock().unwrap_or_else(|e| e.into_inner()).nack = Some((g.id, chunks));
            }
            _ => {
                if data.send(buf[..n].to_vec()).is_err() {
                    return;
                }
                continue;
            }
        }
        sh.wake.notify_one();
    }
}

/// Writes frames to a UDP link, each one until the peer acknowledges it.
pub(crate) struct UdpWriter {
    sh: Arc<Shared>,
    next_id: u64,
}

impl UdpWriter {
    async fn send_chunks(
        &self,
        id: u64,
        bytes: &[u8],
        which: impl Iterator<Item = usize>,
    ) -> Result<(), LinkError> {
        let n = bytes.len().div_ceil(CHUNK).max(1);
        for (sent, i) in which.filter(|&i| i < n).enumerate() {
            let mut d = head(DATA, id);
            d[16..20].copy_from_slice(&(i as u32).to_le_bytes());
            d[20..24].copy_from_slice(&(n as u32).to_le_bytes());
            d.extend_from_slice(&bytes[i * CHUNK..((i + 1) * CHUNK).min(bytes.len())]);
            self.sh.emit(&d).await?;
            if sent % BURST == BURST - 1 {
                tokio::task::yield_now().await;
            }
        }
        Ok(())
    }
}

impl FrameWrite for UdpWriter {
    async fn write_frame(&mut self, frame: Frame) -> Result<(), LinkError> {
        self.next_id += 1;
        let id = self.next_id;
        let bytes = frame.encode();
        let n = bytes.len().div_ceil(CHUNK);
        self.send_chunks(id, &bytes, 0..n).await?;
        let mut wait = PROBE_AFTER;
        loop {
            let woke = tokio::time::timeout(wait, self.sh.wake.notified())
                .await
                .is_ok();
            let nack = {
                let mut acks = self.sh.acks.lock().unwrap_or_else(|e| e.into_inner());
                if acks.acked >= id {
                    return Ok(());
                }
                acks.nack.take().filter(|(nid, _)| *nid == id)
            };
            let resend: Vec<usize> = match (nack, woke) {
                (Some((_, chunks)), _) => chunks.into_iter().map(|c| c as usize).collect(),
                (None, true) => continue,
                // Nothing heard: the last chunk again makes the receiver acknowledge or
                // say what it lacks.
                (None, false) => {
                    wait = (wait * 2).min(Duration::from_millis(200));
                    vec![n - 1]
                }
            };
            self.sh
                .stats
                .retransmits
                .fetch_add(resend.len() as u64, std::sync::atomic::Ordering::Relaxed);
            self.send_chunks(id, &bytes, resend.into_iter()).await?;
        }
    }
}

fn socket(local: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(local), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_recv_buffer_size(SOCKET_BUFFER)?;
    s.set_send_buffer_size(SOCKET_BUFFER)?;
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    s.bind(&local.into())?;
    UdpSocket::from_std(s.into())
}

fn halves(
    sock: UdpSocket,
    stats: Arc<LinkStats>,
    chaos: Option<Chaos>,
    max_payload: u32,
    seed: u64,
    heard: bool,
) -> (UdpReader, UdpWriter) {
    let sh = Arc::new(Shared {
        sock,
        acks: Mutex::new(Acks::default()),
        wake: Notify::new(),
        stats,
        chaos: chaos.map(|odds| {
            Mutex::new(ChaosState {
                odds,
                rng: seed | 1,
                held: None,
            })
        }),
    });
    let (tx, data) = tmpsc::unbounded_channel();
    tokio::spawn(pump(Arc::clone(&sh), tx, heard));
    (
        UdpReader {
            sh: Arc::clone(&sh),
            data,
            max_payload,
            expected: 1,
            partial: None,
            first: None,
        },
        UdpWriter { sh, next_id: 0 },
    )
}

/// Binds `addr` and waits for the first well-formed datagram; the socket then talks to its
/// sender only. Datagrams that are not ours are reported through `refuse` and ignored.
pub(crate) async fn accept(
    addr: SocketAddr,
    stats: Arc<LinkStats>,
    chaos: Option<Chaos>,
    max_payload: u32,
    refuse: impl Fn(SocketAddr, &str),
) -> std::io::Result<(UdpReader, UdpWriter, SocketAddr)> {
    let sock = socket(addr)?;
    let mut buf = vec![0u8; DATAGRAM + 64];
    loop {
        let (n, peer) = sock.recv_from(&mut buf).await?;
        match parse(&buf[..n]) {
            Some(g) if g.kind == DATA && g.id == 1 => {
                sock.connect(peer).await?;
                let (mut r, w) = halves(sock, stats, chaos, max_payload, 0x9e37_79b9, true);
                r.first = Some(buf[..n].to_vec());
                return Ok((r, w, peer));
            }
            Some(_) => refuse(peer, "a datagram of a link it is not part of"),
            None => refuse(peer, "not a hesper ring datagram"),
        }
    }
}

/// A UDP link to `addr`: a heartbeat frame is sent until the peer acknowledges it, with
/// back-off, for at most `wait`.
pub(crate) async fn connect(
    addr: SocketAddr,
    wait: Duration,
    stats: Arc<LinkStats>,
    chaos: Option<Chaos>,
    max_payload: u32,
) -> std::io::Result<(UdpReader, UdpWriter)> {
    let local: SocketAddr = if addr.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let sock = socket(local)?;
    sock.connect(addr).await?;
    let (r, mut w) = halves(sock, stats, chaos, max_payload, 0x2545_f491, false);
    let probe = Frame::empty(crate::frame::Kind::Heartbeat);
    let handshake = w.write_frame(probe);
    match tokio::time::timeout(wait, handshake).await {
        Ok(Ok(())) => Ok((r, w)),
        Ok(Err(e)) => Err(std::io::Error::other(e.to_string())),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer to UDP probes",
        )),
    }
}
