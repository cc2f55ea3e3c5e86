//! `hesper-rs node`: run as one node of a ring that splits a model layer-wise across
//! processes and machines. The master prints exactly what `generate` prints for the same
//! flags; workers log to stderr. The ring itself is `hesper-runtime`'s.

use std::net::SocketAddr;
use std::ops::Range;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use hesper_engine::backend::Backend;
use hesper_engine::model::{HeadPlace, Model};
use hesper_engine::sampler::Sampler;
use hesper_engine::tokenizer::Tokenizer;
use hesper_ring::TransportKind;
use hesper_runtime::ring::{
    serve, Formation, NodeSettings, RingError, RingEvaluator, RingNode, RingOptions, RingRunner,
};
use hesper_runtime::{run_model, settings, with_model, ModelRef};

use crate::args::ContextArgs;
use crate::generate::{drive, print_stats, GenerateArgs};
use crate::load::load_part;
use crate::report::note;
use crate::ring_args::{resolve, Layers, RingNetArgs, Wire};
use crate::ring_plan::{model_config, offer, plan};
use hesper_engine::attention::AttentionConfig;

/// Flags of `node`.
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// This node's part: `master` (embedding, the first layers, sampling, the output),
    /// `worker` (a later range of layers; the one that ends at the last layer also runs the
    /// LM head) or `standby` (a worker in reserve for `--standby`).
    #[arg(long = "role", value_enum)]
    role: Role,
    /// The layers this node holds, START..END (END not included), or `auto`: the master
    /// assigns them when the ring forms, by each node's measured speed and memory (what a
    /// worker or standby without --layers does).
    #[arg(long = "layers", value_name = "START..END|auto")]
    layers: Option<Layers>,
    /// First layer (LEAP's spelling; with --end instead of --layers).
    #[arg(long = "split", visible_alias = "start", value_name = "START")]
    split: Option<usize>,
    /// End layer, not included (LEAP's spelling; with --split).
    #[arg(long = "end", value_name = "END")]
    end: Option<usize>,
    /// Listen on 0.0.0.0:PORT (LEAP's spelling of --listen).
    #[arg(long = "port", value_name = "PORT")]
    port: Option<u16>,
    /// The next node's host (LEAP's spelling; with --next-port).
    #[arg(long = "next-host", value_name = "HOST")]
    next_host: Option<String>,
    /// The next node's port (LEAP's spelling; with --next-host).
    #[arg(long = "next-port", value_name = "PORT")]
    next_port: Option<u16>,
    #[command(flatten)]
    ring: RingNetArgs,
    #[command(flatten)]
    generate: GenerateArgs,
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

impl NodeArgs {
    /// The layers from `--layers` or `--split`/`--end`: a worker or standby that gives none
    /// is assigned its layers (`auto`).
    fn layers(&self) -> Result<Layers> {
        match (&self.layers, self.split, self.end) {
            (Some(l), None, None) => Ok(l.clone()),
            (Some(_), _, _) => {
                bail!("give the layers once: --layers START..END, or --split START --end END")
            }
            (None, Some(a), Some(b)) if a < b => Ok(Layers::Range(a..b)),
            (None, Some(a), Some(b)) => {
                bail!("--split {a} --end {b}: the range is empty (START must be below END)")
            }
            (None, None, None) if self.role != Role::Master => Ok(Layers::Auto),
            (None, _, _) => bail!(
                "--layers START..END or --layers auto is required (or --split START --end END)"
            ),
        }
    }

