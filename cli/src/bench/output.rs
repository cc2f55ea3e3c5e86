//! `bench`'s output: llama-bench's Markdown table with notes after it, or CSV, JSON and JSON
//! lines holding every figure and nothing else.

use std::collections::BTreeSet;
use std::io::Write;

use anyhow::Result;
use serde_json::{json, Value};

use super::measure::{mean_sd, Record, Run};
use super::Format;

/// Writes `runs` on stdout in `format`.
pub fn write(format: Format, runs: &[Run]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match format {
        Format::Md => markdown(&mut out, runs)?,
        Format::Csv => csv(&mut out, runs)?,
        Format::Json => {
            let rows: Vec<Value> = objects(runs).collect();
            writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
        }
        Format::Jsonl => {
            for row in objects(runs) {
                writeln!(out, "{row}")?;
            }
        }
    }
    Ok(())
}

/// Every record of every run with its run.
fn records(runs: &[Run]) -> impl Iterator<Item = (&Run, &Record)> {
    runs.iter()
        .flat_map(|run| run.records.iter().map(move |r| (run, r)))
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

/// Weight bytes read per second while generating, in GB/s.
fn weight_gbs(run: &Run, r: &Record) -> Option<f64> {
    r.test
        .is_gen()
        .then(|| mean_sd(&r.samples_ts()).0 * run.bytes_per_token as f64 / 1e9)
}

fn markdown(out: &mut impl Write, runs: &[Run]) -> Result<()> {
    writeln!(
        out,
        "| model | type | size | params | backend | threads | test | t/s | weight GB/s |"
    )?;
    writeln!(
        out,
        "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"
    )?;
    // The batch is named after a prompt test's name when several were measured.
    let batches: BTreeSet<usize> = records(runs)
        .filter(|(_, r)| r.test.n_prompt() > 0)
        .map(|(_, r)| r.batch)
        .collect();
    for (run, r) in records(runs) {
        let m = &run.model;
        let (mean, sd) = mean_sd(&r.samples_ts());
        let batch = if batches.len() > 1 && r.test.n_prompt() > 0 {
            format!(" (b {})", r.batch)
        } else {
            String::new()
        };
        writeln!(
            out,
            "| {}{} | {} | {:.2} MiB | {} | {} | {} | {}{batch} | {mean:.2} ± {sd:.2} | {} |",
            m.filename,
            match m.lm_head {
                "exact" => String::new(),
                head => format!(" (lm-head {head})"),
            },
            m.type_name,
            m.size_bytes as f64 / (1 << 20) as f64,
            show_params(m.params),
            run.backend,
            run.threads,
            r.test.name(),
            weight_gbs(run, r).map_or_else(|| "-".into(), |g| format!("{g:.2}"))
        )?;
    }
    for run in runs {
        if runs.len() > 1 {
            writeln!(out, "\n-t {}:", run.threads)?;
        } else {
            writeln!(out)?;
        }
        notes(out, run)?;
    }
    Ok(())
}

/// What explains a run's figures, after the table.
fn notes(out: &mut impl Write, run: &Run) -> Result<()> {
    writeln!(out, "attention: {}", run.attention)?;
    if let Some(layout) = &run.cpu_layout {
        writeln!(out, "cpu: {layout}")?;
    }
    writeln!(
        out,
        "bytes read per generated token (weights incl. LM head): {:.1} MB",
        run.bytes_per_token as f64 / 1e6
    )?;
    if let Some(mib) = run.resident_mib {
        writeln!(
            out,
            "resident set after the tests: {mib:.0} MiB (tensors {:.0} MiB)",
            run.model.size_bytes as f64 / (1 << 20) as f64
        )?;
    }
    if let (Some(gbs), Some(roof)) = (run.bandwidth, run.roofline()) {
        if run.gpu {
            writeln!(
                out,
                "GPU copy bandwidth (read + written): {gbs:.1} GB/s -> roofline {roof:.2} t/s"
            )?;
        } else {
            writeln!(
                out,
                "memory read bandwidth ({} threads): {gbs:.1} GB/s -> roofline {roof:.2} t/s",
                run.threads
            )?;
        }
        for r in run.records.iter().filter(|r| r.test.is_gen()) {
            writeln!(
                out,
                "{}: {:.1} % of the roofline",
                r.test.name(),
                100.0 * mean_sd(&r.samples_ts()).0 / roof
            )?;
        }
    }
    if let Some(line) = &run.gpu_line {
        writeln!(out, "{line}")?;
    }
    for r in run.records.iter().filter(|r| !r.products.is_empty()) {
        let launched: Vec<String> = r
            .products
            .iter()
            .map(|(name, n)| format!("{name} ×{n}"))
            .collect();
        writeln!(
            out,
            "gpu matrix kernels of {} ({}), launches per repetition: {}",
            r.test.name(),
            r.steps,
            launched.join(", ")
        )?;
    }
    if let Some(kernels) = &run.kernels {
        kernels.print(out)?;
    }
    for table in &run.ops {
        table.print(out)?;
    }
    Ok(())
}

/// llama-bench's CSV columns that hesper-rs fills.
const CSV_COLUMNS: &str = "model_filename,model_type,model_size,model_n_params,backends,n_threads,n_batch,n_prompt,n_gen,test,avg_ns,stddev_ns,avg_ts,stddev_ts";

fn csv(out: &mut impl Write, runs: &[Run]) -> Result<()> {
    writeln!(out, "{CSV_COLUMNS}")?;
    for (run, r) in records(runs) {
        let (avg_ns, sd_ns) = mean_sd(&r.samples_ns);
        let (avg_ts, sd_ts) = mean_sd(&r.samples_ts());
        let m = &run.model;
        let fields = [
            m.filename.clone(),
            m.type_name.clone(),
            m.size_bytes.to_string(),
            m.params.to_string(),
            run.backend.clone(),
            run.threads.to_string(),
            r.batch.to_string(),
            r.test.n_prompt().to_string(),
            r.test.n_gen().to_string(),
            r.test.name(),
            format!("{avg_ns:.0}"),
            format!("{sd_ns:.0}"),
            format!("{avg_ts:.6}"),
            format!("{sd_ts:.6}"),
        ];
        let quoted: Vec<String> = fields
            .iter()
            .map(|f| format!("\"{}\"", f.replace('"', "\"\"")))
            .collect();
        writeln!(out, "{}", quoted.join(","))?;
    }
    Ok(())
}

/// One JSON object per record: llama-bench's fields, then hesper-rs' own (the roofline, the
/// GPU's counters and kernels, the CPU's operations).
fn objects(runs: &[Run]) -> impl Iterator<Item = Value> + '_ {
    records(runs).map(|(run, r)| {
        let (avg_ns, sd_ns) = mean_sd(&r.samples_ns);
        let samples_ts = r.samples_ts();
        let (avg_ts, sd_ts) = mean_sd(&samples_ts);
        let m = &run.model;
        let gen = r.test.is_gen();
        let roofline = run.roofline();
        json!({
            "model_filename": m.filename, "model_type": m.type_name, "model_size": m.size_bytes,
            "model_n_params": m.params, "backends": run.backend, "n_threads": run.threads,
            "n_batch": r.batch, "n_prompt": r.test.n_prompt(), "n_gen": r.test.n_gen(),
            "test": r.test.name(), "avg_ns": avg_ns, "stddev_ns": sd_ns, "samples_ns": r.samples_ns,
            "avg_ts": avg_ts, "stddev_ts": sd_ts, "samples_ts": samples_ts,
            "model": m.source, "lm_head": m.lm_head, "backend": run.backend, "threads": run.threads,
            "attention": run.attention, "cpu_layout": run.cpu_layout,
            "bytes_per_token": run.bytes_per_token,
            "gb_per_s": weight_gbs(run, r), "resident_mib": run.resident_mib,
            "read_gb_per_s": run.bandwidth.filter(|_| !run.gpu),
            "gpu_copy_gb_per_s": run.bandwidth.filter(|_| run.gpu),
            "roofline_ts": roofline, "roofline_share": roofline.filter(|_| gen).map(|roof| avg_ts / roof),
            "gpu": run.gpu_line.as_ref().filter(|_| gen),
            "kernels": run.kernels.as_ref().filter(|_| gen).map(|k| k.json()),
            "matrix_kernels": (!r.products.is_empty()).then_some(&r.products),
            "profile": (!run.ops.is_empty()).then(|| run.ops.iter().map(|t| t.json()).collect::<Vec<_>>()),
        })
    })
}
