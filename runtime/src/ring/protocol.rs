//! What the ring's frames mean past their header.
//!
//! * A **Forward** frame is one step over several sequences: a table of entries (each a
//!   sequence's cache slot, the first position of its rows, how many, and what the last node
//!   hands back for its last row: [`Readout`] or nothing; or every row's final state, for an
//!   embedding), then every entry's hidden rows in order. Its header's `n_tokens` counts the rows, `aux` the entries.
//! * A **Prediction** frame carries the predictions of a step's entries that asked, in entry
//!   order, each encoded as its readout says: a step's may be cut into several frames (`pos0`:
//!   the first prediction's index, `n_tokens`: how many, `aux`: the step's total). One whose
//!   `dtype` is a float format carries hidden states instead (`n_tokens` rows): the final states
//!   of an embedding's rows, or the last rows' states for a master that keeps the output to
//!   itself.
//! * A **Cache** frame tells each worker to make or free the KV cache of a slot (the master's
//!   pool of sequences), in order before the steps that use it.

use hesper_engine::model::{Prediction, Readout};

/// `readout` code of an entry whose prediction nobody waits for.
const NONE: u32 = 0;
const ARGMAX: u32 = 1;
const LOGITS: u32 = 2;
const TOP: u32 = 3;
/// `readout` code of an entry whose every row's final hidden state is asked for (an
/// embedding's).
const STATES: u32 = 4;

/// Bytes of one entry in a Forward frame's table.
pub const ENTRY_LEN: usize = 16;

/// One sequence's rows in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The sequence's cache slot.
    pub slot: u32,
    /// The first row's position (the node's cache forgets the positions from here on).
    pub pos0: usize,
    /// Rows.
    pub n: usize,
    /// What the last node hands back for the last row.
    pub readout: Option<Readout>,
    /// Whether the last node hands back every row's hidden state leaving the last layer,
    /// normalized by the final norm (an embedding's; then `readout` is `None`).
    pub states: bool,
}

/// A readout as a code.
fn readout_code(r: Option<Readout>) -> u32 {
    match r {
        None => NONE,
        Some(Readout::Argmax) => ARGMAX,
        Some(Readout::Logits) => LOGITS,
        Some(Readout::Top(k)) => TOP | (k.min(0xff_ffff) as u32) << 8,
    }
}

/// The readout a code asks for.
fn readout_of(code: u32) -> Result<Option<Readout>, String> {
    match (code & 0xff, code >> 8) {
        (NONE, 0) => Ok(None),
        (ARGMAX, 0) => Ok(Some(Readout::Argmax)),
        (LOGITS, 0) => Ok(Some(Readout::Logits)),
        (TOP, k) if k > 0 => Ok(Some(Readout::Top(k as usize))),
        _ => Err(format!(
            "an entry asks for readout {code:#x}, which means nothing"
        )),
    }
}

