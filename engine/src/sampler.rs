//! Token sampling with llama.cpp's options, defaults and order:
//! logit bias → penalties (repeat, frequency, presence) → top-k → top-p → min-p → temperature
//! → draw.

/// Sampling settings; `Default` gives llama.cpp's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Temperature; `<= 0` means greedy (argmax).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` × the top one's (0 = off).
    pub min_p: f32,
    /// Penalty for tokens among the last `repeat_last_n` (1 = off).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtracted from a recent token's logit once per time it occurs (OpenAI's
    /// `frequency_penalty`; 0 = off).
    pub frequency_penalty: f32,
    /// Subtracted from a recent token's logit once if it occurs (OpenAI's `presence_penalty`;
    /// 0 = off).
    pub presence_penalty: f32,
    /// Added to the named tokens' logits before anything else (OpenAI's `logit_bias`;
    /// `-inf` bans a token).
    pub logit_bias: Vec<(u32, f32)>,
    /// Random seed; the same seed gives the same tokens.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0x5EED,
        }
    }
}

/// A seeded sampler.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplerConfig,
    rng: SplitMix64,
    recent: Vec<u32>,
}

impl Sampler {
    /// A sampler with `config`.
    pub fn new(config: SamplerConfig) -> Self {
        Self {
            rng: SplitMix64(config.seed),
            config,
            recent: Vec::new(),
        }
    }

    /// Whether this sampler always picks the most likely token (temperature ≤ 0, nothing that
    /// changes logits): then only the argmax of the logits is needed.
    pub fn is_greedy(&self) -> bool {
        self.config.temperature <= 0.0 && !self.changes_logits()
    }

    /// Whether a penalty or a logit bias changes the logits before the draw (then the whole
    /// row is needed).
    fn changes_logits(&self) -> bool {
        let c = &self.config;
        c.repeat_penalty != 1.0
            || c.frequency_penalty != 0.0
            || c.presence_penalty != 0.0
            || !c.logit_bias.is_empty()
    }

    /// Records a token (prompt or generated) for the repeat penalty.
    pub fn accept(&mut self, token: u32) {
        self.recent.push(token);
        let keep = self.config.repeat_last_n;
        if self.recent.len() > keep {
            self.recent.drain(..self.recent.len() - keep);
        }
    }

    /// The `k` of top-k when the backend can pick the candidates itself and hand back only
    /// them ([`Sampler::sample_top`]): sampling (temperature > 0) with top-k on and no repeat
    /// penalty or logit bias, which would need other tokens' logits.
    pub fn backend_top_k(&self) -> Option<usize> {
        let c = &self.config;
        (c.temperature > 0.0 && !self.changes_logits() && c.top_k > 0).then_some(c.top_k)
    }

