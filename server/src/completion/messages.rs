//! `POST /v1/messages`, Anthropic's Messages API (what Claude Code and the `anthropic` SDK
//! speak): `system`, `messages` of text, `tool_use` and `tool_result` blocks, `max_tokens`,
//! `stop_sequences`, sampling, `tools` with `input_schema` and `tool_choice`,
//! `output_config.format` (a JSON schema) and `thinking` become one chat request on the same
//! scheduler; the answer is a `message` with its content blocks (a
//! `thinking` block for a thought, `text`, `tool_use`), `stop_reason` and `usage`, or streamed
//! as Anthropic's named events (`message_start`, `content_block_start`/`_delta`/`_stop`,
//! `message_delta`, `message_stop`). Errors have Anthropic's shape:
//! `{"type": "error", "error": {"type": …, "message": …}}`.

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

use super::{copy_fields, start_translated, translated_stream, Answer, Kind, Translation, Update};
use crate::error::ApiError;
use crate::tools::stream::{Delta, Piece};
use crate::State;

/// `POST /v1/messages`.
pub async fn create(Ext(state): Ext<Arc<State>>, body: Body) -> Response {
    let arrived = Instant::now();
    let (_, plan, updates) = match start_translated(&state, body, chat_body, Kind::Chat).await {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    let m = Messaging::new(Answer::new(plan, state, arrived));
    if m.a.plan.stream {
        translated_stream(m, updates).into_response()
    } else {
        collect(m, updates).await
    }
}

/// Anthropic's error `type` for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        s if s.is_client_error() => "invalid_request_error",
        _ => "api_error",
    }
}

/// `e` as Anthropic sends an error.
fn error_body(e: &ApiError) -> Value {
    let message = match &e.param {
        Some(p) => format!("{p}: {}", e.message),
        None => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": error_type(e.status), "message": message}})
}

fn error_response(e: &ApiError) -> Response {
    let mut r = (e.status, Json(error_body(e))).into_response();
    if let Some(s) = e.retry_after {
        r.headers_mut()
            .insert(axum::http::header::RETRY_AFTER, s.into());
    }
    r
}

/// The chat request a Messages request asks for, as JSON (its fields checked and named).
fn chat_body(r: &Value) -> Result<Value, ApiError> {
    let Some(r) = r.as_object() else {
        return Err(ApiError::bad_request("the body is not a JSON object"));
    };
    let mut messages = Vec::new();
    match r.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(Value::Array(blocks)) => {
            let text = text_of_blocks(blocks, "system")?;
            messages.push(json!({"role": "system", "content": text}));
        }
        Some(_) => {
            return Err(ApiError::bad_param(
                "system",
                "system: a string or a list of text blocks",
            ))
        }
    }
    let Some(Value::Array(turns)) = r.get("messages") else {
        return Err(ApiError::bad_param(
            "messages",
            "messages is required: a list of turns",
        ));
    };
    for (i, turn) in turns.iter().enumerate() {
        messages.extend(turn_messages(turn, i)?);
    }
    if !r.get("max_tokens").is_some_and(Value::is_u64) {
        return Err(ApiError::bad_param(
            "max_tokens",
            "max_tokens is required: a positive integer",
        ));
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::from(messages));
    copy_fields(
        r,
        &mut chat,
        &[
            ("model", "model"),
            ("max_tokens", "max_tokens"),
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("top_k", "top_k"),
            ("stream", "stream"),
            ("stop_sequences", "stop"),
        ],
    );
    if let Some(tools) = r.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = r.get("tool_choice").filter(|v| !v.is_null()) {
        let kind = choice.get("type").and_then(Value::as_str);
        let named = choice.get("name").and_then(Value::as_str);
        let c = match (kind, named) {
            (Some("auto"), _) => json!("auto"),
            (Some("any"), _) => json!("required"),
            (Some("none"), _) => json!("none"),
            (Some("tool"), Some(name)) => json!({"type": "function", "function": {"name": name}}),
            _ => {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    "tool_choice: {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": …}",
                ))
            }
        };
        chat.insert("tool_choice".into(), c);
        if choice.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
            chat.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    // Structured outputs: `output_config.format` is a JSON schema; `effort` reaches the
    // template as `reasoning_effort`.
    if let Some(config) = r.get("output_config").filter(|v| !v.is_null()) {
        if let Some(format) = config.get("format").filter(|v| !v.is_null()) {
            if format.get("type").and_then(Value::as_str) != Some("json_schema") {
                return Err(ApiError::bad_param(
                    "output_config.format",
                    "output_config.format: {\"type\": \"json_schema\", \"schema\": {…}}",
                ));
            }
            chat.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "output",
                       "schema": format.get("schema")}}),
            );
        }
        if let Some(effort) = config.get("effort").filter(|v| !v.is_null()) {
            chat.insert("reasoning_effort".into(), effort.clone());
        }
    }
    // Extended thinking, for a template that can switch it (Qwen3's `enable_thinking`).
    if let Some(kind) = r
        .get("thinking")
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
    {
        chat.insert(
            "chat_template_kwargs".into(),
            json!({ "enable_thinking": kind == "enabled" }),
        );
    }
    Ok(Value::Object(chat))
}

