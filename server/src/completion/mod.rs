//! `/v1/chat/completions` and `/v1/completions`: a request becomes one scheduler job per answer
//! (`n` per prompt), each answer's tokens become text (stop strings held back and cut), and the
//! answers go out as one JSON object or as server-sent events exactly as OpenAI streams them.
//! Everything a request can get wrong is answered before the first byte of a stream; a client
//! that goes away drops its receivers, which cancels its sequences at the next step.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State as Ext;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hesper_engine::chat::{RenderOptions, Role};
use hesper_engine::sampler::SamplerConfig;
use hesper_engine::tokenizer::TextStream;
use hesper_runtime::grammar::GrammarConstraint;
use hesper_runtime::scheduler::{Constraint, Finish, Job, JobEvent, Logprobs, SubmitError};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::error::ApiError;
use crate::reasoning::{ReasoningFormat, Splitter, Syntax};
use crate::request::{parse, CompletionBody, Content, Message, Prompt};
use crate::routes::read_body;
use crate::stop::StopText;
use crate::structured::{self, Structure};
use crate::tools::stream::{AnswerStream, Delta, Piece};
use crate::tools::{self, Family, Said, Tools};
use crate::{Ready, State};

pub mod infill;
pub mod messages;
pub mod native;
pub mod responses;

/// Which endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

/// `POST /v1/chat/completions`.
pub async fn chat(Ext(state): Ext<Arc<State>>, body: Body) -> Response {
    handle(state, body, Kind::Chat).await
}

/// `POST /v1/completions`.
pub async fn text(Ext(state): Ext<Arc<State>>, body: Body) -> Response {
    handle(state, body, Kind::Text).await
}

/// Seconds since the Unix epoch (`created`).
pub fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn handle(state: Arc<State>, body: Body, kind: Kind) -> Response {
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let arrived = Instant::now();
    let plan = match prepare(&state, body, kind).await {
        Ok(plan) => plan,
        Err(e) => {
            state.metrics.errors.fetch_add(1, Ordering::Relaxed);
            return e.into_response();
        }
    };
    let updates = match start(&state, &plan) {
        Ok(u) => u,
        Err(e) => {
            state.metrics.errors.fetch_add(1, Ordering::Relaxed);
            return e.into_response();
        }
    };
    let answer = Answer::new(plan, state, arrived);
    if answer.plan.stream {
        stream(answer, updates).into_response()
    } else {
        collect(answer, updates).await
    }
}

/// A request read and checked.
struct Plan {
    ready: Arc<Ready>,
    kind: Kind,
    id: String,
    model: String,
    /// Each prompt's tokens; answers `n` per prompt, prompt-major.
    prompts: Vec<Vec<u32>>,
    n: usize,
    stops: Vec<String>,
    sampling: SamplerConfig,
    max_tokens: Option<usize>,
    top_logprobs: Option<usize>,
    cache_prompt: bool,
    ignore_eos: bool,
    stream: bool,
    include_usage: bool,
    /// What every answer follows (a JSON schema, a grammar), compiled.
    constraint: Option<GrammarConstraint>,
    /// Chat's tools: answers are read back as calls or a reply.
    tools: Option<Arc<Tools>>,
    /// Control tokens the answer's text keeps (a tool format's markers).
    kept_tokens: Vec<u32>,
    /// Chat: how thoughts are split off to `reasoning_content`, if they are.
    thoughts: Option<Syntax>,
}

/// Reads and checks a request: every error it can have is found here.
async fn prepare(state: &State, body: Body, kind: Kind) -> Result<Plan, ApiError> {
    state.ready()?;
    let b: CompletionBody = parse(&read_body(state, body).await?)?;
    plan(state, b, kind).await
}

/// Checks a request's body ([`prepare`], or a body another endpoint translated).
async fn plan(state: &State, b: CompletionBody, kind: Kind) -> Result<Plan, ApiError> {
    let ready = state.ready()?;
    let tools = match kind {
        Kind::Chat => tools::requested(&b, &ready.tool_format)?.map(Arc::new),
        Kind::Text => None,
    };
    let prompts = match kind {
        Kind::Chat => {
            let text = render_chat(&ready, &b, tools.as_deref()).await?;
            vec![ready
                .tok
                .encode(&text, ready.tok.add_bos(), true)
                .map_err(|e| ApiError::bad_param("messages", e.to_string()))?]
        }
        Kind::Text => text_prompts(&ready, &b)?,
    };
    for p in &prompts {
        if p.is_empty() {
            return Err(ApiError::bad_param("prompt", "the prompt is empty"));
        }
        if p.len() >= ready.n_ctx {
            let mut e = ApiError::bad_request(format!(
                "the request has {} prompt tokens; the context holds {} (an answer needs at least one more)",
                p.len(),
                ready.n_ctx
            ));
            e.extra.insert("n_prompt_tokens".into(), json!(p.len()));
            e.extra.insert("n_ctx".into(), json!(ready.n_ctx));
            return Err(e);
        }
    }
    let max_tokens = b.max_tokens()?;
    if max_tokens == Some(0) {
        return Err(ApiError::bad_param(
            "max_tokens",
            "max_tokens 0: ask for at least 1 token",
        ));
    }
    let stream = b.stream.unwrap_or(false);
    if b.stream_options.is_some() && !stream {
        return Err(ApiError::bad_param(
            "stream_options",
            "stream_options needs stream: true",
        ));
    }
    let thoughts = match kind {
        Kind::Chat => thoughts(state, &ready, &b, &prompts[0])?,
        Kind::Text => None,
    };
    let structure = match (structured::requested(&b)?, &tools) {
        (Some(s), Some(_)) => {
            return Err(ApiError::bad_param(
                s.param,
                format!("{} and tools both shape the answer: give one", s.param),
            ))
        }
        // gpt-oss thinks before its answer: a schema shapes its final channel.
        (Some(s), None) if thoughts == Some(Syntax::Harmony) => Some(s.in_final_channel()),
        (Some(s), None) => Some(s),
        (None, Some(t)) => t.grammar().map(|spec| Structure {
            spec,
            param: "tools",
        }),
        (None, None) => None,
    };
    let constraint = match structure {
        Some(s) => Some(structured::compile(&ready, s).await?),
        None => None,
    };
    static NEXT_ID: AtomicU64 = AtomicU64::new(0);
    let prefix = if kind == Kind::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    let id = format!(
        "{prefix}-{:x}{:06x}",
        unix_time(),
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    );
    Ok(Plan {
        kind,
        id,
        model: b
            .model
            .clone()
            .unwrap_or_else(|| state.config.alias.clone()),
        n: b.n()?,
        stops: b.stops()?,
        sampling: b.sampling(ready.n_vocab)?,
        max_tokens,
        top_logprobs: b.top_logprobs(kind == Kind::Chat)?,
        cache_prompt: b.cache_prompt.unwrap_or(true),
        ignore_eos: b.ignore_eos.unwrap_or(false),
        include_usage: b
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        stream,
        thoughts,
        prompts,
        constraint,
        kept_tokens: tools
            .as_ref()
            .map(|t| t.format().kept_tokens())
            .unwrap_or_default(),
        tools,
        ready,
    })
}

