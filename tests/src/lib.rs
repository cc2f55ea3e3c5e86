//! Helpers for golden-value tests: reading the manifests in `golden-values/out/` and
//! comparing logits.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hesper_cpu::{CpuBackend, Isa};
use hesper_engine::file::ModelFile;
use hesper_engine::model::{LoadOptions, Model};
use serde_json::Value;

pub mod geometry;
pub mod layers;
pub mod ops;
pub mod random;
pub mod scratch;

/// The `golden-values/` folder.
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../golden-values")
}

/// One recorded token sequence.
pub struct Sequence {
    /// Token ids fed (no BOS added).
    pub tokens: Vec<u32>,
    /// The text the reference tokenized into `tokens`, where it recorded one (a model with a
    /// text vocabulary).
    pub text: Option<String>,
    /// What the reference detokenizes `tokens` after BOS into, where it recorded `text`.
    pub detokenized: Option<String>,
    /// Reference logits `[n_tokens][n_vocab]`.
    pub logits: Vec<f32>,
    /// Reference residual stream after each layer, `[n_layer][n_tokens][n_embd]`; empty where
    /// the manifest records none (the long sequences).
    pub hidden: Vec<f32>,
}

/// How the `reference` labels begin of the references whose LM head takes its input unrounded
/// where the head is F16: our float64 NumPy reference (generate.py), and bitnet.cpp at its
/// pinned commit (its llamafile tinyBLAS multiplies the F16 matrix by the f32 activations).
/// llama.cpp 0c1e57098 rounds the input to f16, as hesper-rs does.
pub const UNROUNDED_HEAD_REFERENCES: [&str; 2] =
    ["hesper-rs float64 NumPy reference", "bitnet.cpp"];

