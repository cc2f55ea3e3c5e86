//! `--ring-key`: links authenticated with HMAC-SHA-256. When a link opens, the two ends trade
//! nonces and derive one key per direction from the ring key and both nonces; from then on
//! every frame (heartbeats too) carries a 32-byte MAC over a per-direction frame counter, its
//! header and its payload. A node that does not know the key cannot join or inject frames, and
//! a recorded frame replayed — on this link or another, now or in a later session — fails its
//! MAC (the counter and the nonces differ). Frames are authenticated, not encrypted.
//!
//! ```text
//! connector → acceptor: Auth, payload nonce_c (16 bytes)          (no MAC)
//! acceptor → connector: Auth, payload nonce_a, MAC under k_ac, counter 0
//! connector → acceptor: Auth, empty payload,   MAC under k_ca, counter 0
//! k = HMAC(ring key, "hesper-ring v1" ‖ nonce_c ‖ nonce_a); k_ac = HMAC(k, "a→c"), k_ca = HMAC(k, "c→a")
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::frame::{Frame, Header, Kind};
use crate::link::{FrameRead, FrameWrite, LinkError};

/// Bytes of MAC after an authenticated frame's payload.
pub const MAC_LEN: usize = 32;
const NONCE_LEN: usize = 16;

/// The secret every node of a ring is given.
#[derive(Clone)]
pub struct RingKey(Arc<[u8]>);

impl RingKey {
    /// A key from its bytes (a passphrase's UTF-8 is fine: it is only ever HMAC'd).
    pub fn new(bytes: &[u8]) -> Self {
        Self(bytes.into())
    }
}

impl std::fmt::Debug for RingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RingKey(…)")
    }
}

impl PartialEq for RingKey {
    fn eq(&self, other: &Self) -> bool {
        same(&self.0, &other.0)
    }
}

/// HMAC-SHA-256 (RFC 2104) of the concatenated `parts`.
pub fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Equality in time that does not depend on where two MACs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// A value used once: the clock, the process, a counter (uniqueness is what a nonce needs).
fn nonce() -> [u8; NONCE_LEN] {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let c = COUNT.fetch_add(1, Ordering::Relaxed);
    let d = Sha256::digest(
        [
            &t.to_le_bytes()[..],
            &std::process::id().to_le_bytes(),
            &c.to_le_bytes(),
        ]
        .concat(),
    );
    let mut n = [0u8; NONCE_LEN];
    n.copy_from_slice(&d[..NONCE_LEN]);
    n
}

/// Reads frames and checks their MACs.
pub(crate) struct AuthReader<R> {
    inner: R,
    key: [u8; 32],
    counter: u64,
}

/// Writes frames with MACs.
pub(crate) struct AuthWriter<W> {
    inner: W,
    key: [u8; 32],
    counter: u64,
}

/// Checks the MAC of `f`, the `counter`-th frame of its direction, and strips it.
fn open(key: &[u8; 32], counter: u64, f: Frame) -> Result<Frame, LinkError> {
    let Some(body_len) = f.payload.len().checked_sub(MAC_LEN) else {
        return Err(LinkError::Auth("a frame without its MAC".into()));
    };
    let (body, mac) = f.payload.split_at(body_len);
    let want = hmac(key, &[&counter.to_le_bytes(), &f.header.encode(), body]);
    if !same(mac, &want) {
        return Err(LinkError::Auth(
            "a frame with a wrong MAC (another ring key, or a forged or replayed frame)".into(),
        ));
    }
    let mut header = f.header;
    header.len = body_len as u32;
    Ok(Frame {
        header,
        payload: body.to_vec(),
    })
}

/// `frame` with the MAC of the `counter`-th frame of its direction appended.
fn seal(key: &[u8; 32], counter: u64, frame: &Frame) -> Frame {
    let mut header = frame.header;
    header.len = (frame.payload.len() + MAC_LEN) as u32;
    let mac = hmac(
        key,
        &[&counter.to_le_bytes(), &header.encode(), &frame.payload],
    );
    let mut payload = Vec::with_capacity(frame.payload.len() + MAC_LEN);
    payload.extend_from_slice(&frame.payload);
    payload.extend_from_slice(&mac);
    Frame { header, payload }
}

impl<R: FrameRead> FrameRead for AuthReader<R> {
    async fn read_frame(&mut self) -> Result<Frame, LinkError> {
        let f = self.inner.read_frame().await?;
        let f = open(&self.key, self.counter, f)?;
        self.counter += 1;
        Ok(f)
    }
}

impl<W: FrameWrite> FrameWrite for AuthWriter<W> {
    async fn write_frame(&mut self, frame: Frame) -> Result<(), LinkError> {
        let sealed = seal(&self.key, self.counter, &frame);
        self.counter += 1;
        self.inner.write_frame(sealed).await
    }

