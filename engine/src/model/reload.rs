//! Hot-swap: replacing the tensors whose bytes changed on disk in a running model, as
//! ik_llama.cpp's on-demand tensor reload does. A model loaded with [`Model::load_hot_swap`]
//! reads every tensor into memory (nothing borrows the file, so rewriting it in place cannot
//! pull pages from under the model) and keeps each tensor's shape and XXH3-128 hash (not a
//! cryptographic hash: it tells an edited tensor from an untouched one, at ~10 GB/s).
//! [`Model::reload_changed`] then costs one `stat()` while the file is untouched; after a
//! write it reads the new header and every tensor, hashes them, prepares the parts whose
//! tensors changed through the loader a fresh load takes (a type change included: repacked,
//! re-uploaded, joined again), and swaps them in all at once — or, when anything is wrong (a
//! torn file, a shape change, a type the backend cannot run), changes nothing and says why;
//! the next check tries again.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use thiserror::Error;
use xxhash_rust::xxh3::{xxh3_128, Xxh3};

use super::load::{tensor_len, Fetch, Loader, Part, Plan, Prepared, Streamed};
use super::{check_tensor_table, HeadFormat, LoadOptions, Model, ModelError};
use crate::backend::Backend;
use crate::config::Config;
use crate::file::FileError;
use crate::gguf::TensorInfo;
use crate::source::{read_header, FileSource, HeaderError, TensorSource};

/// A tensor as it was loaded.
struct Seen {
    /// XXH3-128 of its bytes.
    hash: u128,
    /// Its dims.
    ne: Vec<u64>,
    /// Its type's name.
    ty: String,
}

/// What `stat()` says of the file: any write, truncation, `touch` or rename over it changes
/// this (the inode's change time cannot be set back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        Ok(Self {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// What a hot-swappable model compares its file with.
pub(super) struct HotSwap {
    path: PathBuf,
    /// The file as it was when last read whole.
    stamp: Stamp,
    /// Every tensor the model was made from.
    seen: HashMap<String, Seen>,
    head: HeadFormat,
    /// The file as it was when a check last refused it, and why: the same bytes are not
    /// read again (a client calling `/health` must not make the server re-read a refused
    /// 1.5 GB file each time).
    refused: Option<(Stamp, String)>,
}

/// What [`Model::reload_changed`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// No tensor of the model changed (the file may have been touched or rewritten alike).
    Unchanged,
    /// Tensors changed and were swapped in.
    Swapped(Swap),
}

impl Reload {
    /// A swap of `tensors` (`(name, type before, type after)`), or `Unchanged` when there are
    /// none; `bytes_read` to find them.
    pub fn of(tensors: Vec<(String, String, String)>, bytes_read: u64) -> Self {
        if tensors.is_empty() {
            Self::Unchanged
        } else {
            Self::Swapped(Swap {
                tensors,
                bytes_read,
            })
        }
    }
}

/// A swap done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swap {
    /// Each tensor whose bytes changed, in the file's order, with its type before and after
    /// (`Q8_0 -> F16`; the same name twice when only the values changed).
    pub tensors: Vec<(String, String, String)>,
    /// Bytes read from the file to find them (every tensor of the model).
    pub bytes_read: u64,
}

