//! `hesper-rs serve`: the OpenAI-compatible server (`hesper-server`) with llama-server's flags.
//! The listener opens first and `/health` answers 503 while the model loads; then this thread
//! runs the scheduler that every request's sequence joins.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use hesper_engine::attention::AttentionConfig;
use hesper_engine::backend::Backend;
use hesper_engine::model::HeadPlace;
use hesper_runtime::ring::{Formation, NodeSettings, RingOptions, RingRunner};
use hesper_runtime::scheduler::{self, SchedulerConfig};
use hesper_runtime::{run_model, with_model, ModelRef};
use hesper_server::embeddings::Pooling;
use hesper_server::log::{LogFormat, RequestLog};
use hesper_server::reasoning::ReasoningFormat;
use hesper_server::tools::ToolFormat;
use hesper_server::{Ready, ServerConfig, State};
use serde_json::json;

use crate::args::{ContextArgs, ModelArgs};
use crate::chat_template::chat_template;
use crate::load::{load_part, BUILTIN_LABEL};
use crate::report::note;
use crate::ring_args::{resolve, Layers, RingNetArgs};
use crate::ring_plan::{model_config, offer, plan};

/// Largest request body.
const MAX_BODY: usize = 8 << 20;
/// Longest wait for a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Flags of `serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Context per sequence (-c) and tokens per step (-b: prompt chunks of all sequences and
    /// one token of each generating one share it).
    #[command(flatten)]
    pub ctx: ContextArgs,
    /// Address to listen on (0.0.0.0: every interface; give --api-key then).
    #[arg(long = "host", default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0: any free port; the one chosen is printed).
    #[arg(long = "port", default_value_t = 8080)]
    port: u16,
    /// Sequences generated at once (also -np); each may use the whole context.
    #[arg(long = "parallel", value_name = "N", default_value_t = 4)]
    parallel: usize,
    /// Requests waiting for a sequence beyond which the server answers 503.
    #[arg(long = "queue", value_name = "N", default_value_t = 64)]
    queue: usize,
    /// Finished sequences' KV caches kept for requests that share their prefix [default: --parallel].
    #[arg(long = "cache-idle", value_name = "N")]
    cache_idle: Option<usize>,
    /// KV positions of all sequences together [default: -c × -np]: a sequence takes what its
    /// prompt and max_tokens need (up to -c), and requests wait while the pool is full.
    #[arg(long = "kv-pool", value_name = "N")]
    kv_pool: Option<usize>,
    /// API key clients must send (Authorization: Bearer KEY or X-Api-Key); repeat or separate
    /// with commas for several.
    #[arg(long = "api-key", value_name = "KEY", value_delimiter = ',')]
    api_key: Vec<String>,
    /// A file of API keys, one per line.
    #[arg(long = "api-key-file", value_name = "FILE")]
    api_key_file: Option<PathBuf>,
    /// Answer GET /metrics (Prometheus' text format).
    #[arg(long = "metrics")]
    metrics: bool,
    /// Answer GET /slots with 501 (it shows every running request's prompt and answer).
    #[arg(long = "no-slots")]
    no_slots: bool,
    /// Serve no chat page at / (the API only).
    #[arg(long = "no-webui")]
    no_webui: bool,
    /// The model's name in answers and /v1/models [default: the file's name].
    #[arg(short = 'a', long = "alias", value_name = "NAME")]
    alias: Option<String>,
    /// Seconds a request body may take to arrive.
    #[arg(long = "timeout", value_name = "SECONDS", default_value_t = 600)]
    timeout: u64,
    /// Connections served at once (more wait to be accepted).
    #[arg(long = "max-connections", value_name = "N", default_value_t = 256)]
    max_connections: usize,
    /// An origin allowed to call the API from a browser (CORS); repeat for several.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origin: Vec<String>,
    /// Swap in the tensors that changed in the model file on each GET /health (ik_llama.cpp's
    /// trigger) and POST /reload, between two steps; running requests go on from their start
    /// with the new weights, and the prefix cache is emptied. The model is read into memory
    /// instead of mapped.
    #[arg(long = "hot-swap")]
    hot_swap: bool,
    /// A Jinja chat template for chat requests instead of the file's `tokenizer.chat_template`.
    #[arg(long = "chat-template-file", value_name = "FILE")]
    chat_template_file: Option<PathBuf>,
    /// Where a chat answer's <think>…</think> goes: `deepseek` (message.reasoning_content),
    /// `none` (left in content), `auto` (deepseek when the vocabulary has <think> and </think>).
    #[arg(
        long = "reasoning-format",
        value_name = "FORMAT",
        default_value = "auto"
    )]
    reasoning_format: ReasoningFormat,
    /// Answer POST /v1/embeddings: each input's final normalized hidden states pooled by
    /// --pooling and scaled to unit length.
    #[arg(long)]
    embeddings: bool,
    /// How --embeddings pools an input's tokens: `last` (the last token's), `mean`, or `cls`
    /// (the first token's).
    #[arg(long, value_name = "POOLING", default_value = "last")]
    pooling: Pooling,
    /// How each request's line on stderr is written: `text` or `json` (one object per line).
    #[arg(long = "log-format", value_name = "FORMAT", default_value = "text")]
    log_format: LogFormat,
    /// Log each request's body with its line (never its headers), and /health polls too.
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,
    /// Serve over a ring of processes or machines that split the model layer-wise: this
    /// process is the ring's master (the embedding, the first layers, sampling) and workers
    /// (`hesper-rs node --role worker`) run the rest; --listen and --next form it. Requests
    /// are batched as without a ring, and several steps go round it at once, so every node
    /// computes while the others do.
    #[arg(long = "ring", help_heading = "Ring")]
    ring: bool,
    /// The master's layers, START..END (END not included; with --ring), or `auto` (the
    /// default): every node that gives none is assigned its layers when the ring forms, by
    /// its measured speed and memory, and the plan is printed.
    #[arg(long = "layers", value_name = "START..END|auto", help_heading = "Ring")]
    layers: Option<Layers>,
    /// Steps kept in flight round the ring at once (with --ring) [default: one per node].
    #[arg(long = "ring-inflight", value_name = "N", help_heading = "Ring")]
    ring_inflight: Option<usize>,
    #[command(flatten)]
    ring_net: RingNetArgs,
}

