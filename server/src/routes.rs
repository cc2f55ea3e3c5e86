//! The router: llama-server's and OpenAI's paths, the API-key check, CORS when asked, JSON
//! errors for unknown paths and methods, and the small endpoints (`/health`, `/v1/models`,
//! `/props`, `/tokenize`, `/detokenize`, `/metrics`; `/reload` is the hot-swap's).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State as Ext};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use subtle::ConstantTimeEq;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::completion;
use crate::error::ApiError;
use crate::request::parse;
use crate::State;

/// Paths that answer without a key.
const PUBLIC: &[&str] = &["/health", "/v1/health"];

/// Every endpoint over `state`.
pub fn router(state: Arc<State>) -> Router {
    let mut app = Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/models", get(models))
        .route("/v1/chat/completions", post(completion::chat))
        .route("/chat/completions", post(completion::chat))
        .route("/v1/responses", post(completion::responses::create))
        .route("/v1/messages", post(completion::messages::create))
        .route("/v1/embeddings", post(crate::embeddings::create))
        .route("/embeddings", post(crate::embeddings::create))
        .route("/embedding", post(crate::embeddings::create_native))
        .route("/responses", post(completion::responses::create))
        .route("/v1/completions", post(completion::text))
        .route("/completion", post(completion::native::create))
        .route("/infill", post(completion::infill::create))
        .route("/completions", post(completion::text))
        .route("/apply-template", post(completion::apply_template))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/props", get(props))
        .route("/metrics", get(metrics))
        .route("/slots", get(crate::slots::slots))
        .route("/reload", post(crate::reload::reload));
    if state.config.webui {
        for (path, _, _) in crate::webui::FILES {
            app = app.route(path, get(move || async move { crate::webui::file(path) }));
        }
    }
    app = app
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), authorize));
    if let Ok(Some(origins)) = allowed_origins(&state.config.cors_origins) {
        app = app.layer(
            CorsLayer::new()
                .allow_origin(origins)
                .allow_methods([Method::GET, Method::POST])
                .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE]),
        );
    }
    // Outside every other layer: refused and unknown requests are logged too.
    app.layer(middleware::from_fn_with_state(
        state.clone(),
        crate::log::log_requests,
    ))
    .with_state(state)
}

/// The origins `--cors-origin` allows: `*` is any origin (alone: it would make every other
/// value pointless), any other value an exact origin such as `https://app.example`; none
/// given, no CORS at all. A value that cannot be used is an error naming it.
pub fn allowed_origins(origins: &[String]) -> Result<Option<AllowOrigin>, String> {
    if origins.is_empty() {
        return Ok(None);
    }
    if origins.iter().any(|o| o == "*") {
        if origins.len() > 1 {
            return Err("--cors-origin '*' allows every origin: give it alone".into());
        }
        return Ok(Some(AllowOrigin::any()));
    }
    let values = origins
        .iter()
        .map(|o| {
            let usable = o.starts_with("http://") || o.starts_with("https://");
            let value = HeaderValue::from_str(o).ok().filter(|_| usable);
            value.ok_or_else(|| {
                format!("--cors-origin {o:?}: give an origin such as https://app.example, or '*'")
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(AllowOrigin::list(values)))
}

/// Refuses a request without a valid key (when keys are set), comparing in constant time.
async fn authorize(Ext(state): Ext<Arc<State>>, req: Request, next: Next) -> Response {
    let keys = &state.config.api_keys;
    let path = req.uri().path();
    let page = state.config.webui && crate::webui::is_page(path);
    if keys.is_empty() || PUBLIC.contains(&path) || page || req.method() == Method::OPTIONS {
        return next.run(req).await;
    }
    let given = key_of(req.headers());
    let valid = given.is_some_and(|g| {
        keys.iter().fold(false, |ok, k| {
            ok | bool::from(k.as_bytes().ct_eq(g.as_bytes()))
        })
    });
    if valid {
        next.run(req).await
    } else {
        ApiError::new(StatusCode::UNAUTHORIZED, "Invalid API Key").into_response()
    }
}

/// The key a request carries: `Authorization: Bearer KEY` or `X-Api-Key: KEY`.
fn key_of(h: &HeaderMap) -> Option<&str> {
    if let Some(v) = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        return v.strip_prefix("Bearer ").map(str::trim);
    }
    h.get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// How much of an over-long body is read and dropped before the 413 goes out, and for how long:
/// a client that sends its whole body before it reads the answer (Python's `http.client`,
/// curl without `Expect`) would otherwise meet a connection reset by the unread bytes instead of
/// the 413 (the lingering close of Apache and nginx). Past either bound the connection closes.
const DRAIN_BYTES: usize = 64 << 20;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads a request body of at most `--max-body` bytes: 413 past it, 408 when the whole of it
/// has not arrived within `--timeout` (however it trickles in).
pub async fn read_body(state: &State, body: Body) -> Result<Bytes, ApiError> {
    let limit = state.config.max_body;
    let read = tokio::time::timeout(state.config.timeout, collect(body, limit));
    let Ok(read) = read.await else {
        return Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive within --timeout",
        ));
    };
    match read {
        Ok(bytes) => Ok(bytes),
        Err(Collect::TooLarge(rest)) => {
            let _ = tokio::time::timeout(DRAIN_TIME, drain(rest, DRAIN_BYTES)).await;
            Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is over {limit} bytes"),
            ))
        }
        Err(Collect::Failed(e)) => Err(ApiError::bad_request(format!(
            "cannot read the request body: {e}"
        ))),
    }
}

