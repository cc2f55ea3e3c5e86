//! SentencePiece (`tokenizer.ggml.model = "llama"`) tokenization, exactly as llama.cpp's
//! `llm_tokenizer_spm_session` does it.
//!
//! Our own code rather than the `tokenizers` crate: llama.cpp does not run SentencePiece's
//! algorithm but a greedy bigram merge over the token *scores* (no merge list exists in the
//! file), with ties broken by position and byte fallback for leftovers. A `tokenizers` BPE
//! model needs merges derived from the scores, whose tie-breaking differs from llama.cpp's.
//!
//! The text is cut into UTF-8 characters; every adjacent pair whose concatenation is a vocabulary
//! entry is queued with that entry's score; the best pair (highest score, then leftmost) is merged
//! and its new neighbours are queued, until no pair is left. Each final piece is emitted as its
//! token, or as byte tokens (`<0xNN>`) when the piece is not in the vocabulary.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::special::Fragment;
use super::vocab::Vocab;
use super::TokenizerError;

/// Tokenizes the fragments left by special-token matching, as llama.cpp's SPM branch of
/// `llama_vocab::impl::tokenize`: text at the start and right after a special token gets the
/// space prefix (`▁`) when `add_space_prefix`; every space becomes `▁`.
pub(crate) fn encode_fragments(
    vocab: &Vocab,
    frags: &[Fragment<'_>],
    add_space_prefix: bool,
    unk: Option<u32>,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let mut after_special = true;
    let mut buf = String::new();
    for frag in frags {
        match *frag {
            Fragment::Text(s) => {
                buf.clear();
                if add_space_prefix && after_special {
                    buf.push('\u{2581}');
                }
                buf.extend(s.chars().map(|c| if c == ' ' { '\u{2581}' } else { c }));
                encode(vocab, &buf, unk, out)?;
                after_special = false;
            }
            Fragment::Token(id) => {
                out.push(id);
                after_special = true;
            }
        }
    }
    Ok(())
}

/// One piece of the text: a byte range linked to its neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of two adjacent symbols.
#[derive(Debug, Clone, Copy)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    /// Byte length of the merged text; a stale entry no longer matches it.
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Tokenizes `text` (spaces already replaced by `▁`) and appends the ids to `out`.
/// `unk` is used for a byte that has no `<0xNN>` token.
pub(crate) fn encode(
    vocab: &Vocab,
    text: &str,
    unk: Option<u32>,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (i, (start, c)) in text.char_indices().enumerate() {
        let len = c.len_utf8();
        let next = (start + len < text.len()).then_some(i + 1);
        symbols.push(Symbol {
            start,
            len,
            prev: i.checked_sub(1),
            next,
        });
    }
    let mut queue = BinaryHeap::new();
    for i in 1..symbols.len() {
        push_bigram(vocab, text, &symbols, i - 1, i, &mut queue);
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(b.left);
        }
        if let Some(p) = l.prev {
            push_bigram(vocab, text, &symbols, p, b.left, &mut queue);
        }
        if let Some(n) = r.next {
            push_bigram(vocab, text, &symbols, b.left, n, &mut queue);
        }
    }
    let mut cur = if symbols.is_empty() { None } else { Some(0) };
    while let Some(i) = cur {
        let s = symbols[i];
        let piece = &text[s.start..s.start + s.len];
        match vocab.id(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece.as_bytes() {
                    out.push(byte_token(vocab, b, unk)?);
                }
            }
        }
        cur = s.next;
    }
    Ok(())
}

fn push_bigram(
    vocab: &Vocab,
    text: &str,
    symbols: &[Symbol],
    left: usize,
    right: usize,
    queue: &mut BinaryHeap<Bigram>,
) {
    let (l, r) = (symbols[left], symbols[right]);
    let size = l.len + r.len;
    let Some(id) = vocab.id(&text[l.start..l.start + size]) else {
        return;
    };
    // `+ 0.0` turns -0.0 into +0.0: llama.cpp compares scores with `<`, which ties them.
    let score = vocab.scores.get(id as usize).copied().unwrap_or(0.0) + 0.0;
    queue.push(Bigram {
        left,
        right,
        score,
        size,
    });
}

/// The token for one raw byte: `<0xNN>`, else the one-byte text, else `unk`.
fn byte_token(vocab: &Vocab, b: u8, unk: Option<u32>) -> Result<u32, TokenizerError> {
    if let Some(id) = vocab.id(&format!("<0x{b:02X}>")) {
        return Ok(id);
    }
    if b.is_ascii() {
        if let Some(id) = vocab.id(&char::from(b).to_string()) {
            return Ok(id);
        }
    }
    unk.ok_or(TokenizerError::NoByteToken(b))
}
