//! `POST /v1/embeddings` (with `--embeddings`), as llama-server answers it for a causal model:
//! each input's tokens are evaluated alone, their final normalized hidden states (the model's
//! last layer through its final norm, before the LM head) are pooled by `--pooling` — `last`
//! (the last token's, what decoder embedding models such as Qwen3-Embedding use), `mean`
//! (over the tokens) or `cls` (the first token's) — and scaled to unit length (L2), as
//! llama-server's default `embd_normalize` does. `input` is a string, a list of strings, a
//! list of token ids or a list of such lists; `encoding_format` is `float` or `base64` (the
//! little-endian f32 bytes). `POST /embedding` is llama-server's own form of it.

use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State as Ext;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use hesper_runtime::scheduler::SubmitError;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::request::parse;
use crate::routes::read_body;
use crate::{Ready, State};

/// How the hidden states of an input's tokens become one vector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The last token's.
    #[default]
    Last,
    /// The mean over the tokens.
    Mean,
    /// The first token's.
    Cls,
}

impl FromStr for Pooling {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "last" => Ok(Self::Last),
            "mean" => Ok(Self::Mean),
            "cls" => Ok(Self::Cls),
            other => Err(format!("{other:?}: last, mean or cls")),
        }
    }
}

impl Pooling {
    /// `hidden` (`[n][d]`) pooled into one vector of unit length (a zero vector stays zero).
    pub fn pool(self, hidden: &[f32], d: usize) -> Vec<f32> {
        let rows: Vec<&[f32]> = hidden.chunks_exact(d).collect();
        let mut v = match self {
            Self::Last => rows.last().map(|r| r.to_vec()).unwrap_or_default(),
            Self::Cls => rows.first().map(|r| r.to_vec()).unwrap_or_default(),
            Self::Mean => {
                let mut sum = vec![0.0f64; d];
                for r in &rows {
                    for (s, x) in sum.iter_mut().zip(r.iter()) {
                        *s += f64::from(*x);
                    }
                }
                let n = rows.len().max(1) as f64;
                sum.iter().map(|s| (s / n) as f32).collect()
            }
        };
        let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        if norm > 0.0 {
            for x in &mut v {
                *x = (f64::from(*x) / norm) as f32;
            }
        }
        v
    }
}

/// `POST /v1/embeddings`.
pub async fn create(Ext(state): Ext<Arc<State>>, body: Body) -> Response {
    answer(&state, body, false).await
}

/// `POST /embedding`, llama-server's own: with `content` (instead of `input`), an array of
/// `{"index": i, "embedding": [[…]]}` (the pooled vector in a list, as llama-server nests it);
/// with `input`, the answer of `/v1/embeddings`.
pub async fn create_native(Ext(state): Ext<Arc<State>>, body: Body) -> Response {
    answer(&state, body, true).await
}

async fn answer(state: &State, body: Body, native: bool) -> Response {
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let answered = async {
        let r: Value = parse(&read_body(state, body).await?)?;
        match r.get("content").filter(|_| native) {
            Some(content) => {
                let (vectors, _) = embeddings(state, &r, Some(content)).await?;
                let list: Vec<Value> = vectors
                    .iter()
                    .enumerate()
                    .map(|(i, v)| json!({"index": i, "embedding": [v]}))
                    .collect();
                Ok(Value::Array(list))
            }
            None => openai_list(state, &r).await,
        }
    };
    match answered.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => {
            state.metrics.errors.fetch_add(1, Ordering::Relaxed);
            e.into_response()
        }
    }
}

/// OpenAI's answer: a list of `embedding` objects, floats or base64, with `usage`.
async fn openai_list(state: &State, r: &Value) -> Result<Value, ApiError> {
    let base64 = match r.get("encoding_format").and_then(Value::as_str) {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_param(
                "encoding_format",
                format!("encoding_format {other:?}: float or base64"),
            ))
        }
    };
    let (vectors, tokens) = embeddings(state, r, r.get("input")).await?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let model = r
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(&state.config.alias);
    Ok(json!({"object": "list", "data": data, "model": model,
              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}))
}

