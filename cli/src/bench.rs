//! `hesper-rs bench`: prompt-processing and generation speed, in the spirit of `llama-bench`.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use hesper_cpu::CpuBackend;
use hesper_engine::backend::Backend;
use hesper_engine::model::{Logits, Model};
use hesper_gpu_backend::GpuBackend;
use hesper_runtime::load::AnyModel;

use crate::args::{LmHead, ModelArgs};
use crate::attention::AttentionArgs;
use crate::load::load;
use crate::report::note;

/// Flags of `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens processed in one batch (pp test; 0 = skip).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Tokens generated one at a time (tg test; 0 = skip).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    repetitions: usize,
    /// Prompt batch size.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,
    /// Print JSON instead of a table.
    #[arg(long = "json")]
    json: bool,
    /// Also measure the memory bandwidth that bounds decoding and print generation speed as a
    /// share of its roofline, bandwidth / bytes per token: on the CPU the host's read
    /// bandwidth (same threads, about 2 s), on the GPU the device's copy bandwidth (bytes read
    /// plus written by buffer-to-buffer copies, as CUDA's bandwidth test counts them).
    #[arg(long = "roofline")]
    roofline: bool,
    /// CPU backend: run the prompt test (and 16 generated tokens) once more with every
    /// operation timed, and print each kind's share of the time (matmul, attention, ...).
    #[arg(long = "profile")]
    profile: bool,
    /// GPU backend: submit a step's recorded work each time it holds this many dispatches, so
    /// the GPU starts while the host records the rest (0: one submit per step, with its
    /// read-back).
    #[arg(long = "gpu-flush", value_name = "DISPATCHES", default_value_t = hesper_gpu_backend::FLUSH_DISPATCHES)]
    gpu_flush: usize,
    #[command(flatten)]
    attention: AttentionArgs,
}

/// One test's result.
struct Row {
    test: String,
    tokens_per_s: Vec<f64>,
}

impl Row {
    fn mean_sd(&self) -> (f64, f64) {
        let n = self.tokens_per_s.len() as f64;
        let mean = self.tokens_per_s.iter().sum::<f64>() / n;
        let var = self
            .tokens_per_s
            .iter()
            .map(|v| (v - mean).powi(2))
            .sum::<f64>()
            / (n - 1.0).max(1.0);
        (mean, var.sqrt())
    }
}

/// Runs `bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    if args.repetitions == 0 || (args.n_prompt == 0 && args.n_gen == 0) {
        bail!("nothing to measure: give -r >= 1 and -p or -n above 0");
    }
    args.attention.config()?;
    let loaded = load(&args.model, None)?;
    match &loaded.model {
        // On the backend's own threads: see `run_model!`.
        AnyModel::Cpu(model) => model.backend.install(|| {
            bench_on(&args, model, None)?;
            if args.profile {
                op_profile(&args, model)?;
            }
            Ok(())
        }),
        AnyModel::Gpu(model) => {
            model.backend.set_flush_dispatches(match args.gpu_flush {
                0 => usize::MAX,
                n => n,
            });
            if args.profile {
                note!("hesper: --profile times the CPU backend's operations; the GPU prints its per-kernel times after tg");
            }
            bench_on(&args, model, Some(&model.backend))
        }
    }
}

