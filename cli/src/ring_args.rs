//! The flags that form a ring, shared by `node` and `serve --ring`: where a node listens and
//! what follows it, the standby, the transport and wire format, the ring key, and a node's
//! layer range.

use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::Range;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use hesper_ring::{Chaos, Dtype, NetConfig, RingKey, Timing, TransportKind};
use hesper_runtime::ring::{max_payload, NodeSettings};

use crate::report::note;

/// How a node joins its ring (`node`, `serve --ring`).
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Ring")]
pub struct RingNetArgs {
    /// Where to listen for the previous node.
    #[arg(long = "listen", value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// The next node in the ring.
    #[arg(long = "next", value_name = "HOST:PORT")]
    pub next: Option<String>,
    /// A standby node (master only): if a node is lost, the ring is re-formed as the master
    /// and this node, which must hold every layer after the master's; the token history is
    /// replayed on it and generation goes on with the same tokens.
    #[arg(long = "standby", value_name = "HOST:PORT")]
    pub standby: Option<String>,
    /// Keep the output on the master (master only): it also holds the LM head and samples, so
    /// the other nodes see hidden states only — never a token id, the prompt or the answer as
    /// text. Hidden states can still be inverted by a node that holds the model file.
    #[arg(long = "private")]
    pub private: bool,
    /// How frames travel between nodes.
    #[arg(long = "transport", value_enum, default_value_t = Transport::Tcp)]
    pub transport: Transport,
    /// How hidden states travel (the master's choice; f32 is exact, f16 and q8_0 send
    /// 2× and 3.8× fewer bytes at a small cost in accuracy).
    #[arg(long = "wire", value_enum, default_value_t = Wire::F32)]
    pub wire: Wire,
    /// Seconds to wait for the ring to form (its nodes may start in any order).
    #[arg(long = "form-timeout", value_name = "SECONDS", default_value_t = 60.0)]
    pub form_timeout: f64,
    /// A secret every node of the ring is given: each link is then authenticated (HMAC-SHA-256
    /// over every frame, keys per link from a nonce handshake, replays refused), so a node
    /// without it can neither join nor inject frames. Not encryption: hidden states on the
    /// wire still reveal the prompt.
    #[arg(long = "ring-key", value_name = "KEY")]
    pub ring_key: Option<String>,
    /// Test hook: drop, duplicate and reorder this node's outgoing UDP datagrams with these
    /// probabilities (DROP,DUP,REORDER); generation must stay exact.
    #[arg(long = "udp-chaos", value_name = "DROP,DUP,REORDER", hide = true)]
    pub udp_chaos: Option<ChaosArg>,
    /// Benchmark hook: hold each frame this node sends for MS milliseconds (a network's
    /// one-way latency, emulated on loopback).
    #[arg(long = "link-delay", value_name = "MS", hide = true)]
    pub link_delay: Option<f64>,
    /// Test hook: the memory this node offers the ring for `--layers auto` is at most SIZE
    /// (bytes, or with K, M or G).
    #[arg(long = "ring-memory", value_name = "SIZE", hide = true)]
    pub ring_memory: Option<Size>,
}

/// A size in bytes, written as a number with an optional K, M or G (powers of 1024).
#[derive(Debug, Clone, Copy)]
pub struct Size(pub u64);

impl FromStr for Size {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let (num, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
            Some('K') => (&t[..t.len() - 1], 10),
            Some('M') => (&t[..t.len() - 1], 20),
            Some('G') => (&t[..t.len() - 1], 30),
            _ => (t, 0),
        };
        num.trim()
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(1 << shift))
            .map(Self)
            .ok_or_else(|| format!("{s:?}: expected a size such as 512M, 2G or 1048576"))
    }
}

/// A node's layers: `START..END`, or `auto` (the master assigns them by measurement).
#[derive(Debug, Clone)]
pub enum Layers {
    /// Assigned at formation.
    Auto,
    /// Given by hand.
    Range(Range<usize>),
}

impl FromStr for Layers {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim() == "auto" {
            return Ok(Self::Auto);
        }
        s.parse::<LayerRange>()
            .map(|r| Self::Range(r.0))
            .map_err(|e| format!("{e}, or auto"))
    }
}