    async fn flush(&mut self) -> Result<(), LinkError> {
        self.inner.flush().await
    }
}

/// The per-direction keys of a link: (acceptor → connector, connector → acceptor).
fn link_keys(key: &RingKey, nc: &[u8], na: &[u8]) -> ([u8; 32], [u8; 32]) {
    let k = hmac(&key.0, &[b"hesper-ring v1", nc, na]);
    (hmac(&k, &[b"a->c"]), hmac(&k, &[b"c->a"]))
}

/// The next frame that is not a heartbeat.
async fn next_frame(r: &mut impl FrameRead) -> Result<Frame, LinkError> {
    loop {
        let f = r.read_frame().await?;
        if f.header.kind != Kind::Heartbeat {
            return Ok(f);
        }
    }
}

/// The connecting end's handshake.
pub(crate) async fn connector<R: FrameRead, W: FrameWrite>(
    mut r: R,
    mut w: W,
    key: &RingKey,
) -> Result<(AuthReader<R>, AuthWriter<W>), LinkError> {
    let nc = nonce();
    w.write_frame(Frame::new(Header::new(Kind::Auth), nc.to_vec()))
        .await?;
    let reply = next_frame(&mut r).await?;
    if reply.header.kind != Kind::Auth || reply.payload.len() != NONCE_LEN + MAC_LEN {
        return Err(LinkError::Auth(
            "the next node did not answer the key handshake (is it started with the same --ring-key?)"
                .into(),
        ));
    }
    let na = reply.payload[..NONCE_LEN].to_vec();
    let (k_ac, k_ca) = link_keys(key, &nc, &na);
    open(&k_ac, 0, reply)
        .map_err(|_| LinkError::Auth("the next node holds another --ring-key".into()))?;
    w.write_frame(seal(&k_ca, 0, &Frame::empty(Kind::Auth)))
        .await?;
    Ok((
        AuthReader {
            inner: r,
            key: k_ac,
            counter: 1,
        },
        AuthWriter {
            inner: w,
            key: k_ca,
            counter: 1,
        },
    ))
}

/// The accepting end's handshake, `first` being the connector's first frame.
pub(crate) async fn acceptor<R: FrameRead, W: FrameWrite>(
    first: Frame,
    r: R,
    mut w: W,
    key: &RingKey,
) -> Result<(AuthReader<R>, AuthWriter<W>), LinkError> {
    if first.header.kind != Kind::Auth || first.payload.len() != NONCE_LEN {
        return Err(LinkError::Auth(
            "it did not open with the key handshake (this node is started with --ring-key)".into(),
        ));
    }
    let na = nonce();
    let (k_ac, k_ca) = link_keys(key, &first.payload, &na);
    w.write_frame(seal(
        &k_ac,
        0,
        &Frame::new(Header::new(Kind::Auth), na.to_vec()),
    ))
    .await?;
    let mut reader = AuthReader {
        inner: r,
        key: k_ca,
        counter: 0,
    };
    let confirm = next_frame(&mut reader)
        .await
        .map_err(|_| LinkError::Auth("it holds another --ring-key".into()))?;
    if confirm.header.kind != Kind::Auth {
        return Err(LinkError::Auth("it broke the key handshake".into()));
    }
    Ok((
        reader,
        AuthWriter {
            inner: w,
            key: k_ac,
            counter: 1,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2.
        let mac = hmac(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_sealed_frame_opens_once_in_place_and_nowhere_else() {
        let key = [7u8; 32];
        let mut h = Header::new(Kind::Forward);
        h.seq = 3;
        let f = Frame::new(h, vec![1, 2, 3]);
        let sealed = seal(&key, 5, &f);
        assert_eq!(sealed.payload.len(), 3 + MAC_LEN);
        assert_eq!(open(&key, 5, sealed.clone()).unwrap(), f);
        // Replayed later in the stream, under another key, or with a byte changed: refused.
        assert!(open(&key, 6, sealed.clone()).is_err());
        assert!(open(&[8u8; 32], 5, sealed.clone()).is_err());
        let mut tampered = sealed.clone();
        tampered.payload[0] ^= 1;
        assert!(open(&key, 5, tampered).is_err());
        let mut moved = sealed;
        moved.header.seq = 4;
        assert!(open(&key, 5, moved).is_err());
    }

    #[test]
    fn each_link_direction_has_its_own_key() {
        let k = RingKey::new(b"secret");
        let (ac, ca) = link_keys(&k, &[1; 16], &[2; 16]);
        assert_ne!(ac, ca);
        assert_ne!(link_keys(&k, &[1; 16], &[3; 16]).0, ac);
        assert_ne!(link_keys(&RingKey::new(b"other"), &[1; 16], &[2; 16]).0, ac);
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce(), nonce());
    }
}