/// The chat's messages as the template reads them. With `tools` in a native format, tool
/// results and calls keep their structure for the template; otherwise they are written as the
/// generic format's JSON, and that format's system turn describes the tools.
fn chat_messages(b: &CompletionBody, tools: Option<&Tools>) -> Result<Vec<Value>, ApiError> {
    let Some(messages) = &b.messages else {
        return Err(ApiError::bad_param("messages", "messages is required"));
    };
    if messages.is_empty() {
        return Err(ApiError::bad_param("messages", "messages is empty"));
    }
    let native = tools.is_some_and(Tools::native);
    let harmony = tools.is_some_and(|t| t.format().family() == Family::Harmony);
    let mut out = Vec::with_capacity(messages.len() + 1);
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => Role::System,
            "user" | "tool" | "function" => Role::User,
            "assistant" => Role::Assistant,
            r => {
                return Err(ApiError::bad_param(
                    &format!("messages[{i}].role"),
                    format!("role {r:?}: system, developer, user, assistant or tool"),
                ))
            }
        };
        let text = message_text(m, i)?;
        let calls = m.tool_calls.as_deref().filter(|c| !c.is_empty());
        let message = match (m.role.as_str(), calls) {
            ("tool" | "function", _) if native => {
                let mut v = json!({"role": "tool", "content": text});
                if let Some(id) = &m.tool_call_id {
                    v["tool_call_id"] = json!(id);
                }
                if let Some(name) = &m.name {
                    v["name"] = json!(name);
                }
                v
            }
            ("tool" | "function", _) => json!({"role": "user", "content":
                tools::result_text(m.name.as_deref(), m.tool_call_id.as_deref(), &text)}),
            ("assistant", Some(calls)) if native => {
                json!({"role": "assistant", "content": text, "tool_calls": tools::calls_json(calls)})
            }
            ("assistant", Some(calls)) => {
                json!({"role": "assistant", "content": tools::calls_text(calls)})
            }
            _ => json!({"role": role.as_str(), "content": text}),
        };
        out.push(with_thought(message, m, harmony));
    }
    if let Some(t) = tools.filter(|t| !t.native()) {
        let prompt = t.system_prompt();
        match out.first_mut() {
            Some(first) if first["role"] == "system" => {
                let text = first["content"].as_str().unwrap_or_default();
                first["content"] = json!(format!("{text}\n\n{prompt}"));
            }
            _ => out.insert(0, json!({"role": "system", "content": prompt})),
        }
    }
    Ok(out)
}

/// An assistant turn with the thought its client sent back, as llama-server passes it: as
/// `reasoning_content` (which Qwen3's template reads), and to gpt-oss's template (`harmony`)
/// as `thinking`, a call's turn without its content (the template keeps a call's analysis
/// for the next turn, from one field or the other).
fn with_thought(mut message: Value, m: &Message, harmony: bool) -> Value {
    if let Some(thought) = m
        .reasoning_content
        .as_deref()
        .filter(|_| m.role == "assistant")
    {
        message["reasoning_content"] = json!(thought);
        if harmony {
            message["thinking"] = json!(thought);
            if message.get("tool_calls").is_some() {
                message.as_object_mut().map(|o| o.remove("content"));
            }
        }
    }
    message
}

/// Message `i`'s text: its content, or its text parts joined (other parts are refused).
fn message_text(m: &Message, i: usize) -> Result<String, ApiError> {
    Ok(match &m.content {
        None => String::new(),
        Some(Content::Text(s)) => s.clone(),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => text.push_str(t),
                    (k, _) => {
                        return Err(ApiError::bad_param(
                            &format!("messages[{i}].content[{j}]"),
                            format!("content part of type {k:?}: this model reads text parts only"),
                        ))
                    }
                }
            }
            text
        }
    })
}

