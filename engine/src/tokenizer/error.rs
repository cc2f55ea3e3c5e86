//! Errors raised while building a tokenizer from GGUF metadata or while encoding text.

use thiserror::Error;

/// Why a tokenizer could not be built or could not encode a text.
///
/// Metadata errors name the GGUF key at fault, so a broken file can be fixed with a KV editor.
#[derive(Debug, Error)]
pub enum TokenizerError {
    /// A key the tokenizer needs is absent.
    #[error("GGUF metadata key {key:?} is missing ({why})")]
    MissingKey {
        /// The missing key.
        key: &'static str,
        /// What it is needed for.
        why: &'static str,
    },
    /// A key holds a value of the wrong type.
    #[error("GGUF metadata key {key:?} has type {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: &'static str,
        /// The type the tokenizer accepts.
        expected: &'static str,
        /// The type found in the file.
        found: String,
    },
    /// A per-token array is shorter than `tokenizer.ggml.tokens`.
    #[error(
        "GGUF metadata key {key:?} has {len} entries but tokenizer.ggml.tokens has {n_tokens}"
    )]
    TooShort {
        /// The key of the short array.
        key: &'static str,
        /// Its length.
        len: usize,
        /// The number of tokens.
        n_tokens: usize,
    },
    /// `tokenizer.ggml.tokens` is empty or too long for 32-bit ids.
    #[error("GGUF metadata key \"tokenizer.ggml.tokens\" has {0} entries; expected 1 to 2^31-1")]
    BadVocabSize(usize),
    /// Two entries of `tokenizer.ggml.tokens` hold the same text.
    #[error("GGUF metadata key \"tokenizer.ggml.tokens\" holds {text:?} twice (ids {first} and {second})")]
    DuplicateToken {
        /// The repeated text.
        text: String,
        /// Its first id.
        first: u32,
        /// Its second id.
        second: u32,
    },
    /// `tokenizer.ggml.model` names a tokenizer hesper-rs does not implement.
    #[error(
        "GGUF metadata key \"tokenizer.ggml.model\" is {0:?}; hesper-rs supports \"gpt2\" (byte-level BPE), \
         \"llama\" (SentencePiece) and \"none\""
    )]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer hesper-rs does not implement.
    #[error(
        "GGUF metadata key \"tokenizer.ggml.pre\" is {0:?}, an unsupported pre-tokenizer; supported: \
         \"llama3\", \"llama-v3\", \"llama-bpe\", \"default\" (override with --tokenizer-pre)"
    )]
    UnsupportedPre(String),
    /// A forced pre-tokenizer does not fit the tokenizer model.
    #[error("pre-tokenizer {pre} cannot be used with tokenizer.ggml.model = {model:?}")]
    PreMismatch {
        /// The forced split, as text.
        pre: String,
        /// The model name from the file.
        model: String,
    },
    /// The `tokenizers` crate refused the vocabulary or a split pattern.
    #[error("cannot build the BPE tokenizer from tokenizer.ggml.tokens/merges: {0}")]
    Build(String),
    /// The `tokenizers` crate failed while encoding.
    #[error("tokenization failed: {0}")]
    Encode(String),
    /// A SentencePiece vocabulary lacks a byte token (`<0xNN>`) and an unknown token for a
    /// character outside the vocabulary.
    #[error(
        "tokenizer.ggml.tokens has no byte token <0x{0:02X}> and no unknown token \
         (tokenizer.ggml.unknown_token_id) for a character outside the vocabulary"
    )]
    NoByteToken(u8),
}
