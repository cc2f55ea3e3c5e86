//! `POST /v1/responses`, OpenAI's Responses API without stored state: `input` (text, or
//! messages), `instructions`, `max_output_tokens`, sampling, `text.format` (a JSON schema or
//! object) and function `tools` become one chat request on the same scheduler; the answer is
//! a `response` object with its output items (a reasoning item for a thought, a message, or
//! function calls), streamed as OpenAI's named events (`response.created` …
//! `response.output_text.delta` … `response.completed`).

use std::sync::atomic::{AtomicU64, Ordering};
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
    copy_fields, start_translated, translated_stream, unix_time, Answer, Kind, Translation, Update,
};
use crate::error::ApiError;
use crate::tools::stream::{Delta, Piece};
use crate::State;

/// `POST /v1/responses`.
pub async fn create(Ext(state): Ext<Arc<State>>, body: Body) -> Response {
    let arrived = Instant::now();
    let (request, plan, updates) = match start_translated(&state, body, chat_body, Kind::Chat).await
    {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let answer = Answer::new(plan, state, arrived);
    let r = Responding::new(answer, &request);
    if r.a.plan.stream {
        translated_stream(r, updates).into_response()
    } else {
        collect(r, updates).await
    }
}

/// The chat request a Responses request asks for, as JSON (its fields checked and named).
fn chat_body(r: &Value) -> Result<Value, ApiError> {
    let Some(r) = r.as_object() else {
        return Err(ApiError::bad_request("the body is not a JSON object"));
    };
    if r.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::bad_param(
            "previous_response_id",
            "responses are not stored here: send the whole conversation as input",
        ));
    }
    let mut messages = Vec::new();
    if let Some(i) = r.get("instructions").filter(|v| !v.is_null()) {
        let text = i
            .as_str()
            .ok_or_else(|| ApiError::bad_param("instructions", "instructions: a string"))?;
        messages.push(json!({"role": "system", "content": text}));
    }
    match r.get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                messages.push(input_item(item, i)?);
            }
        }
        _ => {
            return Err(ApiError::bad_param(
                "input",
                "input is required: a string or a list of messages",
            ))
        }
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::from(messages));
    copy_fields(
        r,
        &mut chat,
        &[
            ("model", "model"),
            ("max_output_tokens", "max_tokens"),
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("stream", "stream"),
            ("parallel_tool_calls", "parallel_tool_calls"),
            ("tool_choice", "tool_choice"),
            ("seed", "seed"),
        ],
    );
    if let Some(tools) = r.get("tools").and_then(Value::as_array) {
        let tools: Vec<Value> = tools
            .iter()
            .enumerate()
            .map(|(i, t)| match t.get("type").and_then(Value::as_str) {
                Some("function") => {
                    let mut f = t.clone();
                    if let Some(o) = f.as_object_mut() {
                        o.remove("type");
                    }
                    Ok(json!({"type": "function", "function": f}))
                }
                other => Err(ApiError::bad_param(
                    &format!("tools[{i}].type"),
                    format!("tools[{i}].type {other:?}: function is the only kind here"),
                )),
            })
            .collect::<Result<_, _>>()?;
        chat.insert("tools".into(), Value::from(tools));
    }
    // A named function is {"type": "function", "name": …} here, nested in chat.
    if let Some(Value::Object(c)) = chat.get("tool_choice") {
        if let Some(name) = c.get("name").cloned() {
            chat.insert(
                "tool_choice".into(),
                json!({"type": "function", "function": {"name": name}}),
            );
        }
    }
    if let Some(format) = r.get("text").and_then(|t| t.get("format")) {
        let kind = format.get("type").and_then(Value::as_str).unwrap_or("text");
        let response_format = match kind {
            "json_schema" => json!({"type": "json_schema", "json_schema": {
                "name": format.get("name"), "schema": format.get("schema"),
                "strict": format.get("strict")}}),
            _ => json!({ "type": kind }),
        };
        chat.insert("response_format".into(), response_format);
    }
    Ok(Value::Object(chat))
}

