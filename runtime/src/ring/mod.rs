//! Ring nodes: one model split layer-wise over processes (see the crate README).
//!
//! The master holds the first layers, the embedding and the sampler; each worker holds the
//! next range; the last worker's range ends at the last layer and it also runs the final
//! norm and LM head. A step — rows of several sequences, each with its cache slot and first
//! position — goes round the ring master → worker → … → last worker as hidden states, and
//! each sequence's prediction (a token, the top k, or a logits row, as its sampler needs)
//! comes back to the master over the last link. Positions are explicit: a worker forgets
//! whatever a slot's KV cache holds from an entry's first position on (so a master that trims
//! a context, or reuses a cached prefix, trims the ring's), refusing an entry that skips ahead.
//! Several steps are in flight at once, so every node computes while the others do.
//!
//! * [`serve`]: a worker's loop;
//! * [`RingRunner`]: the master's side, the [`crate::scheduler::StepRunner`] a server's
//!   scheduler runs on;
//! * [`RingEvaluator`]: one sequence on a ring, an [`crate::Evaluator`] a completion runs on;
//! * [`hello`]: the check that the ring covers the model once, with the same model everywhere.

mod evaluator;
mod form;
pub mod hello;
mod master;
pub mod plan;
mod probe;
mod protocol;
mod reload;
mod worker;

use std::net::SocketAddr;
use std::time::Duration;

use hesper_engine::config::Config;
use hesper_engine::model::ModelError;
use hesper_ring::{Dtype, NetConfig, NetError};
use thiserror::Error;

pub use evaluator::RingEvaluator;
pub use form::Formation;
pub use master::{RingCache, RingOptions, RingRunner};
pub use probe::measure;
pub use worker::{serve, RingNode};

/// Most rows in one Forward frame: a longer input goes as several steps.
pub const MAX_FRAME_ROWS: usize = 4096;

/// A Hello's flag (in its `pos0`): the master serves requests, so a worker that loses a
/// neighbour waits for the ring to form again instead of ending.
const HELLO_SERVES: u32 = 1;

/// A Hello's flag: its payload begins with the layers each node is to hold (the master's
/// plan, `--layers auto`).
const HELLO_PLAN: u32 = 2;

/// A Hello's flag: the master keeps the output to itself (it holds the LM head and samples);
/// the last node hands back hidden states.
const HELLO_PRIVATE: u32 = 4;

/// How a node joins its ring.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// Where this node listens for its predecessor.
    pub listen: SocketAddr,
    /// The next node.
    pub next: SocketAddr,
    /// Transport, heartbeats and frame limit (see [`max_payload`]).
    pub net: NetConfig,
    /// How hidden states travel (the master's choice; workers answer in kind).
    pub wire: Dtype,
    /// How long the ring may take to form (nodes started in any order).
    pub form_wait: Duration,
    /// Where the node's notes go (refused connections, a lost neighbour).
    pub log: fn(&str),
}

/// The longest frame payload a node of this model accepts: a step of [`MAX_FRAME_ROWS`] rows
/// of f32 hidden states with an entry each, or two predictions of whole logits rows,
/// whichever is longer.
pub fn max_payload(c: &Config) -> u32 {
    let rows = MAX_FRAME_ROWS.saturating_mul(c.n_embd.saturating_mul(4) + protocol::ENTRY_LEN);
    let prediction = c.n_vocab.saturating_mul(8);
    u32::try_from(rows.max(prediction).saturating_add(64 << 10)).unwrap_or(u32::MAX)
}

/// Why a ring node stopped.
#[derive(Debug, Error)]
pub enum RingError {
    /// A link could not be made.
    #[error(transparent)]
    Net(#[from] NetError),
    /// The nodes do not make a ring of one model.
    #[error("the ring is misconfigured: {0}")]
    Config(String),
    /// A neighbour went away.
    #[error("ring node {node} is lost: {why}")]
    Lost {
        /// The node, as named by its record or address.
        node: String,
        /// What was seen.
        why: String,
    },
    /// Another node reported that it cannot go on.
    #[error("{0}")]
    Fault(String),
    /// The master ended the ring with a reason.
    #[error("the master ended the ring: {0}")]
    Shutdown(String),
    /// A frame broke the protocol.
    #[error("a ring frame broke the protocol: {0}")]
    Protocol(String),
    /// This node's model refused the work.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Longest wait for a link to put a node's last frames on their way before the node moves on
/// ([`hesper_ring::Link::flush`]: it returns as soon as they are; a peer that is gone never
/// acknowledges a UDP frame).
const FLUSH: Duration = Duration::from_secs(1);

/// Sends a node's last `frame` on `link` and waits (at most [`FLUSH`]) until it is on its way,
/// so that it is not lost with the node.
fn send_last(link: &hesper_ring::Link, frame: hesper_ring::Frame) {
    link.send(frame);
    link.flush(FLUSH);
}

/// Longest wait for a master's Shutdown to come back round the ring ([`form::shut_down`]).
const CLOSE_WAIT: Duration = Duration::from_secs(5);
