//! `/metrics` in Prometheus' text format: request and token counters, the scheduler's queue,
//! running sequences and KV cache use, and histograms of time to first token, time per output
//! token and request latency.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use hesper_runtime::scheduler::Gauges;

/// Seconds bounds of the latency histograms.
const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// A histogram of seconds.
#[derive(Debug)]
pub struct Histogram {
    /// Observations at or below each bound, then the total count.
    counts: Mutex<(Vec<u64>, f64)>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: Mutex::new((vec![0; BUCKETS.len() + 1], 0.0)),
        }
    }
}

impl Histogram {
    /// Records one observation of `seconds`.
    pub fn observe(&self, seconds: f64) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        for (i, &b) in BUCKETS.iter().enumerate() {
            if seconds <= b {
                c.0[i] += 1;
            }
        }
        c.0[BUCKETS.len()] += 1;
        c.1 += seconds;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", c.0[i]);
        }
        let n = c.0[BUCKETS.len()];
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {n}", c.1);
    }
}

/// What the HTTP side counts.
#[derive(Debug)]
pub struct Metrics {
    /// When the server started.
    started: Instant,
    /// Completion requests answered (all endpoints), errors included.
    pub requests: AtomicU64,
    /// Requests refused because the admission queue was full.
    pub rejected: AtomicU64,
    /// Requests that ended with an error.
    pub errors: AtomicU64,
    /// Time from a request's arrival to its first token.
    pub ttft: Histogram,
    /// Time per output token after the first.
    pub tpot: Histogram,
    /// Time from arrival to the last token.
    pub latency: Histogram,
    /// Hot-swap checks, swaps, tensors and refusals.
    pub swaps: crate::reload::SwapCounters,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            requests: AtomicU64::default(),
            rejected: AtomicU64::default(),
            errors: AtomicU64::default(),
            ttft: Histogram::default(),
            tpot: Histogram::default(),
            latency: Histogram::default(),
            swaps: crate::reload::SwapCounters::default(),
        }
    }
}

impl Metrics {
    /// Everything in Prometheus' text format, the scheduler's `gauges` included.
    pub fn render(&self, g: &Gauges) -> String {
        let count = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let gauge = |a: &AtomicUsize| a.load(Ordering::Relaxed) as f64;
        let (used, cap) = (gauge(&g.kv_positions), gauge(&g.kv_capacity));
        let usage = if cap > 0.0 { used / cap } else { 0.0 };
        let values: [(&str, &str, &str, f64); 17] = [
            (
                "hesper_requests_total",
                "counter",
                "Completion requests received.",
                count(&self.requests),
            ),
            (
                "hesper_requests_rejected_total",
                "counter",
                "Requests refused with 503 because the admission queue was full.",
                count(&self.rejected),
            ),
            (
                "hesper_requests_failed_total",
                "counter",
                "Requests that ended with an error.",
                count(&self.errors),
            ),
            (
                "hesper_prompt_tokens_total",
                "counter",
                "Prompt tokens evaluated.",
                count(&g.prompt_tokens),
            ),
            (
                "hesper_prompt_tokens_cached_total",
                "counter",
                "Prompt tokens taken from the prefix cache instead.",
                count(&g.cached_tokens),
            ),
            (
                "hesper_tokens_generated_total",
                "counter",
                "Tokens generated.",
                count(&g.generated_tokens),
            ),
            (
                "hesper_steps_total",
                "counter",
                "Batched steps run.",
                count(&g.steps),
            ),
            (
                "hesper_requests_queued",
                "gauge",
                "Sequences waiting for admission.",
                gauge(&g.queued),
            ),
            (
                "hesper_sequences_running",
                "gauge",
                "Sequences running.",
                gauge(&g.running),
            ),
            (
                "hesper_kv_cache_positions",
                "gauge",
                "KV positions held by running sequences and the prefix cache.",
                used,
            ),
            (
                "hesper_kv_cache_capacity_positions",
                "gauge",
                "KV positions the sessions can hold.",
                cap,
            ),
            (
                "hesper_kv_cache_usage_ratio",
                "gauge",
                "KV positions held over capacity.",
                usage,
            ),
            (
                "hesper_hot_swap_checks_total",
                "counter",
                "Hot-swap checks run (--hot-swap: GET /health, POST /reload).",
                count(&self.swaps.checks),
            ),
            (
                "hesper_hot_swaps_total",
                "counter",
                "Hot-swap checks that swapped changed tensors in.",
                count(&self.swaps.swaps),
            ),
            (
                "hesper_hot_swap_tensors_total",
                "counter",
                "Tensors swapped in.",
                count(&self.swaps.tensors),
            ),
            (
                "hesper_hot_swap_refused_total",
                "counter",
                "Changed files a hot-swap refused (the weights loaded before stayed).",
                count(&self.swaps.refused),
            ),
            (
                "hesper_uptime_seconds",
                "gauge",
                "Seconds since the server started.",
                self.started.elapsed().as_secs_f64(),
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, v) in values {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
        self.ttft.write(
            &mut out,
            "hesper_time_to_first_token_seconds",
            "Time from a request's arrival to its first token.",
        );
        self.tpot.write(
            &mut out,
            "hesper_time_per_output_token_seconds",
            "Time per output token after the first, per request.",
        );
        self.latency.write(
            &mut out,
            "hesper_request_duration_seconds",
            "Time from a request's arrival to its last token.",
        );
        out
    }
}