impl ServeArgs {
    /// Keys from --api-key and --api-key-file.
    fn api_keys(&self) -> Result<Vec<String>> {
        let mut keys: Vec<String> = self.api_key.iter().map(|k| k.trim().to_string()).collect();
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--api-key-file {}: cannot read it", path.display()))?;
            keys.extend(text.lines().map(|l| l.trim().to_string()));
        }
        keys.retain(|k| !k.is_empty());
        if (!self.api_key.is_empty() || self.api_key_file.is_some()) && keys.is_empty() {
            bail!("--api-key/--api-key-file: no key given (empty)");
        }
        Ok(keys)
    }

    fn check(&self) -> Result<()> {
        for (flag, v) in [
            ("-np/--parallel", self.parallel),
            ("--queue", self.queue),
            ("--max-connections", self.max_connections),
            ("--timeout", self.timeout as usize),
        ] {
            if v == 0 {
                bail!("{flag} 0: give at least 1");
            }
        }
        if !self.ring {
            let mut given = self.ring_net.given();
            if self.layers.is_some() {
                given.push("--layers");
            }
            if self.ring_inflight.is_some() {
                given.push("--ring-inflight");
            }
            if let Some(flag) = given.first() {
                bail!("{flag} applies to --ring (a server over a ring of nodes)");
            }
        }
        if self.ring_inflight == Some(0) {
            bail!("--ring-inflight 0: give at least 1");
        }
        if self.ctx.batch_size < self.parallel {
            bail!(
                "-b/--batch-size {} is below -np/--parallel {}: a step holds one token of every running sequence",
                self.ctx.batch_size,
                self.parallel
            );
        }
        Ok(())
    }
}

