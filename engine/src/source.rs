//! Where a streamed load reads tensor bytes: one tensor at a time, so that a backend that
//! copies weights to its own memory (a GPU) never needs the whole file in the host's memory.
//! A browser reads from a `Blob` (a picked file, or one cached in the Origin Private File
//! System); natively, [`FileSource`] reads a file with positioned reads.

use std::future::Future;
use std::sync::Arc;

use thiserror::Error;

use crate::file::{FileError, ModelFile};

/// A read that failed, with the reason the source gave.
#[derive(Debug, Error)]
#[error("cannot read {len} bytes at offset {offset} of {source_name}: {why}")]
pub struct ReadError {
    /// The file, URL or label read.
    pub source_name: String,
    /// Where the read started.
    pub offset: u64,
    /// How many bytes it asked for.
    pub len: usize,
    /// What went wrong.
    pub why: String,
}

/// A file read piece by piece.
pub trait TensorSource {
    /// A name for messages (a path, a file name, a URL).
    fn name(&self) -> String;
    /// The file's length in bytes.
    fn len(&self) -> u64;
    /// Whether the file is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Reads `len` bytes at `offset` (the range lies inside the file).
    fn read(&mut self, offset: u64, len: usize)
        -> impl Future<Output = Result<Vec<u8>, ReadError>>;
}

/// Why a header could not be read from a source.
#[derive(Debug, Error)]
pub enum HeaderError {
    /// Reading failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The bytes are not a GGUF file.
    #[error(transparent)]
    File(#[from] FileError),
}

/// First read of a header; doubled until the header fits (the 2B4T file's header, with its
/// 128k-token vocabulary and merges, is about 7 MB).
const FIRST_HEADER_READ: usize = 1 << 20;

/// Reads the GGUF header (metadata and tensor table) from the front of `source`, reading
/// more while it runs past what was read, and returns a [`ModelFile`] that holds only it.
pub async fn read_header<S: TensorSource>(source: &mut S) -> Result<Arc<ModelFile>, HeaderError> {
    read_header_from(source, FIRST_HEADER_READ).await
}

async fn read_header_from<S: TensorSource>(
    source: &mut S,
    first_read: usize,
) -> Result<Arc<ModelFile>, HeaderError> {
    let file_len = source.len();
    let mut want = first_read.max(1);
    loop {
        let n = usize::try_from(file_len).map_or(want, |len| want.min(len));
        let prefix = source.read(0, n).await?;
        match ModelFile::from_header(prefix, file_len, &source.name()) {
            Err(FileError::Gguf { source: e, .. })
                if e.may_need_more() && (n as u64) < file_len =>
            {
                want = want.saturating_mul(2);
            }
            other => return Ok(other?),
        }
    }
}

/// A native file read with positioned reads (tests, and a check that a streamed load equals
/// a mapped one).
#[cfg(unix)]
pub struct FileSource {
    file: std::fs::File,
    len: u64,
    path: String,
}

#[cfg(unix)]
impl FileSource {
    /// Opens `path`.
    /// Anything but a regular file is refused without blocking: opening is non-blocking (a
    /// path that became a pipe with no writer would otherwise wait for one for good).
    pub fn open(path: &std::path::Path) -> Result<Self, FileError> {
        use std::os::unix::fs::OpenOptionsExt;
        let shown = path.display().to_string();
        let io = |source| FileError::Io {
            path: shown.clone(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(FileError::NotAFile {
                path: shown,
                what: crate::file::file_kind(&meta),
            });
        }
        let len = meta.len();
        Ok(Self {
            file,
            len,
            path: shown,
        })
    }
}

#[cfg(unix)]
impl FileSource {
    /// Reads `buf.len()` bytes at `offset` into `buf` (a buffer reused across reads).
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        use std::os::unix::fs::FileExt;
        self.file.read_exact_at(buf, offset).map_err(|e| ReadError {
            source_name: self.path.clone(),
            offset,
            len: buf.len(),
            why: e.to_string(),
        })
    }
}

#[cfg(unix)]
impl TensorSource for FileSource {
    fn name(&self) -> String {
        self.path.clone()
    }

    fn len(&self) -> u64 {
        self.len
    }

    async fn read(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, ReadError> {
        let mut out = vec![0; len];
        self.read_into(offset, &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufError;

    /// A file in memory that records the length of each read.
    struct Memory {
        bytes: Vec<u8>,
        reads: Vec<usize>,
    }

    impl TensorSource for Memory {
        fn name(&self) -> String {
            "memory".into()
        }

        fn len(&self) -> u64 {
            self.bytes.len() as u64
        }

        async fn read(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, ReadError> {
            self.reads.push(len);
            let start = offset as usize;
            Ok(self.bytes[start..start + len].to_vec())
        }
    }

    fn demo() -> Vec<u8> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/hesper-tiny.gguf");
        std::fs::read(path).expect("demo model")
    }

    #[test]
    fn the_header_read_grows_until_the_header_fits() {
        let bytes = demo();
        let whole = crate::gguf::Gguf::parse(&bytes).expect("parse");
        let mut source = Memory {
            bytes,
            reads: Vec::new(),
        };
        let file = pollster::block_on(read_header_from(&mut source, 4096)).expect("header");
        assert_eq!(file.header().tensors().len(), whole.tensors().len());
        assert_eq!(file.header().data_start, whole.data_start);
        assert_eq!(file.len(), source.bytes.len() as u64);
        assert!(!file.holds_tensors());
        // 4 KiB, 8 KiB, ... until the ~0.5 MB header of a 32000-token vocabulary fits, and no
        // read past what it needed twice over.
        assert!(source.reads.len() > 2, "{:?}", source.reads);
        assert!(source.reads.windows(2).all(|w| w[1] == 2 * w[0]));
        let last = *source.reads.last().expect("a read") as u64;
        assert!(last >= whole.data_start && last < 2 * whole.data_start.max(4096));
    }

    #[test]
    fn a_file_cut_inside_its_header_or_tensors_is_refused() {
        let bytes = demo();
        let data_start = crate::gguf::Gguf::parse(&bytes).expect("parse").data_start as usize;
        for cut in [100, data_start / 2, data_start + 10, bytes.len() - 1] {
            let mut source = Memory {
                bytes: bytes[..cut].to_vec(),
                reads: Vec::new(),
            };
            let err = pollster::block_on(read_header_from(&mut source, 4096))
                .err()
                .unwrap_or_else(|| panic!("a file cut at {cut} was accepted"));
            assert!(
                matches!(
                    err,
                    HeaderError::File(FileError::Gguf {
                        source: GgufError::Truncated { .. }
                            | GgufError::AbsurdCount { .. }
                            | GgufError::OutOfBounds { .. },
                        ..
                    })
                ),
                "cut at {cut}: {err}"
            );
        }
    }
}