/// The variables a request gives the template: llama-server's `chat_template_kwargs`, and
/// OpenAI's `reasoning_effort` (which gpt-oss' template reads).
fn template_variables(b: &CompletionBody) -> Result<Map<String, Value>, ApiError> {
    let mut vars = match &b.chat_template_kwargs {
        None => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => {
            return Err(ApiError::bad_param(
                "chat_template_kwargs",
                "chat_template_kwargs is an object of the template's variables",
            ))
        }
    };
    if let Some(effort) = &b.reasoning_effort {
        vars.insert("reasoning_effort".into(), json!(effort));
    }
    Ok(vars)
}

/// How a chat's thoughts are split off to `reasoning_content` (`None`: they are not): the
/// vocabulary's syntax, with whether the prompt opened a `<think>` (the answer then starts
/// inside it).
fn thoughts(
    state: &State,
    ready: &Ready,
    b: &CompletionBody,
    prompt: &[u32],
) -> Result<Option<Syntax>, ApiError> {
    let format = match &b.reasoning_format {
        Some(f) => f.parse().map_err(|e| {
            ApiError::bad_param("reasoning_format", format!("reasoning_format {e}"))
        })?,
        None => state.config.reasoning_format,
    };
    let tok = &ready.tok;
    let tail = tok.decode(&prompt[prompt.len().saturating_sub(4)..]);
    let opened = tail.trim_end().ends_with("<think>");
    let syntax = Syntax::of_vocabulary(|t| tok.token_id(t).is_some(), opened);
    Ok(match format {
        ReasoningFormat::None => None,
        // Forced: `<think>` tags where the vocabulary has no syntax of its own.
        ReasoningFormat::Deepseek => Some(syntax.unwrap_or(Syntax::Think { opened })),
        ReasoningFormat::Auto => syntax,
    })
}

/// The chat's messages (with the tools of a native format, and the request's template
/// variables) rendered by the model's template.
async fn render_chat(
    ready: &Arc<Ready>,
    b: &CompletionBody,
    tools: Option<&Tools>,
) -> Result<String, ApiError> {
    let messages = chat_messages(b, tools)?;
    let options = RenderOptions {
        tools: tools.filter(|t| t.native()).map(Tools::definitions),
        variables: template_variables(b)?,
    };
    // A template from a downloaded file may spend its whole fuel: off the async workers.
    let r = Arc::clone(ready);
    let rendered =
        tokio::task::spawn_blocking(move || r.template.render_messages(&messages, &options, true))
            .await;
    rendered
        .map_err(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "rendering the chat template failed",
            )
        })?
        .map_err(|e| ApiError::bad_param("messages", e.to_string()))
}

/// `POST /apply-template` (llama-server's): the prompt a chat request makes, as text.
pub async fn apply_template(Ext(state): Ext<Arc<State>>, body: Body) -> Response {
    let prompt = async {
        let ready = state.ready()?;
        let b: CompletionBody = parse(&read_body(&state, body).await?)?;
        let tools = tools::requested(&b, &ready.tool_format)?;
        render_chat(&ready, &b, tools.as_ref()).await
    };
    match prompt.await {
        Ok(p) => Json(json!({ "prompt": p })).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A completion's prompts as tokens.
fn text_prompts(ready: &Ready, b: &CompletionBody) -> Result<Vec<Vec<u32>>, ApiError> {
    let tok = &ready.tok;
    let encode = |s: &str| {
        tok.encode(s, tok.add_bos(), true)
            .map_err(|e| ApiError::bad_param("prompt", e.to_string()))
    };
    let ids = |v: &Vec<u32>| match v.iter().find(|&&t| t as usize >= ready.n_vocab) {
        Some(t) => Err(ApiError::bad_param(
            "prompt",
            format!("token {t} is not an id below {}", ready.n_vocab),
        )),
        None => Ok(v.clone()),
    };
    let prompts = match &b.prompt {
        None => return Err(ApiError::bad_param("prompt", "prompt is required")),
        Some(Prompt::Text(s)) => vec![encode(s)?],
        Some(Prompt::Texts(v)) => v.iter().map(|s| encode(s)).collect::<Result<_, _>>()?,
        Some(Prompt::Tokens(v)) => vec![ids(v)?],
        Some(Prompt::TokenLists(v)) => v.iter().map(ids).collect::<Result<_, _>>()?,
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_param("prompt", "prompt is an empty list"));
    }
    Ok(prompts)
}

/// A single answer translated into another API's named events (the Responses and Messages
/// APIs), streamed by [`translated_stream`].
trait Translation: Send + 'static {
    /// The answer under way.
    fn answer(&mut self) -> &mut Answer;
    /// The events an update makes.
    fn events(&mut self, u: &Update) -> Vec<Event>;
    /// The event that reports a failure (the stream then ends).
    fn error_event(&mut self, e: &ApiError) -> Event;
}

/// Streams `t`'s events as its answer goes, ending after the finish or a failure.
fn translated_stream<T: Translation>(
    t: T,
    updates: UnboundedReceiver<(usize, Update)>,
) -> impl IntoResponse {
    let st = (t, updates, VecDeque::new(), false);
    let events = futures_util::stream::unfold(
        st,
        |(mut t, mut updates, mut queued, mut done)| async move {
            loop {
                if let Some(e) = queued.pop_front() {
                    return Some((Ok::<_, Infallible>(e), (t, updates, queued, done)));
                }
                if done {
                    return None;
                }
                let (i, u) = match updates.recv().await {
                    Some(x) => x,
                    None => (0, Update::Failed("the answer did not finish".into())),
                };
                if let Err(e) = t.answer().apply(i, &u) {
                    queued.push_back(t.error_event(&e));
                    done = true;
                    continue;
                }
                queued.extend(t.events(&u));
                done = t.answer().choices[0].finish.is_some();
            }
        },
    );
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(2)))
}

