//! Layers assigned by measurement (`--layers auto`): at formation each node offers what it
//! has — its backend, the memory it may use, and the time one layer and the LM head of this
//! model take on its hardware ([`Offer`]) — and the master picks contiguous ranges, in ring
//! order, that make the slowest node's share of a step as short as it can be while each node's
//! share fits in its memory ([`assign`]).

use std::fmt::Write as _;
use std::ops::Range;

use hesper_engine::gguf::Gguf;

/// What a node offers the ring at formation.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    /// The address it listens on.
    pub listen: String,
    /// Its backend, as `info` names it.
    pub backend: String,
    /// Bytes it may hold (`None`: unknown, e.g. a GPU, whose free memory WebGPU does not
    /// tell).
    pub memory: Option<u64>,
    /// Milliseconds one layer takes for one token on its hardware.
    pub ms_layer: f64,
    /// Milliseconds the final norm and LM head take for one token.
    pub ms_head: f64,
    /// The layers it was given by hand (`--layers`), which the plan keeps.
    pub layers: Option<Range<usize>>,
}

/// Bytes of a model's parts: what a node holding some of them needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelBytes {
    /// Each layer's tensors.
    pub layers: Vec<u64>,
    /// The embedding table (held by the master).
    pub embedding: u64,
    /// The final norm and the LM head (the embedding table's bytes again when it is tied).
    pub head: u64,
    /// One layer's KV cache for every position the master's sequences may hold.
    pub kv_per_layer: u64,
}

impl ModelBytes {
    /// The bytes of the model `g` describes, with a KV cache of `kv_positions` positions in
    /// all (f32 keys and values of `kv_dim` each).
    pub fn of(g: &Gguf, n_layer: usize, kv_dim: usize, kv_positions: usize) -> Self {
        let size = |name: &str| g.tensor(name).and_then(|t| t.nbytes).unwrap_or(0);
        let mut layers = vec![0; n_layer];
        for t in g.tensors() {
            let layer = t
                .name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next())
                .and_then(|n| n.parse::<usize>().ok());
            if let Some(il) = layer.filter(|&il| il < n_layer) {
                layers[il] += t.nbytes.unwrap_or(0);
            }
        }
        let embedding = size("token_embd.weight");
        let head = size("output_norm.weight")
            + match g.tensor("output.weight") {
                Some(_) => size("output.weight"),
                None => embedding,
            };
        Self {
            layers,
            embedding,
            head,
            kv_per_layer: (kv_positions as u64) * (kv_dim as u64) * 2 * 4,
        }
    }

    /// The bytes of layers `r`, their KV cache included.
    fn range(&self, r: &Range<usize>) -> u64 {
        self.layers[r.clone()].iter().sum::<u64>() + self.kv_per_layer * r.len() as u64
    }
}

/// Each node's layers, and what the plan expects of each.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Each node's layers, in ring order (the master's first).
    pub ranges: Vec<Range<usize>>,
    /// Each node's expected milliseconds per token.
    pub ms: Vec<f64>,
    /// Each node's bytes.
    pub bytes: Vec<u64>,
    /// The node that runs the LM head.
    pub head: usize,
}

/// Picks each node's layers (`offers` in ring order, the master's first; the master holds the
/// embedding, and the LM head is held by the last node, or by the master when `head_on_master`)
/// to make the slowest node's share of a token as short as possible within every node's
/// memory. Every worker holds at least one layer; ranges given by hand are kept. A model that
/// fits nowhere is refused, saying how much memory is missing.
pub fn assign(offers: &[Offer], bytes: &ModelBytes, head_on_master: bool) -> Result<Plan, String> {
    let n_layer = bytes.layers.len();
    let nodes = offers.len();
    if nodes < 2 {
        return Err("a ring needs the master and at least one worker".into());
    }
    if n_layer < nodes - 1 {
        return Err(format!(
            "{n_layer} layers cannot give each of {} workers one",
            nodes - 1
        ));
    }
    let head_node = if head_on_master { 0 } else { nodes - 1 };
    let extras = |i: usize| {
        let mut b = 0;
        if i == 0 {
            b += bytes.embedding;
        }
        if i == head_node {
            b += bytes.head;
        }
        b
    };
    let cost = |i: usize, r: &Range<usize>| {
        let o = &offers[i];
        o.ms_layer * r.len() as f64 + if i == head_node { o.ms_head } else { 0.0 }
    };
    let fits = |i: usize, r: &Range<usize>| {
        offers[i]
            .memory
            .is_none_or(|m| bytes.range(r) + extras(i) <= m)
    };
    // A range given by hand is the node's, loaded already (its memory is what is left).
    let allowed = |i: usize, r: &Range<usize>| match &offers[i].layers {
        Some(given) => given == r,
        None => (i == 0 || !r.is_empty()) && fits(i, r),
    };
    // best[i][e]: the slowest share of nodes 0..=i when node i ends at layer e, and where it
    // starts.
    let mut best = vec![vec![None::<(f64, usize)>; n_layer + 1]; nodes];
    for (e, b) in best[0].iter_mut().enumerate() {
        let r = 0..e;
        if allowed(0, &r) {
            *b = Some((cost(0, &r), 0));
        }
    }
    for i in 1..nodes {
        for e in 1..=n_layer {
            for s in 0..e {
                let Some((before, _)) = best[i - 1][s] else {
                    continue;
                };
                let r = s..e;
                if !allowed(i, &r) {
                    continue;
                }
                let slowest = before.max(cost(i, &r));
                if best[i][e].is_none_or(|(b, _)| slowest < b) {
                    best[i][e] = Some((slowest, s));
                }
            }
        }
    }
    if best[nodes - 1][n_layer].is_none() {
        return Err(refusal(offers, bytes, head_node));
    }
    let mut ranges = vec![0..0; nodes];
    let mut end = n_layer;
    for i in (0..nodes).rev() {
        let (_, start) = best[i][end].expect("a plan reaches here");
        ranges[i] = start..end;
        end = start;
    }
    Ok(Plan {
        ms: (0..nodes).map(|i| cost(i, &ranges[i])).collect(),
        bytes: (0..nodes)
            .map(|i| bytes.range(&ranges[i]) + extras(i))
            .collect(),
        ranges,
        head: head_node,
    })
}

