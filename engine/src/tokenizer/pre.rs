//! Pre-tokenizers (how text is split into words before BPE) and which one a file gets.

use std::fmt;

use super::meta::{Meta, ModelKind, KEY_PRE};
use super::TokenizerError;

/// How text is cut into words before the merges run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PreTokenizer {
    /// Llama 3's split (one regex, from its `tokenizer.json`), with `ignore_merges`: a word that
    /// is itself a vocabulary entry is emitted whole. llama.cpp uses it for
    /// `tokenizer.ggml.pre` = `llama3`, `llama-v3` or `llama-bpe`.
    Llama3,
    /// llama.cpp's `default` split: four regexes applied one after another, merges always
    /// applied. llama.cpp uses it when `tokenizer.ggml.pre` is `default` or missing.
    LlamaCppDefault,
    /// Qwen2's split: Llama 3's with digits one by one, merges always applied. llama.cpp uses it
    /// for `tokenizer.ggml.pre` = `qwen2` or `deepseek-r1-qwen`.
    Qwen2,
    /// GPT-4o's split (tiktoken's `o200k_base`, gpt-oss's `o200k_harmony`): words keep a
    /// leading capitalized run, contractions and one leading non-letter; digits in threes;
    /// merges always applied. llama.cpp uses it for `tokenizer.ggml.pre` = `gpt-4o` (and
    /// `llama4`, `kanana2`, `talkie`).
    Gpt4o,
    /// llama's SentencePiece: no split; a space prefix and `▁` for spaces.
    Spm,
}

impl PreTokenizer {
    /// The name used on the command line and in `tokenizer.ggml.pre` (`llama3`, `default`, `spm`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama3 => "llama3",
            Self::LlamaCppDefault => "default",
            Self::Qwen2 => "qwen2",
            Self::Gpt4o => "gpt-4o",
            Self::Spm => "spm",
        }
    }

    /// Parses a `--tokenizer-pre` value: a [`name`](Self::name) or a `tokenizer.ggml.pre`
    /// value llama.cpp maps to the same split (`llama-bpe`, `llama-v3`, `falcon3`,
    /// `deepseek-r1-qwen`, `llama4`), or ik_llama.cpp does (`falcon_e`, which bitnet.cpp writes in
    /// Falcon-E's 1.58-bit files and mainline llama.cpp does not know).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon_e" => Some(Self::Llama3),
            "default" => Some(Self::LlamaCppDefault),
            "qwen2" | "deepseek-r1-qwen" => Some(Self::Qwen2),
            "gpt-4o" | "llama4" | "kanana2" | "talkie" => Some(Self::Gpt4o),
            "spm" => Some(Self::Spm),
            _ => None,
        }
    }

    /// The regexes of a BPE split, applied one after another (empty for [`Spm`](Self::Spm)).
    pub(crate) fn regexes(self) -> &'static [&'static str] {
        match self {
            // llama.cpp's spelling of the `tokenizer.json` regex: `(?i:'s|...)` written with
            // explicit case pairs, so Unicode case folding (e.g. `ſ` ~ `s`) cannot sneak in.
            Self::Llama3 => &[concat!(
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
                r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            )],
            // Llama 3's with `\p{N}` in place of `\p{N}{1,3}` (llama.cpp's spelling again).
            Self::Qwen2 => &[concat!(
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
                r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            )],
            // llama.cpp's spelling of `tokenizer.json`'s regex: its classes of upper- and
            // lower-case letters (`\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}`, `\p{Ll}\p{Lm}\p{Lo}\p{M}`)
            // as "a letter but not a–z" and "a letter but not A–Z".
            Self::Gpt4o => &[concat!(
                r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+",
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
                r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*",
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            )],
            Self::LlamaCppDefault => &[
                r"[\p{P}\$\+<=>\^~\|]+",
                r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
                r"\p{N}+",
                r"[0-9][0-9][0-9]",
            ],
            Self::Spm => &[],
        }
    }

    /// Words that are vocabulary entries skip the merges.
    pub(crate) fn ignore_merges(self) -> bool {
        self == Self::Llama3
    }
}

impl fmt::Display for PreTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Llama3 => "Llama-3 split",
            Self::LlamaCppDefault => "llama.cpp 'default' split",
            Self::Qwen2 => "Qwen2 split",
            Self::Gpt4o => "GPT-4o split",
            Self::Spm => "SentencePiece",
        })
    }
}

/// Smallest vocabulary taken for a Llama-3 one when `tokenizer.ggml.pre` is missing.
const LLAMA3_MIN_TOKENS: usize = 128_000;

/// Picks the split for `meta`, honouring `forced`; returns it with a note for `describe`.
pub(crate) fn choose(
    meta: &Meta<'_>,
    forced: Option<PreTokenizer>,
) -> Result<(PreTokenizer, String), TokenizerError> {
    let from_file = match &meta.pre {
        Some(p) => format!("{KEY_PRE} = {p:?}"),
        None => format!("{KEY_PRE} missing"),
    };
    let mismatch = |pre: PreTokenizer| TokenizerError::PreMismatch {
        pre: pre.name().into(),
        model: meta.model_name.clone(),
    };
    if meta.kind == ModelKind::Llama {
        return match forced {
            None | Some(PreTokenizer::Spm) => Ok((PreTokenizer::Spm, String::new())),
            Some(other) => Err(mismatch(other)),
        };
    }
    if let Some(pre) = forced {
        if pre == PreTokenizer::Spm {
            return Err(mismatch(pre));
        }
        return Ok((pre, format!("forced; {from_file}")));
    }
    match meta.pre.as_deref() {
        Some(p) => match PreTokenizer::from_name(p) {
            Some(pre) if pre != PreTokenizer::Spm => Ok((pre, from_file)),
            _ => Err(TokenizerError::UnsupportedPre(p.to_string())),
        },
        None if looks_like_llama3(meta) => Ok((
            PreTokenizer::Llama3,
            format!(
                "{from_file}: chose llama3, the split the model was trained with; \
                 llama.cpp would use its 'default' split"
            ),
        )),
        None => Ok((
            PreTokenizer::LlamaCppDefault,
            format!("{from_file}: llama.cpp's fallback"),
        )),
    }
}

/// A Llama-3 vocabulary: `<|begin_of_text|>` present and at least 128 000 tokens.
fn looks_like_llama3(meta: &Meta<'_>) -> bool {
    meta.tokens.len() >= LLAMA3_MIN_TOKENS && meta.tokens.iter().any(|t| t == "<|begin_of_text|>")
}