/// Why a body was not collected.
enum Collect {
    /// It passed the limit; what is left of it.
    TooLarge(Body),
    /// The connection failed under it.
    Failed(axum::Error),
}

/// The body's bytes, if they come to at most `limit`.
async fn collect(mut body: Body, limit: usize) -> Result<Bytes, Collect> {
    use http_body_util::BodyExt;
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(Collect::Failed)?.into_data() else {
            continue;
        };
        if bytes.len() + data.len() > limit {
            return Err(Collect::TooLarge(body));
        }
        bytes.extend_from_slice(&data);
    }
    Ok(bytes.into())
}

/// Reads and drops up to `most` bytes of what is left of `body`.
async fn drain(mut body: Body, most: usize) {
    use http_body_util::BodyExt;
    let mut read = 0;
    while read < most {
        match body.frame().await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, |d| d.len()),
            _ => return,
        }
    }
}

/// `{"status": "ok"}` once the model is ready (a 503 saying why while it loads, or while a
/// ring that lost a node forms again). With `--hot-swap`, each call first swaps in
/// what changed in the model file (ik_llama.cpp's trigger; calls share checks spaced at least
/// [`crate::reload::HEALTH_CHECK_INTERVAL`] apart), and says so under `hot_swap`; a
/// refused file does not make the server unhealthy (it goes on with the weights it had).
async fn health(Ext(state): Ext<Arc<State>>) -> Response {
    if let Err(e) = state.ready().and_then(|r| r.available()) {
        return e.into_response();
    }
    if !state.config.hot_swap {
        return Json(json!({"status": "ok"})).into_response();
    }
    let swap = crate::reload::health_check(&state).await;
    Json(json!({"status": "ok", "hot_swap": swap})).into_response()
}

async fn models(Ext(state): Ext<Arc<State>>) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": state.config.alias,
            "object": "model",
            "created": completion::unix_time(),
            "owned_by": "hesper-rs",
            "meta": ready.meta,
        }],
    })))
}

/// `GET /v1/models/{id}`: the model served, or a 404 naming the id.
async fn model(
    Ext(state): Ext<Arc<State>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    let Json(list) = models(Ext(state)).await?;
    let found = list["data"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["id"] == id.as_str());
    found.cloned().map(Json).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("The model {id:?} does not exist: this server serves one model, named in /v1/models"),
        )
    })
}

async fn props(Ext(state): Ext<Arc<State>>) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    let mut props = ready.props.clone();
    props["total_slots"] = json!(ready.parallel);
    props["default_generation_settings"] = json!({ "n_ctx": ready.n_ctx });
    let g = ready.submitter.gauges();
    props["kv_pool"] = json!({
        "capacity": g.kv_capacity.load(Ordering::Relaxed),
        "held": g.kv_positions.load(Ordering::Relaxed),
    });
    props["model_alias"] = json!(state.config.alias);
    props["build_info"] = json!(concat!("hesper-rs ", env!("CARGO_PKG_VERSION")));
    Ok(Json(props))
}

#[derive(Deserialize)]
struct TokenizeBody {
    content: String,
    #[serde(default)]
    add_special: bool,
    #[serde(default)]
    parse_special: Option<bool>,
    #[serde(default)]
    with_pieces: bool,
}

async fn tokenize(Ext(state): Ext<Arc<State>>, body: Body) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    let b: TokenizeBody = parse(&read_body(&state, body).await?)?;
    let tok = &ready.tok;
    let ids = tok
        .encode(
            &b.content,
            b.add_special && tok.add_bos(),
            b.parse_special.unwrap_or(true),
        )
        .map_err(|e| ApiError::bad_param("content", e.to_string()))?;
    let tokens: Vec<Value> = if b.with_pieces {
        ids.iter()
            .map(|&id| {
                let piece = tok.token_piece(id, true);
                let piece = match String::from_utf8(piece) {
                    Ok(s) => json!(s),
                    Err(e) => json!(e.into_bytes()),
                };
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({ "tokens": tokens })))
}

#[derive(Deserialize)]
struct DetokenizeBody {
    tokens: Vec<i64>,
}

async fn detokenize(Ext(state): Ext<Arc<State>>, body: Body) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    let b: DetokenizeBody = parse(&read_body(&state, body).await?)?;
    let n = ready.tok.vocab_size();
    let mut ids = Vec::with_capacity(b.tokens.len());
    for t in b.tokens {
        match u32::try_from(t).ok().filter(|&t| (t as usize) < n) {
            Some(t) => ids.push(t),
            None => {
                return Err(ApiError::bad_param(
                    "tokens",
                    format!("token {t} is not an id below {n}"),
                ))
            }
        }
    }
    Ok(Json(json!({ "content": ready.tok.decode(&ids) })))
}

async fn metrics(Ext(state): Ext<Arc<State>>) -> Response {
    if !state.config.metrics {
        return ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "metrics are off; start the server with --metrics",
        )
        .into_response();
    }
    let ready = match state.ready() {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let text = state.metrics.render(ready.submitter.gauges());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no endpoint {} {}", req.method(), req.uri().path()),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not answer {}", req.uri().path(), req.method()),
    )
}
