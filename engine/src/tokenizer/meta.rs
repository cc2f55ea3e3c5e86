//! Reads and type-checks the `tokenizer.ggml.*` metadata keys.
//!
//! The checks follow llama.cpp's `llama_vocab::impl::load` (`src/llama-vocab.cpp`): the same keys,
//! the same accepted types, and the same tolerance for out-of-range special-token ids (ignored
//! with a warning instead of failing).

use crate::gguf::{Array, Gguf, Value};

use super::fim::FimTokens;
use super::TokenizerError;

/// `tokenizer.ggml.model`.
pub(crate) const KEY_MODEL: &str = "tokenizer.ggml.model";
/// `tokenizer.ggml.pre`.
pub(crate) const KEY_PRE: &str = "tokenizer.ggml.pre";
/// `tokenizer.ggml.tokens`.
pub(crate) const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
/// `tokenizer.ggml.token_type`.
pub(crate) const KEY_TYPES: &str = "tokenizer.ggml.token_type";
/// `tokenizer.ggml.scores`.
pub(crate) const KEY_SCORES: &str = "tokenizer.ggml.scores";
/// `tokenizer.ggml.merges`.
pub(crate) const KEY_MERGES: &str = "tokenizer.ggml.merges";

/// The tokenizer family named by `tokenizer.ggml.model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModelKind {
    /// `gpt2`: byte-level BPE with merges.
    Gpt2,
    /// `llama`: SentencePiece with scores.
    Llama,
}

/// Token ids and flags read from the file; `None` when the key is absent (or out of range).
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialKeys {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// The fill-in-the-middle tokens the metadata names.
    pub fim: FimTokens,
}

/// Everything the tokenizer reads from the file, checked.
#[derive(Debug, Clone)]
pub(crate) struct Meta<'g> {
    pub kind: ModelKind,
    pub model_name: String,
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// `token_type` per token (1 = normal when the key is absent).
    pub types: Vec<i32>,
    /// Scores per token (0 when the key is absent).
    pub scores: Vec<f32>,
    /// Merge strings (gpt2 only), borrowed from the file.
    pub merges: &'g [String],
    pub special: SpecialKeys,
    /// Out-of-range ids and similar oddities that llama.cpp also tolerates.
    pub warnings: Vec<String>,
}

/// Reads the tokenizer metadata; `Ok(None)` when the file carries no tokenizer.
pub(crate) fn read(g: &Gguf) -> Result<Option<Meta<'_>>, TokenizerError> {
    let model_name = match g.get(KEY_MODEL) {
        None => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(wrong(KEY_MODEL, "str", other.type_name())),
    };
    let kind = match model_name.as_str() {
        "none" | "no_vocab" => return Ok(None),
        "gpt2" => ModelKind::Gpt2,
        "llama" => ModelKind::Llama,
        _ => return Err(TokenizerError::UnsupportedModel(model_name)),
    };
    let pre = match g.get(KEY_PRE) {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => return Err(wrong(KEY_PRE, "str", other.type_name())),
    };
    let tokens = match g.get(KEY_TOKENS) {
        None => {
            return Err(TokenizerError::MissingKey {
                key: KEY_TOKENS,
                why: "the vocabulary",
            })
        }
        Some(Value::Array(Array::String(v))) => v.clone(),
        Some(other) => return Err(wrong(KEY_TOKENS, "array of str", &value_type(other))),
    };
    let n = tokens.len();
    if n == 0 || n > i32::MAX as usize {
        return Err(TokenizerError::BadVocabSize(n));
    }
    let types = match g.get(KEY_TYPES) {
        None => vec![1; n],
        Some(Value::Array(Array::I32(v))) => truncated(KEY_TYPES, v, n)?,
        Some(other) => return Err(wrong(KEY_TYPES, "array of i32", &value_type(other))),
    };
    let scores = match g.get(KEY_SCORES) {
        None => vec![0.0; n],
        Some(Value::Array(Array::F32(v))) => truncated(KEY_SCORES, v, n)?,
        Some(Value::Array(Array::I32(v))) => truncated(KEY_SCORES, v, n)?
            .into_iter()
            .map(|s| s as f32)
            .collect(),
        Some(other) => return Err(wrong(KEY_SCORES, "array of f32 or i32", &value_type(other))),
    };
    let merges = match (kind, g.get(KEY_MERGES)) {
        (ModelKind::Llama, _) => &[],
        (ModelKind::Gpt2, None) => {
            return Err(TokenizerError::MissingKey {
                key: KEY_MERGES,
                why: "gpt2 BPE needs its merge list",
            })
        }
        (ModelKind::Gpt2, Some(Value::Array(Array::String(v)))) => v.as_slice(),
        (ModelKind::Gpt2, Some(other)) => {
            return Err(wrong(KEY_MERGES, "array of str", &value_type(other)))
        }
    };
    let mut warnings = Vec::new();
    let special = read_special(g, n, &mut warnings)?;
    Ok(Some(Meta {
        kind,
        model_name,
        pre,
        tokens,
        types,
        scores,
        merges,
        special,
        warnings,
    }))
}