/// One `input` item as a chat message: a message (`role` and text content or parts), a
/// `function_call` the model made, or a `function_call_output`.
fn input_item(item: &Value, i: usize) -> Result<Value, ApiError> {
    let param = format!("input[{i}]");
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    match kind {
        "message" => {
            let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
            let text = match item.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.get("type").and_then(Value::as_str), p.get("text")) {
                            (
                                Some("input_text" | "output_text" | "text"),
                                Some(Value::String(t)),
                            ) => text.push_str(t),
                            (k, _) => {
                                return Err(ApiError::bad_param(
                                    &format!("{param}.content[{j}]"),
                                    format!(
                                        "a content part of type {k:?}: this model reads text only"
                                    ),
                                ))
                            }
                        }
                    }
                    text
                }
                _ => {
                    return Err(ApiError::bad_param(
                        &format!("{param}.content"),
                        format!("{param}.content: text or a list of text parts"),
                    ))
                }
            };
            Ok(json!({"role": role, "content": text}))
        }
        "function_call" => Ok(
            json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": item.get("call_id"), "type": "function", "function": {
                "name": item.get("name"), "arguments": item.get("arguments")}}]}),
        ),
        "function_call_output" => Ok(json!({"role": "tool", "tool_call_id": item.get("call_id"),
                                            "content": item.get("output")})),
        other => Err(ApiError::bad_param(
            &format!("{param}.type"),
            format!("{param}.type {other:?}: message, function_call or function_call_output"),
        )),
    }
}

/// A response under way: its ids, the request's echoed settings, the events sent.
struct Responding {
    a: Answer,
    id: String,
    message_id: String,
    /// Settings a `response` object repeats.
    echo: Value,
    sequence: u64,
    /// Streamed: the item open now.
    open: Open,
    /// Streamed: the thought so far (a reasoning item is first in `output` when not empty).
    thought: String,
    /// Streamed: the message's text so far, once its item was opened.
    message: Option<String>,
    /// Streamed: the function calls so far, each as its item.
    calls: Vec<Value>,
}

/// The output item a stream has open.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    None,
    Thinking,
    Message,
    /// Function call `k`.
    Call(usize),
}

