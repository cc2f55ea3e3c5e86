//! GPU time per generated token by kernel (timestamp queries), with the bytes each kernel
//! reads and writes: `bench --backend gpu` prints it after the decode test.

use std::io::Write;

use anyhow::Result;
use hesper_engine::backend::Backend;
use hesper_engine::model::{Logits, Model};
use hesper_gpu_backend::GpuBackend;

/// GPU time per generated token by kernel, from timestamp queries, with the bytes each
/// kernel reads and writes (as the backend counts them when it records the launch).
pub struct KernelProfile {
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
    pub fn json(&self) -> serde_json::Value {
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

    pub fn print(&self, out: &mut impl Write) -> Result<()> {
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
pub fn kernel_profile<B: Backend>(
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
