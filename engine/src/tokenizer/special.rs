//! Cuts special tokens out of the input text before the model-specific tokenizer runs,
//! as llama.cpp's `tokenizer_st_partition` does.
//!
//! Candidates are the control, unknown and user-defined tokens, longest text first. Each one is
//! searched, left to right, in every text fragment left by the previous ones. Without
//! `parse_special`, control and unknown tokens are not searched (their text is tokenized as
//! plain text) but user-defined tokens still are.

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
}

impl SpecialTokens {
    /// Collects the candidates of `vocab`.
    pub fn new(vocab: &Vocab) -> Self {
        let mut order: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| {
                matches!(
                    vocab.token_kind(id),
                    TokenKind::Control | TokenKind::Unknown | TokenKind::UserDefined
                )
            })
            .collect();
        order.sort_by_key(|&id| (std::cmp::Reverse(vocab.texts[id as usize].len()), id));
        Self { order }
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
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                match frag {
                    Fragment::Text(s) => split_one(s, needle, id, &mut next),
                    token => next.push(token),
                }
            }
            frags = next;
        }
        frags
    }
}

fn split_one<'a>(mut s: &'a str, needle: &str, id: u32, out: &mut Vec<Fragment<'a>>) {
    while let Some(pos) = s.find(needle) {
        if pos > 0 {
            out.push(Fragment::Text(&s[..pos]));
        }
        out.push(Fragment::Token(id));
        s = &s[pos + needle.len()..];
    }
    if !s.is_empty() {
        out.push(Fragment::Text(s));
    }
}
