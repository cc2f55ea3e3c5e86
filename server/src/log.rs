//! One line per request on stderr, written when its answer has been sent (or the client went
//! away), as llama-server logs them and with what a client integration is debugged by: the
//! method, path, status and client address; for a generation, the prompt's tokens (those read
//! from the prefix cache apart), the tokens generated, the time to the first one; the total
//! time. `--log-format json` writes each line as a JSON object; `-v` adds the request's body
//! (never its headers, where the API key travels) and logs `/health` polls too.

use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State as Ext};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use serde_json::{json, Value};

use crate::State;

/// How request lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `request: POST /v1/chat/completions 200 127.0.0.1:40312 …`
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!("{other:?}: text or json")),
        }
    }
}

/// Which requests are logged and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestLog {
    /// The lines' form.
    pub format: LogFormat,
    /// `-v`: each line with the request's body, and `/health` polls logged too.
    pub verbose: bool,
}

/// The client's address, put on each request by the accept loop.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub std::net::SocketAddr);

/// What a request's generation used, filled in when it finishes.
#[derive(Debug, Default)]
pub struct Usage {
    recorded: AtomicBool,
    prompt: AtomicUsize,
    cached: AtomicUsize,
    generated: AtomicUsize,
    /// Microseconds from arrival to the first token (`u64::MAX`: none).
    first_token_us: AtomicU64,
}

impl Usage {
    /// Records a finished generation: prompt tokens, of them cached, tokens generated, and
    /// the time to the first (none for an embedding).
    pub fn record(&self, prompt: usize, cached: usize, generated: usize, ttft: Option<Duration>) {
        self.prompt.store(prompt, Ordering::Relaxed);
        self.cached.store(cached, Ordering::Relaxed);
        self.generated.store(generated, Ordering::Relaxed);
        let us = ttft.map_or(u64::MAX, |d| d.as_micros().min(u64::MAX as u128 - 1) as u64);
        self.first_token_us.store(us, Ordering::Relaxed);
        self.recorded.store(true, Ordering::Release);
    }
}

tokio::task_local! {
    /// The usage record of the request being handled.
    static USAGE: Arc<Usage>;
}

/// The usage record of the request being handled, when its line is to be logged.
pub fn current() -> Option<Arc<Usage>> {
    USAGE.try_with(Arc::clone).ok()
}

/// Logs each request's line once its answer has gone (the middleware outside all others, so
/// that refused and unknown requests are logged too).
pub async fn log_requests(Ext(state): Ext<Arc<State>>, req: Request, next: Next) -> Response {
    let Some(log) = state.config.log else {
        return next.run(req).await;
    };
    let path = req.uri().path().to_string();
    if !log.verbose && (path == "/health" || path == "/v1/health") {
        return next.run(req).await;
    }
    let mut line = Line {
        log,
        method: req.method().to_string(),
        path,
        client: req.extensions().get::<Peer>().map(|p| p.0.to_string()),
        start: Instant::now(),
        body: None,
        status: 0,
        usage: None,
    };
    let req = if log.verbose {
        let (parts, body) = req.into_parts();
        match crate::routes::read_body(&state, body).await {
            Ok(bytes) => {
                line.body = Some(String::from_utf8_lossy(&bytes).into_owned());
                Request::from_parts(parts, Body::from(bytes))
            }
            Err(e) => return line.wrap(e.into_response()),
        }
    } else {
        req
    };
    let usage = Arc::new(Usage::default());
    line.usage = Some(usage.clone());
    let response = USAGE.scope(usage, next.run(req)).await;
    line.wrap(response)
}

/// A request's line, written when it is dropped.
struct Line {
    log: RequestLog,
    method: String,
    path: String,
    client: Option<String>,
    start: Instant,
    body: Option<String>,
    status: u16,
    usage: Option<Arc<Usage>>,
}

impl Line {
    /// `response` with this line written when its body has been sent or dropped.
    fn wrap(mut self, response: Response) -> Response {
        self.status = response.status().as_u16();
        let (parts, body) = response.into_parts();
        Response::from_parts(
            parts,
            Body::new(Logged {
                inner: body,
                _line: self,
            }),
        )
    }

    /// The line's fields.
    fn fields(&self) -> Value {
        let mut v = json!({
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "client": self.client,
            "total_ms": round_ms(self.start.elapsed()),
        });
        if let Some(u) = self
            .usage
            .as_ref()
            .filter(|u| u.recorded.load(Ordering::Acquire))
        {
            v["prompt_tokens"] = json!(u.prompt.load(Ordering::Relaxed));
            v["cached_tokens"] = json!(u.cached.load(Ordering::Relaxed));
            v["generated_tokens"] = json!(u.generated.load(Ordering::Relaxed));
            let us = u.first_token_us.load(Ordering::Relaxed);
            if us != u64::MAX {
                v["first_token_ms"] = json!(round_ms(Duration::from_micros(us)));
            }
        }
        if let Some(b) = &self.body {
            v["body"] = json!(b);
        }
        v
    }

    /// The line as text.
    fn text(&self) -> String {
        let v = self.fields();
        let mut s = format!(
            "request: {} {} {} {}",
            self.method,
            self.path,
            self.status,
            self.client.as_deref().unwrap_or("-")
        );
        if let Some(p) = v["prompt_tokens"].as_u64() {
            s.push_str(&format!(
                " | prompt {p} (cached {}), generated {}",
                v["cached_tokens"], v["generated_tokens"]
            ));
            if let Some(t) = v["first_token_ms"].as_f64() {
                s.push_str(&format!(", first token {t} ms"));
            }
        }
        s.push_str(&format!(" | total {} ms", v["total_ms"]));
        if let Some(b) = &self.body {
            s.push_str(&format!(" | body {b}"));
        }
        s
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        use std::io::Write as _;
        let line = match self.log.format {
            LogFormat::Text => self.text(),
            LogFormat::Json => self.fields().to_string(),
        };
        // A closed or failing stderr is not the request's problem.
        let _ = writeln!(std::io::stderr(), "{line}");
    }
}

/// Milliseconds to a tenth.
fn round_ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

/// A response body that carries its request's line until it is done with.
struct Logged {
    inner: Body,
    _line: Line,
}

impl HttpBody for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