/// Runs the tests on a model on any backend; `gpu` is the same backend when it is the GPU
/// (for its counters and per-kernel timings).
fn bench_on<B: Backend>(
    args: &BenchArgs,
    model: &Model<B>,
    gpu: Option<&GpuBackend>,
) -> Result<()> {
    let gpu_stats = || gpu.map(GpuBackend::stats);
    let c = &model.config;
    let n_ctx = args.n_prompt.max(args.n_gen).max(1);
    let attention = args.attention.config()?;
    let session = |batch: usize| model.new_session_with(n_ctx, batch, &attention);
    // Sized (and refused, if too large) before any test runs.
    drop(session(args.batch_size)?);
    if n_ctx > c.n_ctx_train {
        note!(
            "hesper: note: {n_ctx} tokens exceed the model's training context {}",
            c.n_ctx_train
        );
    }
    // Deterministic, in-vocabulary token ids.
    let ids = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|i| ((i as u64 * 2_654_435_761 + 1) % c.n_vocab as u64) as u32)
            .collect()
    };
    let mut rows = Vec::new();
    let mut gpu_line = None;
    if args.n_prompt > 0 {
        let tokens = ids(args.n_prompt);
        let mut row = Row {
            test: format!("pp{}", args.n_prompt),
            tokens_per_s: Vec::new(),
        };
        // One untimed pass first, as llama-bench does: pipelines compile, pages fault in.
        model.eval(&mut session(args.batch_size)?, &tokens, Logits::Last)?;
        for _ in 0..args.repetitions {
            let mut s = session(args.batch_size)?;
            let t0 = Instant::now();
            model.eval(&mut s, &tokens, Logits::Last)?;
            row.tokens_per_s
                .push(tokens.len() as f64 / t0.elapsed().as_secs_f64());
        }
        rows.push(row);
    }
    if args.n_gen > 0 {
        let tokens = ids(args.n_gen);
        let mut row = Row {
            test: format!("tg{}", args.n_gen),
            tokens_per_s: Vec::new(),
        };
        model.eval(&mut session(1)?, &tokens[..1], Logits::Last)?;
        for _ in 0..args.repetitions {
            let mut s = session(1)?;
            let before = gpu_stats();
            let t0 = Instant::now();
            for &t in &tokens {
                model.eval(&mut s, &[t], Logits::Last)?;
            }
            let wall = t0.elapsed().as_secs_f64();
            row.tokens_per_s.push(tokens.len() as f64 / wall);
            if let (Some(a), Some(b)) = (before, gpu_stats()) {
                let n = tokens.len() as f64;
                let ms = |ns: u64| ns as f64 / 1e6 / n;
                gpu_line = Some(format!(
                    "gpu per generated token: {:.1} dispatches, {:.2} queue submits, {:.3} ms of host time ({:.3} ms waiting for the GPU, {:.3} ms encoding and submitting, the rest recording and sampling); during tg: pipeline cache {} hits, {} misses, {} bind groups created",
                    (b.dispatches - a.dispatches) as f64 / n,
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
        rows.push(row);
    }
    let weight_bytes = model.bytes_per_token();
    let resident = resident_mib();
    // Measured after the tests so that the model's pages stay warm for them.
    let bandwidth = match (args.roofline, gpu) {
        (false, _) => None,
        (true, Some(gpu)) => Some(gpu.copy_bandwidth(3)? / 1e9),
        (true, None) => Some(hesper_cpu::membw::read_bandwidth(
            args.model.threads(),
            1 << 30,
            4,
        )),
    };
    let roofline = bandwidth.map(|gbs| gbs * 1e9 / weight_bytes as f64);
    let kernels = match gpu.filter(|_| args.n_gen > 0) {
        Some(gpu) => Some(kernel_profile(
            model,
            gpu,
            &ids(args.n_gen.min(16)),
            bandwidth,
        )?),
        None => None,
    };
    let size_mib = model.file.len() as f64 / (1 << 20) as f64;
    let n_params = model
        .file
        .header()
        .tensors()
        .iter()
        .map(|t| t.n_elements())
        .sum::<u64>();
    let mut out = std::io::stdout().lock();
    if args.json {
        let items: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                let (mean, sd) = r.mean_sd();
                serde_json::json!({
                    "model": model.file.source, "lm_head": args.model.lm_head.flag(), "size_bytes": model.file.len(), "params": n_params,
                    "backend": model.backend.name(), "threads": args.model.threads(), "test": r.test, "gpu": gpu_line, "attention": attention.describe(),
                    "avg_ts": mean, "stddev_ts": sd, "samples_ts": r.tokens_per_s,
                    "bytes_per_token": weight_bytes, "gb_per_s": if r.test.starts_with("tg") { mean * weight_bytes as f64 / 1e9 } else { f64::NAN },
                    "read_gb_per_s": bandwidth.filter(|_| gpu.is_none()), "gpu_copy_gb_per_s": bandwidth.filter(|_| gpu.is_some()),
                    "roofline_ts": roofline, "roofline_share": roofline.filter(|_| r.test.starts_with("tg")).map(|roof| mean / roof),
                    "kernels": kernels.as_ref().filter(|_| r.test.starts_with("tg")).map(|k| k.json()),
                })
            })
            .collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&items)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "| model | size | params | backend | test | t/s | weight GB/s |"
    )?;
    writeln!(out, "| --- | ---: | ---: | --- | ---: | ---: | ---: |")?;
    for r in &rows {
        let (mean, sd) = r.mean_sd();
        let gbs = if r.test.starts_with("tg") {
            format!("{:.2}", mean * weight_bytes as f64 / 1e9)
        } else {
            "-".into()
        };
        writeln!(
            out,
            "| {} | {size_mib:.2} MiB | {} | {} | {} | {mean:.2} ± {sd:.2} | {gbs} |",
            match args.model.lm_head {
                LmHead::Exact => c.arch.clone(),
                head => format!("{} (lm-head {})", c.arch, head.flag()),
            },
            show_params(n_params),
            model.backend.name(),
            r.test
        )?;
    }
    writeln!(out, "\nattention: {}", attention.describe())?;
    writeln!(
        out,
        "bytes read per generated token (weights incl. LM head): {:.1} MB",
        weight_bytes as f64 / 1e6
    )?;
    if let Some(mib) = resident {
        writeln!(
            out,
            "resident set after the tests: {mib:.0} MiB (file {size_mib:.0} MiB)"
        )?;
    }
    if let (Some(gbs), Some(roof)) = (bandwidth, roofline) {
        if gpu.is_some() {
            writeln!(
                out,
                "GPU copy bandwidth (read + written): {gbs:.1} GB/s -> roofline {roof:.2} t/s"
            )?;
        } else {
            writeln!(
                out,
                "memory read bandwidth ({} threads): {gbs:.1} GB/s -> roofline {roof:.2} t/s",
                args.model.threads()
            )?;
        }
        for r in rows.iter().filter(|r| r.test.starts_with("tg")) {
            writeln!(
                out,
                "{}: {:.1} % of the roofline",
                r.test,
                100.0 * r.mean_sd().0 / roof
            )?;
        }
    }
    if let Some(line) = gpu_line {
        writeln!(out, "{line}")?;
    }
    if let Some(kernels) = kernels {
        kernels.print(&mut out)?;
    }
    Ok(())
}

