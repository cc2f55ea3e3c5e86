//! Frames: a fixed 40-byte header, then `len` payload bytes.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "HSRG"
//!      4     2  version (2)
//!      6     1  kind      (Kind)
//!      7     1  dtype     (Dtype: how a Forward payload's floats are stored)
//!      8     8  session   (the master's run; a node starts afresh on a new one)
//!     16     8  seq       (the master's step number; a prediction carries its step's)
//!     24     4  pos0      (kind-specific: a Hello's flags, a Prediction's first index)
//!     28     4  n_tokens  (rows in a Forward payload, predictions in a Prediction's)
//!     32     4  aux       (kind-specific: a Forward's entries, a Hello's context)
//!     36     4  len       (payload bytes)
//! ```
//! All little-endian. Decoding checks every field before anything is allocated: a payload
//! longer than the receiver's limit is refused from the header alone.

use thiserror::Error;

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"HSRG";
/// The frame layout version this build speaks.
pub const VERSION: u16 = 2;
/// Bytes in a header.
pub const HEADER_LEN: usize = 40;

/// What a frame is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// The ring check: each node appends its record, the master reads them all.
    Hello = 1,
    /// One step: hidden states (`n_tokens` rows of `aux` sequences, each from its own
    /// position) for the next node's layers.
    Forward = 2,
    /// The last node's predictions for a step, on their way to the master.
    Prediction = 3,
    /// "Still here" (sent when a link is otherwise idle; never handed to the node).
    Heartbeat = 4,
    /// The ring is over; the payload says why (UTF-8).
    Shutdown = 5,
    /// A node cannot go on (a lost neighbour, a refused frame); the payload says why (UTF-8).
    Fault = 6,
    /// The key handshake of a link (`--ring-key`, see `auth`).
    Auth = 7,
    /// A hot-swap between two steps: each node swaps in what changed in its model file and
    /// appends what it found, on the way round to the master.
    Reload = 8,
    /// KV caches of the master's sequences made or freed on every worker (its slots).
    Cache = 9,
    /// The round before a Hello that assigns layers: each node appends what it offers (its
    /// backend, memory and measured speed).
    Probe = 10,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Hello,
            2 => Self::Forward,
            3 => Self::Prediction,
            4 => Self::Heartbeat,
            5 => Self::Shutdown,
            6 => Self::Fault,
            7 => Self::Auth,
            8 => Self::Reload,
            9 => Self::Cache,
            10 => Self::Probe,
            _ => return None,
        })
    }
}

/// How the floats of a payload are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Dtype {
    /// Not a float payload.
    #[default]
    None = 0,
    /// 4-byte floats.
    F32 = 1,
    /// IEEE half floats.
    F16 = 2,
    /// Blocks of 32: an f16 scale and 32 signed bytes (GGML's Q8_0).
    Q8_0 = 3,
}

impl Dtype {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::None,
            1 => Self::F32,
            2 => Self::F16,
            3 => Self::Q8_0,
            _ => return None,
        })
    }
}

/// A frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame is for.
    pub kind: Kind,
    /// How float payloads are stored.
    pub dtype: Dtype,
    /// The master's run.
    pub session: u64,
    /// The master's step.
    pub seq: u64,
    /// First position of the rows.
    pub pos0: u32,
    /// Rows in the payload.
    pub n_tokens: u32,
    /// Kind-specific.
    pub aux: u32,
    /// Payload bytes.
    pub len: u32,
}

impl Header {
    /// A header of `kind` with every other field zero.
    pub fn new(kind: Kind) -> Self {
        Self {
            kind,
            dtype: Dtype::None,
            session: 0,
            seq: 0,
            pos0: 0,
            n_tokens: 0,
            aux: 0,
            len: 0,
        }
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6] = self.kind as u8;
        b[7] = self.dtype as u8;
        b[8..16].copy_from_slice(&self.session.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..28].copy_from_slice(&self.pos0.to_le_bytes());
        b[28..32].copy_from_slice(&self.n_tokens.to_le_bytes());
        b[32..36].copy_from_slice(&self.aux.to_le_bytes());
        b[36..40].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Reads and checks a header; `max_payload` bounds `len`.
    pub fn decode(b: &[u8; HEADER_LEN], max_payload: u32) -> Result<Self, FrameError> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | u64::from(u32_at(i + 4)) << 32;
        if b[0..4] != MAGIC {
            return Err(FrameError::Magic([b[0], b[1], b[2], b[3]]));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(FrameError::Version(version));
        }
        let kind = Kind::from_u8(b[6]).ok_or(FrameError::Kind(b[6]))?;
        let dtype = Dtype::from_u8(b[7]).ok_or(FrameError::Dtype(b[7]))?;
        let len = u32_at(36);
        if len > max_payload {
            return Err(FrameError::TooLong {
                len,
                max: max_payload,
            });
        }
        Ok(Self {
            kind,
            dtype,
            session: u64_at(8),
            seq: u64_at(16),
            pos0: u32_at(24),
            n_tokens: u32_at(28),
            aux: u32_at(32),
            len,
        })
    }
}