/// What [`start_translated`] started: the request as sent, its plan, its answer's updates.
type Started = (Value, Plan, UnboundedReceiver<(usize, Update)>);

/// Reads another API's request, turns it into a request of `kind` by `translate` and starts
/// it on the scheduler; a failure is counted and returned.
async fn start_translated(
    state: &State,
    body: Body,
    translate: impl FnOnce(&Value) -> Result<Value, ApiError>,
    kind: Kind,
) -> Result<Started, ApiError> {
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let started = async {
        state.ready()?;
        let request: Value = parse(&read_body(state, body).await?)?;
        let translated = translate(&request)?;
        let b: CompletionBody = parse(translated.to_string().as_bytes())?;
        let plan = plan(state, b, kind).await?;
        let updates = start(state, &plan)?;
        Ok((request, plan, updates))
    };
    started.await.inspect_err(|_| {
        state.metrics.errors.fetch_add(1, Ordering::Relaxed);
    })
}

/// Copies the fields of `r` named first in `fields` (those not null) into `chat` under the
/// second name: another API's request read as a chat request.
fn copy_fields(r: &Map<String, Value>, chat: &mut Map<String, Value>, fields: &[(&str, &str)]) {
    for (from, to) in fields {
        if let Some(v) = r.get(*from).filter(|v| !v.is_null()) {
            chat.insert((*to).into(), v.clone());
        }
    }
}

/// One token's log-probabilities as text.
#[derive(Debug, Clone)]
struct TokenLogprob {
    id: u32,
    token: String,
    bytes: Vec<u8>,
    logprob: f32,
    /// The most likely tokens: id, text, bytes, log-probability.
    top: Vec<(u32, String, Vec<u8>, f32)>,
}

/// What one answer reports as it goes.
#[derive(Debug)]
enum Update {
    Started {
        cached: usize,
    },
    Text {
        text: String,
        /// The model's thought (`reasoning_content`).
        reasoning: String,
        logprobs: Vec<TokenLogprob>,
    },
    Finish {
        reason: &'static str,
        tokens: usize,
        /// The stop string that ended the answer.
        stop: Option<String>,
    },
    Failed(String),
}

/// Queues one job per answer and starts turning each answer's events into updates, tagged
/// with the answer's index. A full queue refuses the whole request (503); one of more answers
/// than the queue can ever hold is a 400.
fn start(state: &State, plan: &Plan) -> Result<UnboundedReceiver<(usize, Update)>, ApiError> {
    let ready = &plan.ready;
    ready.available()?;
    let answers = plan.prompts.len().saturating_mul(plan.n);
    let capacity = ready.submitter.capacity();
    if answers > capacity {
        let param = if plan.n > 1 { "n" } else { "prompt" };
        return Err(ApiError::bad_param(
            param,
            format!(
                "{} prompt(s) × n {} = {answers} answers, more than the server queues at once (--queue {capacity})",
                plan.prompts.len(),
                plan.n
            ),
        ));
    }
    let (tx, rx) = unbounded_channel();
    let mut events = Vec::new();
    for prompt in &plan.prompts {
        for j in 0..plan.n {
            let (etx, erx) = unbounded_channel();
            let job = Job {
                prompt: prompt.clone(),
                sampling: SamplerConfig {
                    seed: plan.sampling.seed.wrapping_add(j as u64),
                    ..plan.sampling.clone()
                },
                max_tokens: plan
                    .max_tokens
                    .unwrap_or(usize::MAX)
                    .min(ready.n_ctx - prompt.len()),
                top_logprobs: plan.top_logprobs,
                cache_prompt: plan.cache_prompt,
                ignore_eos: plan.ignore_eos,
                constraint: plan
                    .constraint
                    .clone()
                    .map(|c| Box::new(c) as Box<dyn Constraint>),
                events: etx,
            };
            match ready.submitter.submit(job) {
                Ok(()) => events.push(erx),
                Err(SubmitError::Full) => {
                    state.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                    return Err(ApiError::unavailable(
                        "the server is busy (its admission queue is full); try again",
                        1,
                    ));
                }
                Err(SubmitError::Closed) => {
                    return Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the model's scheduler has stopped",
                    ))
                }
            }
        }
    }
    for (index, erx) in events.into_iter().enumerate() {
        let task = Answering {
            ready: ready.clone(),
            stops: plan.stops.clone(),
            thoughts: plan.thoughts,
            kept_tokens: plan.kept_tokens.clone(),
            index,
            out: tx.clone(),
        };
        tokio::spawn(task.run(erx));
    }
    Ok(rx)
}

/// Turns one answer's scheduler events into text updates.
struct Answering {
    ready: Arc<Ready>,
    stops: Vec<String>,
    /// How thoughts are split from the answer, if they are.
    thoughts: Option<Syntax>,
    /// Control tokens the text keeps.
    kept_tokens: Vec<u32>,
    index: usize,
    out: UnboundedSender<(usize, Update)>,
}