/// Runs `serve`.
pub fn run(args: ServeArgs) -> Result<()> {
    args.check()?;
    let attention = args.ctx.attention.config()?;
    let api_keys = args.api_keys()?;
    let addr = SocketAddr::new(args.host, args.port);
    let listener = TcpListener::bind(addr)
        .with_context(|| format!("--host/--port: cannot listen on {addr}"))?;
    let addr = listener.local_addr()?;
    if !args.host.is_loopback() && api_keys.is_empty() {
        note!("hesper: warning: listening on {} without --api-key: anyone who can reach it can use the model", args.host);
    }
    let alias = args
        .alias
        .clone()
        .unwrap_or_else(|| match &args.model.file.gguf {
            Some(p) => p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            ),
            None => "hesper-kjv".into(),
        });
    let config = ServerConfig {
        api_keys,
        alias: alias.clone(),
        metrics: args.metrics,
        slots: !args.no_slots,
        webui: !args.no_webui,
        timeout: Duration::from_secs(args.timeout),
        header_timeout: HEADER_TIMEOUT.min(Duration::from_secs(args.timeout)),
        max_body: MAX_BODY,
        max_connections: args.max_connections,
        cors_origins: args.cors_origin.clone(),
        hot_swap: args.hot_swap,
        reasoning_format: args.reasoning_format,
        embeddings: args.embeddings.then_some(args.pooling),
        log: (!crate::report::QUIET.load(std::sync::atomic::Ordering::Relaxed)).then_some(
            RequestLog {
                format: args.log_format,
                verbose: args.verbose,
            },
        ),
    };
    config.check().map_err(anyhow::Error::msg)?;
    let state = State::new(config);
    let server = state.clone();
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            // A server that cannot serve must not stay up: a panic ends the process too.
            let serve = || hesper_server::serve(listener, server);
            let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(serve));
            match served {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    note!("error: the HTTP server stopped: {e}");
                    std::process::exit(1);
                }
                Err(_) => {
                    note!("error: the HTTP server failed");
                    std::process::exit(1);
                }
            }
        })?;
    note!("hesper: listening on http://{addr} (loading the model; /health answers 503 until it is ready)");
    let mut ring = args.ring.then(|| RingPlan::of(&args)).transpose()?;
    let layers = match &mut ring {
        Some(plan) => Some(plan.layers(&args)?),
        None => None,
    };
    let head = match &ring {
        Some(_) if args.ring_net.private => HeadPlace::Here,
        _ => HeadPlace::LastLayer,
    };
    let loaded = load_part(&args.model, layers, head, args.hot_swap)?;
    let Some(tok) = loaded.tokenizer else {
        bail!(
            "{} has no tokenizer (tokenizer.ggml.model is missing or \"none\"); a server needs one",
            loaded.model.file().source
        );
    };
    let template = chat_template(
        args.chat_template_file.as_deref(),
        loaded.model.file().header(),
        &tok,
    )?;
    let config = loaded.model.config().clone();
    let n_ctx = args.ctx.n_ctx(config.n_ctx_train);
    ContextArgs::note_past_training(n_ctx, config.n_ctx_train);
    if let Some(pool) = args.kv_pool.filter(|&p| p < n_ctx) {
        bail!("--kv-pool {pool} is smaller than the context ({n_ctx}): one sequence could not use it all");
    }
    let parallel = args.parallel;
    let sched = SchedulerConfig {
        n_ctx,
        parallel,
        batch: args.ctx.batch_size,
        keep_idle: args.cache_idle.unwrap_or(parallel),
        kv_pool: args.kv_pool,
        attention,
    };
    let (submitter, jobs) = scheduler::queue(args.queue);
    let gauges = submitter.gauges().clone();
    let tok = Arc::new(tok);
    let backend = hesper_runtime::with_model!(&loaded.model, |m| m.backend.name());
    let source = loaded.model.file().source.clone();
    let model_label = if args.model.file.gguf.is_none() {
        BUILTIN_LABEL.to_string()
    } else {
        source
    };
    let tool_format = ToolFormat::of(&template, &tok);
    let where_ = if ring.is_some() {
        format!("ring master on {backend}")
    } else {
        backend.clone()
    };
    let ready = Ready {
        grammars: Default::default(),
        n_vocab: loaded.model.sampled_vocab(),
        n_embd: config.n_embd,
        props: json!({
            "model_path": model_label,
            "backend": backend,
            "chat_template": template.origin().to_string(),
            "tool_call_format": tool_format.name(),
            "n_ctx_train": config.n_ctx_train,
        }),
        meta: json!({
            "n_vocab": config.n_vocab,
            "n_ctx_train": config.n_ctx_train,
            "n_embd": config.n_embd,
            "n_layer": config.n_layer,
        }),
        tok: tok.clone(),
        template,
        tool_format,
        submitter,
        n_ctx,
        n_batch: args.ctx.batch_size,
        parallel,
    };
    let serving = format!(
        "hesper: serving {model_label} as {alias:?} | {where_} | ctx {n_ctx} per sequence | {parallel} sequences, {} tokens per step | chat template: {} | tool calls: {}",
        args.ctx.batch_size,
        ready.template.origin(),
        ready.tool_format.name()
    );
    if let Some(plan) = ring {
        let start = RingStart {
            settings: plan.settings,
            formation: plan.formation,
            opts: RingOptions {
                standby: plan.standby,
                serving: true,
                n_ctx,
                batch: args.ctx.batch_size,
                in_flight: args.ring_inflight,
                private: args.ring_net.private,
            },
            state,
            ready,
            serving,
        };
        if args.hot_swap {
            let mut model = loaded.model;
            return with_model!(&mut model, |m| serve_ring(
                m, start, &tok, &sched, jobs, &gauges
            ));
        }
        return run_model!(&loaded.model, |m| serve_ring(
            m, start, &tok, &sched, jobs, &gauges
        ));
    }
    note!("{serving}");
    crate::report::flush_later();
    state.set_ready(ready);
    if args.hot_swap {
        // The scheduler holds the model mutably to swap tensors in between steps: the CPU's
        // operations are then handed to its threads one by one.
        let mut model = loaded.model;
        with_model!(&mut model, |m| scheduler::run(
            m, &tok, &sched, jobs, &gauges
        ))?;
        return Ok(());
    }
    run_model!(&loaded.model, |m| scheduler::run(
        m, &tok, &sched, jobs, &gauges
    ))?;
    Ok(())
}