/// Why no plan fits: how much memory the model needs beyond the ring's, or which node's
/// memory or hand-given range stands in the way.
fn refusal(offers: &[Offer], bytes: &ModelBytes, head_node: usize) -> String {
    let all = 0..bytes.layers.len();
    let need = bytes.range(&all) + bytes.embedding + bytes.head;
    let known: Option<u64> = offers.iter().map(|o| o.memory).sum();
    match known {
        Some(have) if have < need => format!(
            "the model does not fit in the ring's memory: it needs {} (layers and their KV cache {}, embedding {}, LM head {}), the ring's {} nodes have {}: {} missing",
            mib(need),
            mib(bytes.range(&all)),
            mib(bytes.embedding),
            mib(bytes.head),
            offers.len(),
            mib(have),
            mib(need - have)
        ),
        _ => {
            let head = &offers[head_node];
            let tight = head.memory.filter(|&m| m < bytes.head + bytes.layers.first().copied().unwrap_or(0));
            match tight {
                Some(m) => format!(
                    "no split fits: node {head_node} {} holds the LM head ({}) and a layer, but has {}",
                    head.listen,
                    mib(bytes.head),
                    mib(m)
                ),
                None => "no split of contiguous layers fits every node's memory and the layers given by hand".into(),
            }
        }
    }
}

/// Bytes as MiB, for messages.
pub fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1 << 20) as f64)
}

/// The plan as a table, a line per node: its backend, layers, memory, milliseconds per layer,
/// and its expected share of a step.
pub fn table(plan: &Plan, offers: &[Offer]) -> String {
    let slowest = plan.ms.iter().copied().fold(0.0, f64::max).max(1e-9);
    let mut out = String::from(
        "| node | backend | layers | memory (of) | ms/layer | ms/token | busy |\n|---|---|---|---:|---:|---:|---:|\n",
    );
    for (i, o) in offers.iter().enumerate() {
        let r = &plan.ranges[i];
        let head = if i == plan.head { " + head" } else { "" };
        let of = o.memory.map_or_else(|| "?".into(), mib);
        let _ = writeln!(
            out,
            "| {i} {}{} | {} | {}..{} ({}){head} | {} ({of}) | {:.2} | {:.1} | {:.0} % |",
            o.listen,
            if i == 0 { " (master)" } else { "" },
            o.backend,
            r.start,
            r.end,
            r.len(),
            mib(plan.bytes[i]),
            o.ms_layer,
            plan.ms[i],
            100.0 * plan.ms[i] / slowest
        );
    }
    out
}

/// Offers as a Probe frame's payload.
pub fn encode(offers: &[Offer]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(offers.len() as u16).to_le_bytes());
    for o in offers {
        for s in [&o.listen, &o.backend] {
            let s = &s.as_bytes()[..s.len().min(255)];
            out.push(s.len() as u8);
            out.extend_from_slice(s);
        }
        out.extend_from_slice(&o.memory.unwrap_or(u64::MAX).to_le_bytes());
        out.extend_from_slice(&o.ms_layer.to_le_bytes());
        out.extend_from_slice(&o.ms_head.to_le_bytes());
        let (a, b) = o
            .layers
            .as_ref()
            .map_or((u32::MAX, u32::MAX), |r| (r.start as u32, r.end as u32));
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
    }
    out
}