    /// Where to listen.
    fn listen(&self) -> Result<SocketAddr> {
        match (&self.ring.listen, self.port) {
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
        match (&self.ring.next, &self.next_host, self.next_port) {
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
        self.ring.settings(self.listen()?, self.next()?, model)
    }
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
        if args.ring.wire != Wire::F32 {
            bail!("--wire applies to --role master (workers answer in the master's format)");
        }
        if args.ring.standby.is_some() {
            bail!("--standby applies to --role master (the master re-forms a broken ring)");
        }
        if args.ring.private {
            bail!("--private applies to --role master (the master keeps the output to itself)");
        }
    }
    let standby = args.ring.standby()?;
    g.check()?;
    if g.shift_keep().is_some() {
        bail!("--context-shift does not cross a ring yet: its nodes stop at a full context");
    }
    if args.role == Role::Master {
        g.check_hot_swap()?;
    }
    if g.ctx.attention.config()? != AttentionConfig::default() {
        bail!("--kv-type, --attn and --swa-full are not carried over a ring yet: its nodes run dense attention over an f32 cache, sliding windows bounded");
    }
    let sampler = settings::sampler(g.sampling())?;
    let (file, config) = model_config(&g.model)?;
    let settings = args.settings(&config)?;
    let (formation, layers) = match (layers, args.role) {
        (Layers::Range(r), Role::Master) => (None, r),
        (Layers::Range(r), _) if r.is_empty() => {
            bail!(
                "--layers {}..{}: a worker holds at least one layer",
                r.start,
                r.end
            )
        }
        (Layers::Range(r), _) => (None, r),
        (Layers::Auto, Role::Master) => {
            let formation = Formation::probe(&settings, offer(&g.model, &args.ring)?)?;
            let n_ctx = g.ctx.n_ctx(config.n_ctx_train);
            let (formation, plan) = plan(formation, &file, (&config, n_ctx), args.ring.private)?;
            let own = plan[0].clone();
            (Some((formation, plan)), own)
        }
        (Layers::Auto, _) => {
            return auto_worker(&args, &settings, args.role == Role::Standby);
        }
    };
    drop(file);
    let head = if args.ring.private {
        HeadPlace::Here
    } else {
        HeadPlace::LastLayer
    };
    let mut loaded = load_part(&g.model, Some(layers), head, g.hot_swap)?;
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
            let ring = RingStart {
                settings: &settings,
                standby,
                private: args.ring.private,
                formation,
            };
            if g.hot_swap {
                let mut model = loaded.model;
                return with_model!(&mut model, |model| master_on(
                    g, model, tok, sampler, ring, load_ms
                ));
            }
            run_model!(&loaded.model, |model| master_on(
                g, model, tok, sampler, ring, load_ms
            ))
        }
    }
}

/// A worker or standby given no layers: it offers the ring what it measures, and holds the
/// layers the master assigns, loading others when a ring formed again assigns others.
fn auto_worker(args: &NodeArgs, settings: &NodeSettings, standby: bool) -> Result<()> {
    let g = &args.generate;
    let mut node = RingNode::listen(settings, standby)?;
    let mut loaded: Option<crate::load::Loaded> = None;
    loop {
        let assigned = node.wait_for_ring(&mut || {
            offer(&g.model, &args.ring).map_err(|e| RingError::Config(format!("{e:#}")))
        })?;
        let Some(layers) = assigned else {
            bail!("this node was given no layers and the master assigns none: give it --layers START..END, or the master --layers auto");
        };
        let holds = loaded
            .as_ref()
            .map(|l| with_model!(&l.model, |m| m.layer_range()));
        if holds.as_ref() != Some(&layers) {
            // The layers held before are freed first.
            drop(loaded.take());
            let head = if node.private() {
                HeadPlace::Elsewhere
            } else {
                HeadPlace::LastLayer
            };
            let l = load_part(&g.model, Some(layers), head, g.hot_swap)?;
            with_model!(&l.model, |m| say_worker(m, standby));
            loaded = Some(l);
        }
        let Some(l) = loaded.as_mut() else {
            unreachable!("loaded above")
        };
        let batch = g.ctx.batch_size;
        let ended = if g.hot_swap {
            with_model!(&mut l.model, |m| node.run(m, batch).map(|(_, e)| e))?
        } else {
            run_model!(&l.model, |m| node.run(m, batch).map(|(_, e)| e))?
        };
        if ended {
            note!("hesper: the master ended the ring");
            return Ok(());
        }
    }
}

/// How the master forms its ring.
struct RingStart<'a> {
    settings: &'a NodeSettings,
    standby: Option<SocketAddr>,
    /// Whether the master keeps the output to itself (`--private`).
    private: bool,
    /// The Probe round's links and each node's layers, under `--layers auto`.
    formation: Option<(Formation, Vec<Range<usize>>)>,
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

/// The master: forms the ring, then runs `generate` on it.
fn master_on<B: Backend, M: ModelRef<B>>(
    args: &GenerateArgs,
    model: M,
    tok: &Tokenizer,
    sampler: Sampler,
    ring: RingStart<'_>,
    load_ms: f64,
) -> Result<()> {
    let RingStart {
        settings,
        standby,
        private,
        formation,
    } = ring;
    let m = model.get();
    let n_ctx = args.ctx.n_ctx(m.config.n_ctx_train);
    ContextArgs::note_past_training(n_ctx, m.config.n_ctx_train);
    // Read before the ring owns the model (a hot-swap may replace its file).
    let (file, backend) = (m.file.clone(), m.backend.name());
    let batch = args.ctx.batch_size.min(n_ctx);
    let opts = RingOptions {
        private,
        ..RingEvaluator::<B, M>::options(n_ctx, batch, standby)
    };
    let runner = match formation {
        None => RingRunner::form(model, settings, opts)?,
        Some((f, plan)) => RingRunner::form_planned(model, f, settings, opts, plan)?,
    };
    let mut ring = RingEvaluator::on(runner, n_ctx, batch)?;
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
