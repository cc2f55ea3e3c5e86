//! A model's next-token distributions compared with a base model's over the same tokens, with
//! the statistics `llama-perplexity --kl-divergence` prints: both perplexities and their
//! relation, KL(base ‖ model) per token, the change Δp of the probability of the right token, and
//! how often both put the same token on top.

use super::Accumulator;

/// Per-token figures gathered so far.
#[derive(Debug, Clone, Default)]
pub struct Divergence {
    kld: Vec<f64>,
    dp: Vec<f64>,
    same_top: usize,
    model: Accumulator,
    base: Accumulator,
    /// Σ ln p, Σ ln p_base, Σ (ln p)², Σ (ln p_base)², Σ ln p · ln p_base (for the correlation).
    sums: [f64; 5],
}

/// A mean with its standard error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mean {
    /// The mean.
    pub mean: f64,
    /// Its standard error (0 with fewer than two values).
    pub err: f64,
}

/// Order statistics of a per-token figure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// Largest value.
    pub max: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Median.
    pub median: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 5th percentile.
    pub p5: f64,
    /// 1st percentile.
    pub p1: f64,
    /// 0.1th percentile.
    pub p0_1: f64,
    /// Smallest value.
    pub min: f64,
}

/// Everything [`Divergence::report`] works out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    /// Tokens compared.
    pub count: usize,
    /// The model's perplexity.
    pub ppl: super::Estimate,
    /// The base model's perplexity.
    pub ppl_base: super::Estimate,
    /// Pearson correlation of ln p and ln p_base of the right tokens.
    pub cor_ln_p: f64,
    /// Mean of ln(p_base / p) of the right tokens: ln(PPL / PPL_base).
    pub ln_ppl_ratio: Mean,
    /// KL(base ‖ model) per token, nats.
    pub kld: Mean,
    /// Its order statistics.
    pub kld_spread: Spread,
    /// p − p_base of the right token, as a fraction (not percent).
    pub dp: Mean,
    /// Its order statistics.
    pub dp_spread: Spread,
    /// Root mean square of Δp, with its error.
    pub rms_dp: Mean,
    /// Fraction of tokens where both put the same token on top.
    pub same_top: Mean,
}

impl Divergence {
    /// Compares one position: log-probabilities of the model and of the base, and the token that
    /// came next.
    pub fn add(&mut self, logp: &[f32], logp_base: &[f32], target: u32) {
        let mut kld = 0f64;
        for (&q, &b) in logp.iter().zip(logp_base) {
            let b = b as f64;
            kld += b.exp() * (b - q as f64);
        }
        self.kld.push(kld);
        let (lq, lb) = (
            logp[target as usize] as f64,
            logp_base[target as usize] as f64,
        );
        self.dp.push(lq.exp() - lb.exp());
        self.same_top += usize::from(argmax(logp) == argmax(logp_base));
        self.model.add(-lq);
        self.base.add(-lb);
        for (s, v) in self
            .sums
            .iter_mut()
            .zip([lq, lb, lq * lq, lb * lb, lq * lb])
        {
            *s += v;
        }
    }

    /// Compares every scored position of a chunk (`[targets.len()][n_vocab]` each).
    pub fn add_chunk(&mut self, logp: &[f32], logp_base: &[f32], targets: &[u32]) {
        let n_vocab = logp.len() / targets.len().max(1);
        for ((q, b), &t) in logp
            .chunks_exact(n_vocab)
            .zip(logp_base.chunks_exact(n_vocab))
            .zip(targets)
        {
            self.add(q, b, t);
        }
    }

    /// The model's perplexity so far (what a chunk line shows).
    pub fn ppl(&self) -> super::Estimate {
        self.model.estimate()
    }

    /// Mean KL divergence so far.
    pub fn mean_kld(&self) -> f64 {
        mean_err(&self.kld).mean
    }

    /// The statistics over every token added.
    pub fn report(&self) -> Report {
        let n = self.kld.len().max(1) as f64;
        let [sq, sb, sqq, sbb, sqb] = self.sums.map(|s| s / n);
        let cov = sqb - sq * sb;
        let cor = cov / ((sqq - sq * sq) * (sbb - sb * sb)).sqrt();
        let diff_nll = self.model.estimate().mean_nll - self.base.estimate().mean_nll;
        // Error of the mean of (nll − nll_base): var(a − b) = var a + var b − 2 cov(a, b).
        let var_diff = (sqq - sq * sq) + (sbb - sb * sb) - 2.0 * cov;
        let ln_err = if self.kld.len() > 1 {
            (var_diff.max(0.0) / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        let dp2: Vec<f64> = self.dp.iter().map(|d| d * d).collect();
        let ms = mean_err(&dp2);
        let rms = ms.mean.sqrt();
        let same = self.same_top as f64 / n;
        Report {
            count: self.kld.len(),
            ppl: self.model.estimate(),
            ppl_base: self.base.estimate(),
            cor_ln_p: cor,
            ln_ppl_ratio: Mean {
                mean: diff_nll,
                err: ln_err,
            },
            kld: mean_err(&self.kld),
            kld_spread: spread(&self.kld),
            dp: mean_err(&self.dp),
            dp_spread: spread(&self.dp),
            // d√x = dx / (2√x).
            rms_dp: Mean {
                mean: rms,
                err: if rms > 0.0 { ms.err / (2.0 * rms) } else { 0.0 },
            },
            same_top: Mean {
                mean: same,
                err: if n > 1.0 {
                    (same * (1.0 - same) / (n - 1.0)).sqrt()
                } else {
                    0.0
                },
            },
        }
    }
}

/// The first index of the largest value.
fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

fn mean_err(v: &[f64]) -> Mean {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    Mean {
        mean,
        err: if v.len() > 1 {
            (var / (n - 1.0)).sqrt()
        } else {
            0.0
        },
    }
}

/// Order statistics by nearest rank on the sorted values.
fn spread(v: &[f64]) -> Spread {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: f64| {
        if s.is_empty() {
            return 0.0;
        }
        s[((q * (s.len() - 1) as f64).round() as usize).min(s.len() - 1)]
    };
    Spread {
        max: at(1.0),
        p99_9: at(0.999),
        p99: at(0.99),
        p95: at(0.95),
        p90: at(0.90),
        median: at(0.5),
        p10: at(0.10),
        p5: at(0.05),
        p1: at(0.01),
        p0_1: at(0.001),
        min: at(0.0),
    }
}