impl Answering {
    /// Runs until the answer ends, fails, or nobody listens (dropping `events` cancels it).
    async fn run(self, mut events: UnboundedReceiver<JobEvent>) {
        let tok = &self.ready.tok;
        let mut text = TextStream::for_display(tok).keeping(&self.kept_tokens);
        let mut stop = StopText::new(self.stops.clone());
        let mut thoughts = self.thoughts.map(Splitter::new);
        let mut tokens = 0;
        let send = |u: Update| self.out.send((self.index, u)).is_ok();
        while let Some(event) = events.recv().await {
            let (piece, logprobs, end) = match event {
                JobEvent::Started { cached_tokens } => {
                    if !send(Update::Started {
                        cached: cached_tokens,
                    }) {
                        return;
                    }
                    continue;
                }
                JobEvent::Token { id, logprobs } => {
                    tokens += 1;
                    let lp = logprobs.map(|l| self.describe(id, &l));
                    (text.push(id), lp, None)
                }
                JobEvent::Done(finish) => (String::new(), None, Some(finish)),
                JobEvent::Failed(why) => {
                    send(Update::Failed(why));
                    return;
                }
            };
            let (mut out, stopped) = stop.push(&piece);
            let reason = match end {
                _ if stopped => Some("stop"),
                Some(finish) => {
                    // What the stream still held ends the answer.
                    let rest = std::mem::replace(&mut text, TextStream::for_display(tok)).finish();
                    let (more, stopped) = stop.push(&rest);
                    out.push_str(&more);
                    if !stopped {
                        out.push_str(&stop.finish());
                    }
                    Some(match finish {
                        _ if stopped => "stop",
                        Finish::Stop => "stop",
                        Finish::Length => "length",
                    })
                }
                None => None,
            };
            let mut reasoning = String::new();
            if let Some(t) = &mut thoughts {
                let (thought, answer) = t.push(&out);
                (reasoning, out) = (thought, answer);
                if reason.is_some() {
                    let (thought, answer) = t.finish();
                    reasoning.push_str(&thought);
                    out.push_str(&answer);
                }
            }
            if (!out.is_empty() || !reasoning.is_empty() || logprobs.is_some())
                && !send(Update::Text {
                    text: out,
                    reasoning,
                    logprobs: logprobs.into_iter().collect(),
                })
            {
                return;
            }
            if let Some(reason) = reason {
                send(Update::Finish {
                    reason,
                    tokens,
                    stop: stop.matched().map(str::to_string),
                });
                return;
            }
        }
        send(Update::Failed("the model's scheduler stopped".into()));
    }

    /// A token's log-probabilities with the text of each token.
    fn describe(&self, id: u32, l: &Logprobs) -> TokenLogprob {
        let piece = |t: u32| {
            let bytes = self.ready.tok.token_piece(t, true);
            (String::from_utf8_lossy(&bytes).into_owned(), bytes)
        };
        let (token, bytes) = piece(id);
        TokenLogprob {
            id,
            token,
            bytes,
            logprob: l.logprob,
            top: l
                .top
                .iter()
                .map(|&(t, lp)| {
                    let (s, b) = piece(t);
                    (t, s, b, lp)
                })
                .collect(),
        }
    }
}

/// One answer as it accumulates.
#[derive(Debug, Default)]
struct Choice {
    text: String,
    reasoning: String,
    logprobs: Vec<TokenLogprob>,
    finish: Option<&'static str>,
    /// The stop string that ended it.
    stop: Option<String>,
    tokens: usize,
    cached: usize,
    /// Bytes of token text before each token (completions' `text_offset`).
    offsets: Vec<usize>,
    pieces_len: usize,
}

/// A request's answers and timings, for either kind of response.
struct Answer {
    plan: Plan,
    state: Arc<State>,
    arrived: Instant,
    first_token: Option<Instant>,
    choices: Vec<Choice>,
    /// Each answer with tools as streamed so far (all but the older single `function_call`).
    streamed: Vec<Option<Streamed>>,
    /// The request's usage record for its log line.
    log: Option<Arc<crate::log::Usage>>,
    created: u64,
}

/// An answer with tools read as it arrives, and what of it was sent.
struct Streamed {
    reader: AnswerStream,
    /// The content sent.
    content: String,
    /// Each call's name and the arguments sent.
    calls: Vec<(String, String)>,
}

impl Streamed {
    /// Records `pieces` as sent.
    fn record(&mut self, pieces: &[Piece]) {
        for p in pieces {
            match p {
                Piece::Content(t) => self.content.push_str(t),
                Piece::Call(Delta::Begin { name, .. }) => {
                    self.calls.push((name.clone(), String::new()))
                }
                Piece::Call(Delta::Arguments { index, text }) => {
                    if let Some(c) = self.calls.get_mut(*index) {
                        c.1.push_str(text);
                    }
                }
            }
        }
    }
}

impl Answer {
    fn new(plan: Plan, state: Arc<State>, arrived: Instant) -> Self {
        let total = plan.prompts.len() * plan.n;
        let streamed = (0..total)
            .map(|_| {
                let t = plan.tools.as_ref().filter(|t| !t.legacy())?;
                Some(Streamed {
                    reader: AnswerStream::new(t.format().family(), t.may_reply()),
                    content: String::new(),
                    calls: Vec::new(),
                })
            })
            .collect();
        Self {
            streamed,
            log: crate::log::current(),
            choices: (0..total).map(|_| Choice::default()).collect(),
            plan,
            state,
            arrived,
            first_token: None,
            created: unix_time(),
        }
    }