/// A header and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The header (`len` equals the payload's length).
    pub header: Header,
    /// The payload.
    pub payload: Vec<u8>,
}

impl Frame {
    /// A frame of `header` carrying `payload` (sets `len`).
    pub fn new(mut header: Header, payload: Vec<u8>) -> Self {
        header.len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        Self { header, payload }
    }

    /// A frame with no payload.
    pub fn empty(kind: Kind) -> Self {
        Self::new(Header::new(kind), Vec::new())
    }

    /// A frame whose payload is a message (Shutdown, Fault).
    pub fn text(kind: Kind, message: &str) -> Self {
        Self::new(Header::new(kind), message.as_bytes().to_vec())
    }

    /// The payload as text (Shutdown, Fault), invalid UTF-8 replaced.
    pub fn message(&self) -> String {
        String::from_utf8_lossy(&self.payload).into_owned()
    }

    /// Decodes a whole frame held in `bytes` (a datagram's reassembly, a test).
    pub fn decode(bytes: &[u8], max_payload: u32) -> Result<Self, FrameError> {
        let head: &[u8; HEADER_LEN] = bytes
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or(FrameError::Truncated {
                got: bytes.len(),
                want: HEADER_LEN,
            })?;
        let header = Header::decode(head, max_payload)?;
        let body = &bytes[HEADER_LEN..];
        if body.len() != header.len as usize {
            return Err(FrameError::Length {
                len: header.len,
                got: body.len(),
            });
        }
        Ok(Self {
            header,
            payload: body.to_vec(),
        })
    }

    /// The frame's bytes, header first.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        out.extend_from_slice(&self.header.encode());
        out.extend_from_slice(&self.payload);
        out
    }
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    /// Not a hesper ring frame at all.
    #[error("bad magic {0:02x?} (not a hesper ring frame)")]
    Magic([u8; 4]),
    /// A frame layout this build does not speak.
    #[error("frame version {0}, this build speaks version {VERSION}")]
    Version(u16),
    /// An unknown kind.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// An unknown float format.
    #[error("unknown payload dtype {0}")]
    Dtype(u8),
    /// A payload longer than this node accepts.
    #[error("payload of {len} bytes, more than the {max} this node accepts")]
    TooLong {
        /// Declared length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// Fewer bytes than a header.
    #[error("truncated frame: {got} bytes, a header needs {want}")]
    Truncated {
        /// Bytes there.
        got: usize,
        /// Bytes needed.
        want: usize,
    },
    /// A payload whose length is not the header's.
    #[error("payload of {got} bytes, the header says {len}")]
    Length {
        /// Declared length.
        len: u32,
        /// Bytes there.
        got: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_survives_encoding() {
        let mut h = Header::new(Kind::Forward);
        h.dtype = Dtype::F16;
        h.session = 0x0102_0304_0506_0708;
        h.seq = u64::MAX - 3;
        h.pos0 = 17;
        h.n_tokens = 2;
        h.aux = 0xdead_beef;
        let f = Frame::new(h, vec![1, 2, 3, 4, 5]);
        assert_eq!(Frame::decode(&f.encode(), 5), Ok(f.clone()));
        // One byte over the limit is refused from the header alone.
        assert_eq!(
            Frame::decode(&f.encode(), 4),
            Err(FrameError::TooLong { len: 5, max: 4 })
        );
    }

    #[test]
    fn each_bad_field_is_named() {
        let good = Frame::text(Kind::Fault, "x").encode();
        let with = |i: usize, v: u8| {
            let mut b = good.clone();
            b[i] = v;
            Frame::decode(&b, 64)
        };
        assert!(matches!(with(0, b'X'), Err(FrameError::Magic(_))));
        assert_eq!(with(4, 9), Err(FrameError::Version(9)));
        assert_eq!(with(6, 0), Err(FrameError::Kind(0)));
        assert_eq!(with(7, 4), Err(FrameError::Dtype(4)));
        assert_eq!(
            Frame::decode(&good[..good.len() - 1], 64),
            Err(FrameError::Length { len: 1, got: 0 })
        );
        assert_eq!(
            Frame::decode(&good[..10], 64),
            Err(FrameError::Truncated { got: 10, want: 40 })
        );
    }
}