/// A Probe frame's offers.
pub fn decode(mut b: &[u8]) -> Result<Vec<Offer>, String> {
    let mut take = |n: usize| -> Result<&[u8], String> {
        if b.len() < n {
            return Err("a Probe frame ends inside an offer".into());
        }
        let (head, tail) = b.split_at(n);
        b = tail;
        Ok(head)
    };
    let count = u16::from_le_bytes(take(2)?.try_into().map_err(|_| "short")?) as usize;
    let mut offers = Vec::with_capacity(count.min(256));
    for _ in 0..count {
        let mut text = || -> Result<String, String> {
            let n = take(1)?[0] as usize;
            Ok(String::from_utf8_lossy(take(n)?).into_owned())
        };
        let listen = text()?;
        let backend = text()?;
        let u64_of = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or([0; 8]));
        let memory = Some(u64_of(take(8)?)).filter(|&m| m != u64::MAX);
        let ms_layer = f64::from_bits(u64_of(take(8)?));
        let ms_head = f64::from_bits(u64_of(take(8)?));
        let u32_of = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap_or([0; 4]));
        let (a, e) = (u32_of(take(4)?), u32_of(take(4)?));
        if !(ms_layer.is_finite() && ms_layer >= 0.0 && ms_head.is_finite() && ms_head >= 0.0) {
            return Err(format!(
                "an offer of {ms_layer} ms a layer, {ms_head} ms the head"
            ));
        }
        let layers = match (a, e) {
            (u32::MAX, u32::MAX) => None,
            (a, e) if a <= e => Some(a as usize..e as usize),
            _ => return Err(format!("an offer of layers {a}..{e}")),
        };
        offers.push(Offer {
            listen,
            backend,
            memory,
            ms_layer,
            ms_head,
            layers,
        });
    }
    if !b.is_empty() {
        return Err(format!(
            "a Probe frame has {} bytes after its offers",
            b.len()
        ));
    }
    Ok(offers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(ms_layer: f64, ms_head: f64, memory: Option<u64>) -> Offer {
        Offer {
            listen: "127.0.0.1:1".into(),
            backend: "cpu".into(),
            memory,
            ms_layer,
            ms_head,
            layers: None,
        }
    }

    fn bytes(n: usize) -> ModelBytes {
        ModelBytes {
            layers: vec![100; n],
            embedding: 50,
            head: 300,
            kv_per_layer: 10,
        }
    }

    #[test]
    fn the_slowest_share_is_made_as_short_as_it_can_be() {
        // Equal nodes, a head worth three layers on the last: 8 layers split 5 | 3 + head
        // (5 and 6 ms) rather than in halves (4 | 4 + 3 = 7 ms).
        let p = assign(
            &[offer(1.0, 3.0, None), offer(1.0, 3.0, None)],
            &bytes(8),
            false,
        )
        .expect("a plan");
        assert_eq!(p.ranges, vec![0..5, 5..8]);
        assert_eq!(p.ms, vec![5.0, 6.0]);
        // A node twice as fast takes twice the layers.
        let p = assign(
            &[
                offer(2.0, 0.0, None),
                offer(1.0, 0.0, None),
                offer(2.0, 0.0, None),
            ],
            &bytes(8),
            false,
        )
        .expect("a plan");
        assert_eq!(p.ranges, vec![0..2, 2..6, 6..8]);
        // The head on the master (private ends).
        let p = assign(
            &[offer(1.0, 3.0, None), offer(1.0, 3.0, None)],
            &bytes(8),
            true,
        )
        .expect("a plan");
        assert_eq!((p.ranges.clone(), p.head), (vec![0..2, 2..8], 0));
    }

    #[test]
    fn memory_and_hand_given_ranges_are_kept_and_a_model_too_big_is_refused() {
        // The fast master may hold only 2 layers (2 × 110 + 50 bytes).
        let p = assign(
            &[offer(0.1, 0.0, Some(270)), offer(1.0, 0.0, None)],
            &bytes(8),
            false,
        )
        .expect("a plan");
        assert_eq!(p.ranges, vec![0..2, 2..8]);
        assert!(p.bytes[0] <= 270);
        let mut given = offer(1.0, 0.0, None);
        given.layers = Some(1..7);
        let p = assign(
            &[offer(1.0, 0.0, None), given, offer(1.0, 0.0, None)],
            &bytes(8),
            false,
        )
        .expect("a plan");
        assert_eq!(p.ranges, vec![0..1, 1..7, 7..8]);
        let e = assign(
            &[offer(1.0, 0.0, Some(500)), offer(1.0, 0.0, Some(600))],
            &bytes(8),
            false,
        )
        .unwrap_err();
        assert!(e.contains("does not fit in the ring's memory"), "{e}");
        assert!(e.contains("MiB missing"), "{e}");
        let e = assign(
            &[offer(1.0, 0.0, None), offer(1.0, 0.0, Some(350))],
            &bytes(8),
            false,
        )
        .unwrap_err();
        assert!(e.contains("holds the LM head"), "{e}");
    }

    #[test]
    fn offers_survive_a_probe_frame_and_truncation_is_refused() {
        let mut given = offer(0.25, 7.5, Some(1 << 30));
        given.layers = Some(3..9);
        let offers = vec![offer(1.5, 2.0, None), given];
        let b = encode(&offers);
        assert_eq!(decode(&b), Ok(offers));
        for n in 0..b.len() {
            assert!(decode(&b[..n]).is_err(), "{n} bytes");
        }
    }
}
