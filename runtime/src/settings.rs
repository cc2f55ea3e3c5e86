//! Sampling settings (the engine's [`SamplerConfig`], llama.cpp's names and defaults), checked
//! before any work, and a seed from the clock for when none is given.

use hesper_engine::sampler::{Sampler, SamplerConfig};
use thiserror::Error;

/// A setting whose value cannot mean anything; named by its llama.cpp flag.
#[derive(Debug, Error, PartialEq)]
#[error("{flag} {value}: {why}")]
pub struct SettingError {
    /// The flag, e.g. `--temp`.
    pub flag: &'static str,
    /// The value given.
    pub value: String,
    /// What a valid value is.
    pub why: &'static str,
}

/// Checks every value of `c`.
pub fn check(c: &SamplerConfig) -> Result<(), SettingError> {
    let bad = |flag, value: f32, why| {
        Err(SettingError {
            flag,
            value: value.to_string(),
            why,
        })
    };
    if !(0.0..=1.0).contains(&c.top_p) {
        return bad("--top-p", c.top_p, "must lie between 0 and 1");
    }
    if !(0.0..=1.0).contains(&c.min_p) {
        return bad("--min-p", c.min_p, "must lie between 0 and 1");
    }
    if !c.temperature.is_finite() {
        return bad(
            "--temp",
            c.temperature,
            "must be a finite number (0 or below = greedy)",
        );
    }
    if !(c.repeat_penalty.is_finite() && c.repeat_penalty > 0.0) {
        return bad(
            "--repeat-penalty",
            c.repeat_penalty,
            "must be a finite number above 0 (1 = off)",
        );
    }
    for (flag, v) in [
        ("--frequency-penalty", c.frequency_penalty),
        ("--presence-penalty", c.presence_penalty),
    ] {
        if !v.is_finite() {
            return bad(flag, v, "must be a finite number (0 = off)");
        }
    }
    Ok(())
}

/// A sampler for `c`, checked.
pub fn sampler(c: SamplerConfig) -> Result<Sampler, SettingError> {
    check(&c)?;
    Ok(Sampler::new(c))
}

/// A seed from the clock, for a run given none (two runs differ).
pub fn clock_seed() -> u64 {
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
    #[cfg(target_arch = "wasm32")]
    {
        (crate::clock::now_ms() * 1e6) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meaningless_values_are_named() {
        let with = |f: fn(&mut SamplerConfig)| {
            let mut c = SamplerConfig::default();
            f(&mut c);
            check(&c).map_err(|e| e.to_string())
        };
        assert_eq!(with(|_| {}), Ok(()));
        assert_eq!(with(|c| c.temperature = -1.0), Ok(()));
        assert_eq!(
            with(|c| c.temperature = f32::NAN),
            Err("--temp NaN: must be a finite number (0 or below = greedy)".into())
        );
        assert!(with(|c| c.repeat_penalty = f32::INFINITY).is_err());
        assert!(with(|c| c.repeat_penalty = 0.0).is_err());
        assert!(with(|c| c.top_p = f32::NAN).is_err());
        assert!(with(|c| c.min_p = 1.5).is_err());
        assert!(with(|c| c.presence_penalty = f32::NAN).is_err());
        assert!(with(|c| c.frequency_penalty = f32::INFINITY).is_err());
    }

    #[test]
    fn clock_seeds_differ() {
        let a = clock_seed();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_ne!(a, clock_seed());
    }
}