impl Swap {
    /// The changed tensors as one line: `blk.0.ffn_up.weight (Q8_0 -> F16), output.weight`.
    pub fn describe(&self) -> String {
        self.tensors
            .iter()
            .map(|(name, from, to)| match from == to {
                true => name.clone(),
                false => format!("{name} ({from} -> {to})"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Why a check swapped nothing. The weights loaded before stay in place.
#[derive(Debug, Error)]
pub enum ReloadError {
    /// The model was loaded without [`Model::load_hot_swap`].
    #[error("this model was not loaded for hot-swap")]
    NotEnabled,
    /// The file is as it was when a check refused it; it was not read again.
    #[error("{why} (the file is unchanged since)")]
    StillRefused {
        /// Why it was refused.
        why: String,
    },
    /// The file cannot be looked at.
    #[error("cannot look at {path}: {source}")]
    Stat {
        /// The model's path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The header cannot be read: a torn or half-written file, often.
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// The hyperparameters changed.
    #[error("{path}: the model's hyperparameters changed ({what}); a hot-swap replaces tensors, not the model: restart to load it")]
    Metadata {
        /// The model's path.
        path: String,
        /// What differs.
        what: String,
    },
    /// A tensor's shape changed.
    #[error("{path}: tensor {name:?} has shape {disk:?} on disk, {loaded:?} loaded: a hot-swap keeps every shape")]
    Shape {
        /// The model's path.
        path: String,
        /// The tensor.
        name: String,
        /// Its dims on disk.
        disk: Vec<u64>,
        /// Its dims loaded.
        loaded: Vec<u64>,
    },
    /// A tensor the model reads is gone, or one it would read appeared.
    #[error("{path}: tensor {name:?} was {what} the file: a hot-swap keeps the set of tensors")]
    TensorSet {
        /// The model's path.
        path: String,
        /// The tensor.
        name: String,
        /// "removed from" or "added to".
        what: &'static str,
    },
    /// A new tensor cannot be used (an unsupported type, say), or the backend failed.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Hashes each tensor a streamed load reads.
struct Hashing<'s, S> {
    inner: Streamed<'s, S>,
    seen: HashMap<String, Seen>,
}

impl<S: TensorSource> Fetch for Hashing<'_, S> {
    async fn fetch(&mut self, info: &TensorInfo) -> Result<Option<Vec<u8>>, ModelError> {
        let bytes = self.inner.fetch(info).await?;
        if let Some(b) = &bytes {
            self.seen.insert(info.name.clone(), seen(info, b));
        }
        Ok(bytes)
    }
}

fn seen(info: &TensorInfo, bytes: &[u8]) -> Seen {
    Seen {
        hash: xxh3_128(bytes),
        ne: info.dims().to_vec(),
        ty: info.ty.to_string(),
    }
}

/// Serves the changed tensors a check read, and reads the others again, checking that they
/// are still the bytes loaded before (a joined pair re-joins an unchanged half).
struct Replay<'a> {
    source: &'a mut FileSource,
    changed: &'a HashMap<String, Vec<u8>>,
    seen: &'a HashMap<String, Seen>,
}

impl Fetch for Replay<'_> {
    async fn fetch(&mut self, info: &TensorInfo) -> Result<Option<Vec<u8>>, ModelError> {
        if let Some(bytes) = self.changed.get(&info.name) {
            return Ok(Some(bytes.clone()));
        }
        let bytes = Streamed(&mut *self.source).fetch(info).await?;
        let same = match (&bytes, self.seen.get(&info.name)) {
            (Some(b), Some(before)) => seen(info, b).hash == before.hash,
            _ => false,
        };
        if !same {
            return Err(ModelError::ChangedWhileLoading(info.name.clone()));
        }
        Ok(bytes)
    }
}

/// Bytes read at a time while hashing: small enough to stay in the CPU's cache between the
/// read that fills it and the hash that reads it, so the file crosses memory once.
pub(super) const HASH_CHUNK: usize = 1 << 20;

/// Reads and hashes each of `infos` from `source`, split over the cores; returns the index,
/// hash and bytes of each one whose hash differs from `seen`'s (read once more, whole).
fn hash_all(
    source: &FileSource,
    infos: &[&TensorInfo],
    seen: &HashMap<String, Seen>,
) -> Result<Vec<(usize, Seen, Vec<u8>)>, ModelError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let part = |k: usize| -> Result<Vec<(usize, Seen, Vec<u8>)>, ModelError> {
        let mut buf = vec![0; HASH_CHUNK];
        let mut out = Vec::new();
        for (i, info) in infos.iter().enumerate().skip(k).step_by(threads) {
            if hash_read(source, info, &mut buf)? != seen[&info.name].hash {
                let mut bytes = vec![0; tensor_len(info)?];
                source.read_into(info.start, &mut bytes)?;
                out.push((i, self::seen(info, &bytes), bytes));
            }
        }
        Ok(out)
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (1..threads).map(|k| s.spawn(move || part(k))).collect();
        let mut all = part(0)?;
        for h in handles {
            all.extend(h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))?);
        }
        Ok(all)
    })
}

/// The XXH3-128 of tensor `info`'s bytes, read from `source` a chunk of `buf` at a time.
pub(super) fn hash_read(
    source: &FileSource,
    info: &TensorInfo,
    buf: &mut [u8],
) -> Result<u128, ModelError> {
    let len = tensor_len(info)?;
    let mut hasher = Xxh3::new();
    let step = buf.len();
    for at in (0..len).step_by(step) {
        let chunk = &mut buf[..step.min(len - at)];
        source.read_into(info.start + at as u64, chunk)?;
        hasher.update(chunk);
    }
    Ok(hasher.digest128())
}

