//! Running the tests on one loaded model: each test's repetitions timed, then the figures that
//! explain them (bytes per token, the roofline, the GPU's counters and per-kernel times).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use hesper_engine::backend::Backend;
use hesper_engine::gguf::Gguf;
use hesper_engine::model::{Logits, Model, Session};
use hesper_gpu_backend::GpuBackend;

use super::gpu_profile::{kernel_profile, KernelProfile};
use super::op_profile::OpTable;
use super::plan::Test;
use super::BenchArgs;
use crate::args::{LmHead, ModelArgs};
use crate::load::{BUILTIN_FILE, BUILTIN_LABEL};
use crate::report::note;

/// The model as the table names it.
pub struct ModelFacts {
    /// Where it was read from (a path, or the built-in model's label).
    pub source: String,
    /// The file's name.
    pub filename: String,
    /// The weight type of most of the layers' parameters (`I2_S`, `Q4_K`, …).
    pub type_name: String,
    /// Bytes of its tensors (as `info` sums them).
    pub size_bytes: u64,
    /// Parameters.
    pub params: u64,
    /// `--lm-head` as given.
    pub lm_head: &'static str,
}

/// One test's timings.
pub struct Record {
    /// The test.
    pub test: Test,
    /// Tokens per step while processing its prompt (1 for generation).
    pub batch: usize,
    /// Wall time of each repetition, in nanoseconds.
    pub samples_ns: Vec<f64>,
    /// On the GPU, the matrix kernel instances (decode or wide-step) its products launched in
    /// the first repetition, by name, with their launch counts; empty on the CPU.
    pub products: BTreeMap<&'static str, u64>,
    /// How its rows were stepped, in words ("steps of up to 32 rows, then one").
    pub steps: String,
}

impl Record {
    /// Tokens per second of each repetition.
    pub fn samples_ts(&self) -> Vec<f64> {
        let n = self.test.tokens() as f64;
        self.samples_ns.iter().map(|ns| n * 1e9 / ns).collect()
    }
}

/// Mean and sample standard deviation.
pub fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

/// Everything one loaded model gave.
pub struct Run {
    /// The model.
    pub model: ModelFacts,
    /// The backend and its kernels.
    pub backend: String,
    /// CPU threads.
    pub threads: usize,
    /// The attention in use, in words.
    pub attention: String,
    /// On the CPU, its kernels and each weight type's layout, in words.
    pub cpu_layout: Option<String>,
    /// Bytes read per generated token (weights and LM head).
    pub bytes_per_token: u64,
    /// The resident set after the tests, in MiB (Linux).
    pub resident_mib: Option<f64>,
    /// The measured bandwidth (`--roofline`), in GB/s: the host's read bandwidth on the CPU,
    /// the device's copy bandwidth on the GPU.
    pub bandwidth: Option<f64>,
    /// Whether the backend is the GPU.
    pub gpu: bool,
    /// The tests.
    pub records: Vec<Record>,
    /// The GPU's counters per generated token.
    pub gpu_line: Option<String>,
    /// The GPU's time per kernel.
    pub kernels: Option<KernelProfile>,
    /// The CPU's time per operation (`--profile`).
    pub ops: Vec<OpTable>,
}

impl Run {
    /// Generation speed the bandwidth allows: bandwidth / bytes per token.
    pub fn roofline(&self) -> Option<f64> {
        self.bandwidth
            .map(|gbs| gbs * 1e9 / self.bytes_per_token as f64)
    }
}

/// Deterministic, in-vocabulary token ids.
pub fn token_ids(n_vocab: usize, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i as u64 * 2_654_435_761 + 1) % n_vocab as u64) as u32)
        .collect()
}

