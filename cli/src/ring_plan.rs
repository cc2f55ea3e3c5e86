//! `--layers auto` on the command line: what a node offers the ring (its speed, measured on
//! the model's last layer and LM head, and its memory), and the master's plan, printed as a
//! table.

use std::ops::Range;
use std::sync::Arc;

use anyhow::{Context, Result};
use hesper_engine::backend::Backend;
use hesper_engine::config::Config;
use hesper_engine::file::ModelFile;
use hesper_runtime::ring::plan::{assign, mib, table, ModelBytes, Offer};
use hesper_runtime::ring::{measure, Formation};
use hesper_runtime::with_model;

use crate::args::ModelArgs;
use crate::load::{load_with, open_file};
use crate::report::note;
use crate::ring_args::RingNetArgs;

/// The model file `args` name and its configuration, without loading it.
pub fn model_config(args: &ModelArgs) -> Result<(Arc<ModelFile>, Config)> {
    let file = open_file(&args.file)?;
    let g = file.header();
    let n_vocab = g.tensor("token_embd.weight").map(|t| t.ne[1] as usize);
    let config = Config::from_gguf(g, n_vocab)
        .with_context(|| format!("{}: cannot read the model's configuration", file.source))?;
    Ok((file, config))
}

/// What this node offers the ring: the time a layer and the LM head take here, measured on an
/// instance of the model's last layer and head on the backend `args` pick, and the memory it
/// may hold (what the backend says is free, at most `--ring-memory`).
pub fn offer(args: &ModelArgs, net: &RingNetArgs) -> Result<Offer> {
    let (_, config) = model_config(args)?;
    let last = config.n_layer.saturating_sub(1)..config.n_layer;
    let probe = load_with(args, Some(last), false)?;
    let (ms_layer, ms_head, backend, memory) = with_model!(&probe.model, |m| {
        let (layer, head) = measure(m)?;
        let free = m.backend.memory_limits().available;
        (layer, head, m.backend.name(), free)
    });
    let memory = match (memory, net.ring_memory) {
        (Some(m), Some(cap)) => Some(m.min(cap.0)),
        (m, cap) => m.or(cap.map(|c| c.0)),
    };
    note!(
        "hesper: measured on {backend}: {ms_layer:.2} ms a layer, {ms_head:.2} ms the LM head, for one token; {} free",
        memory.map_or_else(|| "memory not known".into(), mib)
    );
    Ok(Offer {
        listen: String::new(),
        backend,
        memory,
        ms_layer,
        ms_head,
        layers: None,
    })
}

/// Each node's layers for the ring `formation` linked (its offers in ring order), for a model
/// of `config` whose sequences hold `kv_positions` positions in all, the LM head on the last
/// node or (`head_on_master`) the master; the plan is printed. A
/// model that fits in no plan ends the forming ring, every node told why.
pub fn plan(
    formation: Formation,
    file: &ModelFile,
    (config, kv_positions): (&Config, usize),
    head_on_master: bool,
) -> Result<(Formation, Vec<Range<usize>>)> {
    let bytes = ModelBytes::of(file.header(), config.n_layer, config.kv_dim(), kv_positions);
    let plan = match assign(&formation.offers, &bytes, head_on_master) {
        Ok(plan) => plan,
        Err(why) => {
            formation.refuse(&why);
            anyhow::bail!(why);
        }
    };
    note!(
        "hesper: layers assigned by measurement (--layers auto):\n{}",
        table(&plan, &formation.offers).trim_end()
    );
    Ok((formation, plan.ranges))
}