/// A step's entries as a Forward frame's table.
pub fn encode_entries(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY_LEN);
    for e in entries {
        let code = if e.states {
            STATES
        } else {
            readout_code(e.readout)
        };
        for v in [e.slot, e.pos0 as u32, e.n as u32, code] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// The `count` entries at the front of a Forward frame's payload, which must hold `rows` rows
/// in all, and the rest of the payload (the hidden rows).
pub fn decode_entries(b: &[u8], count: usize, rows: usize) -> Result<(Vec<Entry>, &[u8]), String> {
    let len = count
        .checked_mul(ENTRY_LEN)
        .filter(|&l| l <= b.len())
        .ok_or_else(|| {
            format!(
                "a Forward frame of {} bytes cannot hold {count} entries",
                b.len()
            )
        })?;
    let (table, rest) = b.split_at(len);
    let word = |e: &[u8], i: usize| u32::from_le_bytes([e[i], e[i + 1], e[i + 2], e[i + 3]]);
    let entries: Vec<Entry> = table
        .chunks_exact(ENTRY_LEN)
        .map(|e| {
            Ok(Entry {
                slot: word(e, 0),
                pos0: word(e, 4) as usize,
                n: word(e, 8) as usize,
                readout: match word(e, 12) {
                    STATES => None,
                    code => readout_of(code)?,
                },
                states: word(e, 12) == STATES,
            })
        })
        .collect::<Result<_, String>>()?;
    if entries.is_empty() || entries.iter().any(|e| e.n == 0) {
        return Err("a Forward frame with an empty entry".into());
    }
    let total = entries.iter().try_fold(0usize, |t, e| t.checked_add(e.n));
    if total != Some(rows) {
        return Err(format!(
            "a Forward frame's entries hold {} rows, its header says {rows}",
            total.map_or_else(|| "too many".into(), |t| t.to_string())
        ));
    }
    for (i, e) in entries.iter().enumerate() {
        if entries[..i].iter().any(|o| o.slot == e.slot) {
            return Err(format!("a Forward frame names slot {} twice", e.slot));
        }
    }
    Ok((entries, rest))
}

/// The bytes `readout`'s prediction takes over a vocabulary of `n_vocab`.
pub fn prediction_len(readout: Readout, n_vocab: usize) -> usize {
    match readout {
        Readout::Argmax => 4,
        Readout::Top(k) => 8 * k.min(n_vocab),
        Readout::Logits => 4 * n_vocab,
    }
}

/// A prediction's bytes.
pub fn encode_prediction(p: &Prediction, out: &mut Vec<u8>) {
    match p {
        Prediction::Token(t) => out.extend_from_slice(&t.to_le_bytes()),
        Prediction::Top(top) => {
            for (id, logit) in top {
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&logit.to_le_bytes());
            }
        }
        Prediction::Logits(row) => {
            for v in row {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// The prediction `b` holds for `readout`, checked against the vocabulary.
pub fn decode_prediction(readout: Readout, b: &[u8], n_vocab: usize) -> Result<Prediction, String> {
    let words: Vec<[u8; 4]> = b
        .chunks_exact(4)
        .map(|w| [w[0], w[1], w[2], w[3]])
        .collect();
    let bad = || format!("a {readout:?} prediction of {} bytes", b.len());
    let token = |w: [u8; 4]| {
        let t = u32::from_le_bytes(w);
        ((t as usize) < n_vocab)
            .then_some(t)
            .ok_or_else(|| format!("a predicted token {t} outside the vocabulary ({n_vocab})"))
    };
    if b.len() != prediction_len(readout, n_vocab) {
        return Err(bad());
    }
    match readout {
        Readout::Argmax => Ok(Prediction::Token(token(words[0])?)),
        Readout::Top(_) => Ok(Prediction::Top(
            words
                .chunks_exact(2)
                .map(|p| Ok((token(p[0])?, f32::from_le_bytes(p[1]))))
                .collect::<Result<_, String>>()?,
        )),
        Readout::Logits => Ok(Prediction::Logits(
            words.into_iter().map(f32::from_le_bytes).collect(),
        )),
    }
}

/// What a Cache frame asks of a worker, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOp {
    /// Make slot `slot` a cache of `n_ctx` positions (replacing one it names).
    Alloc {
        /// The slot.
        slot: u32,
        /// Its positions.
        n_ctx: usize,
    },
    /// Free slot `slot`.
    Free {
        /// The slot.
        slot: u32,
    },
}

/// Bytes of one operation of a Cache frame.
const OP_LEN: usize = 9;

/// Operations as a Cache frame's payload.
pub fn encode_ops(ops: &[CacheOp]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ops.len() * OP_LEN);
    for op in ops {
        let (code, slot, n_ctx) = match *op {
            CacheOp::Alloc { slot, n_ctx } => (1u8, slot, n_ctx as u32),
            CacheOp::Free { slot } => (2u8, slot, 0),
        };
        out.push(code);
        out.extend_from_slice(&slot.to_le_bytes());
        out.extend_from_slice(&n_ctx.to_le_bytes());
    }
    out
}

/// A Cache frame's operations.
pub fn decode_ops(b: &[u8]) -> Result<Vec<CacheOp>, String> {
    if !b.len().is_multiple_of(OP_LEN) {
        return Err(format!("a Cache frame of {} bytes", b.len()));
    }
    b.chunks_exact(OP_LEN)
        .map(|o| {
            let slot = u32::from_le_bytes([o[1], o[2], o[3], o[4]]);
            let n_ctx = u32::from_le_bytes([o[5], o[6], o[7], o[8]]) as usize;
            match o[0] {
                1 if n_ctx > 0 => Ok(CacheOp::Alloc { slot, n_ctx }),
                2 => Ok(CacheOp::Free { slot }),
                code => Err(format!(
                    "a Cache frame asks for operation {code} (n_ctx {n_ctx})"
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_predictions_and_cache_ops_round_trip() {
        let entries = [
            Entry {
                slot: 3,
                pos0: 17,
                n: 2,
                readout: Some(Readout::Top(40)),
                states: false,
            },
            Entry {
                slot: 9,
                pos0: 0,
                n: 5,
                readout: None,
                states: true,
            },
            Entry {
                slot: 1,
                pos0: 4,
                n: 1,
                readout: Some(Readout::Argmax),
                states: false,
            },
        ];
        let mut b = encode_entries(&entries);
        b.extend_from_slice(&[7; 12]);
        let (back, rest) = decode_entries(&b, 3, 8).expect("decode");
        assert_eq!((back.as_slice(), rest), (&entries[..], &[7u8; 12][..]));
        assert!(decode_entries(&b, 3, 9)
            .unwrap_err()
            .contains("hold 8 rows"));
        assert!(decode_entries(&b[..20], 3, 8).is_err());
        let twice = encode_entries(&[entries[0], entries[0]]);
        assert!(decode_entries(&twice, 2, 4).unwrap_err().contains("twice"));
        let mut bad = encode_entries(&entries[..1]);
        bad[12] = 7;
        assert!(decode_entries(&bad, 1, 2).unwrap_err().contains("readout"));

        let cases = [
            (Readout::Argmax, Prediction::Token(5)),
            (Readout::Top(2), Prediction::Top(vec![(3, 1.5), (0, -2.0)])),
            (Readout::Logits, Prediction::Logits(vec![0.25; 8])),
        ];
        for (r, p) in cases {
            let mut b = Vec::new();
            encode_prediction(&p, &mut b);
            assert_eq!(b.len(), prediction_len(r, 8));
            assert_eq!(decode_prediction(r, &b, 8), Ok(p));
        }
        assert!(decode_prediction(Readout::Argmax, &9u32.to_le_bytes(), 8).is_err());
        assert!(decode_prediction(Readout::Logits, &[0; 12], 8).is_err());

        let ops = [
            CacheOp::Alloc {
                slot: 4,
                n_ctx: 256,
            },
            CacheOp::Free { slot: 2 },
        ];
        assert_eq!(decode_ops(&encode_ops(&ops)), Ok(ops.to_vec()));
        assert!(decode_ops(&[1, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(decode_ops(&[3; 9]).is_err());
        assert!(decode_ops(&[1; 8]).is_err());
    }
}
