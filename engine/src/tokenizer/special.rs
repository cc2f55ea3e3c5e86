//! Cuts special tokens out of the input text before the model-specific tokenizer runs,
//! as llama.cpp's `tokenizer_st_partition` does.
//!
//! Candidates are the control, unknown and user-defined tokens, longest text first. Each one is
//! searched, left to right, in every text fragment left by the previous ones. Without
//! `parse_special`, control and unknown tokens are not searched (their text is tokenized as
//! plain text) but user-defined tokens still are.
//!
//! A token may take the whitespace beside it with it (llama.cpp's `RSTRIP` token attribute,
//! which it gives by the model's `general.name`: every special token of a Phi-3 model but
//! `<unk>`, `<s>` and `<|endoftext|>`, so `<|user|>\nHi` is `<|user|>`, `Hi`).

use super::vocab::{TokenKind, Vocab};

/// A piece of the input: text still to tokenize, or a token already found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    /// Plain text.
    Text(&'a str),
    /// A special token matched in the text.
    Token(u32),
}

/// The special tokens of a vocabulary, in matching order.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialTokens {
    /// Ids, longest text first (ties by id, so the order is reproducible).
    order: Vec<u32>,
    /// The ids whose match takes the whitespace after it, sorted.
    rstrip: Vec<u32>,
}

/// The special tokens a Phi-3 model's vocabulary keeps the whitespace after (llama.cpp).
const PHI3_KEEPS_SPACE: [&str; 3] = ["<unk>", "<s>", "<|endoftext|>"];

impl SpecialTokens {
    /// Collects the candidates of `vocab`, of the model named `name` (`general.name`).
    pub fn new(vocab: &Vocab, name: &str) -> Self {
        let mut order: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| {
                matches!(
                    vocab.token_kind(id),
                    TokenKind::Control | TokenKind::Unknown | TokenKind::UserDefined
                )
            })
            .collect();
        order.sort_by_key(|&id| (std::cmp::Reverse(vocab.texts[id as usize].len()), id));
        let name = name.to_lowercase();
        let mut rstrip: Vec<u32> = if name.contains("phi-3") || name.contains("phi3") {
            order
                .iter()
                .copied()
                .filter(|&id| !PHI3_KEEPS_SPACE.contains(&vocab.texts[id as usize].as_str()))
                .collect()
        } else {
            Vec::new()
        };
        rstrip.sort_unstable();
        Self { order, rstrip }
    }

    /// Splits `text` into fragments.
    pub fn split<'a>(
        &self,
        vocab: &Vocab,
        text: &'a str,
        parse_special: bool,
    ) -> Vec<Fragment<'a>> {
        let mut frags = if text.is_empty() {
            Vec::new()
        } else {
            vec![Fragment::Text(text)]
        };
        for &id in &self.order {
            let kind = vocab.token_kind(id);
            if !parse_special && matches!(kind, TokenKind::Control | TokenKind::Unknown) {
                continue;
            }
            let needle = vocab.texts[id as usize].as_str();
            if needle.is_empty() {
                continue; // cannot happen (empty tokens are renamed), but `find("")` would loop
            }
            let found = frags
                .iter()
                .any(|f| matches!(f, Fragment::Text(s) if s.contains(needle)));
            if !found {
                continue;
            }
            let rstrip = self.rstrip.binary_search(&id).is_ok();
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                match frag {
                    Fragment::Text(s) => split_one(s, needle, id, rstrip, &mut next),
                    token => next.push(token),
                }
            }
            frags = next;
        }
        frags
    }
}

/// Cuts every `needle` (token `id`) out of `s`; with `rstrip` the ASCII whitespace after each
/// goes with it (C's `isspace`, as llama.cpp tests each byte).
fn split_one<'a>(mut s: &'a str, needle: &str, id: u32, rstrip: bool, out: &mut Vec<Fragment<'a>>) {
    while let Some(pos) = s.find(needle) {
        if pos > 0 {
            out.push(Fragment::Text(&s[..pos]));
        }
        out.push(Fragment::Token(id));
        s = &s[pos + needle.len()..];
        if rstrip {
            s = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
        }
    }
    if !s.is_empty() {
        out.push(Fragment::Text(s));
    }
}
