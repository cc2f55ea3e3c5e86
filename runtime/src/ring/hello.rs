//! The ring check. The master's Hello frame travels the ring once; each node appends a record
//! of what it holds, and the master checks the records before any hidden state flows: the
//! layer ranges must cover the model exactly once, in ring order, and every node must hold
//! the same model: the same header and tensor table (their SHA-256) and file length, and in
//! each tensor a node holds the bytes the master's file has there (XXH3-128 per tensor).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::ops::Range;

use hesper_engine::backend::Backend;
use hesper_engine::file::ModelFile;
use hesper_engine::model::{Model, ModelError};
use sha2::{Digest, Sha256};

/// What one node holds, as it tells the master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// Its layers.
    pub layers: Range<usize>,
    /// Layers in its model.
    pub n_layer: usize,
    /// SHA-256 of its file's header and tensor table.
    pub model: [u8; 32],
    /// Its file's length in bytes.
    pub file_len: u64,
    /// Its backend, as `info` names it.
    pub backend: String,
    /// The address it listens on.
    pub listen: String,
    /// The XXH3-128 of each tensor it holds, by name.
    pub tensors: Vec<(String, u128)>,
}

/// The identity of a model file: the SHA-256 of its header and tensor table (the bytes
/// before the tensor data; reading them pages in nothing else).
pub fn model_id(file: &ModelFile) -> [u8; 32] {
    let header_len = usize::try_from(file.header().data_start)
        .unwrap_or(usize::MAX)
        .min(file.bytes().len());
    Sha256::digest(&file.bytes()[..header_len]).into()
}

impl NodeRecord {
    /// The record of `model` on a node listening on `listen` (hashing the tensors it holds).
    pub fn of<B: Backend>(model: &Model<B>, listen: SocketAddr) -> Result<Self, ModelError> {
        let mut record = Self {
            layers: model.layer_range(),
            n_layer: model.config.n_layer,
            model: [0; 32],
            file_len: 0,
            backend: model.backend.name(),
            listen: listen.to_string(),
            tensors: Vec::new(),
        };
        record.refresh_file(model);
        record.refresh_tensors(model)?;
        Ok(record)
    }

    /// Takes `model`'s file as it is now (after a hot-swap check): its header's identity and
    /// length.
    pub fn refresh_file<B: Backend>(&mut self, model: &Model<B>) {
        self.model = model_id(&model.file);
        self.file_len = model.file.len();
    }

    /// Takes the hashes of the tensors `model` holds now (after a hot-swap swapped some in).
    pub fn refresh_tensors<B: Backend>(&mut self, model: &Model<B>) -> Result<(), ModelError> {
        let names = model.held_tensors();
        let hashes = model.tensor_hashes(&names)?;
        self.tensors = names.into_iter().zip(hashes).collect();
        Ok(())
    }

    /// How messages name the node.
    pub fn name(&self) -> String {
        format!(
            "{} (layers {}..{}, {})",
            self.listen, self.layers.start, self.layers.end, self.backend
        )
    }
}

/// The records as a Hello payload.
pub fn encode(records: &[NodeRecord]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(records.len() as u16).to_le_bytes());
    for r in records {
        for v in [r.layers.start, r.layers.end, r.n_layer] {
            out.extend_from_slice(&(v as u32).to_le_bytes());
        }
        out.extend_from_slice(&r.model);
        out.extend_from_slice(&r.file_len.to_le_bytes());
        for s in [&r.backend, &r.listen] {
            let s = &s.as_bytes()[..s.len().min(255)];
            out.push(s.len() as u8);
            out.extend_from_slice(s);
        }
        out.extend_from_slice(&(r.tensors.len() as u32).to_le_bytes());
        for (name, hash) in &r.tensors {
            let name = &name.as_bytes()[..name.len().min(u16::MAX.into())];
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(name);
            out.extend_from_slice(&hash.to_le_bytes());
        }
    }
    out
}