    /// Applies an update; a failure is returned as the error to send.
    fn apply(&mut self, i: usize, u: &Update) -> Result<(), ApiError> {
        let c = &mut self.choices[i];
        match u {
            Update::Started { cached } => c.cached = *cached,
            Update::Text {
                text,
                reasoning,
                logprobs,
            } => {
                self.first_token.get_or_insert_with(Instant::now);
                c.text.push_str(text);
                c.reasoning.push_str(reasoning);
                for lp in logprobs {
                    c.offsets.push(c.pieces_len);
                    c.pieces_len += lp.token.len();
                }
                c.logprobs.extend(logprobs.iter().cloned());
            }
            Update::Finish {
                reason,
                tokens,
                stop,
            } => {
                c.finish = Some(reason);
                c.tokens = *tokens;
                c.stop.clone_from(stop);
                if self.choices.iter().all(|c| c.finish.is_some()) {
                    self.record();
                }
            }
            Update::Failed(why) => {
                self.state.metrics.errors.fetch_add(1, Ordering::Relaxed);
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("generation failed: {why}"),
                ));
            }
        }
        Ok(())
    }

    /// Records the finished request's timings, and its tokens for its log line.
    fn record(&self) {
        if let Some(u) = &self.log {
            let usage = self.usage();
            let count = |v: &Value| v.as_u64().unwrap_or(0) as usize;
            u.record(
                count(&usage["prompt_tokens"]),
                count(&usage["prompt_tokens_details"]["cached_tokens"]),
                count(&usage["completion_tokens"]),
                self.first_token.map(|t| t - self.arrived),
            );
        }
        let m = &self.state.metrics;
        let end = Instant::now();
        m.latency.observe((end - self.arrived).as_secs_f64());
        if let Some(first) = self.first_token {
            m.ttft.observe((first - self.arrived).as_secs_f64());
            let tokens: usize = self.choices.iter().map(|c| c.tokens).sum();
            if tokens > 1 {
                m.tpot
                    .observe((end - first).as_secs_f64() / (tokens - 1) as f64);
            }
        }
    }

    /// OpenAI's `usage`: prompt tokens once per prompt, cached ones as its best answer saw.
    fn usage(&self) -> Value {
        let n = self.plan.n;
        let prompt: usize = self.plan.prompts.iter().map(Vec::len).sum();
        let cached: usize = self
            .choices
            .chunks(n)
            .map(|c| c.iter().map(|c| c.cached).max().unwrap_or(0))
            .sum();
        let completion: usize = self.choices.iter().map(|c| c.tokens).sum();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": { "cached_tokens": cached },
        })
    }

    /// A chunk or completion object around `choices`.
    fn object(&self, object: &str, choices: Vec<Value>) -> Value {
        json!({
            "id": self.plan.id,
            "object": object,
            "created": self.created,
            "model": self.plan.model,
            "system_fingerprint": concat!("hesper-rs-", env!("CARGO_PKG_VERSION")),
            "choices": choices,
        })
    }

    /// Log-probabilities of `lps` as the endpoint writes them (`offsets` for completions).
    fn logprobs_json(&self, lps: &[TokenLogprob], offsets: &[usize]) -> Value {
        if self.plan.top_logprobs.is_none() {
            return Value::Null;
        }
        match self.plan.kind {
            Kind::Chat => {
                let entry =
                    |t: &str, b: &[u8], lp: f32| json!({"token": t, "logprob": lp, "bytes": b});
                let content: Vec<Value> = lps
                    .iter()
                    .map(|l| {
                        let mut e = entry(&l.token, &l.bytes, l.logprob);
                        e["top_logprobs"] =
                            l.top.iter().map(|(_, t, b, lp)| entry(t, b, *lp)).collect();
                        e
                    })
                    .collect();
                json!({ "content": content })
            }
            Kind::Text => json!({
                "tokens": lps.iter().map(|l| l.token.clone()).collect::<Vec<_>>(),
                "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
                "top_logprobs": lps.iter().map(|l| {
                    l.top.iter().map(|(_, t, _, lp)| (t.clone(), json!(lp))).collect::<serde_json::Map<_, _>>()
                }).collect::<Vec<_>>(),
                "text_offset": offsets,
            }),
        }
    }
}

/// Waits for every answer and sends one JSON object.
async fn collect(mut a: Answer, mut updates: UnboundedReceiver<(usize, Update)>) -> Response {
    while let Some((i, u)) = updates.recv().await {
        if let Err(e) = a.apply(i, &u) {
            return e.into_response();
        }
        if a.choices.iter().all(|c| c.finish.is_some()) {
            break;
        }
    }
    if a.choices.iter().any(|c| c.finish.is_none()) {
        return ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "an answer did not finish",
        )
        .into_response();
    }
    let choices: Vec<Value> = a
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let logprobs = a.logprobs_json(&c.logprobs, &c.offsets);
            match a.plan.kind {
                Kind::Chat => {
                    let (message, finish) = a.message(i, c);
                    json!({
                        "index": i,
                        "message": message,
                        "logprobs": logprobs,
                        "finish_reason": finish,
                    })
                }
                Kind::Text => json!({
                    "index": i,
                    "text": c.text,
                    "logprobs": logprobs,
                    "finish_reason": c.finish,
                }),
            }
        })
        .collect();
    let object = if a.plan.kind == Kind::Chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    let mut body = a.object(object, choices);
    body["usage"] = a.usage();
    Json(body).into_response()
}

