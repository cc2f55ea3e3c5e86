//! Errors as OpenAI's API sends them: `{"error": {"message", "type", "param", "code"}}` with the
//! matching HTTP status, before any byte of a stream.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

/// An error answer.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// The field at fault, when one is.
    pub param: Option<String>,
    /// Fields added to the error object (llama-server's `n_prompt_tokens`, `n_ctx`); boxed,
    /// so that the `Result`s that carry an error stay small.
    pub extra: Box<Map<String, Value>>,
    /// Seconds after which to try again (`Retry-After`).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// An error with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            extra: Box::default(),
            retry_after: None,
        }
    }

    /// 400: a request that cannot be served as sent.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 400 about one field.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::bad_request(message)
        }
    }

    /// 503: the model is loading, or the queue is full (`retry_after` seconds).
    pub fn unavailable(message: impl Into<String>, retry_after: u32) -> Self {
        Self {
            retry_after: Some(retry_after),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }

    /// OpenAI's `type` for this status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            StatusCode::INTERNAL_SERVER_ERROR => "server_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The JSON body (also what a stream sends when generation fails mid-way).
    pub fn body(&self) -> Value {
        let mut error = Map::new();
        error.insert("message".into(), json!(self.message));
        error.insert("type".into(), json!(self.kind()));
        error.insert("param".into(), json!(self.param));
        error.insert("code".into(), json!(self.status.as_u16()));
        error.extend(self.extra.as_ref().clone());
        json!({ "error": error })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