/// A golden manifest and its data.
pub struct Golden {
    /// Model file (for a generated model, the manifest's label).
    pub model: PathBuf,
    /// SHA-256 of a model the tests build in memory (`geometry`), instead of reading `model`.
    pub model_sha256: Option<String>,
    /// Who computed the values.
    pub reference: String,
    /// Activation quantization the reference applied (`none`, `q8_k`, `per_token_i8`).
    pub act_quant: String,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Hidden width.
    pub n_embd: usize,
    /// Layers.
    pub n_layer: usize,
    /// Recorded sequences.
    pub sequences: Vec<Sequence>,
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn read_manifest(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

impl Golden {
    /// Reads `golden-values/out/<stem>.json` and its data files.
    pub fn load(stem: &str) -> Self {
        let out = golden_dir().join("out");
        let m = read_manifest(&out.join(format!("{stem}.json")));
        let num = |k: &str| {
            m[k].as_u64()
                .unwrap_or_else(|| panic!("{stem}: {k} missing")) as usize
        };
        let sequences = m["sequences"]
            .as_array()
            .unwrap_or_else(|| panic!("{stem}: no sequences"))
            .iter()
            .map(|s| Sequence {
                tokens: s["tokens"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_u64)
                    .map(|t| t as u32)
                    .collect(),
                text: s["text"].as_str().map(str::to_string),
                detokenized: s["detokenized"].as_str().map(str::to_string),
                logits: read_f32(&out.join(s["logits"].as_str().unwrap_or_default())),
                hidden: s["hidden"]
                    .as_str()
                    .map(|h| read_f32(&out.join(h)))
                    .unwrap_or_default(),
            })
            .collect();
        Self {
            model: golden_dir().join(m["model"].as_str().unwrap_or_default()),
            model_sha256: m["model_sha256"].as_str().map(str::to_string),
            reference: m["reference"].as_str().unwrap_or_default().to_string(),
            act_quant: m["act_quant"].as_str().unwrap_or_default().to_string(),
            n_vocab: num("n_vocab"),
            n_embd: num("n_embd"),
            n_layer: num("n_layer"),
            sequences,
        }
    }

    /// How closely `ours` — each sequence's logits `[positions][n_vocab]`, in the manifest's
    /// order — follow this golden's, over every position of every sequence.
    pub fn agreement(&self, ours: impl IntoIterator<Item = impl AsRef<[f32]>>) -> Agreement {
        self.sequences
            .iter()
            .zip(ours)
            .map(|(s, o)| Agreement::of(o.as_ref(), &s.logits, self.n_vocab))
            .reduce(Agreement::merge)
            .expect("a sequence")
    }

    /// How closely `other` (a golden of the same token sequences: a control) follows this one.
    pub fn agreement_with(&self, other: &Golden) -> Agreement {
        for (a, b) in other.sequences.iter().zip(&self.sequences) {
            assert_eq!(a.tokens, b.tokens, "the goldens hold other sequences");
        }
        self.agreement(other.sequences.iter().map(|s| &s.logits))
    }

    /// Opens the model file (or builds the generated one).
    pub fn file(&self) -> Arc<ModelFile> {
        if let Some(sha) = &self.model_sha256 {
            return geometry::model(sha);
        }
        ModelFile::open(&self.model).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Every golden model stem.
pub const ALL: &[&str] = &[
    "tiny-f32",
    "tiny-f32-scale",
    "tiny-tq2_0",
    "tiny-tq1_0",
    "tiny-tq2_0-f16emb",
    "tiny-i2s",
];

/// The golden models of the other families (`llama`, `qwen2`, `qwen3`, `qwen3moe`, `gemma2`,
/// `gemma3`, `phi3`, `gpt-oss`;
/// golden-values/families.py):
/// llama.cpp's, and bitnet.cpp's for the `llama` + I2_S one.
pub const FAMILIES: &[&str] = &[
    "tiny-llama-f16",
    "tiny-llama-q8_0",
    "tiny-qwen2-f16",
    "tiny-falcon3-f16",
    "tiny-falcon3-i2s",
    "tiny-mistral-f32",
    "tiny-llama-tq1_0",
    "tiny-qwen2-tq2_0",
    "tiny-qwen3-f16",
    "tiny-qwen3moe-f16",
    "tiny-gemma2-f16",
    "tiny-gemma3-f16",
    "tiny-phi3-f16",
    "tiny-mixtral-f16",
    "tiny-gpt-oss-f16",
];

/// Golden models made by llama.cpp's own quantizer from `tiny-llama-f16`, `tiny-mistral-f32`,
/// `tiny-gpt-oss-f16`, `tiny-qwen3moe-f16` and `tiny-falcon3-f16` (golden-values/families.py):
/// the file types people download — Q4_0, Q4_K_M, Q5_K_M, Q6_K, BF16, an untied Q4_K_M (a Q4_K
/// embedding), gpt-oss's MXFP4 experts beside Q8_0 matrices, a mixture's Q4_K_M (Q4_K and Q6_K
/// experts) and a Q4_K_M with heads of 256 (Falcon3's) — with llama.cpp's logits for them.
pub const QUANTS: &[&str] = &[
    "tiny-llama-q4_0",
    "tiny-llama-q4_k_m",
    "tiny-llama-q5_k_m",
    "tiny-llama-q6_k",
    "tiny-llama-bf16",
    "tiny-mistral-q4_k_m",
    "tiny-gpt-oss-mxfp4",
    "tiny-qwen3moe-q4_k_m",
    "tiny-falcon3-q4_k_m",
];

/// The instruction sets to test on this machine: the scalar reference and the best SIMD one.
/// With `HESPER_TEST_SIMD_ONLY=1` only the SIMD one, which must then exist: CI sets it under
/// emulation (aarch64 in qemu), where the scalar path would repeat, many times slower, the same
/// target-independent Rust the native run has just checked.
pub fn isas() -> Vec<Isa> {
    let simd = Isa::detect();
    if std::env::var_os("HESPER_TEST_SIMD_ONLY").is_some_and(|v| v == "1") {
        assert_ne!(
            simd,
            Isa::Scalar,
            "HESPER_TEST_SIMD_ONLY=1 on a machine without SIMD"
        );
        return vec![simd];
    }
    let mut v = vec![Isa::Scalar];
    if simd != Isa::Scalar {
        v.push(simd);
    }
    v
}

/// Loads `file` (optionally only `layers`) on a 2-thread CPU backend using `isa`.
pub fn cpu_model(
    file: &Arc<ModelFile>,
    isa: Isa,
    layers: Option<std::ops::Range<usize>>,
) -> Model<CpuBackend> {
    cpu_model_with(
        file,
        isa,
        LoadOptions {
            layers,
            ..Default::default()
        },
    )
}

/// Loads `file` (optionally only `layers`) on the GPU backend; finding no adapter fails.
#[cfg(feature = "gpu")]
pub fn gpu_model(
    file: &Arc<ModelFile>,
    layers: Option<std::ops::Range<usize>>,
) -> Model<hesper_gpu_backend::GpuBackend> {
    let backend = hesper_gpu_backend::GpuBackend::new().unwrap_or_else(|e| panic!("{e}"));
    let opts = LoadOptions {
        layers,
        ..Default::default()
    };
    Model::load(backend, file.clone(), opts).unwrap_or_else(|e| panic!("{e}"))
}

/// Loads `file` on a 2-thread CPU backend using `isa` with explicit options.
pub fn cpu_model_with(file: &Arc<ModelFile>, isa: Isa, opts: LoadOptions<'_>) -> Model<CpuBackend> {
    let backend = CpuBackend::with_isa(2, isa).unwrap_or_else(|e| panic!("{e}"));
    Model::load(backend, file.clone(), opts).unwrap_or_else(|e| panic!("{e}"))
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Cosine similarity.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Index of the largest value.
pub fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
            if x > best.1 {
                (i, x)
            } else {
                best
            }
        })
        .0
}

/// Per-op reference tensors of one sequence (`golden-values/out/<stem>.ops.json`).
pub struct Ops {
    /// Token ids.
    pub tokens: Vec<u32>,
    tensors: std::collections::HashMap<String, Vec<f32>>,
}

impl Ops {
    /// Reads the op tensors of `stem`.
    pub fn load(stem: &str) -> Self {
        let out = golden_dir().join("out");
        let m = read_manifest(&out.join(format!("{stem}.ops.json")));
        let mut blobs = std::collections::HashMap::new();
        let mut tensors = std::collections::HashMap::new();
        for (name, op) in m["ops"]
            .as_object()
            .unwrap_or_else(|| panic!("{stem}: no ops"))
        {
            let file = op["file"].as_str().unwrap_or_default().to_string();
            let blob = blobs
                .entry(file.clone())
                .or_insert_with(|| read_f32(&out.join(&file)));
            let start = op["offset"].as_u64().unwrap_or_default() as usize / 4;
            let len: usize = op["shape"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_u64)
                .product::<u64>() as usize;
            tensors.insert(name.clone(), blob[start..start + len].to_vec());
        }
        let tokens = m["tokens"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .map(|t| t as u32)
            .collect();
        Self { tokens, tensors }
    }

    /// The tensor `name` (e.g. `q_proj-0`), `[n_tokens][width]`.
    pub fn get(&self, name: &str) -> &[f32] {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("op {name} missing"))
    }
}

/// How closely one engine's logits follow the reference's over all positions of some
/// sequences (model level).
#[derive(Debug, Clone, Copy)]
pub struct Agreement {
    /// Largest absolute logit difference.
    pub max_abs: f32,
    /// Smallest cosine similarity of a position's logit vectors.
    pub min_cosine: f64,
    /// Positions whose argmax agrees.
    pub same_argmax: usize,
    /// Positions compared.
    pub positions: usize,
}

impl Agreement {
    /// Compares `ours` with `reference`, both `[positions][n_vocab]` (several sequences may be
    /// folded in with [`Agreement::merge`]).
    pub fn of(ours: &[f32], reference: &[f32], n_vocab: usize) -> Self {
        let mut a = Self {
            max_abs: max_abs_diff(ours, reference),
            min_cosine: 1.0,
            same_argmax: 0,
            positions: 0,
        };
        for (x, y) in ours.chunks(n_vocab).zip(reference.chunks(n_vocab)) {
            a.min_cosine = a.min_cosine.min(cosine(x, y));
            a.same_argmax += usize::from(argmax(x) == argmax(y));
            a.positions += 1;
        }
        a
    }

    /// Both comparisons together.
    pub fn merge(self, other: Self) -> Self {
        Self {
            max_abs: self.max_abs.max(other.max_abs),
            min_cosine: self.min_cosine.min(other.min_cosine),
            same_argmax: self.same_argmax + other.same_argmax,
            positions: self.positions + other.positions,
        }
    }

    /// Whether this agreement is within `bound`.
    pub fn within(&self, bound: QuantizedBound) -> bool {
        self.min_cosine >= bound.min_cosine
            && self.same_argmax as f64 >= bound.argmax_share * self.positions as f64
    }
}

/// A model-level bound for files with quantized activations. Rounding to int8 is
/// discontinuous, so a correct engine that sums in another order than the reference still
/// flips a code now and then, and the flips grow with the width and the number of positions:
/// the bound is set per golden model from what an exact float64 emulation of llama.cpp's own
/// scheme reaches against llama.cpp, and checked to reject a known-wrong scheme (per-token int8
/// where llama.cpp quantizes Q8_K blocks of 256).
#[derive(Debug, Clone, Copy)]
pub struct QuantizedBound {
    /// Smallest cosine similarity allowed at any position.
    pub min_cosine: f64,
    /// Share of positions whose argmax must agree.
    pub argmax_share: f64,
}

/// The bound for the tiny golden models (width 256, ≤ 33 positions): every TQ file on every
/// CPU path and the GPU reaches min cosine 0.99994 and every argmax, exactly what the float64
/// emulation of Q8_K gets against llama.cpp's logits (one flip inside llama.cpp's own f32
/// evaluation); I2_S vs the float64 reference 1.0000000. The known-wrong scheme
/// (`out/tiny-tq2_0.per-token-i8.json`) reaches 0.99959 and 54 of 56 argmaxes, which the old
/// bound (0.999, 90 % of argmaxes) accepted.
pub const TINY_BOUND: QuantizedBound = QuantizedBound {
    min_cosine: 0.9999,
    argmax_share: 1.0,
};

/// The bound for the 2B4T-geometry model (width 2560/6912, 1056 positions): there the
/// float64 emulation of llama.cpp's Q8_K scheme reaches only min cosine 0.99963 and 1026 of
/// 1056 argmaxes against llama.cpp (the logits of 512 random tokens have near-ties), the CPU
/// backend 0.99976 and 1035; per-token int8 reaches 0.99600 and 950 (the manifest's
/// `controls`, which the tests hold this bound to).
pub const GEOMETRY_BOUND: QuantizedBound = QuantizedBound {
    min_cosine: 0.9995,
    argmax_share: 0.96,
};

impl std::fmt::Display for Agreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "max|Δlogit| {:.3e}, min cosine {:.7}, argmax {}/{}",
            self.max_abs, self.min_cosine, self.same_argmax, self.positions
        )
    }
}

/// Where `ne[0]` of tensor `name` is stored in a GGUF file's bytes: after its tensor-table
/// record's name (length, then bytes) and dimension count.
pub fn dim0_offset(gguf: &[u8], name: &str) -> usize {
    let record = [&(name.len() as u64).to_le_bytes()[..], name.as_bytes()].concat();
    gguf.windows(record.len())
        .position(|w| w == record)
        .unwrap_or_else(|| panic!("no tensor record {name:?}"))
        + record.len()
        + 4
}