/// A parameter count as llama-bench prints it: `2.41 B`, `4.52 M`, `812.00 K`.
fn show_params(n: u64) -> String {
    let n = n as f64;
    match n {
        n if n >= 1e9 => format!("{:.2} B", n / 1e9),
        n if n >= 1e6 => format!("{:.2} M", n / 1e6),
        n => format!("{:.2} K", n / 1e3),
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

/// Runs the prompt test and 16 generated tokens once more with the CPU backend timing each
/// operation, and prints each kind's share.
fn op_profile(args: &BenchArgs, model: &Model<CpuBackend>) -> Result<()> {
    let c = &model.config;
    let ids = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|i| ((i as u64 * 2_654_435_761 + 1) % c.n_vocab as u64) as u32)
            .collect()
    };
    let mut out = std::io::stdout().lock();
    let n_gen = args.n_gen.min(16);
    let passes: [(String, usize, usize); 2] = [
        (
            format!("pp{}", args.n_prompt),
            args.n_prompt,
            args.batch_size,
        ),
        (format!("tg{n_gen}"), n_gen, 1),
    ];
    for (test, n, batch) in passes.into_iter().filter(|p| p.1 > 0) {
        let mut s = model.new_session(n.max(1), batch)?;
        let tokens = ids(n);
        model.backend.set_profiling(true);
        let t0 = Instant::now();
        for chunk in tokens.chunks(batch) {
            model.eval(&mut s, chunk, Logits::Last)?;
        }
        let wall = t0.elapsed().as_nanos() as f64;
        let times = model.backend.op_times();
        model.backend.set_profiling(false);
        writeln!(
            out,
            "\nCPU time by operation, {test} ({}):",
            model.backend.name()
        )?;
        writeln!(out, "| op | calls | ms | share |")?;
        writeln!(out, "| --- | ---: | ---: | ---: |")?;
        let timed: u64 = times.iter().map(|t| t.ns).sum();
        for t in times.iter().filter(|t| t.calls > 0) {
            writeln!(
                out,
                "| {} | {} | {:.1} | {:.1} % |",
                t.op.name(),
                t.calls,
                t.ns as f64 / 1e6,
                100.0 * t.ns as f64 / wall
            )?;
        }
        writeln!(
            out,
            "| outside the backend (LM head read-back, sampling, bookkeeping) | | {:.1} | {:.1} % |",
            (wall - timed as f64).max(0.0) / 1e6,
            100.0 * (wall - timed as f64).max(0.0) / wall
        )?;
    }
    Ok(())
}

/// GPU time per generated token by kernel, from timestamp queries, with the bytes each
/// kernel reads and writes (as the backend counts them when it records the launch).
struct KernelProfile {
    /// Tokens decoded while timing.
    tokens: usize,
    /// Per kernel, slowest first; `None` when the adapter has no `TIMESTAMP_QUERY`.
    times: Option<Vec<hesper_gpu_backend::KernelTime>>,
    /// The device's copy bandwidth in GB/s, when `--roofline` measured it.
    bandwidth: Option<f64>,
}

