//! What can go wrong between a name and a checked file, each said in one line.

use std::path::PathBuf;

/// A download that did not give a usable file.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The name is not `owner/name[:QUANT or FILE]`.
    #[error("{spec:?}: {why} (expected owner/name, owner/name:QUANT or owner/name:FILE.gguf)")]
    BadSpec {
        /// What was typed.
        spec: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// No home or cache directory can be found.
    #[error("no cache directory: set HF_HOME (or HF_HUB_CACHE, or HOME)")]
    NoCacheDir,
    /// The endpoint cannot be reached (offline, a wrong `HF_ENDPOINT`, a proxy).
    #[error("cannot reach {endpoint} ({cause}); check the network or HF_ENDPOINT (HF_HUB_OFFLINE=1 uses only files downloaded before)")]
    Unreachable {
        /// The endpoint.
        endpoint: String,
        /// What the connection attempt said.
        cause: String,
    },
    /// `HF_HUB_OFFLINE` is set and the cache has no matching file.
    #[error("HF_HUB_OFFLINE is set and {repo} has no downloaded {wanted} in {cache}")]
    NotCached {
        /// The repository.
        repo: String,
        /// Which file was asked for, in words.
        wanted: String,
        /// The cache directory looked in.
        cache: PathBuf,
    },
    /// The repository does not exist (or is private and no token was given).
    #[error(
        "{endpoint} has no model repository {repo} (check the name; a private one needs HF_TOKEN)"
    )]
    NoRepo {
        /// The repository.
        repo: String,
        /// The endpoint.
        endpoint: String,
    },
    /// The repository is gated or private.
    #[error("{repo} is gated or private: {hint}")]
    Gated {
        /// The repository.
        repo: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// Another HTTP status.
    #[error("{url}: HTTP {status}")]
    Status {
        /// The address asked.
        url: String,
        /// The status it answered.
        status: u16,
    },
    /// The file list cannot be read.
    #[error("{repo}: the Hub's file list cannot be read: {detail}")]
    BadListing {
        /// The repository.
        repo: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The repository has no GGUF file.
    #[error(
        "{repo} has no GGUF file (hesper-rs runs GGUF models; look for a repository named …-GGUF)"
    )]
    NoGguf {
        /// The repository.
        repo: String,
    },
    /// No file matches what was named.
    #[error("{repo} has no GGUF file matching {wanted:?}; it has: {available}")]
    NoMatch {
        /// The repository.
        repo: String,
        /// The quantization or file asked for.
        wanted: String,
        /// Its GGUF files.
        available: String,
    },
    /// Several files match: the user must name one.
    #[error("{repo} has several GGUF files{matching}; name one as {repo}:QUANT or {repo}:FILE: {choices}")]
    Ambiguous {
        /// The repository.
        repo: String,
        /// " matching …" when a quantization was named.
        matching: String,
        /// The candidates.
        choices: String,
    },
    /// A model split over several files.
    #[error("{repo}: {file} is one part of a split model; hesper-rs reads single-file GGUF models (join the parts with llama.cpp's llama-gguf-split --merge)")]
    Split {
        /// The repository.
        repo: String,
        /// The part that matched.
        file: String,
    },
    /// The Hub publishes no SHA-256 for the file, so it cannot be checked.
    #[error("{repo}: the Hub publishes no size and SHA-256 for {file} (not stored with Git LFS), so it cannot be checked")]
    NoChecksum {
        /// The repository.
        repo: String,
        /// The file.
        file: String,
    },
    /// The transfer stopped before the end, every try.
    #[error("{file}: the transfer stopped at {done} of {size} bytes ({cause}); run the command again to resume it")]
    Interrupted {
        /// The file.
        file: String,
        /// Bytes kept.
        done: u64,
        /// Bytes in all.
        size: u64,
        /// The last failure.
        cause: String,
    },
    /// The bytes received are not the ones the Hub publishes.
    #[error("{file}: the downloaded bytes {what}; the partial file was removed, run the command again to download it afresh")]
    Corrupt {
        /// The file.
        file: String,
        /// How they differ (the two SHA-256 or sizes).
        what: String,
    },
    /// Reading or writing the cache failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl HubError {
    /// An I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}