    /// Picks the next token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let c = &self.config;
        let mut cands: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        for &(t, bias) in &c.logit_bias {
            if let Some(cand) = cands.get_mut(t as usize) {
                cand.1 += bias;
            }
        }
        self.penalize(&mut cands);
        if c.temperature <= 0.0 {
            return argmax(cands.iter().map(|c| c.1));
        }
        keep_top(&mut cands, c.top_k);
        self.draw(cands)
    }

    /// llama.cpp's penalties over the recent tokens, each distinct token once: the repeat
    /// penalty divides a positive logit (multiplies a negative one), then the frequency
    /// penalty times its count and the presence penalty are subtracted.
    fn penalize(&self, cands: &mut [(u32, f32)]) {
        let c = &self.config;
        if c.repeat_penalty == 1.0 && c.frequency_penalty == 0.0 && c.presence_penalty == 0.0 {
            return;
        }
        let mut counts: Vec<(u32, usize)> = Vec::new();
        for &t in &self.recent {
            match counts.iter_mut().find(|(id, _)| *id == t) {
                Some((_, n)) => *n += 1,
                None => counts.push((t, 1)),
            }
        }
        for (t, n) in counts {
            if let Some(cand) = cands.get_mut(t as usize) {
                if cand.1 > 0.0 {
                    cand.1 /= c.repeat_penalty;
                } else {
                    cand.1 *= c.repeat_penalty;
                }
                cand.1 -= n as f32 * c.frequency_penalty + c.presence_penalty;
            }
        }
    }

    /// Picks the next token from the `k` most likely candidates (`k` from
    /// [`Sampler::backend_top_k`]), as [`top_candidates`] orders them: the same token
    /// [`Sampler::sample`] picks from the whole row.
    pub fn sample_top(&mut self, top: Vec<(u32, f32)>) -> u32 {
        self.draw(top)
    }

    /// Top-k, top-p, min-p and temperature over candidates sorted most likely first, then the
    /// draw.
    fn draw(&mut self, mut cands: Vec<(u32, f32)>) -> u32 {
        let c = &self.config;
        if c.top_k > 0 {
            cands.truncate(c.top_k);
        }
        let probs = softmax(&cands, 1.0);
        if c.top_p < 1.0 {
            let mut sum = 0.0;
            let keep = probs.iter().position(|&p| {
                sum += p;
                sum >= c.top_p
            });
            cands.truncate(keep.map_or(cands.len(), |i| i + 1));
        }
        if c.min_p > 0.0 {
            let top = probs[0];
            let keep = probs
                .iter()
                .take(cands.len())
                .take_while(|&&p| p >= c.min_p * top)
                .count();
            cands.truncate(keep.max(1));
        }
        let probs = softmax(&cands, c.temperature);
        let r = self.rng.next_f64() as f32;
        let mut acc = 0.0;
        for (cand, p) in cands.iter().zip(&probs) {
            acc += p;
            if r < acc {
                return cand.0;
            }
        }
        // Rounding left `acc` short of `r`: the least likely candidate that can be drawn (a
        // token masked to −∞ by a grammar has probability 0 and never can).
        cands
            .iter()
            .zip(&probs)
            .rev()
            .find(|(_, &p)| p > 0.0)
            .map_or(0, |(c, _)| c.0)
    }
}

/// Most likely first; equal values by lower id.
fn sort_candidates(cands: &mut [(u32, f32)]) {
    cands.sort_by(by_likelihood);
}