impl HotSwap {
    /// The hash of tensor `name` as loaded, if the model was made from it.
    pub(super) fn hash_of(&self, name: &str) -> Option<u128> {
        self.seen.get(name).map(|s| s.hash)
    }

    /// The file the model is read from.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

fn open_error(path: &Path, source: std::io::Error) -> HeaderError {
    HeaderError::File(FileError::Io {
        path: path.display().to_string(),
        source,
    })
}

impl<B: Backend> Model<B> {
    /// Loads the model at `path` for hot-swap: every tensor is read into memory (the file is
    /// never mapped) and its hash and shape kept for [`Model::reload_changed`].
    pub fn load_hot_swap(
        backend: B,
        path: &Path,
        opts: LoadOptions<'_>,
    ) -> Result<Self, ModelError> {
        let stamp = Stamp::of(path).map_err(|e| open_error(path, e))?;
        let mut source = FileSource::open(path).map_err(HeaderError::File)?;
        let head = opts.head;
        let (mut model, seen) = pollster::block_on(async {
            let file = read_header(&mut source).await?;
            let mut fetch = Hashing {
                inner: Streamed(&mut source),
                seen: HashMap::new(),
            };
            let model = Self::load_from(backend, file, &mut fetch, opts).await?;
            Ok::<_, ModelError>((model, fetch.seen))
        })?;
        model.swap = Some(Box::new(HotSwap {
            path: path.to_path_buf(),
            stamp,
            seen,
            head,
            refused: None,
        }));
        Ok(model)
    }

    /// Whether this model was loaded with [`Model::load_hot_swap`].
    pub fn hot_swappable(&self) -> bool {
        self.swap.is_some()
    }

    /// Looks at the file and swaps in every tensor whose bytes changed, all at once. Costs
    /// one `stat()` when the file is untouched. Call it between steps: sessions' KV caches
    /// were computed with the old weights, so a caller that wants the new weights to hold
    /// for the whole history evaluates it again (see the runtime's users).
    pub fn reload_changed(&mut self) -> Result<Reload, ReloadError> {
        let swap = self.swap.as_ref().ok_or(ReloadError::NotEnabled)?;
        let path = swap.path.clone();
        let stamp = Stamp::of(&path).map_err(|source| ReloadError::Stat {
            path: path.display().to_string(),
            source,
        })?;
        if stamp == swap.stamp {
            return Ok(Reload::Unchanged);
        }
        if let Some((refused, why)) = &swap.refused {
            if *refused == stamp {
                return Err(ReloadError::StillRefused { why: why.clone() });
            }
        }
        let result = self.swap_in(&path, stamp);
        if let Some(swap) = self.swap.as_mut() {
            swap.refused = result.as_ref().err().map(|e| (stamp, e.to_string()));
        }
        result
    }

    /// [`Model::reload_changed`] for a file whose stamp is new: reads it whole, and swaps in
    /// what changed or refuses it all.
    fn swap_in(&mut self, path: &Path, stamp: Stamp) -> Result<Reload, ReloadError> {
        let swap = self.swap.as_ref().ok_or(ReloadError::NotEnabled)?;
        let mut source = FileSource::open(path).map_err(HeaderError::File)?;
        let file = pollster::block_on(read_header(&mut source))?;
        let shown = path.display().to_string();
        let g = file.header();
        let n_vocab = g.tensor("token_embd.weight").map(|t| t.ne[1] as usize);
        let config = Config::from_gguf(g, n_vocab).map_err(ModelError::from)?;
        if config != self.config {
            return Err(ReloadError::Metadata {
                path: shown,
                what: config_difference(&self.config, &config),
            });
        }
        check_tensor_table(g, &config)?;
        let plan = Plan::new(
            config,
            g,
            self.layer_range.clone(),
            swap.head,
            self.output_norm.is_some(),
        );
        self.check_tensor_set(&plan, g, &shown)?;

        // Which tensors changed: every one is read and hashed, on as many threads as there
        // are cores (reading from the page cache and hashing are each bound by one core).
        let infos: Vec<&TensorInfo> = g
            .tensors()
            .iter()
            .filter(|t| swap.seen.contains_key(&t.name))
            .collect();
        let bytes_read = infos.iter().filter_map(|t| t.nbytes).sum();
        let mut found = hash_all(&source, &infos, &swap.seen)?;
        found.sort_by_key(|(i, ..)| *i);
        let mut changed = HashMap::new();
        let mut now_seen = HashMap::new();
        let mut tensors = Vec::new();
        for (i, now, bytes) in found {
            let name = &infos[i].name;
            tensors.push((name.clone(), swap.seen[name].ty.clone(), now.ty.clone()));
            changed.insert(name.clone(), bytes);
            now_seen.insert(name.clone(), now);
        }
        let parts: BTreeSet<Part> = tensors
            .iter()
            .flat_map(|(name, ..)| plan.parts_of(name))
            .collect();

        // Every changed part prepared before any is swapped in.
        let mut fetch = Replay {
            source: &mut source,
            changed: &changed,
            seen: &swap.seen,
        };
        let mut loader = Loader::new(&self.backend, &file, &plan, &mut fetch, None);
        let mut prepared = Vec::with_capacity(parts.len());
        for &part in &parts {
            prepared.push(pollster::block_on(loader.prepare(part))?);
        }
        let new_bytes = std::mem::take(&mut loader.part_bytes);
        drop(changed);

        for p in prepared {
            self.apply(p);
        }
        self.part_bytes.extend(new_bytes);
        self.bytes_per_token = plan.bytes_per_token(&self.part_bytes);
        self.file = file;
        if let Some(swap) = self.swap.as_mut() {
            swap.seen.extend(now_seen);
            swap.stamp = stamp;
        }
        Ok(Reload::of(tensors, bytes_read))
    }