/// Reads a Hello payload.
pub fn decode(mut b: &[u8]) -> Result<Vec<NodeRecord>, String> {
    let mut take = |n: usize| -> Result<&[u8], String> {
        if b.len() < n {
            return Err("a Hello frame ends inside a node record".into());
        }
        let (head, tail) = b.split_at(n);
        b = tail;
        Ok(head)
    };
    let u32_of = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize;
    let count = u16::from_le_bytes(take(2)?.try_into().map_err(|_| "short")?) as usize;
    let mut records = Vec::with_capacity(count.min(256));
    for _ in 0..count {
        let start = u32_of(take(4)?);
        let end = u32_of(take(4)?);
        let n_layer = u32_of(take(4)?);
        let model: [u8; 32] = take(32)?.try_into().map_err(|_| "short")?;
        let file_len = u64::from_le_bytes(take(8)?.try_into().map_err(|_| "short")?);
        let mut text = || -> Result<String, String> {
            let n = take(1)?[0] as usize;
            Ok(String::from_utf8_lossy(take(n)?).into_owned())
        };
        let backend = text()?;
        let listen = text()?;
        let n_tensors = u32_of(take(4)?);
        let mut tensors = Vec::with_capacity(n_tensors.min(4096));
        for _ in 0..n_tensors {
            let len = u16::from_le_bytes(take(2)?.try_into().map_err(|_| "short")?) as usize;
            let name = String::from_utf8_lossy(take(len)?).into_owned();
            let hash = u128::from_le_bytes(take(16)?.try_into().map_err(|_| "short")?);
            tensors.push((name, hash));
        }
        records.push(NodeRecord {
            layers: start..end,
            n_layer,
            model,
            file_len,
            backend,
            listen,
            tensors,
        });
    }
    if !b.is_empty() {
        return Err(format!(
            "a Hello frame has {} bytes after its records",
            b.len()
        ));
    }
    Ok(records)
}

/// A Hello's payload: the layers each node is to hold, in ring order (when the master assigns
/// them: `plan`), then the records so far.
pub fn encode_hello(plan: Option<&[Range<usize>]>, records: &[NodeRecord]) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(plan) = plan {
        out.extend_from_slice(&(plan.len() as u16).to_le_bytes());
        for r in plan {
            out.extend_from_slice(&(r.start as u32).to_le_bytes());
            out.extend_from_slice(&(r.end as u32).to_le_bytes());
        }
    }
    out.extend(encode(records));
    out
}

/// The layers each node of a ring is to hold, in ring order.
pub type Ranges = Vec<Range<usize>>;