/// Each of `input`'s embeddings (pooled, of unit length), and the tokens they read.
async fn embeddings(
    state: &State,
    r: &Value,
    input: Option<&Value>,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let Some(pooling) = state.config.embeddings else {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "this server does not compute embeddings: start it with --embeddings",
        ));
    };
    let ready = state.ready()?;
    let d = ready.n_embd;
    if let Some(n) = r.get("dimensions").filter(|v| !v.is_null()) {
        if n.as_u64() != Some(d as u64) {
            return Err(ApiError::bad_param(
                "dimensions",
                format!("dimensions {n}: this model's embeddings have {d}"),
            ));
        }
    }
    // llama-server's `embd_normalize`: 2 (unit length, its default) is what is computed.
    if let Some(n) = r.get("embd_normalize").filter(|n| n.as_i64() != Some(2)) {
        return Err(ApiError::bad_param(
            "embd_normalize",
            format!("embd_normalize {n}: only 2 (unit length, the default) is computed"),
        ));
    }
    let inputs = inputs(&ready, input)?;
    ready.available()?;
    // Every input is queued before the first is awaited: they run between the same steps.
    let mut replies = Vec::with_capacity(inputs.len());
    for tokens in &inputs {
        let reply = ready
            .submitter
            .hidden_states(tokens.clone())
            .map_err(|e| match e {
                SubmitError::Full => ApiError::unavailable("the embeddings queue is full", 1),
                SubmitError::Closed => ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the model's scheduler stopped",
                ),
            })?;
        replies.push(reply);
    }
    let mut vectors = Vec::with_capacity(inputs.len());
    for (i, reply) in replies.into_iter().enumerate() {
        let hidden = reply
            .await
            .map_err(|_| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the model's scheduler stopped",
                )
            })?
            .map_err(|why| ApiError::bad_param("input", format!("input {i}: {why}")))?;
        vectors.push(pooling.pool(&hidden, d));
    }
    let tokens: usize = inputs.iter().map(Vec::len).sum();
    if let Some(u) = crate::log::current() {
        u.record(tokens, 0, 0, None);
    }
    Ok((vectors, tokens))
}

/// Each input's tokens: texts encoded as a prompt is (with the BOS the tokenizer adds), ids
/// checked against the vocabulary; none empty or longer than the context.
fn inputs(ready: &Ready, input: Option<&Value>) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = || {
        ApiError::bad_param(
            "input",
            "input: a string, a list of strings, a list of token ids or a list of such lists",
        )
    };
    let ids = |v: &[Value]| -> Result<Vec<u32>, ApiError> {
        v.iter()
            .map(|t| {
                t.as_u64()
                    .filter(|&t| (t as usize) < ready.n_vocab)
                    .map(|t| t as u32)
                    .ok_or_else(|| {
                        ApiError::bad_param(
                            "input",
                            format!("token {t} is not an id below {}", ready.n_vocab),
                        )
                    })
            })
            .collect()
    };
    let text = |s: &str| {
        ready
            .tok
            .encode(s, ready.tok.add_bos(), true)
            .map_err(|e| ApiError::bad_param("input", e.to_string()))
    };
    let out = match input {
        Some(Value::String(s)) => vec![text(s)?],
        Some(Value::Array(items)) if items.is_empty() => return Err(bad()),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => vec![ids(items)?],
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => text(s),
                Value::Array(v) => ids(v),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(bad()),
    };
    for (i, t) in out.iter().enumerate() {
        if t.is_empty() || t.len() > ready.n_ctx {
            return Err(ApiError::bad_param(
                "input",
                format!(
                    "input {i} has {} tokens; an input holds 1 to {} (the context)",
                    t.len(),
                    ready.n_ctx
                ),
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_picks_rows_and_scales_to_unit_length() {
        let hidden = [3.0, 4.0, 0.0, 2.0, -1.0, 0.0];
        assert_eq!(Pooling::Last.pool(&hidden, 2), vec![-1.0, 0.0]);
        assert_eq!(Pooling::Cls.pool(&hidden, 2), vec![0.6, 0.8]);
        // Mean (2/3, 2): length 2.108…
        let m = Pooling::Mean.pool(&hidden, 2);
        assert!((m[0] - 0.316_227_8).abs() < 1e-6 && (m[1] - 0.948_683_3).abs() < 1e-6);
        assert_eq!(Pooling::Last.pool(&[0.0, 0.0], 2), vec![0.0, 0.0]);
    }
}
