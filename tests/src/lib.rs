//! Helpers for golden-value tests: reading the manifests in `golden-values/out/` and
//! comparing logits.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hesper_cpu::{CpuBackend, Isa};
use hesper_engine::file::ModelFile;
use hesper_engine::model::{LoadOptions, Model};
use serde_json::Value;

/// The `golden-values/` folder.
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../golden-values")
}

/// One recorded token sequence.
pub struct Sequence {
    /// Token ids fed (no BOS added).
    pub tokens: Vec<u32>,
    /// Reference logits `[n_tokens][n_vocab]`.
    pub logits: Vec<f32>,
    /// Reference residual stream after each layer, `[n_layer][n_tokens][n_embd]`.
    pub hidden: Vec<f32>,
}

/// A golden manifest and its data.
pub struct Golden {
    /// Model file.
    pub model: PathBuf,
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
                logits: read_f32(&out.join(s["logits"].as_str().unwrap_or_default())),
                hidden: read_f32(&out.join(s["hidden"].as_str().unwrap_or_default())),
            })
            .collect();
        Self {
            model: golden_dir().join(m["model"].as_str().unwrap_or_default()),
            reference: m["reference"].as_str().unwrap_or_default().to_string(),
            act_quant: m["act_quant"].as_str().unwrap_or_default().to_string(),
            n_vocab: num("n_vocab"),
            n_embd: num("n_embd"),
            n_layer: num("n_layer"),
            sequences,
        }
    }

    /// Opens the model file.
    pub fn file(&self) -> Arc<ModelFile> {
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

/// The instruction sets to test on this machine: the scalar reference and the best SIMD one.
pub fn isas() -> Vec<Isa> {
    let mut v = vec![Isa::Scalar];
    if Isa::detect() != Isa::Scalar {
        v.push(Isa::detect());
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
