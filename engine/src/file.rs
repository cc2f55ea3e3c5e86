//! A GGUF file held in memory: memory-mapped natively, or an owned buffer (tests, wasm); or
//! only its header, for a load that streams the tensors from a [`crate::source::TensorSource`].

#[cfg(not(target_arch = "wasm32"))]
use std::path::Path;
use std::sync::Arc;

use thiserror::Error;

use crate::gguf::{Gguf, GgufError, TensorError, TensorInfo};

/// Errors raised while opening a model file.
#[derive(Debug, Error)]
pub enum FileError {
    /// The file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path given.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The path names a directory, a device or a pipe, not a file.
    #[error("{path} is {what}, not a GGUF file")]
    NotAFile {
        /// The path given.
        path: String,
        /// What it is instead, e.g. "a directory".
        what: &'static str,
    },
    /// The bytes are not a valid GGUF file.
    #[error("{path}: {source}")]
    Gguf {
        /// The path given.
        path: String,
        /// What is wrong with it.
        source: GgufError,
    },
}

/// What a path that is not a regular file is, for an error message.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_fifo() {
            return "a pipe";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if meta.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

enum Bytes {
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file and its bytes. Cheap to share: backends keep an `Arc` and borrow tensor
/// data from it instead of copying weights.
pub struct ModelFile {
    bytes: Bytes,
    /// Length of the whole file; more than `bytes` holds when only the header was read.
    file_len: u64,
    header: Gguf,
    /// Where the file came from (a path, or a label for in-memory files).
    pub source: String,
}

impl ModelFile {
    /// Memory-maps and parses the file at `path`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: &Path) -> Result<Arc<Self>, FileError> {
        let shown = path.display().to_string();
        let io = |source| FileError::Io {
            path: shown.clone(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_file() {
            return Err(FileError::NotAFile {
                path: shown,
                what: file_kind(&meta),
            });
        }
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process; like every mmap-based model
        // loader we rely on the file not being truncated while it is in use.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::from_bytes_inner(Bytes::Mapped(map), shown)
    }

    /// Parses a file already in memory.
    pub fn from_bytes(bytes: Vec<u8>, label: &str) -> Result<Arc<Self>, FileError> {
        Self::from_bytes_inner(Bytes::Owned(bytes), label.to_string())
    }

    /// Parses the header held in `prefix`, the first bytes of a file of `file_len` bytes
    /// whose tensors a streamed load reads later. Fails with a [`FileError::Gguf`] error for
    /// which [`GgufError::may_need_more`] holds when the header runs past the prefix.
    pub fn from_header(
        prefix: Vec<u8>,
        file_len: u64,
        label: &str,
    ) -> Result<Arc<Self>, FileError> {
        let header = Gguf::parse_prefix(&prefix, file_len).map_err(|source| FileError::Gguf {
            path: label.to_string(),
            source,
        })?;
        Ok(Arc::new(Self {
            bytes: Bytes::Owned(prefix),
            file_len,
            header,
            source: label.to_string(),
        }))
    }

    fn from_bytes_inner(bytes: Bytes, source: String) -> Result<Arc<Self>, FileError> {
        let header = Gguf::parse(bytes.as_slice()).map_err(|source_err| FileError::Gguf {
            path: source.clone(),
            source: source_err,
        })?;
        Ok(Arc::new(Self {
            file_len: bytes.as_slice().len() as u64,
            bytes,
            header,
            source,
        }))
    }

    /// The bytes held: the whole file, or only its first bytes (see [`ModelFile::holds_tensors`]).
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Whether the tensor data is held (false for a file opened with [`ModelFile::from_header`]).
    pub fn holds_tensors(&self) -> bool {
        self.bytes().len() as u64 == self.file_len
    }

    /// The parsed header.
    pub fn header(&self) -> &Gguf {
        &self.header
    }

    /// The data of one tensor.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> Result<&[u8], TensorError> {
        self.header.tensor_bytes(self.bytes(), info)
    }

    /// Drops the pages of `range` from this process's resident set: for bytes read once (a
    /// head that was re-quantized at load), so that they do not count against the memory the
    /// model holds. A later read maps them again from the page cache or the file. Owned
    /// buffers (tests, wasm) are left as they are.
    pub fn release(&self, range: std::ops::Range<usize>) {
        #[cfg(unix)]
        if let Bytes::Mapped(map) = &self.bytes {
            let Some(len) = range.end.min(map.len()).checked_sub(range.start) else {
                return;
            };
            // SAFETY: the map is read-only and never written, so MADV_DONTNEED only unmaps
            // pages whose contents the next access reads back unchanged from the file; no
            // reference into them is invalidated. Failure only means the pages stay resident.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, range.start, len)
            };
        }
        #[cfg(not(unix))]
        let _ = range;
    }

    /// Size of the file in bytes.
    pub fn len(&self) -> u64 {
        self.file_len
    }

    /// True for an empty file (never the case for a parsed one).
    pub fn is_empty(&self) -> bool {
        self.file_len == 0
    }
}