fn read_special(
    g: &Gguf,
    n: usize,
    warnings: &mut Vec<String>,
) -> Result<SpecialKeys, TokenizerError> {
    let mut id = |key: &'static str| -> Result<Option<u32>, TokenizerError> {
        let Some(v) = g.get(key) else { return Ok(None) };
        let Some(id) = v.as_u64() else {
            return Err(wrong(key, "unsigned integer", v.type_name()));
        };
        if id >= n as u64 {
            warnings.push(format!(
                "{key} = {id} is outside the vocabulary ({n} tokens); ignored"
            ));
            return Ok(None);
        }
        Ok(Some(id as u32))
    };
    let bos = id("tokenizer.ggml.bos_token_id")?;
    let eos = id("tokenizer.ggml.eos_token_id")?;
    let eot = id("tokenizer.ggml.eot_token_id")?;
    let eom = id("tokenizer.ggml.eom_token_id")?;
    let unk = id("tokenizer.ggml.unknown_token_id")?;
    // The older keys, where present, win (llama.cpp reads them last).
    let mut fim = FimTokens {
        pre: id("tokenizer.ggml.fim_pre_token_id")?,
        suf: id("tokenizer.ggml.fim_suf_token_id")?,
        mid: id("tokenizer.ggml.fim_mid_token_id")?,
        pad: id("tokenizer.ggml.fim_pad_token_id")?,
        rep: id("tokenizer.ggml.fim_rep_token_id")?,
        sep: id("tokenizer.ggml.fim_sep_token_id")?,
    };
    for (key, slot) in [
        ("tokenizer.ggml.prefix_token_id", &mut fim.pre),
        ("tokenizer.ggml.suffix_token_id", &mut fim.suf),
        ("tokenizer.ggml.middle_token_id", &mut fim.mid),
    ] {
        if let Some(t) = id(key)? {
            *slot = Some(t);
        }
    }
    let flag = |key: &'static str| -> Result<Option<bool>, TokenizerError> {
        match g.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(wrong(key, "bool", other.type_name())),
        }
    };
    Ok(SpecialKeys {
        bos,
        eos,
        eot,
        eom,
        unk,
        add_bos: flag("tokenizer.ggml.add_bos_token")?,
        add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?,
        fim,
    })
}

fn truncated<T: Copy>(key: &'static str, v: &[T], n: usize) -> Result<Vec<T>, TokenizerError> {
    match v.get(..n) {
        Some(head) => Ok(head.to_vec()),
        None => Err(TokenizerError::TooShort {
            key,
            len: v.len(),
            n_tokens: n,
        }),
    }
}

fn value_type(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("array of {}", a.type_name()),
        other => other.type_name().to_string(),
    }
}

fn wrong(key: &'static str, expected: &'static str, found: &str) -> TokenizerError {
    TokenizerError::WrongType {
        key,
        expected,
        found: found.to_string(),
    }
}