/// The order of [`sort_candidates`]: a total order (ids differ), so a selection and a sort
/// agree.
fn by_likelihood(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Keeps the `k` most likely candidates (all when `k` is 0), sorted as [`sort_candidates`]
/// sorts: a selection in linear time, then a sort of the `k` (a vocabulary of 128 000 is not
/// sorted for top-40).
fn keep_top(cands: &mut Vec<(u32, f32)>, k: usize) {
    if k > 0 && k < cands.len() {
        cands.select_nth_unstable_by(k - 1, by_likelihood);
        cands.truncate(k);
    }
    sort_candidates(cands);
}

/// The `k` largest of `logits` as `(id, value)`, most likely first, equal values by lower id
/// (what a backend's top-k hands [`Sampler::sample_top`]).
pub fn top_candidates(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut cands: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    keep_top(&mut cands, k.max(1));
    cands.truncate(k);
    cands
}

/// Index of the largest value (first on ties).
pub fn argmax(values: impl IntoIterator<Item = f32>) -> u32 {
    let mut best = (0u32, f32::NEG_INFINITY);
    for (i, v) in values.into_iter().enumerate() {
        if v > best.1 {
            best = (i as u32, v);
        }
    }
    best.0
}

fn softmax(cands: &[(u32, f32)], temperature: f32) -> Vec<f32> {
    let max = cands.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = cands
        .iter()
        .map(|c| ((c.1 - max) / temperature).exp())
        .collect();
    let sum: f32 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// SplitMix64: small, fast, and the same sequence on every platform.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        (0..100).map(|i| ((i * 37 % 101) as f32) / 10.0).collect()
    }

    #[test]
    fn sampling_from_the_top_k_equals_sampling_from_the_row() {
        // Ties included: values repeat every 101 ids.
        let row: Vec<f32> = (0..1000).map(|i| ((i * 7919 % 101) as f32) / 7.0).collect();
        for (seed, top_k, top_p, min_p, temperature) in [
            (1, 40, 0.95, 0.05, 0.8),
            (2, 1, 1.0, 0.0, 1.0),
            (3, 5, 0.5, 0.0, 2.0),
            (4, 200, 1.0, 0.1, 0.3),
        ] {
            let config = SamplerConfig {
                seed,
                top_k,
                top_p,
                min_p,
                temperature,
                ..SamplerConfig::default()
            };
            let (mut whole, mut top) = (Sampler::new(config.clone()), Sampler::new(config));
            let k = top.backend_top_k().expect("top-k sampling");
            for _ in 0..50 {
                assert_eq!(
                    whole.sample(&row),
                    top.sample_top(top_candidates(&row, k)),
                    "seed {seed}, top-k {top_k}"
                );
            }
        }
        let off = |f: fn(&mut SamplerConfig)| {
            let mut c = SamplerConfig::default();
            f(&mut c);
            Sampler::new(c).backend_top_k()
        };
        assert_eq!(off(|_| {}), Some(40));
        assert_eq!(off(|c| c.top_k = 0), None);
        assert_eq!(off(|c| c.temperature = 0.0), None);
        assert_eq!(off(|c| c.repeat_penalty = 1.1), None);
    }

    #[test]
    fn greedy_is_argmax() {
        let l = logits();
        let mut s = Sampler::new(SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        });
        let best = l
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32);
        assert_eq!(Some(s.sample(&l)), best);
    }

    #[test]
    fn same_seed_same_tokens_and_other_seed_differs() {
        let l = logits();
        let cfg = SamplerConfig {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        let run = |seed| {
            let mut s = Sampler::new(SamplerConfig {
                seed,
                ..cfg.clone()
            });
            (0..50).map(|_| s.sample(&l)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let l = logits();
        let mut s = Sampler::new(SamplerConfig {
            top_k: 1,
            ..Default::default()
        });
        let greedy = argmax(l.iter().copied());
        assert!((0..20).all(|_| s.sample(&l) == greedy));
    }

    #[test]
    fn min_p_and_top_p_restrict_the_choice() {
        // Two strong tokens, the rest far below.
        let mut l = vec![-10.0; 50];
        l[3] = 5.0;
        l[9] = 4.9;
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            min_p: 0.5,
            ..Default::default()
        });
        assert!((0..200).all(|_| matches!(s.sample(&l), 3 | 9)));
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_p: 0.4,
            min_p: 0.0,
            ..Default::default()
        });
        assert!((0..200).all(|_| s.sample(&l) == 3));
    }

    #[test]
    fn repeat_penalty_demotes_recent_tokens() {
        let mut l = vec![0.0; 10];
        l[2] = 2.0;
        l[5] = 1.9;
        let mut s = Sampler::new(SamplerConfig {
            temperature: 0.0,
            repeat_penalty: 1.5,
            ..Default::default()
        });
        s.accept(2);
        assert_eq!(s.sample(&l), 5);
    }

    #[test]
    fn penalties_count_each_recent_token_as_llama_cpp_does() {
        // Token 2 occurs twice: the repeat penalty divides once (2.0 / 1.5 = 1.33, above 1.3),
        // the frequency penalty takes 2 × 0.1, the presence penalty 0.05 once: 1.08 < 1.3.
        let mut l = vec![0.0; 10];
        l[2] = 2.0;
        l[5] = 1.3;
        let pick = |repeat, frequency, presence| {
            let mut s = Sampler::new(SamplerConfig {
                temperature: 0.0,
                repeat_penalty: repeat,
                frequency_penalty: frequency,
                presence_penalty: presence,
                ..Default::default()
            });
            s.accept(2);
            s.accept(2);
            assert!(!s.is_greedy() || repeat == 1.0 && frequency == 0.0 && presence == 0.0);
            s.sample(&l)
        };
        assert_eq!(pick(1.0, 0.0, 0.0), 2);
        assert_eq!(pick(1.5, 0.0, 0.0), 2);
        assert_eq!(pick(1.5, 0.1, 0.0), 5);
        assert_eq!(pick(1.0, 0.0, 0.8), 5);
        assert_eq!(pick(1.0, 0.3, 0.0), 2);
    }

    #[test]
    fn logit_bias_shifts_and_bans_tokens() {
        let l = logits();
        let greedy = argmax(l.iter().copied());
        let with = |bias: Vec<(u32, f32)>| {
            let mut s = Sampler::new(SamplerConfig {
                temperature: 0.0,
                logit_bias: bias,
                ..Default::default()
            });
            assert_eq!(s.backend_top_k(), None);
            s.sample(&l)
        };
        assert_eq!(with(vec![]), greedy);
        assert_eq!(with(vec![(7, 100.0)]), 7);
        assert_ne!(with(vec![(greedy, f32::NEG_INFINITY)]), greedy);
    }
}
