//! A hot-swap across the ring: between two steps the master's Reload frame travels the ring
//! once; each node swaps in what changed in its own model file (for its own layers) and
//! appends its record — with the new header's hash — and what it found. The master then checks
//! the records as it does when the ring forms: every node must now hold the same file.

use hesper_engine::model::{Reload, ReloadError};

use super::hello::{self, NodeRecord};

/// What one node found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Nothing changed.
    Unchanged,
    /// These tensors were swapped in: `(name, type before, type after)`.
    Swapped(Vec<(String, String, String)>),
    /// The file was refused (the node keeps the weights it had), or the node was not loaded
    /// for hot-swap; the reason.
    Refused(String),
}

impl Found {
    /// What a node's own check gives.
    pub fn of(check: &Result<Reload, ReloadError>) -> Self {
        match check {
            Ok(Reload::Unchanged) => Self::Unchanged,
            Ok(Reload::Swapped(s)) => Self::Swapped(s.tensors.clone()),
            Err(ReloadError::NotEnabled) => {
                Self::Refused("it was not started with --hot-swap".into())
            }
            Err(e) => Self::Refused(e.to_string()),
        }
    }

    fn code(&self) -> u8 {
        match self {
            Self::Unchanged => 0,
            Self::Swapped(_) => 1,
            Self::Refused(_) => 2,
        }
    }

    /// Text after the code: a tensor per line (`name\tfrom\tto`), or the reason.
    fn text(&self) -> String {
        match self {
            Self::Unchanged => String::new(),
            Self::Swapped(t) => t
                .iter()
                .map(|(n, a, b)| format!("{n}\t{a}\t{b}"))
                .collect::<Vec<_>>()
                .join("\n"),
            Self::Refused(why) => why.clone(),
        }
    }

    fn from_parts(code: u8, text: &str) -> Result<Self, String> {
        Ok(match code {
            0 => Self::Unchanged,
            1 => Self::Swapped(
                text.lines()
                    .map(|l| match l.split('\t').collect::<Vec<_>>()[..] {
                        [n, a, b] => Ok((n.to_string(), a.to_string(), b.to_string())),
                        _ => Err(format!("a Reload frame names a tensor as {l:?}")),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            2 => Self::Refused(text.to_string()),
            c => {
                return Err(format!(
                    "a Reload frame holds outcome {c}, which means nothing"
                ))
            }
        })
    }
}

/// A Reload frame's payload: the records as a Hello's, then each node's outcome (a code byte
/// and a length-prefixed text).
pub fn encode(nodes: &[(NodeRecord, Found)]) -> Vec<u8> {
    let records: Vec<NodeRecord> = nodes.iter().map(|(r, _)| r.clone()).collect();
    let head = hello::encode(&records);
    let mut out = (head.len() as u32).to_le_bytes().to_vec();
    out.extend(head);
    for (_, found) in nodes {
        let text = found.text();
        out.push(found.code());
        out.extend((text.len() as u32).to_le_bytes());
        out.extend(text.as_bytes());
    }
    out
}

/// The nodes of a Reload frame's payload.
pub fn decode(b: &[u8]) -> Result<Vec<(NodeRecord, Found)>, String> {
    let short = || "a Reload frame ends inside its records".to_string();
    let word = |b: &[u8], at: usize| -> Result<usize, String> {
        let w = b.get(at..at + 4).ok_or_else(short)?;
        Ok(u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as usize)
    };
    let len = word(b, 0)?;
    let records = hello::decode(b.get(4..4 + len).ok_or_else(short)?)?;
    let mut at = 4 + len;
    let mut nodes = Vec::with_capacity(records.len());
    for r in records {
        let code = *b.get(at).ok_or_else(short)?;
        let n = word(b, at + 1)?;
        let text = b.get(at + 5..at + 5 + n).ok_or_else(short)?;
        let found = Found::from_parts(code, &String::from_utf8_lossy(text))?;
        nodes.push((r, found));
        at += 5 + n;
    }
    if at != b.len() {
        return Err(format!(
            "a Reload frame has {} bytes after its outcomes",
            b.len() - at
        ));
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_survive_a_reload_frame_and_truncation_is_refused() {
        let record = |port: u16| NodeRecord {
            layers: 0..2,
            n_layer: 4,
            model: [7; 32],
            file_len: 10,
            backend: "cpu".into(),
            listen: format!("127.0.0.1:{port}"),
            tensors: vec![("blk.0.attn_q.weight".into(), u128::MAX - u128::from(port))],
        };
        let nodes = vec![
            (record(1), Found::Unchanged),
            (
                record(2),
                Found::Swapped(vec![(
                    "blk.2.ffn_up.weight".into(),
                    "Q8_0".into(),
                    "F16".into(),
                )]),
            ),
            (record(3), Found::Refused("a torn file".into())),
        ];
        let bytes = encode(&nodes);
        assert_eq!(decode(&bytes), Ok(nodes));
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "{n} bytes");
        }
    }
}