/// What `serve --ring` was asked for: the master's layers and the ring's settings.
struct RingPlan {
    layers: Layers,
    settings: NodeSettings,
    standby: Option<SocketAddr>,
    /// The Probe round's links and each node's layers, under `--layers auto`.
    formation: Option<(Formation, Vec<Range<usize>>)>,
}

impl RingPlan {
    /// The plan `args` give, or the first flag that is missing or cannot be served.
    fn of(args: &ServeArgs) -> Result<Self> {
        let net = &args.ring_net;
        let Some(listen) = &net.listen else {
            bail!("--ring needs --listen HOST:PORT (where the ring's last node connects)");
        };
        let Some(next) = &net.next else {
            bail!("--ring needs --next HOST:PORT (the ring's first worker)");
        };
        if args.ctx.attention.config()? != AttentionConfig::default() {
            bail!("--kv-type, --attn and --swa-full are not carried over a ring yet: its nodes run dense attention over an f32 cache, sliding windows bounded");
        }
        let (listen, next) = (resolve("--listen", listen)?, resolve("--next", next)?);
        let (_, config) = model_config(&args.model)?;
        Ok(Self {
            layers: args.layers.clone().unwrap_or(Layers::Auto),
            settings: net.settings(listen, next, &config)?,
            standby: net.standby()?,
            formation: None,
        })
    }

    /// The master's layers: given, or planned after a Probe round round the ring (`auto`).
    fn layers(&mut self, args: &ServeArgs) -> Result<Range<usize>> {
        if let Layers::Range(r) = &self.layers {
            return Ok(r.clone());
        }
        let (file, config) = model_config(&args.model)?;
        let formation = Formation::probe(&self.settings, offer(&args.model, &args.ring_net)?)?;
        let n_ctx = args.ctx.n_ctx(config.n_ctx_train);
        let positions = args.kv_pool.unwrap_or(n_ctx.saturating_mul(args.parallel));
        let (formation, plan) = plan(
            formation,
            &file,
            (&config, positions),
            args.ring_net.private,
        )?;
        let own = plan[0].clone();
        self.formation = Some((formation, plan));
        Ok(own)
    }
}

/// What the ring's master needs once its model is loaded.
struct RingStart {
    settings: NodeSettings,
    formation: Option<(Formation, Vec<Range<usize>>)>,
    opts: RingOptions,
    state: Arc<State>,
    ready: Ready,
    /// The line that says what is served.
    serving: String,
}

/// Forms the ring with `model` as its master, then serves: the server is ready once the ring
/// is formed, and the scheduler runs its steps round the ring.
fn serve_ring<B: Backend, M: ModelRef<B>>(
    model: M,
    start: RingStart,
    tok: &hesper_engine::tokenizer::Tokenizer,
    sched: &SchedulerConfig,
    jobs: scheduler::Inbox,
    gauges: &scheduler::Gauges,
) -> Result<()> {
    let RingStart {
        settings,
        formation,
        opts,
        state,
        mut ready,
        serving,
    } = start;
    let runner = match formation {
        None => RingRunner::form(model, &settings, opts)?,
        Some((f, plan)) => RingRunner::form_planned(model, f, &settings, opts, plan)?,
    };
    let nodes: Vec<String> = runner.nodes().iter().map(|r| r.name()).collect();
    for (i, name) in nodes.iter().enumerate() {
        note!("hesper: ring node {i}: {name}");
    }
    ready.props["ring"] = json!(nodes);
    note!("{serving}");
    crate::report::flush_later();
    state.set_ready(ready);
    scheduler::run_on(runner, tok, sched, jobs, gauges)?;
    Ok(())
}
