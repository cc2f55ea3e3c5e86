//! The token table: texts, kinds, scores and the text → id index, plus per-token bytes.

use super::byte_level;
use super::fast_hash::FastHashMap;
use super::meta::{Meta, ModelKind};
use super::TokenizerError;

/// Token kind, from `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenKind {
    /// 1: ordinary text.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: control token such as `<|eot_id|>`; matched in text only with `parse_special`.
    Control,
    /// 4: user-defined token; always matched in text.
    UserDefined,
    /// 5: unused slot.
    Unused,
    /// 6: one raw byte, written `<0xNN>`.
    Byte,
    /// 0 or anything else.
    Undefined,
}

impl TokenKind {
    fn from_type(t: i32) -> Self {
        match t {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }
}

/// Token texts llama.cpp treats as end of generation, whatever their ids (a subset of the list in
/// `llama_vocab::impl::load`, the entries that need no model-specific workaround).
pub(crate) const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
];

/// gpt-oss's Harmony tokens that llama.cpp marks user-defined so that they are always
/// rendered (the server reads the channels from the generated text).
const HARMONY_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// The vocabulary of one tokenizer.
#[derive(Debug, Clone)]
pub(crate) struct Vocab {
    pub kind: ModelKind,
    pub texts: Vec<String>,
    pub kinds: Vec<TokenKind>,
    pub scores: Vec<f32>,
    pub index: FastHashMap<String, u32>,
}

impl Vocab {
    /// Builds the table. Empty texts are renamed `[EMPTY_<id>]` as llama.cpp does; duplicate
    /// texts are an error (llama.cpp aborts on them). Tokens whose text marks end of generation
    /// are promoted to control tokens, as llama.cpp does.
    pub fn new(meta: &mut Meta<'_>) -> Result<Self, TokenizerError> {
        let n = meta.tokens.len();
        let mut texts = std::mem::take(&mut meta.tokens);
        let mut index = FastHashMap::with_capacity_and_hasher(n, Default::default());
        for (id, text) in texts.iter_mut().enumerate() {
            if text.is_empty() {
                meta.warnings
                    .push(format!("token {id} is empty; renamed [EMPTY_{id}]"));
                *text = format!("[EMPTY_{id}]");
            }
            if let Some(first) = index.insert(text.clone(), id as u32) {
                return Err(TokenizerError::DuplicateToken {
                    text: text.clone(),
                    first,
                    second: id as u32,
                });
            }
        }
        let mut kinds: Vec<TokenKind> = meta
            .types
            .iter()
            .map(|&t| TokenKind::from_type(t))
            .collect();
        for text in EOG_TEXTS {
            if let Some(&id) = index.get(*text) {
                kinds[id as usize] = TokenKind::Control;
            }
        }
        for text in HARMONY_RENDERED {
            if let Some(&id) = index.get(*text) {
                kinds[id as usize] = TokenKind::UserDefined;
            }
        }
        let mut vocab = Self {
            kind: meta.kind,
            texts,
            kinds,
            scores: std::mem::take(&mut meta.scores),
            index,
        };
        if let Some(end) = vocab.harmony_end() {
            vocab.kinds[end as usize] = TokenKind::UserDefined;
        }
        Ok(vocab)
    }

    /// Harmony's `<|end|>` (gpt-oss's), where the vocabulary also has `<|return|>` and
    /// `<|call|>`: it ends a message, not the generation (those two do), and is rendered, as
    /// llama.cpp makes it.
    pub fn harmony_end(&self) -> Option<u32> {
        let has = |text| self.index.contains_key(text);
        (has("<|return|>") && has("<|call|>"))
            .then(|| self.index.get("<|end|>").copied())
            .flatten()
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// Id of an exact token text.
    pub fn id(&self, text: &str) -> Option<u32> {
        self.index.get(text).copied()
    }

    /// Kind of a token (`Undefined` for an id outside the vocabulary).
    pub fn token_kind(&self, id: u32) -> TokenKind {
        self.kinds
            .get(id as usize)
            .copied()
            .unwrap_or(TokenKind::Undefined)
    }

    /// Appends the raw bytes of token `id`, as llama.cpp's `token_to_piece(.., special = true)`:
    /// control, unknown and user-defined tokens give their text, byte tokens their byte, normal
    /// tokens their byte-level (gpt2) or `▁`-for-space (llama) decoding; unused and undefined
    /// tokens, and ids outside the vocabulary, give nothing.
    pub fn push_bytes(&self, id: u32, out: &mut Vec<u8>) {
        let Some(text) = self.texts.get(id as usize) else {
            return;
        };
        match self.token_kind(id) {
            TokenKind::Control | TokenKind::Unknown | TokenKind::UserDefined => {
                out.extend_from_slice(text.as_bytes())
            }
            TokenKind::Byte => match parse_byte_token(text) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(text.as_bytes()),
            },
            TokenKind::Normal => match self.kind {
                ModelKind::Gpt2 => byte_level::decode_token(text, out),
                ModelKind::Llama => out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes()),
            },
            TokenKind::Unused | TokenKind::Undefined => {}
        }
    }
}

/// The byte of a `<0xNN>` token text.
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xff>"), Some(255));
        assert_eq!(parse_byte_token("<0x1>"), None);
        assert_eq!(parse_byte_token("<0x+1>"), None);
        assert_eq!(parse_byte_token("0x0A"), None);
    }
}
