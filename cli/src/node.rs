//! `hesper-rs node`: run as one node of a ring that splits a model layer-wise across
//! processes and machines. The master prints exactly what `generate` prints for the same
//! flags; workers log to stderr. The ring itself is `hesper-runtime`'s.

use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::Range;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use hesper_engine::backend::Backend;
use hesper_engine::model::Model;
use hesper_engine::sampler::Sampler;
use hesper_engine::tokenizer::Tokenizer;
use hesper_ring::{Chaos, Dtype, NetConfig, RingKey, Timing, TransportKind};
use hesper_runtime::ring::{max_payload, serve, NodeSettings, RingEvaluator};
use hesper_runtime::{run_model, settings, with_model, ModelRef};

use crate::args::ContextArgs;
use crate::generate::{drive, print_stats, GenerateArgs};
use crate::load::load_with;
use crate::report::note;
use hesper_engine::attention::AttentionConfig;

/// Flags of `node`.
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// This node's part: `master` (embedding, the first layers, sampling, the output),
    /// `worker` (a later range of layers; the one that ends at the last layer also runs the
    /// LM head) or `standby` (a worker in reserve for `--standby`).
    #[arg(long = "role", value_enum)]
    role: Role,
    /// The layers this node holds, START..END (END not included).
    #[arg(long = "layers", value_name = "START..END")]
    layers: Option<LayerRange>,
    /// First layer (LEAP's spelling; with --end instead of --layers).
    #[arg(long = "split", visible_alias = "start", value_name = "START")]
    split: Option<usize>,
    /// End layer, not included (LEAP's spelling; with --split).
    #[arg(long = "end", value_name = "END")]
    end: Option<usize>,
    /// Where to listen for the previous node.
    #[arg(long = "listen", value_name = "HOST:PORT")]
    listen: Option<String>,
    /// Listen on 0.0.0.0:PORT (LEAP's spelling of --listen).
    #[arg(long = "port", value_name = "PORT")]
    port: Option<u16>,
    /// The next node in the ring.
    #[arg(long = "next", value_name = "HOST:PORT")]
    next: Option<String>,
    /// The next node's host (LEAP's spelling; with --next-port).
    #[arg(long = "next-host", value_name = "HOST")]
    next_host: Option<String>,
    /// The next node's port (LEAP's spelling; with --next-host).
    #[arg(long = "next-port", value_name = "PORT")]
    next_port: Option<u16>,
    /// A standby node (master only): if a node is lost, the ring is re-formed as the master
    /// and this node, which must hold every layer after the master's; the token history is
    /// replayed on it and generation goes on with the same tokens.
    #[arg(long = "standby", value_name = "HOST:PORT")]
    standby: Option<String>,
    /// How frames travel between nodes.
    #[arg(long = "transport", value_enum, default_value_t = Transport::Tcp)]
    transport: Transport,
    /// How hidden states travel (the master's choice; f32 is exact, f16 and q8_0 send
    /// 2× and 3.8× fewer bytes at a small cost in accuracy).
    #[arg(long = "wire", value_enum, default_value_t = Wire::F32)]
    wire: Wire,
    /// Seconds to wait for the ring to form (its nodes may start in any order).
    #[arg(long = "form-timeout", value_name = "SECONDS", default_value_t = 60.0)]
    form_timeout: f64,
    /// A secret every node of the ring is given: each link is then authenticated (HMAC-SHA-256
    /// over every frame, keys per link from a nonce handshake, replays refused), so a node
    /// without it can neither join nor inject frames. Not encryption: hidden states on the
    /// wire still reveal the prompt.
    #[arg(long = "ring-key", value_name = "KEY")]
    ring_key: Option<String>,
    /// Test hook: drop, duplicate and reorder this node's outgoing UDP datagrams with these
    /// probabilities (DROP,DUP,REORDER); generation must stay exact.
    #[arg(long = "udp-chaos", value_name = "DROP,DUP,REORDER", hide = true)]
    udp_chaos: Option<ChaosArg>,
    #[command(flatten)]
    generate: GenerateArgs,
}

/// `--udp-chaos`.
#[derive(Debug, Clone, Copy)]
struct ChaosArg(Chaos);

impl FromStr for ChaosArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let p: Vec<f64> = s
            .split(',')
            .map(|v| v.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("{s:?}: expected three probabilities DROP,DUP,REORDER"))?;
        match p[..] {
            [drop, duplicate, reorder] if p.iter().all(|v| (0.0..0.5).contains(v)) => {
                Ok(Self(Chaos {
                    drop,
                    duplicate,
                    reorder,
                }))
            }
            _ => Err(format!(
                "{s:?}: expected three probabilities DROP,DUP,REORDER, each from 0 to below 0.5"
            )),
        }
    }
}

