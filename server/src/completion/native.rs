//! `POST /completion`, llama-server's own completion API: `prompt` (text or token ids),
//! `n_predict` (-1: until the context is full), its sampling fields (`temperature`, `top_k`,
//! `top_p`, `min_p`, `seed`, `stop`, `ignore_eos`, `cache_prompt`, `grammar`, `json_schema`,
//! penalties) and `n_probs`, run as a text completion on the same scheduler; answered with
//! llama-server's object (`content`, `stop_type`, `stopping_word`, `tokens_predicted`,
//! `tokens_evaluated`, `tokens_cached`, `timings`, `completion_probabilities`), or streamed as
//! its `data:` chunks of `content`, the last one with `stop: true` and the rest of the object.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State as Ext;
use axum::http::StatusCode;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use super::{
    copy_fields, start_translated, translated_stream, Answer, Kind, TokenLogprob, Translation,
    Update,
};
use crate::error::ApiError;
use crate::State;

/// `POST /completion`.
pub async fn create(Ext(state): Ext<Arc<State>>, body: Body) -> Response {
    respond(state, body, completion_body).await
}

/// A request `translate` reads as a `/completion` one (`POST /infill`'s), answered as
/// `/completion` answers.
pub(crate) async fn respond(
    state: Arc<State>,
    body: Body,
    translate: impl FnOnce(&Value) -> Result<Value, ApiError>,
) -> Response {
    let arrived = Instant::now();
    let (request, plan, updates) = match start_translated(&state, body, translate, Kind::Text).await
    {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let n = Native {
        a: Answer::new(plan, state, arrived),
        n_probs: request.get("n_probs").and_then(Value::as_u64).unwrap_or(0) > 0,
        settings: settings(&request),
    };
    if n.a.plan.stream {
        translated_stream(n, updates).into_response()
    } else {
        collect(n, updates).await
    }
}

/// The text-completion request a `/completion` request asks for (its own fields checked).
pub(crate) fn completion_body(r: &Value) -> Result<Value, ApiError> {
    let r = r
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object"))?;
    let prompt = r
        .get("prompt")
        .filter(|p| p.is_string() || p.as_array().is_some_and(|a| a.iter().all(Value::is_u64)));
    let Some(prompt) = prompt else {
        return Err(ApiError::bad_param(
            "prompt",
            "prompt: a string or a list of token ids",
        ));
    };
    for (field, least) in [("n_predict", -1), ("n_probs", 0)] {
        if let Some(v) = r.get(field) {
            if v.as_i64().is_none_or(|n| n < least) {
                return Err(ApiError::bad_param(
                    field,
                    format!("{field} {v}: an integer of at least {least}"),
                ));
            }
        }
    }
    let mut text = Map::new();
    text.insert("prompt".into(), prompt.clone());
    copy_fields(
        r,
        &mut text,
        &[
            ("n_predict", "max_tokens"),
            ("temperature", "temperature"),
            ("top_k", "top_k"),
            ("top_p", "top_p"),
            ("min_p", "min_p"),
            ("seed", "seed"),
            ("stop", "stop"),
            ("stream", "stream"),
            ("cache_prompt", "cache_prompt"),
            ("ignore_eos", "ignore_eos"),
            ("grammar", "grammar"),
            ("json_schema", "json_schema"),
            ("repeat_penalty", "repeat_penalty"),
            ("repeat_last_n", "repeat_last_n"),
            ("presence_penalty", "presence_penalty"),
            ("frequency_penalty", "frequency_penalty"),
        ],
    );
    if let Some(n) = r.get("n_probs").filter(|n| n.as_u64() != Some(0)) {
        text.insert("logprobs".into(), n.clone());
    }
    // llama-server's default: until the end of generation or of the context.
    text.entry("max_tokens").or_insert(json!(-1));
    Ok(Value::Object(text))
}

/// `generation_settings`: the request's sampling fields as it gave them.
fn settings(r: &Value) -> Value {
    let mut s = Map::new();
    for k in [
        "n_predict",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "seed",
        "stop",
        "stream",
        "n_probs",
        "cache_prompt",
        "ignore_eos",
        "repeat_penalty",
        "repeat_last_n",
        "presence_penalty",
        "frequency_penalty",
    ] {
        if let Some(v) = r.get(k) {
            s.insert(k.into(), v.clone());
        }
    }
    Value::Object(s)
}

/// A `/completion` answer under way.
struct Native {
    a: Answer,
    /// Whether `completion_probabilities` are sent.
    n_probs: bool,
    settings: Value,
}

impl Native {
    /// Prompt tokens.
    fn evaluated(&self) -> usize {
        self.a.plan.prompts.first().map_or(0, Vec::len)
    }

    /// `completion_probabilities` of `lps`.
    fn probabilities(lps: &[TokenLogprob]) -> Value {
        let entry = |id: u32, t: &str, b: &[u8], lp: f32| json!({"id": id, "token": t, "bytes": b, "logprob": lp});
        lps.iter()
            .map(|l| {
                let mut e = entry(l.id, &l.token, &l.bytes, l.logprob);
                e["top_logprobs"] = l
                    .top
                    .iter()
                    .map(|(id, t, b, lp)| entry(*id, t, b, *lp))
                    .collect();
                e
            })
            .collect()
    }

    /// The finished answer's object (`content` whole, or empty for a stream's last chunk).
    fn finished(&self, content: &str) -> Value {
        let c = &self.a.choices[0];
        let end = Instant::now();
        let first = self.a.first_token.unwrap_or(end);
        let prompt_n = self.evaluated().saturating_sub(c.cached);
        let prompt_ms = (first - self.a.arrived).as_secs_f64() * 1e3;
        let predicted_ms = (end - first).as_secs_f64() * 1e3;
        let per = |ms: f64, n: usize| (n > 0).then(|| ms / n as f64);
        let rate = |ms: f64, n: usize| (ms > 0.0).then(|| n as f64 * 1e3 / ms);
        let (stop_type, word) = match (c.finish, &c.stop) {
            (_, Some(w)) => ("word", w.as_str()),
            (Some("length"), _) => ("limit", ""),
            _ => ("eos", ""),
        };
        let mut v = json!({
            "index": 0,
            "content": content,
            "tokens": [],
            "id_slot": 0,
            "stop": true,
            "model": self.a.plan.model,
            "tokens_predicted": c.tokens,
            "tokens_evaluated": self.evaluated(),
            "tokens_cached": c.cached,
            "generation_settings": self.settings,
            "prompt": self.a.plan.prompts.first().map(|p| self.a.plan.ready.tok.decode(p)),
            "has_new_line": c.text.contains('\n'),
            "truncated": false,
            "stop_type": stop_type,
            "stopping_word": word,
            "timings": {
                "prompt_n": prompt_n,
                "prompt_ms": prompt_ms,
                "prompt_per_token_ms": per(prompt_ms, prompt_n),
                "prompt_per_second": rate(prompt_ms, prompt_n),
                "predicted_n": c.tokens,
                "predicted_ms": predicted_ms,
                "predicted_per_token_ms": per(predicted_ms, c.tokens),
                "predicted_per_second": rate(predicted_ms, c.tokens),
            },
        });
        if self.n_probs && !content.is_empty() {
            v["completion_probabilities"] = Self::probabilities(&c.logprobs);
        }
        v
    }
}

/// Waits for the answer and sends llama-server's object.
async fn collect(mut n: Native, mut updates: UnboundedReceiver<(usize, Update)>) -> Response {
    while let Some((i, u)) = updates.recv().await {
        if let Err(e) = n.a.apply(i, &u) {
            return e.into_response();
        }
        if n.a.choices[0].finish.is_some() {
            let text = n.a.choices[0].text.clone();
            return Json(n.finished(&text)).into_response();
        }
    }
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the answer did not finish",
    )
    .into_response()
}

impl Translation for Native {
    fn answer(&mut self) -> &mut Answer {
        &mut self.a
    }

    /// A chunk of `content` per update, and the finished object last.
    fn events(&mut self, u: &Update) -> Vec<Event> {
        let v = match u {
            Update::Text { text, logprobs, .. } => {
                let mut v = json!({
                    "index": 0,
                    "content": text,
                    "tokens": [],
                    "stop": false,
                    "id_slot": 0,
                    "tokens_evaluated": self.evaluated(),
                });
                if self.n_probs {
                    v["completion_probabilities"] = Self::probabilities(logprobs);
                }
                v
            }
            Update::Finish { .. } => self.finished(""),
            Update::Started { .. } | Update::Failed(_) => return Vec::new(),
        };
        vec![Event::default().data(v.to_string())]
    }

    fn error_event(&mut self, e: &ApiError) -> Event {
        Event::default().data(e.body().to_string())
    }
}