/// One kernel's figures per generated token.
struct PerToken {
    launches: f64,
    us: f64,
    /// Megabytes read and written; `None` where the launches were not counted.
    mb: Option<f64>,
    /// The bandwidth those bytes took, in GB/s.
    gbs: Option<f64>,
}

impl KernelProfile {
    fn per_token(&self, k: &hesper_gpu_backend::KernelTime) -> PerToken {
        let n = self.tokens as f64;
        let counted = (k.bytes > 0).then_some(k.bytes as f64);
        PerToken {
            launches: k.calls as f64 / n,
            us: k.ns / n / 1e3,
            mb: counted.map(|b| b / n / 1e6),
            gbs: counted.filter(|_| k.ns > 0.0).map(|b| b / k.ns),
        }
    }

    /// `[{kernel, launches_per_token, us_per_token, mb_per_token, gb_per_s,
    /// bandwidth_share}]`, or null without timestamps.
    fn json(&self) -> serde_json::Value {
        match &self.times {
            None => serde_json::Value::Null,
            Some(times) => times
                .iter()
                .map(|k| {
                    let p = self.per_token(k);
                    serde_json::json!({
                        "kernel": k.name, "launches_per_token": p.launches, "us_per_token": p.us,
                        "mb_per_token": p.mb, "gb_per_s": p.gbs,
                        "bandwidth_share": p.gbs.zip(self.bandwidth).map(|(g, b)| g / b),
                    })
                })
                .collect(),
        }
    }

    fn print(&self, out: &mut impl Write) -> Result<()> {
        let Some(times) = &self.times else {
            writeln!(
                out,
                "(the adapter has no TIMESTAMP_QUERY: no per-kernel GPU time)"
            )?;
            return Ok(());
        };
        let total: f64 = times.iter().map(|k| k.ns).sum();
        writeln!(out, "\nGPU time per generated token by kernel (timestamp queries, {} tokens; one pass per dispatch while timing), with the bytes each kernel reads and writes:", self.tokens)?;
        let share_of = |gbs: Option<f64>| match (gbs, self.bandwidth) {
            (Some(g), Some(b)) => format!(" {:.1} % |", 100.0 * g / b),
            (_, Some(_)) => " - |".into(),
            _ => String::new(),
        };
        let (head, rule) = match self.bandwidth {
            Some(_) => (" of copy bandwidth |", " ---: |"),
            None => ("", ""),
        };
        writeln!(
            out,
            "| kernel | launches/token | µs/token | share | MB/token | GB/s |{head}"
        )?;
        writeln!(out, "| --- | ---: | ---: | ---: | ---: | ---: |{rule}")?;
        let or_dash = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
        };
        for k in times {
            let p = self.per_token(k);
            writeln!(
                out,
                "| {} | {:.0} | {:.1} | {:.1} % | {} | {} |{}",
                k.name,
                p.launches,
                p.us,
                100.0 * k.ns / total.max(1.0),
                or_dash(p.mb, 2),
                or_dash(p.gbs, 1),
                share_of(p.gbs)
            )?;
        }
        let bytes: u64 = times.iter().map(|k| k.bytes).sum();
        let all = PerToken {
            launches: 0.0,
            us: total / self.tokens as f64 / 1e3,
            mb: Some(bytes as f64 / self.tokens as f64 / 1e6),
            gbs: (total > 0.0).then(|| bytes as f64 / total),
        };
        writeln!(
            out,
            "| total | | {:.1} | | {} | {} |{}",
            all.us,
            or_dash(all.mb, 2),
            or_dash(all.gbs, 1),
            share_of(all.gbs)
        )?;
        Ok(())
    }
}

/// Decodes `tokens` once more with timestamp queries and returns GPU time (and traffic) per
/// kernel; `bandwidth` (GB/s) is what each kernel's bandwidth is a share of.
fn kernel_profile<B: Backend>(
    model: &Model<B>,
    gpu: &GpuBackend,
    tokens: &[u32],
    bandwidth: Option<f64>,
) -> Result<KernelProfile> {
    if !gpu.set_profiling(true) {
        return Ok(KernelProfile {
            tokens: tokens.len(),
            times: None,
            bandwidth,
        });
    }
    let mut s = model.new_session(tokens.len(), 1)?;
    for &t in tokens {
        model.eval(&mut s, &[t], Logits::Last)?;
    }
    let times = gpu.kernel_times();
    gpu.set_profiling(false);
    Ok(KernelProfile {
        tokens: tokens.len(),
        times: Some(times),
        bandwidth,
    })
}