/// A node's part in the ring.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Embedding, the first layers, sampling and the output.
    Master,
    /// A later range of layers.
    Worker,
    /// A worker kept in reserve: it waits, without a time limit, until a master whose ring
    /// broke re-forms the ring through it (`--standby` on the master).
    Standby,
}

/// `--transport`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// TCP (nodelay, 8 MiB buffers).
    Tcp,
    /// UDP datagrams of at most 1400 bytes, reassembled, lost ones sent again.
    Udp,
    /// TCP through io_uring (Linux: registered receive buffer, zero-copy sends; the same
    /// frames as tcp; falls back to tcp with a note where io_uring is unavailable).
    Uring,
}

/// `--wire`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// 4-byte floats (exact).
    F32,
    /// Half floats.
    F16,
    /// GGML's Q8_0 blocks.
    #[value(name = "q8_0")]
    Q8_0,
}

/// `START..END`.
#[derive(Debug, Clone)]
struct LayerRange(Range<usize>);

impl FromStr for LayerRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected START..END, e.g. 0..15");
        let (a, b) = s.split_once("..").ok_or_else(bad)?;
        let (a, b) = (
            a.trim().parse().map_err(|_| bad())?,
            b.trim().parse().map_err(|_| bad())?,
        );
        if a >= b {
            return Err(format!(
                "{s:?}: the range is empty (START must be below END)"
            ));
        }
        Ok(Self(a..b))
    }
}

impl NodeArgs {
    /// The layer range from `--layers` or `--split`/`--end`.
    fn layers(&self) -> Result<Range<usize>> {
        match (&self.layers, self.split, self.end) {
            (Some(r), None, None) => Ok(r.0.clone()),
            (Some(_), _, _) => {
                bail!("give the layers once: --layers START..END, or --split START --end END")
            }
            (None, Some(a), Some(b)) if a < b => Ok(a..b),
            (None, Some(a), Some(b)) => {
                bail!("--split {a} --end {b}: the range is empty (START must be below END)")
            }
            (None, _, _) => bail!("--layers START..END is required (or --split START --end END)"),
        }
    }

    /// Where to listen.
    fn listen(&self) -> Result<SocketAddr> {
        match (&self.listen, self.port) {
            (Some(a), None) => resolve("--listen", a),
            (None, Some(p)) => Ok(SocketAddr::from(([0, 0, 0, 0], p))),
            (Some(_), Some(_)) => bail!("give --listen HOST:PORT or --port PORT, not both"),
            (None, None) => {
                bail!("--listen HOST:PORT is required (where the previous node connects)")
            }
        }
    }

    /// The next node's address.
    fn next(&self) -> Result<SocketAddr> {
        match (&self.next, &self.next_host, self.next_port) {
            (Some(a), None, None) => resolve("--next", a),
            (None, Some(h), Some(p)) => resolve("--next-host/--next-port", &format!("{h}:{p}")),
            (Some(_), _, _) => {
                bail!("give --next HOST:PORT or --next-host with --next-port, not both")
            }
            (None, _, _) => {
                bail!("--next HOST:PORT is required (the node after this one in the ring)")
            }
        }
    }

    fn settings(&self, model: &hesper_engine::config::Config) -> Result<NodeSettings> {
        if self.ring_key.as_deref().is_some_and(str::is_empty) {
            bail!("--ring-key: the key is empty");
        }
        if !(self.form_timeout > 0.0 && self.form_timeout <= 86_400.0) {
            bail!(
                "--form-timeout {}: give seconds above 0 and at most 86400",
                self.form_timeout
            );
        }
        Ok(NodeSettings {
            listen: self.listen()?,
            next: self.next()?,
            net: NetConfig {
                transport: match self.transport {
                    Transport::Tcp => TransportKind::Tcp,
                    Transport::Udp => TransportKind::Udp,
                    Transport::Uring => TransportKind::Uring,
                },
                timing: Timing::default(),
                max_payload: max_payload(model),
                chaos: self.udp_chaos.map(|c| c.0),
                key: self.ring_key.as_deref().map(|k| RingKey::new(k.as_bytes())),
            },
            wire: match self.wire {
                Wire::F32 => Dtype::F32,
                Wire::F16 => Dtype::F16,
                Wire::Q8_0 => Dtype::Q8_0,
            },
            form_wait: Duration::from_secs_f64(self.form_timeout),
            log: |m| note!("hesper-ring: {m}"),
        })
    }
}

/// Resolves `HOST:PORT` for `flag`.
fn resolve(flag: &str, addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("{flag} {addr:?}: expected HOST:PORT"))?
        .next()
        .with_context(|| format!("{flag} {addr:?}: the host has no address"))
}