/// Anthropic's tools (`name`, `description`, `input_schema`) as OpenAI's.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let Some(tools) = tools.as_array() else {
        return Err(ApiError::bad_param("tools", "tools: a list"));
    };
    let tools = tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            match t.get("type").and_then(Value::as_str) {
                None | Some("custom") => {}
                Some(other) => {
                    return Err(ApiError::bad_param(
                        &format!("tools[{i}].type"),
                        format!("tools[{i}].type {other:?}: only client tools (custom) run here"),
                    ))
                }
            }
            let mut f = json!({ "name": t.get("name") });
            if let Some(d) = t.get("description") {
                f["description"] = d.clone();
            }
            if let Some(s) = t.get("input_schema") {
                f["parameters"] = s.clone();
            }
            Ok(json!({"type": "function", "function": f}))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Value::from(tools))
}

/// The text of a list of `text` blocks.
fn text_of_blocks(blocks: &[Value], param: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, b) in blocks.iter().enumerate() {
        match (b.get("type").and_then(Value::as_str), b.get("text")) {
            (Some("text"), Some(Value::String(t))) => text.push_str(t),
            (kind, _) => {
                return Err(ApiError::bad_param(
                    &format!("{param}[{j}]"),
                    format!("a block of type {kind:?}: this model reads text blocks only"),
                ))
            }
        }
    }
    Ok(text)
}

/// One turn as chat messages: a user turn's `tool_result` blocks become `tool` messages (before
/// its text), an assistant turn's `tool_use` blocks its `tool_calls`; thinking blocks of
/// earlier answers are not read again.
fn turn_messages(turn: &Value, i: usize) -> Result<Vec<Value>, ApiError> {
    let param = format!("messages[{i}]");
    let role = match turn.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        other => {
            return Err(ApiError::bad_param(
                &format!("{param}.role"),
                format!("role {other:?}: user or assistant"),
            ))
        }
    };
    let blocks = match turn.get("content") {
        Some(Value::String(s)) => return Ok(vec![json!({"role": role, "content": s})]),
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(ApiError::bad_param(
                &format!("{param}.content"),
                "content: a string or a list of blocks",
            ))
        }
    };
    let mut out = Vec::new();
    let mut text = String::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{param}.content[{j}]");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("thinking" | "redacted_thinking") if role == "assistant" => {}
            Some("tool_use") if role == "assistant" => calls.push(json!({
                "id": b.get("id"),
                "type": "function",
                "function": {
                    "name": b.get("name"),
                    "arguments": b.get("input").unwrap_or(&json!({})).to_string(),
                },
            })),
            Some("tool_result") if role == "user" => {
                let content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => text_of_blocks(parts, &format!("{at}.content"))?,
                    Some(_) => {
                        return Err(ApiError::bad_param(
                            &format!("{at}.content"),
                            "a tool result is a string or a list of text blocks",
                        ))
                    }
                };
                let content = if b.get("is_error") == Some(&Value::Bool(true)) {
                    format!("Error: {content}")
                } else {
                    content
                };
                out.push(json!({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                                "content": content}));
            }
            other => {
                return Err(ApiError::bad_param(
                    &at,
                    format!("a {role} block of type {other:?}: text, tool_use (assistant) or tool_result (user)"),
                ))
            }
        }
    }
    if role == "assistant" {
        let mut m = json!({"role": "assistant", "content": text});
        if !calls.is_empty() {
            m["tool_calls"] = Value::from(calls);
        }
        out.push(m);
    } else if !text.is_empty() || out.is_empty() {
        out.push(json!({"role": "user", "content": text}));
    }
    Ok(out)
}