/// `--transport`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// TCP (nodelay, 8 MiB buffers).
    #[default]
    Tcp,
    /// UDP datagrams of at most 1400 bytes, reassembled, lost ones sent again.
    Udp,
    /// TCP through io_uring (Linux: registered receive buffer, zero-copy sends; the same
    /// frames as tcp; falls back to tcp with a note where io_uring is unavailable).
    Uring,
}

/// `--wire`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wire {
    /// 4-byte floats (exact).
    #[default]
    F32,
    /// Half floats.
    F16,
    /// GGML's Q8_0 blocks.
    #[value(name = "q8_0")]
    Q8_0,
}

/// `--udp-chaos`.
#[derive(Debug, Clone, Copy)]
pub struct ChaosArg(Chaos);

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

/// `START..END` (or `0..0`: a master that holds the embedding and no layer).
#[derive(Debug, Clone)]
pub struct LayerRange(pub Range<usize>);

impl FromStr for LayerRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected START..END, e.g. 0..15");
        let (a, b) = s.split_once("..").ok_or_else(bad)?;
        let (a, b) = (
            a.trim().parse().map_err(|_| bad())?,
            b.trim().parse().map_err(|_| bad())?,
        );
        // 0..0 is a master's that holds the embedding and no layer.
        if a > b || (a == b && a != 0) {
            return Err(format!(
                "{s:?}: the range is empty (START must be below END; 0..0 is a master's with no layer)"
            ));
        }
        Ok(Self(a..b))
    }
}

impl RingNetArgs {
    /// The flags given that only a ring reads, by name (to refuse them without one).
    pub fn given(&self) -> Vec<&'static str> {
        let defaults = Self {
            form_timeout: 60.0,
            ..Self::default()
        };
        let mut given = Vec::new();
        for (flag, set) in [
            ("--listen", self.listen.is_some()),
            ("--next", self.next.is_some()),
            ("--standby", self.standby.is_some()),
            ("--private", self.private),
            ("--transport", self.transport != defaults.transport),
            ("--wire", self.wire != defaults.wire),
            ("--form-timeout", self.form_timeout != defaults.form_timeout),
            ("--ring-key", self.ring_key.is_some()),
            ("--udp-chaos", self.udp_chaos.is_some()),
            ("--link-delay", self.link_delay.is_some()),
            ("--ring-memory", self.ring_memory.is_some()),
        ] {
            if set {
                given.push(flag);
            }
        }
        given
    }

    /// The standby's address, if one is given.
    pub fn standby(&self) -> Result<Option<SocketAddr>> {
        self.standby
            .as_deref()
            .map(|a| resolve("--standby", a))
            .transpose()
    }

    /// The settings of a node listening on `listen` with `next` after it, for a model of
    /// `config`.
    pub fn settings(
        &self,
        listen: SocketAddr,
        next: SocketAddr,
        config: &hesper_engine::config::Config,
    ) -> Result<NodeSettings> {
        if self.ring_key.as_deref().is_some_and(str::is_empty) {
            bail!("--ring-key: the key is empty");
        }
        if !(self.form_timeout > 0.0 && self.form_timeout <= 86_400.0) {
            bail!(
                "--form-timeout {}: give seconds above 0 and at most 86400",
                self.form_timeout
            );
        }
        let delay = match self.link_delay {
            None => Duration::ZERO,
            Some(ms) if (0.0..=10_000.0).contains(&ms) => Duration::from_secs_f64(ms / 1000.0),
            Some(ms) => bail!("--link-delay {ms}: give milliseconds from 0 to 10000"),
        };
        Ok(NodeSettings {
            listen,
            next,
            net: NetConfig {
                transport: match self.transport {
                    Transport::Tcp => TransportKind::Tcp,
                    Transport::Udp => TransportKind::Udp,
                    Transport::Uring => TransportKind::Uring,
                },
                timing: Timing {
                    delay,
                    ..Timing::default()
                },
                max_payload: max_payload(config),
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
pub fn resolve(flag: &str, addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("{flag} {addr:?}: expected HOST:PORT"))?
        .next()
        .with_context(|| format!("{flag} {addr:?}: the host has no address"))
}
