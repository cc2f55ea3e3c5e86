//! Errors raised while reading a GGUF container.

use thiserror::Error;

/// Why a byte buffer is not a GGUF file hesper-rs can read. Every variant names the offending
/// part of the file.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum GgufError {
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    /// Version 0, 1, > 3, or a byte-swapped version (big-endian file).
    #[error("unsupported GGUF version {0} (hesper-rs reads versions 2 and 3, little-endian)")]
    BadVersion(u32),
    /// The file ends before a field that must be there.
    #[error("file truncated: needed {needed} bytes at offset {offset} while reading {what}, file has {len}")]
    Truncated {
        /// What was being read.
        what: String,
        /// Byte offset of the read.
        offset: u64,
        /// Bytes the read needed.
        needed: u64,
        /// Length of the file.
        len: u64,
    },
    /// A count or length cannot possibly fit in the file.
    #[error("{what} is {count}, more than the {remaining} bytes left in the file could hold")]
    AbsurdCount {
        /// Which count.
        what: String,
        /// The stored value.
        count: u64,
        /// Bytes left after it.
        remaining: u64,
    },
    /// A string is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    BadUtf8 {
        /// Which string.
        what: String,
    },
    /// A metadata value type id outside 0..=12 (or a nested array).
    #[error("metadata key {key:?}: invalid value type {type_id}")]
    BadValueType {
        /// Key whose value is malformed.
        key: String,
        /// The stored type id.
        type_id: u32,
    },
    /// The same metadata key appears twice.
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    /// The same tensor name appears twice.
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    /// A key or tensor name is empty or too long.
    #[error("invalid name {name:?}: {why}")]
    BadName {
        /// The name.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A tensor has more than four dimensions or a zero/overflowing shape.
    #[error("tensor {name:?}: invalid shape {dims:?}")]
    BadShape {
        /// Tensor name.
        name: String,
        /// Its dims as stored.
        dims: Vec<u64>,
    },
    /// `general.alignment` is not a power of two or has the wrong type.
    #[error("general.alignment must be a non-zero power of two stored as u32, got {0}")]
    BadAlignment(String),
    /// A tensor's data offset is not a multiple of the alignment.
    #[error(
        "tensor {name:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    Misaligned {
        /// Tensor name.
        name: String,
        /// Offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's row length is not a multiple of its type's block size.
    #[error(
        "tensor {name:?}: {ty} needs rows that are a multiple of its block size, shape is {dims:?}"
    )]
    BadBlockShape {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: String,
        /// Its dims.
        dims: Vec<u64>,
    },
    /// A tensor's data lies (partly) outside the file.
    #[error("tensor {name:?}: data [{start}, {end}) lies outside the file ({len} bytes)")]
    OutOfBounds {
        /// Tensor name.
        name: String,
        /// Absolute start offset.
        start: u64,
        /// Absolute end offset.
        end: u64,
        /// File length.
        len: u64,
    },
}

impl GgufError {
    /// Whether a header read from a prefix of the file fails this way only because the
    /// prefix ends too early (a field or an array runs past it).
    pub fn may_need_more(&self) -> bool {
        matches!(self, Self::Truncated { .. } | Self::AbsurdCount { .. })
    }
}
