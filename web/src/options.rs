//! Settings handed over from JavaScript as plain objects (`{temperature: 0, top_k: 40}`),
//! with llama.cpp's defaults for whatever is left out, and results handed back the same way.

use hesper_engine::sampler::SamplerConfig;
use hesper_runtime::settings;
use hesper_runtime::Stats;
use js_sys::{Object, Reflect};
use wasm_bindgen::{JsError, JsValue};

/// `obj[key]` as a number, if it is one; anything else there is an error naming the key.
fn number(obj: &JsValue, key: &str) -> Result<Option<f64>, JsError> {
    if !obj.is_object() {
        return Ok(None);
    }
    let v = Reflect::get(obj, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED);
    if v.is_undefined() || v.is_null() {
        return Ok(None);
    }
    v.as_f64()
        .map(Some)
        .ok_or_else(|| JsError::new(&format!("{key} must be a number")))
}

/// A whole number ≥ 0 (`-1` where `allow_negative`), named in the error.
fn count(obj: &JsValue, key: &str, allow_negative: bool) -> Result<Option<i64>, JsError> {
    match number(obj, key)? {
        None => Ok(None),
        Some(x) if x.fract() == 0.0 && (x >= 0.0 || (allow_negative && x == -1.0)) => {
            Ok(Some(x as i64))
        }
        Some(x) => Err(JsError::new(&format!(
            "{key} {x}: must be a whole number{}",
            if allow_negative {
                " (-1: no limit)"
            } else {
                " ≥ 0"
            }
        ))),
    }
}

/// Sampling settings from `{temperature, top_k, top_p, min_p, repeat_penalty, seed}`; a
/// missing seed comes from the clock.
pub fn sampler(obj: &JsValue) -> Result<SamplerConfig, JsError> {
    let mut c = SamplerConfig::default();
    if let Some(t) = number(obj, "temperature")? {
        c.temperature = t as f32;
    }
    if let Some(k) = count(obj, "top_k", false)? {
        c.top_k = k as usize;
    }
    if let Some(p) = number(obj, "top_p")? {
        c.top_p = p as f32;
    }
    if let Some(p) = number(obj, "min_p")? {
        c.min_p = p as f32;
    }
    if let Some(p) = number(obj, "repeat_penalty")? {
        c.repeat_penalty = p as f32;
    }
    c.seed = match count(obj, "seed", true)? {
        None | Some(-1) => settings::clock_seed(),
        Some(s) => s as u64,
    };
    settings::check(&c).map_err(|e| JsError::new(&e.to_string()))?;
    Ok(c)
}

/// Most tokens to generate (`n_predict`, default and `-1`: until the end of the text or a
/// full context).
pub fn n_predict(obj: &JsValue) -> Result<i64, JsError> {
    Ok(count(obj, "n_predict", true)?.unwrap_or(-1))
}

/// The context size asked for (`ctx`, 0 or missing: the model's training context, at most
/// `cap`).
pub fn ctx(obj: &JsValue, trained: usize, cap: usize) -> Result<usize, JsError> {
    Ok(match count(obj, "ctx", false)? {
        None | Some(0) => trained.min(cap),
        Some(n) => n as usize,
    })
}

/// A plain object from `(key, value)` pairs.
pub fn object(pairs: &[(&str, JsValue)]) -> JsValue {
    let o = Object::new();
    for (k, v) in pairs {
        // Setting a property on a fresh plain object cannot fail.
        let _ = Reflect::set(&o, &JsValue::from_str(k), v);
    }
    o.into()
}

/// A completion's text and timings as `{text, stopped, prompt_tokens, prompt_ms, gen_tokens,
/// gen_ms}`.
pub fn completion(text: &str, stopped: bool, stats: &Stats) -> JsValue {
    object(&[
        ("text", text.into()),
        ("stopped", stopped.into()),
        ("prompt_tokens", (stats.prompt_tokens as f64).into()),
        ("prompt_ms", stats.prompt_ms.into()),
        ("gen_tokens", (stats.gen_tokens as f64).into()),
        ("gen_ms", stats.gen_ms.into()),
    ])
}
