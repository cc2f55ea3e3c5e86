//! `bench --profile` on the CPU backend: a prompt and 16 generated tokens run once more with
//! every operation timed, each kind's share of the wall time.

use std::io::Write;
use std::time::Instant;

use anyhow::Result;
use hesper_cpu::CpuBackend;
use hesper_engine::backend::Backend;
use hesper_engine::model::{Logits, Model};

/// One pass's time by operation.
pub struct OpTable {
    /// The pass (`pp512`, `tg16`).
    test: String,
    /// The backend and its kernels.
    backend: String,
    /// Wall time of the pass, in nanoseconds.
    wall_ns: f64,
    /// `(operation, calls, nanoseconds)` for each operation that ran.
    ops: Vec<(&'static str, u64, u64)>,
}

/// Times a prompt of `n_prompt` tokens in batches of `batch` and `n_gen` generated tokens (at
/// most 16), each operation timed by the backend.
pub fn op_profile(
    model: &Model<CpuBackend>,
    ids: impl Fn(usize) -> Vec<u32>,
    n_prompt: usize,
    batch: usize,
    n_gen: usize,
) -> Result<Vec<OpTable>> {
    let n_gen = n_gen.min(16);
    let passes = [
        (format!("pp{n_prompt}"), n_prompt, batch),
        (format!("tg{n_gen}"), n_gen, 1),
    ];
    let mut tables = Vec::new();
    for (test, n, batch) in passes.into_iter().filter(|p| p.1 > 0) {
        let mut s = model.new_session(n.max(1), batch)?;
        let tokens = ids(n);
        model.backend.set_profiling(true);
        let t0 = Instant::now();
        for chunk in tokens.chunks(batch) {
            model.eval(&mut s, chunk, Logits::Last)?;
        }
        let wall_ns = t0.elapsed().as_nanos() as f64;
        let times = model.backend.op_times();
        model.backend.set_profiling(false);
        tables.push(OpTable {
            test,
            backend: model.backend.name(),
            wall_ns,
            ops: times
                .iter()
                .filter(|t| t.calls > 0)
                .map(|t| (t.op.name(), t.calls, t.ns))
                .collect(),
        });
    }
    Ok(tables)
}

impl OpTable {
    /// Time outside the backend's operations (LM head read-back, sampling, bookkeeping).
    fn outside_ns(&self) -> f64 {
        let timed: u64 = self.ops.iter().map(|o| o.2).sum();
        (self.wall_ns - timed as f64).max(0.0)
    }

    /// `{test, backend, wall_ms, ops: [{op, calls, ms, share}], outside_ms}`.
    pub fn json(&self) -> serde_json::Value {
        let ops: Vec<serde_json::Value> = self
            .ops
            .iter()
            .map(|&(op, calls, ns)| {
                serde_json::json!({"op": op, "calls": calls, "ms": ns as f64 / 1e6,
                    "share": ns as f64 / self.wall_ns})
            })
            .collect();
        serde_json::json!({"test": self.test, "backend": self.backend,
            "wall_ms": self.wall_ns / 1e6, "ops": ops, "outside_ms": self.outside_ns() / 1e6})
    }

    /// The table in Markdown.
    pub fn print(&self, out: &mut impl Write) -> Result<()> {
        writeln!(
            out,
            "\nCPU time by operation, {} ({}):",
            self.test, self.backend
        )?;
        writeln!(out, "| op | calls | ms | share |")?;
        writeln!(out, "| --- | ---: | ---: | ---: |")?;
        for &(op, calls, ns) in &self.ops {
            writeln!(
                out,
                "| {op} | {calls} | {:.1} | {:.1} % |",
                ns as f64 / 1e6,
                100.0 * ns as f64 / self.wall_ns
            )?;
        }
        let outside = self.outside_ns();
        writeln!(
            out,
            "| outside the backend (LM head read-back, sampling, bookkeeping) | | {:.1} | {:.1} % |",
            outside / 1e6,
            100.0 * outside / self.wall_ns
        )?;
        Ok(())
    }
}
