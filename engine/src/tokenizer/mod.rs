//! Text to token ids and back, built from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! Two tokenizer families, with llama.cpp's semantics (checked id for id against llama.cpp's
//! own test vocabularies in `golden-values/tokenizer/`):
//!
//! * `gpt2`: byte-level BPE (Llama 3, BitNet b1.58 2B4T) on the `tokenizers` crate, with the
//!   Llama-3 split or llama.cpp's `default` split (see [`PreTokenizer`]);
//! * `llama`: SentencePiece by score, our own port of llama.cpp's `llm_tokenizer_spm`.
//!
//! Special tokens are cut out of the text first, as llama.cpp does: control tokens only with
//! `parse_special`, user-defined ones always.
//!
//! The official BitNet b1.58 2B4T GGUF has no `tokenizer.ggml.pre`. llama.cpp then uses its
//! `default` split, which differs from the model's own tokenizer on common text (`" ("`, `"I've"`,
//! `"\r\n"`, …); we pick the Llama-3 split for a Llama-3 vocabulary instead, and say so in
//! [`Tokenizer::describe`].

mod bpe;
mod byte_level;
mod error;
mod fast_hash;
mod fim;
mod meta;
mod pre;
mod special;
mod spm;
mod stream;
mod vocab;

use crate::gguf::Gguf;

pub use error::TokenizerError;
pub use fim::FimTokens;
pub use pre::PreTokenizer;
pub use stream::TextStream;

use bpe::Bpe;
use meta::ModelKind;
use special::{Fragment, SpecialTokens};
use vocab::{TokenKind, Vocab};

/// The model-specific part of a tokenizer.
#[derive(Debug, Clone)]
enum Engine {
    /// Byte-level BPE.
    Bpe(Box<Bpe>),
    /// SentencePiece by score.
    Spm {
        /// Prepend `▁` to text at the start and after each special token.
        add_space_prefix: bool,
        /// Fallback for a byte without a `<0xNN>` token.
        unk: Option<u32>,
    },
}

/// A tokenizer built from GGUF metadata.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    vocab: Vocab,
    engine: Engine,
    pre: PreTokenizer,
    specials: SpecialTokens,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    fim: FimTokens,
    /// End-of-generation flag per id.
    eog: Vec<bool>,
    model_name: String,
    pre_note: String,
    warnings: Vec<String>,
}

impl Tokenizer {
    /// Builds the tokenizer of `g`. `Ok(None)` when `tokenizer.ggml.model` is absent or
    /// `"none"` (tiny test models feed ids directly).
    pub fn from_gguf(g: &Gguf) -> Result<Option<Tokenizer>, TokenizerError> {
        Self::from_gguf_with(g, None)
    }

    /// Same as [`from_gguf`](Self::from_gguf), but with `pre` forcing the split (for
    /// `--tokenizer-pre` overrides and tests). Forcing a BPE split on a SentencePiece vocabulary
    /// or the reverse is an error.
    pub fn from_gguf_with(
        g: &Gguf,
        pre: Option<PreTokenizer>,
    ) -> Result<Option<Tokenizer>, TokenizerError> {
        let Some(mut meta) = meta::read(g)? else {
            return Ok(None);
        };
        let (pre, pre_note) = pre::choose(&meta, pre)?;
        let vocab = Vocab::new(&mut meta)?;
        let n = vocab.len();
        let keys = meta.special.clone();
        let (engine, bos, eos, add_bos) = match meta.kind {
            ModelKind::Gpt2 => {
                let bpe = Bpe::new(&vocab, meta.merges, pre, &mut meta.warnings)?;
                // llama.cpp: add_bos is on for the Llama-3 split, off for its default split.
                let add_bos = keys.add_bos.unwrap_or(pre == PreTokenizer::Llama3);
                (Engine::Bpe(Box::new(bpe)), keys.bos, keys.eos, add_bos)
            }
            ModelKind::Llama => {
                // llama.cpp's SentencePiece defaults: UNK 0, BOS 1, EOS 2 (when in range).
                let default = |id: u32| (id < n as u32).then_some(id);
                let engine = Engine::Spm {
                    add_space_prefix: keys.add_space_prefix.unwrap_or(true),
                    unk: keys.unk.or(default(0)),
                };
                (
                    engine,
                    keys.bos.or(default(1)),
                    keys.eos.or(default(2)),
                    keys.add_bos.unwrap_or(true),
                )
            }
        };
        let mut eog = vec![false; n];
        for id in [eos, keys.eot, keys.eom].into_iter().flatten() {
            eog[id as usize] = true;
        }
        for text in vocab::EOG_TEXTS {
            if let Some(id) = vocab.id(text) {
                eog[id as usize] = true;
            }
        }
        if let Some(end) = vocab.harmony_end() {
            eog[end as usize] = false;
        }
        let specials = SpecialTokens::new(&vocab, g.get_str("general.name").unwrap_or_default());
        let fim = FimTokens::find(keys.fim, &vocab);
        Ok(Some(Tokenizer {
            vocab,
            engine,
            pre,
            specials,
            bos,
            eos,
            add_bos,
            fim,
            eog,
            model_name: meta.model_name,
            pre_note,
            warnings: meta.warnings,
        }))
    }

