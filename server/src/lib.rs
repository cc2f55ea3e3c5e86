//! hesper-server: `hesper-rs serve`, an OpenAI-compatible HTTP server with llama-server's
//! endpoints, in front of the runtime's continuous-batching scheduler (see the crate README).
//!
//! * [`routes`]: the router, its small endpoints and the API-key check;
//! * [`completion`]: `/v1/chat/completions` and `/v1/completions`, streamed or not;
//! * [`request`]: request bodies; [`error`]: OpenAI's error answers;
//! * [`stop`]: stop strings across token boundaries; [`metrics`]: `/metrics`;
//! * [`structured`]: `response_format`, `json_schema` and `grammar` as a grammar;
//! * [`tools`]: tool calls (llama.cpp's generic format, `tool_choice` as a grammar);
//! * [`reasoning`]: `<think>` thoughts (and gpt-oss's analysis channel) apart from the answer (`reasoning_content`);
//! * [`reload`]: hot-swap checks (`/health` and `POST /reload` with `--hot-swap`);
//! * [`conn`]: the accept loop (connection limit, header timeout);
//! * [`log`]: one line per request on stderr;
//! * [`slots`]: `/slots`, the sequence slots and what runs in them;
//! * [`webui`]: the chat page at `/`.

pub mod completion;
pub mod conn;
pub mod embeddings;
pub mod error;
pub mod log;
pub mod metrics;
pub mod reasoning;
pub mod reload;
pub mod request;
pub mod routes;
pub mod slots;
pub mod stop;
pub mod structured;
pub mod tools;
pub mod webui;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hesper_engine::chat::ChatTemplate;
use hesper_engine::tokenizer::Tokenizer;
use hesper_runtime::grammar::Grammars;
use hesper_runtime::scheduler::Submitter;
use serde_json::Value;

/// How the server behaves (its flags).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Keys a request must carry (`Authorization: Bearer` or `X-Api-Key`); none: open.
    pub api_keys: Vec<String>,
    /// The model's name in answers and `/v1/models`.
    pub alias: String,
    /// Whether `/metrics` answers.
    pub metrics: bool,
    /// Whether `/slots` answers.
    pub slots: bool,
    /// Whether the chat page answers at `/`.
    pub webui: bool,
    /// How long a request body may take to arrive.
    pub timeout: Duration,
    /// How long a request's headers may take to arrive (a slow client is dropped).
    pub header_timeout: Duration,
    /// Largest request body, bytes.
    pub max_body: usize,
    /// Most connections served at once (more wait to be accepted).
    pub max_connections: usize,
    /// Origins allowed to call from a browser (CORS); none: no CORS headers.
    pub cors_origins: Vec<String>,
    /// Whether `/health` and `POST /reload` swap in tensors changed in the model file.
    pub hot_swap: bool,
    /// Where chat answers' `<think>` thoughts go.
    pub reasoning_format: reasoning::ReasoningFormat,
    /// `/v1/embeddings` with this pooling (`--embeddings`); `None`: it answers 501.
    pub embeddings: Option<embeddings::Pooling>,
    /// How requests are logged on stderr; `None`: not at all (`--log-disable`).
    pub log: Option<log::RequestLog>,
}

impl ServerConfig {
    /// Refuses flags the server cannot serve with, in one line (so a server never starts
    /// without serving).
    pub fn check(&self) -> Result<(), String> {
        routes::allowed_origins(&self.cors_origins).map(|_| ())
    }
}

/// What a loaded model gives the server.
pub struct Ready {
    /// The tokenizer.
    pub tok: Arc<Tokenizer>,
    /// The chat template.
    pub template: ChatTemplate,
    /// How the template's model calls tools.
    pub tool_format: tools::ToolFormat,
    /// Where requests go.
    pub submitter: Submitter,
    /// Positions one sequence may use.
    pub n_ctx: usize,
    /// Tokens one step evaluates at most (`-b`).
    pub n_batch: usize,
    /// Ids a prediction may pick.
    pub n_vocab: usize,
    /// The width of a hidden state (an embedding's length).
    pub n_embd: usize,
    /// Sequences run at once.
    pub parallel: usize,
    /// `/props`' model facts (path, backend, sizes).
    pub props: Value,
    /// `/v1/models`' `meta`.
    pub meta: Value,
    /// The tokenizer's grammars (its token trie), built by the first request that
    /// constrains its answer; the error says why this tokenizer cannot be constrained.
    pub grammars: OnceLock<Result<Grammars, String>>,
}

impl Ready {
    /// A 503 while no step can run (a ring that lost a node and has not formed again),
    /// naming why.
    pub fn available(&self) -> Result<(), error::ApiError> {
        match self.submitter.gauges().outage() {
            Some(why) => Err(error::ApiError::unavailable(
                format!("the model cannot run now: {why}"),
                2,
            )),
            None => Ok(()),
        }
    }
}

/// The server's shared state: its flags, the model once loaded, its metrics.
pub struct State {
    /// The flags.
    pub config: ServerConfig,
    ready: OnceLock<Arc<Ready>>,
    /// Request counters and histograms.
    pub metrics: metrics::Metrics,
    /// The hot-swap checks `/health` triggers, shared and spaced out.
    health_checks: reload::HealthChecks,
}

impl State {
    /// A server with no model yet (`/health` answers 503 until [`State::set_ready`]).
    pub fn new(config: ServerConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            ready: OnceLock::new(),
            metrics: metrics::Metrics::default(),
            health_checks: reload::HealthChecks::default(),
        })
    }

    /// The model has loaded.
    pub fn set_ready(&self, ready: Ready) {
        let _ = self.ready.set(Arc::new(ready));
    }

    /// The model, or a 503 while it loads.
    pub fn ready(&self) -> Result<Arc<Ready>, error::ApiError> {
        self.ready
            .get()
            .cloned()
            .ok_or_else(|| error::ApiError::unavailable("Loading model", 1))
    }
}

/// Serves `listener` with `state` until the process ends (blocks; runs its own I/O runtime).
/// Check the flags with [`ServerConfig::check`] first.
pub fn serve(listener: std::net::TcpListener, state: Arc<State>) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let app = routes::router(state.clone());
        conn::accept_loop(listener, app, &state.config).await;
        Ok(())
    })
}