/// Runs `tests` on `model` (any backend); `gpu` is the same backend when it is the GPU, for
/// its counters and per-kernel times.
pub fn measure<B: Backend>(
    args: &BenchArgs,
    model_args: &ModelArgs,
    tests: &[Test],
    model: &Model<B>,
    gpu: Option<&GpuBackend>,
) -> Result<Run> {
    let c = &model.config;
    let attention = args.attention.config()?;
    let session = |n_ctx: usize, batch: usize| model.new_session_with(n_ctx, batch, &attention);
    let ids = |n: usize| token_ids(c.n_vocab, n);
    let batches = &args.batch_size.0;
    // The largest context and batch, sized (and refused, if too large) before any test runs.
    let n_ctx = tests.iter().map(Test::tokens).max().unwrap_or(1).max(1);
    drop(session(n_ctx, batches.iter().copied().max().unwrap_or(1))?);
    if n_ctx > c.n_ctx_train {
        note!(
            "hesper: note: {n_ctx} tokens exceed the model's training context {}",
            c.n_ctx_train
        );
    }
    let gpu_stats = || gpu.map(GpuBackend::stats);
    let products = || gpu.map(GpuBackend::product_launches).unwrap_or_default();
    // What a decoded token's layers launch, apart from its embedding, output norm and head.
    let in_layers = match gpu {
        Some(g) => Some(layer_dispatches(model, &mut session(1, 1)?, g, ids(1)[0])?),
        None => None,
    };
    let mut records = Vec::new();
    let mut gpu_line = None;
    let mut product_launches = BTreeMap::new();
    for &test in tests {
        let batches: &[usize] = if test.n_prompt() > 0 { batches } else { &[1] };
        for &batch in batches {
            let prompt = ids(test.n_prompt());
            let gen = ids(test.n_gen());
            // One untimed pass first, as llama-bench does: pipelines compile, pages fault in.
            let warm = if prompt.is_empty() {
                &gen[..1]
            } else {
                &prompt[..]
            };
            model.eval(&mut session(test.tokens(), batch)?, warm, Logits::Last)?;
            let mut samples_ns = Vec::new();
            for rep in 0..args.repetitions {
                let mut s = session(test.tokens(), batch)?;
                let before = gpu_stats();
                let launched = products();
                let t0 = Instant::now();
                if !prompt.is_empty() {
                    model.eval(&mut s, &prompt, Logits::Last)?;
                }
                for &t in &gen {
                    model.eval(&mut s, &[t], Logits::Last)?;
                }
                let wall = t0.elapsed().as_secs_f64();
                samples_ns.push(wall * 1e9);
                if rep == 0 {
                    product_launches = launches_since(&launched, &products());
                }
                if let (true, Some(a), Some(b)) = (test.is_gen(), before, gpu_stats()) {
                    let n = gen.len() as f64;
                    let ms = |ns: u64| ns as f64 / 1e6 / n;
                    let per_token = (b.dispatches - a.dispatches) as f64 / n;
                    let layers = in_layers.map_or(String::new(), |l| {
                        format!(
                            " ({:.1} a layer, {:.1} outside the layers)",
                            l as f64 / c.n_layer as f64,
                            per_token - l as f64
                        )
                    });
                    gpu_line = Some(format!(
                        "gpu per generated token: {per_token:.1} dispatches{layers}, {:.2} queue submits, {:.3} ms of host time ({:.3} ms waiting for the GPU, {:.3} ms encoding and submitting, the rest recording and sampling); during tg: pipeline cache {} hits, {} misses, {} bind groups created",
                        (b.submits - a.submits) as f64 / n,
                        wall * 1e3 / n,
                        ms(b.wait_ns - a.wait_ns),
                        ms(b.submit_ns - a.submit_ns),
                        b.cache.hits - a.cache.hits,
                        b.cache.misses - a.cache.misses,
                        b.bind_groups - a.bind_groups
                    ));
                }
            }
            let steps = match (test.n_prompt(), test.n_gen()) {
                (0, _) => "one row a step".to_string(),
                (p, 0) => format!("steps of up to {} rows", batch.min(p)),
                (p, _) => format!("steps of up to {} rows, then one", batch.min(p)),
            };
            records.push(Record {
                test,
                batch,
                samples_ns,
                products: std::mem::take(&mut product_launches),
                steps,
            });
        }
    }
    let resident_mib = resident_mib();
    // Measured after the tests so that the model's pages stay warm for them.
    let bandwidth = match (args.roofline, gpu) {
        (false, _) => None,
        (true, Some(gpu)) => Some(gpu.copy_bandwidth(3)? / 1e9),
        (true, None) => Some(hesper_cpu::membw::read_bandwidth(
            model_args.threads(),
            1 << 30,
            4,
        )),
    };
    let first_gen = tests.iter().find(|t| t.is_gen()).map(Test::n_gen);
    let kernels = match (gpu, first_gen) {
        (Some(gpu), Some(n)) => Some(kernel_profile(model, gpu, &ids(n.min(16)), bandwidth)?),
        _ => None,
    };
    Ok(Run {
        model: facts(model.file.header(), &model.file.source, model_args),
        backend: model.backend.name(),
        threads: model_args.threads(),
        attention: attention.describe(),
        cpu_layout: gpu.is_none().then(|| {
            let head_as_stored = model_args.lm_head == LmHead::Exact;
            crate::cpu_layout::describe(&model_args.kernels, model.file.header(), head_as_stored)
        }),
        bytes_per_token: model.bytes_per_token(),
        resident_mib,
        bandwidth,
        gpu: gpu.is_some(),
        records,
        gpu_line,
        kernels,
        ops: Vec::new(),
    })
}