    /// Token ids of `text`, with BOS first when `add_bos` is set (and the vocabulary has one).
    /// With `parse_special`, the text of control tokens (`<|eot_id|>`, `<s>`) becomes those
    /// tokens; without it, such text is tokenized as plain text. User-defined tokens are always
    /// matched. No EOS is appended.
    pub fn encode(
        &self,
        text: &str,
        add_bos: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, add_bos, parse_special, true)
    }

    /// Token ids of `text` where it goes on from earlier text (what a grammar forces into an
    /// answer): no BOS, no SentencePiece space prefix, control-token text as plain text.
    pub fn encode_continuation(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, false, false, false)
    }

    fn encode_with(
        &self,
        text: &str,
        add_bos: bool,
        parse_special: bool,
        space_prefix: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            out.extend(self.bos);
        }
        let frags = self.specials.split(&self.vocab, text, parse_special);
        match &self.engine {
            Engine::Bpe(bpe) => {
                for frag in frags {
                    match frag {
                        Fragment::Text(s) => bpe.encode(s, &mut out)?,
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            &Engine::Spm {
                add_space_prefix,
                unk,
            } => spm::encode_fragments(
                &self.vocab,
                &frags,
                add_space_prefix && space_prefix,
                unk,
                &mut out,
            )?,
        }
        Ok(out)
    }

    /// Text of `ids` (invalid UTF-8 replaced by U+FFFD). Special tokens appear as their text.
    /// For SentencePiece with a space prefix, the leading space of the first token is dropped,
    /// as llama.cpp's detokenizer does, so that `decode(encode(s)) == s`.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            self.push_token_bytes(id, &mut bytes);
        }
        let strip = matches!(
            self.engine,
            Engine::Spm {
                add_space_prefix: true,
                ..
            }
        ) && ids
            .first()
            .is_some_and(|&id| self.token_bytes(id).first() == Some(&b' '));
        let start = usize::from(strip);
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }

    /// Raw bytes of one token: byte-level BPE text unmapped, SentencePiece `▁` as a space,
    /// `<0xNN>` as its byte, special tokens as their text; empty for unused ids.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let mut out = Vec::new();
        self.push_token_bytes(id, &mut out);
        out
    }

    /// llama.cpp's `token_to_piece` (with `lstrip` 0): the token's bytes, except that with
    /// `special` false control and unknown tokens give nothing.
    pub fn token_piece(&self, id: u32, special: bool) -> Vec<u8> {
        if !special && self.is_special(id) {
            return Vec::new();
        }
        self.token_bytes(id)
    }

    fn push_token_bytes(&self, id: u32, out: &mut Vec<u8>) {
        self.vocab.push_bytes(id, out);
    }

    /// The BOS token, if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The EOS token, if the vocabulary has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether prompts start with BOS: `tokenizer.ggml.add_bos_token`, else llama.cpp's default
    /// (true for SentencePiece and for the Llama-3 split, false for the `default` split).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The fill-in-the-middle tokens (code models'), where the vocabulary has them.
    pub fn fim(&self) -> FimTokens {
        self.fim
    }

    /// True for tokens that end generation: EOS, EOT, EOM (from metadata) and tokens whose text
    /// llama.cpp treats as such (`<|eot_id|>`, `<|end_of_text|>`, `<|eom_id|>`, `<|im_end|>`, …;
    /// gpt-oss's `<|return|>` and `<|call|>`, but not its `<|end|>`, which ends a message).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.eog.get(id as usize).copied().unwrap_or(false)
    }

    /// True for control and unknown tokens (the ones a chat display usually hides).
    pub fn is_special(&self, id: u32) -> bool {
        matches!(
            self.vocab.token_kind(id),
            TokenKind::Control | TokenKind::Unknown
        )
    }

    /// Id of the token whose stored text is exactly `text` (e.g. `"<|eot_id|>"`, or `"Ġthe"` in
    /// a byte-level vocabulary).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// The split in use.
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    /// Oddities found in the metadata that were tolerated (as llama.cpp tolerates them).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// One line for `hesper-rs info`, e.g. `gpt2 BPE, 128256 tokens, Llama-3 split
    /// (tokenizer.ggml.pre missing: chose llama3, …), BOS 128000 added`.
    pub fn describe(&self) -> String {
        let family = match self.engine {
            Engine::Bpe(_) => format!("{} BPE", self.model_name),
            Engine::Spm {
                add_space_prefix, ..
            } => {
                format!(
                    "{} SentencePiece (space prefix {})",
                    self.model_name,
                    if add_space_prefix { "on" } else { "off" }
                )
            }
        };
        let mut s = format!("{family}, {} tokens", self.vocab.len());
        if self.pre != PreTokenizer::Spm {
            s.push_str(&format!(", {}", self.pre));
            if !self.pre_note.is_empty() {
                s.push_str(&format!(" ({})", self.pre_note));
            }
        }
        match (self.bos, self.add_bos) {
            (Some(b), true) => s.push_str(&format!(", BOS {b} added")),
            (Some(b), false) => s.push_str(&format!(", BOS {b} not added")),
            (None, _) => s.push_str(", no BOS"),
        }
        if !self.warnings.is_empty() {
            s.push_str(&format!(", {} metadata warning(s)", self.warnings.len()));
        }
        s
    }
}

#[cfg(test)]
mod tests;