/// Streams the answers as server-sent events: chat's role chunk first, then content deltas,
/// a chunk with each answer's `finish_reason`, the `usage` chunk when asked, `[DONE]`.
fn stream(a: Answer, updates: UnboundedReceiver<(usize, Update)>) -> impl IntoResponse {
    struct St {
        a: Answer,
        updates: UnboundedReceiver<(usize, Update)>,
        queued: VecDeque<Event>,
        done: bool,
    }
    let st = St {
        a,
        updates,
        queued: VecDeque::new(),
        done: false,
    };
    let events = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(e) = st.queued.pop_front() {
                return Some((Ok::<_, Infallible>(e), st));
            }
            if st.done {
                return None;
            }
            match st.updates.recv().await {
                Some((i, u)) => {
                    if let Err(e) = st.a.apply(i, &u) {
                        st.queued.push_back(data(&e.body()));
                        st.done = true;
                        continue;
                    }
                    for v in st.a.chunks(i, &u) {
                        st.queued.push_back(data(&v));
                    }
                    if st.a.choices.iter().all(|c| c.finish.is_some()) {
                        if st.a.plan.include_usage {
                            let mut v = st.a.object(st.a.chunk_object(), vec![]);
                            v["usage"] = st.a.usage();
                            st.queued.push_back(data(&v));
                        }
                        st.queued.push_back(Event::default().data("[DONE]"));
                        st.done = true;
                    }
                }
                None => {
                    let e = ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "an answer did not finish",
                    );
                    st.queued.push_back(data(&e.body()));
                    st.done = true;
                }
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(2)))
}

/// One SSE `data:` event of `v`.
fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

