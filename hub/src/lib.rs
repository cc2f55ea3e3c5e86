//! GGUF files from the Hugging Face Hub (`hesper-rs pull`, `-hf`): the file a name picks,
//! downloaded into huggingface_hub's cache with resume, checked against the size and SHA-256
//! the Hub publishes before anything uses it. `HF_ENDPOINT` names another server with the
//! Hub's URL layout, `HF_TOKEN` opens gated repositories, `HF_HUB_OFFLINE=1` uses only what was
//! downloaded before.

mod api;
mod cache;
mod download;
mod env;
mod error;
mod spec;

use std::path::PathBuf;

pub use cache::RepoCache;
pub use env::{Settings, DEFAULT_ENDPOINT};
pub use error::HubError;
pub use spec::{ModelSpec, Pick, DEFAULT_QUANT};

/// How a download is going, for a progress bar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// A transfer starts: `size` bytes in all, `resumed_from` already on disk.
    Started {
        /// Bytes in all.
        size: u64,
        /// Bytes a stopped transfer left, resumed from.
        resumed_from: u64,
    },
    /// Bytes on disk so far.
    Bytes {
        /// Bytes on disk.
        done: u64,
        /// Bytes in all.
        size: u64,
    },
    /// The transfer stopped at `done` bytes and is tried again from there.
    Retrying {
        /// Bytes kept.
        done: u64,
        /// Why it stopped.
        cause: String,
    },
    /// Every byte arrived; the SHA-256 is being checked.
    Checking,
    /// The file is checked and in the cache.
    Done,
}

/// A file in the cache, ready to open.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// Its path (in the cache's snapshot folder).
    pub path: PathBuf,
    /// The repository.
    pub repo: String,
    /// The file's path in the repository.
    pub file: String,
    /// Its size in bytes.
    pub size: u64,
    /// How it was found.
    pub source: Source,
}

/// How a [`Fetched`] file was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Downloaded now.
    Downloaded,
    /// In the cache already, at the commit the Hub names now.
    Cached,
    /// In the cache; the Hub was not asked (`HF_HUB_OFFLINE`) or could not be reached (why).
    Offline(Option<String>),
}

/// The file `spec` names, downloaded when the cache lacks it.
pub fn fetch(
    spec: &ModelSpec,
    settings: &Settings,
    on_progress: &mut dyn FnMut(Progress),
) -> Result<Fetched, HubError> {
    let cache = RepoCache::new(&settings.cache, &spec.repo);
    if settings.offline {
        return from_cache(spec, settings, &cache, None);
    }
    let agent = api::agent();
    let listing = match api::listing(&agent, settings, &spec.repo) {
        Ok(l) => l,
        Err(HubError::Unreachable { endpoint, cause }) => {
            let why = format!("cannot reach {endpoint}: {cause}");
            return from_cache(spec, settings, &cache, Some(why)).map_err(|e| match e {
                HubError::NotCached { .. } => HubError::Unreachable { endpoint, cause },
                e => e,
            });
        }
        Err(e) => return Err(e),
    };
    let paths: Vec<&str> = listing.files.iter().map(|f| f.path.as_str()).collect();
    let path = spec.choose(&paths)?;
    let remote = &listing.files[paths.iter().position(|p| *p == path).unwrap_or(0)];
    let Some((size, sha256)) = &remote.lfs else {
        return Err(HubError::NoChecksum {
            repo: spec.repo.clone(),
            file: path.to_string(),
        });
    };
    let blob = cache.blob(sha256);
    let present = std::fs::metadata(&blob).is_ok_and(|m| m.len() == *size);
    if !present {
        let transfer = download::Transfer {
            repo: &spec.repo,
            commit: &listing.commit,
            path,
            size: *size,
            sha256,
        };
        transfer.run(&agent, settings, &cache.partial(sha256), &blob, on_progress)?;
    }
    let linked = cache.link(&settings.revision, &listing.commit, path, sha256)?;
    Ok(Fetched {
        path: linked,
        repo: spec.repo.clone(),
        file: path.to_string(),
        size: *size,
        source: if present {
            Source::Cached
        } else {
            Source::Downloaded
        },
    })
}

/// The file `spec` names among those downloaded before, without asking the Hub.
fn from_cache(
    spec: &ModelSpec,
    settings: &Settings,
    cache: &RepoCache,
    why: Option<String>,
) -> Result<Fetched, HubError> {
    let not_cached = || HubError::NotCached {
        repo: spec.repo.clone(),
        wanted: match &spec.pick {
            Pick::Default => "GGUF file".into(),
            Pick::Quant(q) => format!("{q} GGUF file"),
            Pick::File(f) => f.clone(),
        },
        cache: settings.cache.clone(),
    };
    let commit = cache.commit(&settings.revision).ok_or_else(not_cached)?;
    let files = cache.files(&commit);
    let paths: Vec<&str> = files.iter().map(String::as_str).collect();
    let path = spec.choose(&paths).map_err(|_| not_cached())?;
    let full = cache.snapshot(&commit, path);
    let size = std::fs::metadata(&full).map_err(HubError::io(&full))?.len();
    Ok(Fetched {
        path: full,
        repo: spec.repo.clone(),
        file: path.to_string(),
        size,
        source: Source::Offline(why),
    })
}