    /// Refuses a file whose tensors are not the ones loaded, of the same shapes.
    fn check_tensor_set(
        &self,
        plan: &Plan,
        g: &crate::gguf::Gguf,
        path: &str,
    ) -> Result<(), ReloadError> {
        let swap = self.swap.as_ref().ok_or(ReloadError::NotEnabled)?;
        for (name, before) in &swap.seen {
            let Some(info) = g.tensor(name) else {
                return Err(ReloadError::TensorSet {
                    path: path.into(),
                    name: name.clone(),
                    what: "removed from",
                });
            };
            if info.dims() != before.ne.as_slice() {
                return Err(ReloadError::Shape {
                    path: path.into(),
                    name: name.clone(),
                    disk: info.dims().to_vec(),
                    loaded: before.ne.clone(),
                });
            }
        }
        if let Some(t) = g
            .tensors()
            .iter()
            .find(|t| !swap.seen.contains_key(&t.name) && !plan.parts_of(&t.name).is_empty())
        {
            return Err(ReloadError::TensorSet {
                path: path.into(),
                name: t.name.clone(),
                what: "added to",
            });
        }
        Ok(())
    }

    /// Puts a prepared part in its place; what it replaces is dropped (its memory freed).
    fn apply(&mut self, p: Prepared<B>) {
        let start = self.layer_range.start;
        match p {
            Prepared::Embedding(m) => self.embedding = m,
            Prepared::Layer(il, piece) => self.layers[il - start].put(piece),
            Prepared::RopeFactors(f) => self.rope_factors = f,
            Prepared::OutputNorm(v) => self.output_norm = v,
            Prepared::Output(m) => self.output = m,
        }
    }
}

/// The first hyperparameter that differs, as `name before -> after`.
fn config_difference(before: &Config, after: &Config) -> String {
    let fields = |c: &Config| {
        [
            ("general.architecture", c.arch.clone()),
            ("vocabulary size", c.n_vocab.to_string()),
            ("embedding_length", c.n_embd.to_string()),
            ("block_count", c.n_layer.to_string()),
            ("attention.head_count", c.n_head.to_string()),
            ("attention.head_count_kv", c.n_head_kv.to_string()),
            ("attention.key_length", c.head_dim.to_string()),
            ("feed_forward_length", c.n_ff.to_string()),
            ("context_length", c.n_ctx_train.to_string()),
            ("attention.layer_norm_rms_epsilon", c.eps.to_string()),
            ("rope.freq_base", c.rope_base.to_string()),
            ("rope scaling", c.rope_scale.to_string()),
            ("rope.dimension_count", c.rope_dim.to_string()),
            ("activation", format!("{:?}", c.activation)),
            ("attention.sliding_window", format!("{:?}", c.window)),
            ("sliding-window layers", format!("{:?}", c.windowed)),
            ("rope.freq_base_swa", c.rope_base_window.to_string()),
        ]
    };
    fields(before)
        .into_iter()
        .zip(fields(after))
        .find(|(x, y)| x.1 != y.1)
        .map_or_else(
            || "the architecture's graph".into(),
            |((name, x), (_, y))| format!("{name} {x} -> {y}"),
        )
}