/// A Hello's plan (when `planned`: its header says it carries one) and records.
pub fn decode_hello(
    planned: bool,
    payload: &[u8],
) -> Result<(Option<Ranges>, Vec<NodeRecord>), String> {
    if !planned {
        return Ok((None, decode(payload)?));
    }
    let short = || "a Hello frame ends inside its plan".to_string();
    let count = payload
        .get(..2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
        .ok_or_else(short)?;
    let body = payload.get(2..2 + 8 * count).ok_or_else(short)?;
    let plan: Vec<Range<usize>> = body
        .chunks_exact(8)
        .map(|c| {
            let a = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
            let b = u32::from_le_bytes([c[4], c[5], c[6], c[7]]) as usize;
            a..b
        })
        .collect();
    if plan.iter().any(|r| r.start > r.end) {
        return Err(format!("a Hello's plan holds an empty range: {plan:?}"));
    }
    Ok((Some(plan), decode(&payload[2 + 8 * count..])?))
}

/// Checks the records of a whole ring, the master's first: the same model everywhere, and
/// layer ranges that follow one another from 0 to the last layer. Says exactly what is wrong.
pub fn check(records: &[NodeRecord]) -> Result<(), String> {
    let Some(master) = records.first() else {
        return Err("the Hello frame came back with no records".into());
    };
    for (i, r) in records.iter().enumerate().skip(1) {
        if r.model != master.model || r.file_len != master.file_len || r.n_layer != master.n_layer {
            return Err(format!(
                "node {i} {} holds a different model than the master {}: header SHA-256 {} vs {}, {} vs {} bytes, {} vs {} layers",
                r.name(),
                master.name(),
                hex(&r.model),
                hex(&master.model),
                r.file_len,
                master.file_len,
                r.n_layer,
                master.n_layer
            ));
        }
    }
    let mut next = 0;
    for (i, r) in records.iter().enumerate() {
        let who = if i == 0 {
            format!("the master {}", r.name())
        } else {
            format!("node {i} {}", r.name())
        };
        if r.layers.start > next {
            return Err(format!(
                "layers {next}..{} are held by no node: {who} starts at layer {}",
                r.layers.start, r.layers.start
            ));
        }
        if r.layers.start < next {
            return Err(format!(
                "layers {}..{} are held twice: {who} starts at layer {}, but the node before it already ends at {next}",
                r.layers.start,
                next.min(r.layers.end),
                r.layers.start
            ));
        }
        next = r.layers.end;
    }
    if next != master.n_layer {
        return Err(format!(
            "layers {next}..{} are held by no node: the ring's last node ends at layer {next}",
            master.n_layer
        ));
    }
    Ok(())
}

/// Checks that every node holds, in each of its tensors, the bytes the master's file has
/// there: `reference` is the master's hash of each tensor the nodes hold (see
/// [`reference_hashes`]). Names the first node and tensor that differ.
pub fn check_data(records: &[NodeRecord], reference: &HashMap<String, u128>) -> Result<(), String> {
    for (i, r) in records.iter().enumerate().skip(1) {
        for (name, hash) in &r.tensors {
            match reference.get(name) {
                Some(want) if want == hash => {}
                Some(want) => {
                    return Err(format!(
                        "node {i} {} holds other data than the master in tensor {name} (XXH3-128 {} vs {}): its file has the same header but other weights",
                        r.name(),
                        hex(&hash.to_be_bytes()),
                        hex(&want.to_be_bytes()),
                    ))
                }
                None => {
                    return Err(format!(
                        "node {i} {} holds tensor {name}, which the master's file does not have",
                        r.name()
                    ))
                }
            }
        }
    }
    Ok(())
}

/// The master's hash of each tensor the ring's nodes hold (`records`, the master's first):
/// its own record's, and the others read from its file.
pub fn reference_hashes<B: Backend>(
    master: &Model<B>,
    records: &[NodeRecord],
) -> Result<HashMap<String, u128>, ModelError> {
    let mut reference: HashMap<String, u128> = records
        .first()
        .map(|r| r.tensors.iter().cloned().collect())
        .unwrap_or_default();
    let mut others: Vec<String> = records
        .iter()
        .skip(1)
        .flat_map(|r| r.tensors.iter().map(|(name, _)| name))
        .filter(|name| {
            !reference.contains_key(*name) && master.file.header().tensor(name).is_some()
        })
        .cloned()
        .collect();
    others.sort();
    others.dedup();
    let hashes = master.tensor_hashes(&others)?;
    reference.extend(others.into_iter().zip(hashes));
    Ok(reference)
}

/// The first 8 bytes of a hash in hex.
fn hex(h: &[u8]) -> String {
    h[..8].iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    }) + "…"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(layers: Range<usize>, id: u8) -> NodeRecord {
        NodeRecord {
            layers: layers.clone(),
            n_layer: 6,
            model: [id; 32],
            file_len: 1000,
            backend: "cpu".into(),
            listen: format!("127.0.0.1:{}", 9000 + u16::from(id)),
            tensors: layers
                .clone()
                .map(|il| (format!("blk.{il}.attn_q.weight"), u128::from(id)))
                .collect(),
        }
    }

    #[test]
    fn records_survive_a_hello_frame_and_truncation_is_refused() {
        let rs = vec![node(0..2, 1), node(2..6, 1)];
        assert_eq!(decode(&encode(&rs)), Ok(rs.clone()));
        let bytes = encode(&rs);
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "{n} bytes");
        }
    }

    #[test]
    fn gaps_overlaps_short_rings_and_other_models_are_named() {
        assert_eq!(
            check(&[node(0..2, 1), node(2..4, 1), node(4..6, 1)]),
            Ok(())
        );
        let gap = check(&[node(0..2, 1), node(3..6, 1)]).unwrap_err();
        assert!(
            gap.starts_with("layers 2..3 are held by no node: node 1"),
            "{gap}"
        );
        let overlap = check(&[node(0..3, 1), node(2..6, 1)]).unwrap_err();
        assert!(
            overlap.starts_with("layers 2..3 are held twice"),
            "{overlap}"
        );
        let short = check(&[node(0..2, 1), node(2..5, 1)]).unwrap_err();
        assert!(
            short.starts_with("layers 5..6 are held by no node"),
            "{short}"
        );
        let other = check(&[node(0..2, 1), node(2..6, 2)]).unwrap_err();
        assert!(other.contains("holds a different model"), "{other}");
    }

    #[test]
    fn a_tensor_with_other_bytes_is_named_with_its_node() {
        let reference: HashMap<String, u128> = (0..6)
            .map(|il| (format!("blk.{il}.attn_q.weight"), 1))
            .collect();
        let mut worker = node(2..6, 1);
        assert_eq!(
            check_data(&[node(0..2, 1), worker.clone()], &reference),
            Ok(())
        );
        worker.tensors[1].1 = 7;
        let e = check_data(&[node(0..2, 1), worker.clone()], &reference).unwrap_err();
        assert!(
            e.starts_with("node 1 127.0.0.1:9001 (layers 2..6, cpu) holds other data than the master in tensor blk.3.attn_q.weight"),
            "{e}"
        );
        worker.tensors[1].0 = "blk.9.attn_q.weight".into();
        let e = check_data(&[node(0..2, 1), worker], &reference).unwrap_err();
        assert!(e.contains("which the master's file does not have"), "{e}");
    }
}