/// The dispatches the layers of a decoded token launch on `gpu`: token `id`'s embedding run
/// through every layer alone, as a ring node runs its range (no output norm, head or argmax).
fn layer_dispatches<B: Backend>(
    model: &Model<B>,
    s: &mut Session<B>,
    gpu: &GpuBackend,
    id: u32,
) -> Result<u64> {
    let hidden = model.embed(s, &[id])?;
    let before = gpu.stats().dispatches;
    model.forward_hidden(s, &hidden)?;
    Ok(gpu.stats().dispatches - before)
}

/// The launches of each kernel between the counts `before` and `after`, those launched only.
fn launches_since(
    before: &BTreeMap<&'static str, u64>,
    after: &BTreeMap<&'static str, u64>,
) -> BTreeMap<&'static str, u64> {
    after
        .iter()
        .map(|(&name, n)| (name, n - before.get(name).copied().unwrap_or(0)))
        .filter(|&(_, n)| n > 0)
        .collect()
}

/// The model's name, type, size and parameters.
fn facts(g: &Gguf, source: &str, args: &ModelArgs) -> ModelFacts {
    let tensors = g.tensors();
    // The type holding most of the layers' matrix parameters (a Q4_K_M file is mostly Q4_K).
    let mut by_type: BTreeMap<String, u64> = BTreeMap::new();
    let layer_matrices = tensors
        .iter()
        .filter(|t| t.name.starts_with("blk.") && t.n_dims >= 2);
    for t in layer_matrices {
        *by_type.entry(t.ty.to_string()).or_default() += t.n_elements();
    }
    let type_name = by_type
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map_or_else(|| "-".to_string(), |(ty, _)| ty);
    ModelFacts {
        source: source.to_string(),
        filename: if source == BUILTIN_LABEL {
            format!("{BUILTIN_FILE} (built-in)")
        } else {
            Path::new(source)
                .file_name()
                .map_or_else(|| source.to_string(), |f| f.to_string_lossy().into_owned())
        },
        type_name,
        size_bytes: tensors.iter().filter_map(|t| t.nbytes).sum(),
        params: tensors.iter().map(|t| t.n_elements()).sum(),
        lm_head: args.lm_head.flag(),
    }
}

/// This process's resident set in MiB (`VmRSS`; Linux only).
fn resident_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}