/// A message under way: the blocks opened so far, when streamed.
struct Messaging {
    a: Answer,
    id: String,
    /// Streamed: the open block (its kind) and how many were opened.
    open: Option<&'static str>,
    blocks: usize,
}

impl Messaging {
    fn new(a: Answer) -> Self {
        let id = format!("msg_{}", a.plan.id.rsplit('-').next().unwrap_or_default());
        Self {
            a,
            id,
            open: None,
            blocks: 0,
        }
    }

    /// `usage`: prompt tokens read from the cache apart, as Anthropic counts them.
    fn usage(&self) -> Value {
        let u = self.a.usage();
        let prompt = u["prompt_tokens"].as_u64().unwrap_or(0);
        let cached = u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        json!({"input_tokens": prompt - cached.min(prompt), "cache_read_input_tokens": cached,
               "cache_creation_input_tokens": 0, "output_tokens": u["completion_tokens"]})
    }

    /// The finished answer's content blocks, `stop_reason` and `stop_sequence`.
    fn finished(&self) -> (Vec<Value>, &'static str, Value) {
        let c = &self.a.choices[0];
        let (message, finish) = self.a.message(0, c);
        let mut content = Vec::new();
        if let Some(thought) = message["reasoning_content"].as_str() {
            content.push(json!({"type": "thinking", "thinking": thought, "signature": ""}));
        }
        let text = message["content"].as_str().unwrap_or_default();
        let calls = message["tool_calls"].as_array();
        if !text.is_empty() || calls.is_none() {
            content.push(json!({"type": "text", "text": text}));
        }
        for call in calls.into_iter().flatten() {
            let input: Value =
                serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or("{}"))
                    .unwrap_or_else(|_| json!({}));
            content.push(json!({"type": "tool_use", "id": call["id"],
                                "name": call["function"]["name"], "input": input}));
        }
        let (reason, sequence) = match (finish, &c.stop) {
            (Some("tool_calls"), _) => ("tool_use", Value::Null),
            (Some("length"), _) => ("max_tokens", Value::Null),
            (_, Some(s)) => ("stop_sequence", json!(s)),
            _ => ("end_turn", Value::Null),
        };
        (content, reason, sequence)
    }

    /// The `message` object.
    fn object(&self, content: Vec<Value>, reason: Value, sequence: Value) -> Value {
        json!({"id": self.id, "type": "message", "role": "assistant", "model": self.a.plan.model,
               "content": content, "stop_reason": reason, "stop_sequence": sequence,
               "usage": self.usage()})
    }

    fn event(kind: &str, mut data: Value) -> Event {
        data["type"] = json!(kind);
        Event::default().event(kind).data(data.to_string())
    }

    /// Opens a block of `kind` (closing the open one) unless one of that kind is open.
    fn open_block(&mut self, block: Value, out: &mut Vec<Event>) {
        let kind = match block["type"].as_str() {
            Some("thinking") => "thinking",
            Some("text") => "text",
            _ => "tool_use",
        };
        if self.open == Some(kind) && kind != "tool_use" {
            return;
        }
        self.close_block(out);
        out.push(Self::event(
            "content_block_start",
            json!({"index": self.blocks, "content_block": block}),
        ));
        self.open = Some(kind);
        self.blocks += 1;
    }

    fn close_block(&mut self, out: &mut Vec<Event>) {
        if self.open.take().is_some() {
            out.push(Self::event(
                "content_block_stop",
                json!({ "index": self.blocks - 1 }),
            ));
        }
    }

    fn delta(&self, delta: Value) -> Event {
        Self::event(
            "content_block_delta",
            json!({"index": self.blocks - 1, "delta": delta}),
        )
    }

    /// The events an update makes: the thought, then text and `tool_use` blocks as they are
    /// written.
    fn events(&mut self, u: &Update) -> Vec<Event> {
        let mut out = Vec::new();
        match u {
            Update::Started { .. } => {
                let start = self.object(vec![], Value::Null, Value::Null);
                out.push(Self::event("message_start", json!({ "message": start })));
                out.push(Self::event("ping", json!({})));
            }
            Update::Text {
                text, reasoning, ..
            } => {
                if !reasoning.is_empty() {
                    self.open_block(
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                        &mut out,
                    );
                    out.push(self.delta(json!({"type": "thinking_delta", "thinking": reasoning})));
                }
                for p in self.a.pieces(0, text) {
                    self.piece_events(p, &mut out);
                }
            }
            Update::Finish { .. } => {
                for p in self.a.closing_pieces(0) {
                    self.piece_events(p, &mut out);
                }
                if self.blocks == 0 {
                    // An empty answer still has its text block.
                    self.open_block(json!({"type": "text", "text": ""}), &mut out);
                }
                self.close_block(&mut out);
                let (_, reason, sequence) = self.finished();
                out.push(Self::event(
                    "message_delta",
                    json!({"delta": {"stop_reason": reason, "stop_sequence": sequence},
                           "usage": self.usage()}),
                ));
                out.push(Self::event("message_stop", json!({})));
            }
            Update::Failed(_) => {}
        }
        out
    }

    /// The events of a piece of the answer: text, or a `tool_use` block and its input's JSON.
    fn piece_events(&mut self, p: Piece, out: &mut Vec<Event>) {
        match p {
            Piece::Content(text) => {
                self.open_block(json!({"type": "text", "text": ""}), out);
                out.push(self.delta(json!({"type": "text_delta", "text": text})));
            }
            Piece::Call(Delta::Begin { index, name }) => {
                let id = self.a.call_id(0, index);
                self.open_block(
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    out,
                );
            }
            Piece::Call(Delta::Arguments { text, .. }) => {
                out.push(self.delta(json!({"type": "input_json_delta", "partial_json": text})));
            }
        }
    }
}

/// Waits for the answer and sends the `message`.
async fn collect(mut m: Messaging, mut updates: UnboundedReceiver<(usize, Update)>) -> Response {
    while let Some((i, u)) = updates.recv().await {
        if let Err(e) = m.a.apply(i, &u) {
            return error_response(&e);
        }
        if m.a.choices[0].finish.is_some() {
            let (content, reason, sequence) = m.finished();
            return Json(m.object(content, json!(reason), sequence)).into_response();
        }
    }
    error_response(&ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the answer did not finish",
    ))
}

impl Translation for Messaging {
    fn answer(&mut self) -> &mut Answer {
        &mut self.a
    }

    fn events(&mut self, u: &Update) -> Vec<Event> {
        Messaging::events(self, u)
    }

    /// An `error` event with Anthropic's error body.
    fn error_event(&mut self, e: &ApiError) -> Event {
        Self::event("error", error_body(e))
    }
}