impl Responding {
    fn new(a: Answer, request: &Value) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let stem = format!(
            "{:x}{:06x}",
            unix_time(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let get = |k: &str| request.get(k).cloned().unwrap_or(Value::Null);
        let echo = json!({
            "instructions": get("instructions"),
            "max_output_tokens": get("max_output_tokens"),
            "temperature": request.get("temperature").cloned().unwrap_or(json!(0.8)),
            "top_p": request.get("top_p").cloned().unwrap_or(json!(0.95)),
            "tools": request.get("tools").cloned().unwrap_or(json!([])),
            "tool_choice": request.get("tool_choice").cloned().unwrap_or(json!("auto")),
            "parallel_tool_calls": request.get("parallel_tool_calls").cloned().unwrap_or(json!(true)),
            "text": request.get("text").cloned().unwrap_or(json!({"format": {"type": "text"}})),
            "metadata": request.get("metadata").cloned().unwrap_or(json!({})),
        });
        Self {
            a,
            id: format!("resp_{stem}"),
            message_id: format!("msg_{stem}"),
            echo,
            sequence: 0,
            open: Open::None,
            thought: String::new(),
            message: None,
            calls: Vec::new(),
        }
    }

    /// The `response` object: `output` and `usage` once it has ended.
    fn object(&self, status: &str, output: Vec<Value>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.a.created,
            "status": status,
            "model": self.a.plan.model,
            "output": output,
            "error": null,
            "incomplete_details": null,
        });
        for (k, x) in self.echo.as_object().into_iter().flatten() {
            v[k] = x.clone();
        }
        if status != "in_progress" {
            let u = self.a.usage();
            v["usage"] = json!({
                "input_tokens": u["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"]},
                "output_tokens": u["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u["total_tokens"],
            });
        }
        if status == "incomplete" {
            v["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        v
    }

    /// The finished answer's output items and status: a reasoning item for a thought, the
    /// message where there is text (or nothing else), then the function calls.
    fn finished(&self) -> (Vec<Value>, &'static str) {
        let c = &self.a.choices[0];
        let (message, finish) = self.a.message(0, c);
        let mut output = Vec::new();
        if let Some(thought) = message["reasoning_content"].as_str() {
            output.push(self.reasoning_item(thought, "completed"));
        }
        let text = message["content"].as_str().unwrap_or_default();
        let calls = message["tool_calls"].as_array();
        if !text.is_empty() || calls.is_none() {
            output.push(self.message_item(text, "completed"));
        }
        for call in calls.into_iter().flatten() {
            output.push(Self::call_item(
                call["id"].as_str().unwrap_or_default(),
                &call["function"]["name"],
                &call["function"]["arguments"],
                "completed",
            ));
        }
        let status = if finish == Some("length") {
            "incomplete"
        } else {
            "completed"
        };
        (output, status)
    }

    /// A `function_call` item.
    fn call_item(call_id: &str, name: &Value, arguments: &Value, status: &str) -> Value {
        json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
               "name": name, "arguments": arguments, "status": status})
    }

    fn message_item(&self, text: &str, status: &str) -> Value {
        let content = if status == "in_progress" {
            json!([])
        } else {
            json!([Self::text_part(text)])
        };
        json!({"type": "message", "id": self.message_id, "status": status,
               "role": "assistant", "content": content})
    }

    fn text_part(text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": []})
    }

    fn reasoning_item(&self, thought: &str, status: &str) -> Value {
        json!({"type": "reasoning", "id": self.reasoning_id(), "status": status,
               "summary": [], "content": [{"type": "reasoning_text", "text": thought}]})
    }

    /// One named event with its sequence number.
    fn event(&mut self, kind: &str, mut data: Value) -> Event {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        Event::default().event(kind).data(data.to_string())
    }

    /// The events an update makes: the thought, then the message's text or the function
    /// calls as they are written.
    fn events(&mut self, u: &Update) -> Vec<Event> {
        let mut out = Vec::new();
        match u {
            Update::Started { .. } => {
                let created = self.object("in_progress", vec![]);
                out.push(self.event("response.created", json!({ "response": created })));
                let progress = self.object("in_progress", vec![]);
                out.push(self.event("response.in_progress", json!({ "response": progress })));
            }
            Update::Text {
                text, reasoning, ..
            } => {
                if !reasoning.is_empty() {
                    if self.open != Open::Thinking {
                        out.extend(self.close_open());
                        self.open = Open::Thinking;
                        let item = self.reasoning_item("", "in_progress");
                        out.push(self.event(
                            "response.output_item.added",
                            json!({"output_index": 0, "item": item}),
                        ));
                    }
                    self.thought.push_str(reasoning);
                    let id = self.reasoning_id();
                    out.push(self.event(
                        "response.reasoning_text.delta",
                        json!({"item_id": id, "output_index": 0, "content_index": 0, "delta": reasoning}),
                    ));
                }
                for p in self.a.pieces(0, text) {
                    out.extend(self.piece_events(p));
                }
            }
            Update::Finish { .. } => out.extend(self.close()),
            Update::Failed(_) => {}
        }
        out
    }

    fn reasoning_id(&self) -> String {
        format!("rs_{}", &self.id[5..])
    }

    /// Where the message item is in `output` (after a reasoning item).
    fn message_index(&self) -> usize {
        usize::from(!self.thought.is_empty())
    }

    /// Where function call `k` is in `output`.
    fn call_index(&self, k: usize) -> usize {
        self.message_index() + usize::from(self.message.is_some()) + k
    }

    /// The events of a piece of the answer: its text in the message item, or a function
    /// call's item and its arguments.
    fn piece_events(&mut self, p: Piece) -> Vec<Event> {
        let mut out = Vec::new();
        match p {
            Piece::Content(text) => {
                if self.open != Open::Message {
                    out.extend(self.open_message());
                }
                self.message.get_or_insert_with(String::new).push_str(&text);
                let (id, index) = (self.message_id.clone(), self.message_index());
                out.push(self.event(
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "delta": text, "logprobs": []}),
                ));
            }
            Piece::Call(Delta::Begin { index: k, name }) => {
                out.extend(self.close_open());
                let call_id = self.a.call_id(0, k);
                let item = Self::call_item(&call_id, &json!(name), &json!(""), "in_progress");
                self.calls.push(item.clone());
                self.open = Open::Call(k);
                let index = self.call_index(k);
                out.push(self.event(
                    "response.output_item.added",
                    json!({"output_index": index, "item": item}),
                ));
            }
            Piece::Call(Delta::Arguments { index: k, text }) => {
                let Some(call) = self.calls.get_mut(k) else {
                    return out;
                };
                let arguments = format!("{}{text}", call["arguments"].as_str().unwrap_or_default());
                call["arguments"] = json!(arguments);
                let id = call["id"].clone();
                let index = self.call_index(k);
                out.push(self.event(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": index, "delta": text}),
                ));
            }
        }
        out
    }

    /// The message item and its text part, opened (after closing the item open before).
    fn open_message(&mut self) -> Vec<Event> {
        let mut out = self.close_open();
        self.open = Open::Message;
        self.message = Some(String::new());
        let index = self.message_index();
        let item = self.message_item("", "in_progress");
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        let id = self.message_id.clone();
        out.push(self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": Self::text_part("")}),
        ));
        out
    }

    /// The end of the item open now, with all it holds.
    fn close_open(&mut self) -> Vec<Event> {
        let open = std::mem::replace(&mut self.open, Open::None);
        match open {
            Open::None => Vec::new(),
            Open::Thinking => {
                let (id, thought) = (self.reasoning_id(), self.thought.clone());
                let item = self.reasoning_item(&thought, "completed");
                vec![
                    self.event(
                        "response.reasoning_text.done",
                        json!({"item_id": id, "output_index": 0, "content_index": 0, "text": thought}),
                    ),
                    self.event(
                        "response.output_item.done",
                        json!({"output_index": 0, "item": item}),
                    ),
                ]
            }
            Open::Message => {
                let text = self.message.clone().unwrap_or_default();
                let (id, index) = (self.message_id.clone(), self.message_index());
                let item = self.message_item(&text, "completed");
                vec![
                    self.event(
                        "response.output_text.done",
                        json!({"item_id": id, "output_index": index, "content_index": 0,
                               "text": text, "logprobs": []}),
                    ),
                    self.event(
                        "response.content_part.done",
                        json!({"item_id": id, "output_index": index, "content_index": 0,
                               "part": Self::text_part(&text)}),
                    ),
                    self.event(
                        "response.output_item.done",
                        json!({"output_index": index, "item": item}),
                    ),
                ]
            }
            Open::Call(k) => {
                let mut item = self.calls[k].clone();
                item["status"] = json!("completed");
                let index = self.call_index(k);
                vec![
                    self.event(
                        "response.function_call_arguments.done",
                        json!({"item_id": item["id"], "output_index": index,
                               "arguments": item["arguments"]}),
                    ),
                    self.event(
                        "response.output_item.done",
                        json!({"output_index": index, "item": item}),
                    ),
                ]
            }
        }
    }

    /// What of the answer was not streamed yet, the end of the open item (an empty message
    /// where nothing was said), then `response.completed` (or `incomplete`).
    fn close(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        for p in self.a.closing_pieces(0) {
            out.extend(self.piece_events(p));
        }
        if self.message.is_none() && self.calls.is_empty() {
            out.extend(self.open_message());
        }
        out.extend(self.close_open());
        let (output, status) = self.finished();
        let done = self.object(status, output);
        let kind = if status == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        out.push(self.event(kind, json!({ "response": done })));
        out
    }
}

/// Waits for the answer and sends the `response` object.
async fn collect(mut r: Responding, mut updates: UnboundedReceiver<(usize, Update)>) -> Response {
    while let Some((i, u)) = updates.recv().await {
        if let Err(e) = r.a.apply(i, &u) {
            return e.into_response();
        }
        if r.a.choices[0].finish.is_some() {
            let (output, status) = r.finished();
            return Json(r.object(status, output)).into_response();
        }
    }
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the answer did not finish",
    )
    .into_response()
}

impl Translation for Responding {
    fn answer(&mut self) -> &mut Answer {
        &mut self.a
    }

    fn events(&mut self, u: &Update) -> Vec<Event> {
        Responding::events(self, u)
    }

    /// An `error` event.
    fn error_event(&mut self, e: &ApiError) -> Event {
        let body = e.body()["error"].clone();
        self.event("error", body)
    }
}