/// Runs `node`.
pub fn run(mut args: NodeArgs) -> Result<()> {
    let layers = args.layers()?;
    // Address and flag mistakes fail before a model is loaded.
    args.listen()?;
    args.next()?;
    if args.role != Role::Master && args.generate.file.is_some() {
        bail!("-f/--file applies to --role master (a worker only runs its layers)");
    }
    args.generate.read_prompt_file()?;
    let g = &args.generate;
    if args.role != Role::Master {
        if g.prompt.is_some() || g.chat {
            bail!("-p/--prompt and --chat apply to --role master (a worker only runs its layers)");
        }
        if args.wire != Wire::F32 {
            bail!("--wire applies to --role master (workers answer in the master's format)");
        }
        if args.standby.is_some() {
            bail!("--standby applies to --role master (the master re-forms a broken ring)");
        }
    }
    let standby = args
        .standby
        .as_deref()
        .map(|a| resolve("--standby", a))
        .transpose()?;
    g.check()?;
    if g.shift_keep().is_some() {
        bail!("--context-shift does not cross a ring yet: its nodes stop at a full context");
    }
    if args.role == Role::Master {
        g.check_hot_swap()?;
    }
    if g.ctx.attention.config()? != AttentionConfig::default() {
        bail!("--kv-type and --attn are not carried over a ring yet: its nodes run dense attention over an f32 cache");
    }
    let sampler = settings::sampler(g.sampling())?;
    let mut loaded = load_with(&g.model, Some(layers), g.hot_swap)?;
    let settings = args.settings(with_config(&loaded.model))?;
    match args.role {
        Role::Worker | Role::Standby => {
            let batch = g.ctx.batch_size;
            let standby = args.role == Role::Standby;
            if g.hot_swap {
                // Lent mutably to swap tensors in between steps.
                with_model!(&mut loaded.model, |model| {
                    say_worker(model, standby);
                    serve(model, &settings, batch, standby)
                })?;
            } else {
                run_model!(&loaded.model, |model| {
                    say_worker(model, standby);
                    serve(model, &settings, batch, standby)
                })?;
            }
            note!("hesper: the master ended the ring");
            Ok(())
        }
        Role::Master => {
            let Some(tok) = loaded.tokenizer.as_ref() else {
                bail!(
                    "{} has no tokenizer; the master needs one",
                    loaded.model.file().source
                );
            };
            let load_ms = loaded.load_ms;
            if g.hot_swap {
                let mut model = loaded.model;
                return with_model!(&mut model, |model| master_on(
                    g,
                    model,
                    tok,
                    sampler,
                    (&settings, standby),
                    load_ms
                ));
            }
            run_model!(&loaded.model, |model| master_on(
                g,
                model,
                tok,
                sampler,
                (&settings, standby),
                load_ms
            ))
        }
    }
}

/// What a worker runs (the address it listens on is said once bound: a port 0 becomes a real
/// one).
fn say_worker<B: Backend>(model: &Model<B>, standby: bool) {
    note!(
        "hesper: {} for layers {:?} of {} on {}",
        if standby { "standby" } else { "worker" },
        model.layer_range(),
        model.file.source,
        model.backend.name(),
    );
}

fn with_config(m: &hesper_runtime::load::AnyModel) -> &hesper_engine::config::Config {
    hesper_runtime::with_model!(m, |m| &m.config)
}

/// The master: forms the ring, then runs `generate` on it.
fn master_on<B: Backend, M: ModelRef<B>>(
    args: &GenerateArgs,
    model: M,
    tok: &Tokenizer,
    sampler: Sampler,
    (settings, standby): (&NodeSettings, Option<SocketAddr>),
    load_ms: f64,
) -> Result<()> {
    let m = model.get();
    let n_ctx = args.ctx.n_ctx(m.config.n_ctx_train);
    ContextArgs::note_past_training(n_ctx, m.config.n_ctx_train);
    // Read before the ring owns the model (a hot-swap may replace its file).
    let (file, backend) = (m.file.clone(), m.backend.name());
    let batch = args.ctx.batch_size.min(n_ctx);
    let mut ring = RingEvaluator::form(model, settings, n_ctx, batch, standby)?;
    for (i, r) in ring.nodes().iter().enumerate() {
        note!("hesper: ring node {i}: {}", r.name());
    }
    let label = format!(
        "{} | ring of {} nodes, master on {}",
        file.source,
        ring.nodes().len(),
        backend
    );
    let stats = drive(args, &mut ring, (tok, file.header()), sampler, &label)?;
    for link in ring.links() {
        let s = link.stats();
        let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        // Only UDP resends: the other transports' bytes arrive or the link fails.
        let resent = match settings.net.transport {
            TransportKind::Udp => format!(", {} datagrams sent again", n(&s.retransmits)),
            _ => String::new(),
        };
        note!(
            "hesper: ring link {} {}: {} frames, {} bytes sent{resent}",
            if link.side() == hesper_ring::Side::Next {
                "to"
            } else {
                "from"
            },
            link.peer(),
            n(&s.frames),
            n(&s.bytes),
        );
    }
    ring.close("");
    print_stats(load_ms, &stats);
    Ok(())
}