impl Answer {
    fn chunk_object(&self) -> &'static str {
        match self.plan.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text => "text_completion",
        }
    }

    /// The id of answer `i`'s call `k`: 9 letters and digits where the model's format
    /// insists (Mistral's).
    fn call_id(&self, i: usize, k: usize) -> String {
        let stem = self.plan.id.rsplit('-').next().unwrap_or_default();
        let short = self
            .plan
            .tools
            .as_ref()
            .is_some_and(|t| t.format().short_ids());
        if !short {
            return format!("call_{stem}_{i}_{k}");
        }
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (stem, i, k).hash(&mut h);
        let mut n = h.finish();
        (0..9)
            .map(|_| {
                let digit = (n % 36) as u32;
                n /= 36;
                char::from_digit(digit, 36).unwrap_or('0')
            })
            .collect()
    }

    /// Chat's message of a finished answer and its `finish_reason`: with tools, the calls it
    /// made (`finish_reason: "tool_calls"`) or its reply; an answer cut short is its text.
    fn message(&self, i: usize, c: &Choice) -> (Value, Option<&'static str>) {
        let (mut message, finish) = self.said(i, c);
        if !c.reasoning.is_empty() {
            message["reasoning_content"] = json!(c.reasoning);
        }
        (message, finish)
    }

    /// [`Answer::message`] without the thought. A call begun that does not parse leaves the
    /// answer as its text, with a `warning` saying why.
    fn said(&self, i: usize, c: &Choice) -> (Value, Option<&'static str>) {
        let text = json!({ "role": "assistant", "content": c.text });
        let Some(tools) = &self.plan.tools else {
            return (text, c.finish);
        };
        match tools.parse(&c.text) {
            Some(Said::Calls { calls, .. }) if tools.legacy() => (
                json!({"role": "assistant", "content": null, "function_call": {
                    "name": calls[0].name, "arguments": calls[0].arguments}}),
                Some("function_call"),
            ),
            Some(Said::Calls { content, calls }) => {
                let calls: Vec<Value> = calls
                    .iter()
                    .enumerate()
                    .map(|(k, call)| {
                        json!({
                            "id": self.call_id(i, k),
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        })
                    })
                    .collect();
                (
                    json!({"role": "assistant", "content": content, "tool_calls": calls}),
                    Some("tool_calls"),
                )
            }
            Some(Said::Reply(r)) => (json!({"role": "assistant", "content": r}), c.finish),
            Some(Said::Unparsed(why)) => {
                let mut message = text;
                message["warning"] = json!(format!(
                    "the answer began a tool call in the {} format that does not parse ({why}): it is returned as text",
                    tools.format().name()
                ));
                (message, c.finish)
            }
            None => (text, c.finish),
        }
    }

    /// The stream chunks an update makes. With tools, the answer is streamed as it is
    /// written: its reply's text, or each call's id and name, then its arguments in pieces.
    fn chunks(&mut self, i: usize, u: &Update) -> Vec<Value> {
        if self.plan.tools.is_none() {
            return self.chunk(i, u).into_iter().collect();
        }
        match u {
            Update::Text {
                text, reasoning, ..
            } => {
                let mut out = Vec::new();
                if !reasoning.is_empty() {
                    out.push(self.wrap(i, json!({ "reasoning_content": reasoning }), None));
                }
                for p in self.pieces(i, text) {
                    out.push(self.piece_chunk(i, p));
                }
                out
            }
            Update::Finish { .. } => self.finish_chunks(i),
            _ => self.chunk(i, u).into_iter().collect(),
        }
    }

    /// What answer `i`'s new `text` adds to its stream, recorded as sent: the text itself
    /// without tools; with them, what the answer's reader makes of it (nothing for the older
    /// single `function_call`, sent when it ends).
    fn pieces(&mut self, i: usize, text: &str) -> Vec<Piece> {
        if self.plan.tools.is_none() {
            return (!text.is_empty())
                .then(|| Piece::Content(text.to_string()))
                .into_iter()
                .collect();
        }
        let Some(s) = &mut self.streamed[i] else {
            return Vec::new();
        };
        let pieces = s.reader.push(text);
        s.record(&pieces);
        pieces
    }

    /// What remains to stream when answer `i` ends: with tools, the text its reader held
    /// back, then what of the finished answer's content and calls was not sent (all of it
    /// where nothing was streamed); without them, nothing.
    fn closing_pieces(&mut self, i: usize) -> Vec<Piece> {
        if self.plan.tools.is_none() {
            return Vec::new();
        }
        let (message, _) = self.said(i, &self.choices[i]);
        let mut out = Vec::new();
        let (content, calls) = match &mut self.streamed[i] {
            Some(s) => {
                let held = s.reader.finish();
                s.record(&held);
                out = held;
                (s.content.clone(), s.calls.clone())
            }
            None => Default::default(),
        };
        let text = message["content"].as_str().unwrap_or_default();
        if calls.is_empty() {
            if let Some(rest) = text
                .strip_prefix(content.as_str())
                .filter(|r| !r.is_empty())
            {
                out.push(Piece::Content(rest.to_string()));
            }
        }
        for (k, call) in message["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let name = call["function"]["name"].as_str().unwrap_or_default();
            let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
            // What was streamed is the start of the call; the rest follows.
            let rest = match calls.get(k) {
                Some((n, a)) if n == name => arguments.strip_prefix(a.as_str()),
                _ => None,
            };
            let text = match rest {
                Some(rest) => rest,
                None => {
                    out.push(Piece::Call(Delta::Begin {
                        index: k,
                        name: name.to_string(),
                    }));
                    arguments
                }
            };
            if !text.is_empty() {
                out.push(Piece::Call(Delta::Arguments {
                    index: k,
                    text: text.to_string(),
                }));
            }
        }
        if let Some(s) = &mut self.streamed[i] {
            s.record(&out);
        }
        out
    }

    /// A stream chunk of answer `i` with `delta`.
    fn wrap(&self, i: usize, delta: Value, finish: Option<&str>) -> Value {
        let choice = json!({"index": i, "delta": delta, "logprobs": null, "finish_reason": finish});
        let mut v = self.object(self.chunk_object(), vec![choice]);
        if self.plan.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// The chat chunk of a piece of answer `i`.
    fn piece_chunk(&self, i: usize, p: Piece) -> Value {
        let delta = match p {
            Piece::Content(text) => json!({ "content": text }),
            Piece::Call(Delta::Begin { index, name }) => {
                json!({"tool_calls": [{"index": index, "id": self.call_id(i, index),
                                       "type": "function",
                                       "function": {"name": name, "arguments": ""}}]})
            }
            Piece::Call(Delta::Arguments { index, text }) => {
                json!({"tool_calls": [{"index": index, "function": {"arguments": text}}]})
            }
        };
        self.wrap(i, delta, None)
    }

    /// The chunks that end answer `i` with tools: what of it was not streamed yet (the
    /// older `function_call` whole), then its `finish_reason`.
    fn finish_chunks(&mut self, i: usize) -> Vec<Value> {
        let (message, finish) = self.said(i, &self.choices[i]);
        let mut out = Vec::new();
        if let Some(f) = message.get("function_call") {
            out.push(self.wrap(
                i,
                json!({"function_call": {"name": f["name"], "arguments": ""}}),
                None,
            ));
            out.push(self.wrap(
                i,
                json!({"function_call": {"arguments": f["arguments"]}}),
                None,
            ));
        } else {
            for p in self.closing_pieces(i) {
                out.push(self.piece_chunk(i, p));
            }
        }
        out.push(self.wrap(i, json!({}), finish));
        out
    }

    /// The stream chunk an update makes, if any.
    fn chunk(&self, i: usize, u: &Update) -> Option<Value> {
        let chat = self.plan.kind == Kind::Chat;
        let choice = match u {
            Update::Started { .. } if chat => json!({
                "index": i,
                "delta": { "role": "assistant", "content": "" },
                "logprobs": null,
                "finish_reason": null,
            }),
            Update::Started { .. } => return None,
            Update::Text {
                text,
                reasoning,
                logprobs,
            } => {
                let c = &self.choices[i];
                let offsets = &c.offsets[c.offsets.len() - logprobs.len()..];
                let lp = self.logprobs_json(logprobs, offsets);
                if chat {
                    let mut delta = json!({ "content": text });
                    if !reasoning.is_empty() {
                        delta["reasoning_content"] = json!(reasoning);
                        if text.is_empty() {
                            delta = json!({ "reasoning_content": reasoning });
                        }
                    }
                    json!({"index": i, "delta": delta, "logprobs": lp, "finish_reason": null})
                } else {
                    json!({"index": i, "text": text, "logprobs": lp, "finish_reason": null})
                }
            }
            Update::Finish { reason, .. } => {
                if chat {
                    json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": reason})
                } else {
                    json!({"index": i, "text": "", "logprobs": null, "finish_reason": reason})
                }
            }
            Update::Failed(_) => return None,
        };
        let mut v = self.object(self.chunk_object(), vec![choice]);
        if self.plan.include_usage {
            v["usage"] = Value::Null;
        }
        Some(v)
    }
}
