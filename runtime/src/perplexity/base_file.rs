//! The file `--kl-divergence-base` writes and `--kl-divergence` reads: the base model's
//! log-probabilities at every scored position, with the tokens they were computed on.
//!
//! Little-endian: the magic `HSPKLB01`; `n_ctx`, `n_vocab`, `n_chunk` as u32; the tokens
//! (`n_chunk · n_ctx` u32); then per chunk `[n_ctx − 1 − n_ctx/2][n_vocab]` f32 log-probabilities.
//! Exact f32 (4 bytes per vocabulary entry per scored token: 2 MB a chunk for a 4 096-token
//! vocabulary at `-c 256`, 131 MB for 128 256 tokens at `-c 512`).

use std::io::{self, Read, Write};

use thiserror::Error;

use super::Chunks;

/// The first bytes of a base file.
pub const MAGIC: &[u8; 8] = b"HSPKLB01";

/// Why a base file cannot be read.
#[derive(Debug, Error)]
pub enum BaseFileError {
    /// It does not start with [`MAGIC`].
    #[error("not a hesper-rs KL base file (written by `perplexity --kl-divergence-base`)")]
    NotBaseFile,
    /// Its header cannot describe a run.
    #[error("the KL base file's header is invalid: {0}")]
    BadHeader(String),
    /// It ends before what its header promises.
    #[error("the KL base file ends early (truncated?)")]
    Truncated,
    /// A row of it is not the log-probabilities of a distribution.
    #[error("the KL base file's scored token {row} holds no log-probabilities: {why}")]
    NotLogProbs {
        /// The scored token, counted from the start of the file.
        row: usize,
        /// What is wrong with its values.
        why: String,
    },
    /// Reading or writing failed.
    #[error(transparent)]
    Io(io::Error),
}

impl From<io::Error> for BaseFileError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            Self::Truncated
        } else {
            Self::Io(e)
        }
    }
}

/// What a base file holds besides the log-probabilities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// How the tokens were cut.
    pub chunks: Chunks,
    /// The base model's vocabulary size.
    pub n_vocab: usize,
    /// The tokens, `n_chunk · n_ctx`.
    pub tokens: Vec<u32>,
}

impl Header {
    /// Bytes of one chunk's log-probabilities.
    pub fn chunk_bytes(&self) -> u64 {
        (self.chunks.scored() * self.n_vocab * 4) as u64
    }

    /// Bytes of the whole file.
    pub fn file_len(&self) -> u64 {
        20 + 4 * self.tokens.len() as u64 + self.chunks.n_chunk as u64 * self.chunk_bytes()
    }

    /// Writes the header.
    pub fn write(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(MAGIC)?;
        for v in [self.chunks.n_ctx, self.n_vocab, self.chunks.n_chunk] {
            w.write_all(&(v as u32).to_le_bytes())?;
        }
        let bytes: Vec<u8> = self.tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        w.write_all(&bytes)
    }

    /// Reads and checks a header.
    pub fn read(r: &mut impl Read) -> Result<Self, BaseFileError> {
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => BaseFileError::NotBaseFile,
            _ => BaseFileError::Io(e),
        })?;
        if &magic != MAGIC {
            return Err(BaseFileError::NotBaseFile);
        }
        let [n_ctx, n_vocab, n_chunk] = [read_u32(r)?, read_u32(r)?, read_u32(r)?];
        if n_ctx < 4 || n_vocab == 0 || n_chunk == 0 {
            return Err(BaseFileError::BadHeader(format!(
                "n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}"
            )));
        }
        let n_tokens = (n_ctx as usize)
            .checked_mul(n_chunk as usize)
            .ok_or_else(|| BaseFileError::BadHeader(format!("{n_chunk} chunks of {n_ctx}")))?;
        // Read in pieces, so a forged count fails on the data, not on one huge allocation.
        let mut tokens = Vec::new();
        let mut buf = vec![0u8; 4 * n_tokens.min(1 << 16)];
        while tokens.len() < n_tokens {
            let take = (n_tokens - tokens.len()).min(buf.len() / 4);
            r.read_exact(&mut buf[..4 * take])?;
            tokens.extend(
                buf[..4 * take]
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            );
        }
        Ok(Self {
            chunks: Chunks {
                n_ctx: n_ctx as usize,
                n_chunk: n_chunk as usize,
            },
            n_vocab: n_vocab as usize,
            tokens,
        })
    }
}

/// Writes one chunk's log-probabilities.
pub fn write_chunk(w: &mut impl Write, logp: &[f32]) -> io::Result<()> {
    let bytes: Vec<u8> = logp.iter().flat_map(|v| v.to_le_bytes()).collect();
    w.write_all(&bytes)
}

/// Reads one chunk's log-probabilities into `out` (`header.chunk_bytes() / 4` values, rows of
/// `n_vocab`; `row0` counts the rows of the chunks before, for the message) and checks that
/// each row is a distribution's: finite values, none above 0, probabilities summing to at most
/// 1 (up to f32 rounding).
pub fn read_chunk(
    r: &mut impl Read,
    out: &mut [f32],
    n_vocab: usize,
    row0: usize,
) -> Result<(), BaseFileError> {
    let mut bytes = vec![0u8; out.len() * 4];
    r.read_exact(&mut bytes)?;
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    for (i, row) in out.chunks_exact(n_vocab.max(1)).enumerate() {
        let bad = |why: String| BaseFileError::NotLogProbs { row: row0 + i, why };
        if let Some(v) = row.iter().find(|v| !v.is_finite()) {
            return Err(bad(format!("{v} is not finite")));
        }
        if let Some(v) = row.iter().find(|&&v| v > 0.0) {
            return Err(bad(format!("{v} is above 0")));
        }
        // A log-softmax row sums to 1 within a few f32 roundings per value.
        let total: f64 = row.iter().map(|&v| f64::from(v).exp()).sum();
        if total > 1.0 + 1e-3 {
            return Err(bad(format!("its probabilities sum to {total:.4}")));
        }
    }
    Ok(())
}

fn read_u32(r: &mut impl Read) -> Result<u32, BaseFileError> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}
