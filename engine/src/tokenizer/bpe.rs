//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`) on the `tokenizers` crate.
//!
//! Pipeline per text fragment: the split regexes of the chosen [`PreTokenizer`] (each one applied
//! to every piece left by the previous one, matches and gaps both kept), then GPT-2's byte-level
//! mapping, then the BPE merges by rank. Special tokens never reach this code: they are cut out
//! beforehand (see `special.rs`), so the `tokenizers` pipeline has no added tokens.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use tokenizers::models::bpe::{Vocab as HfVocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use super::fast_hash::FastHasher;
use super::vocab::Vocab;
use super::{PreTokenizer, TokenizerError};

/// A ready byte-level BPE pipeline.
#[derive(Debug, Clone)]
pub(crate) struct Bpe {
    inner: tokenizers::Tokenizer,
}

impl Bpe {
    /// Builds the pipeline from the vocabulary and the `"left right"` merge strings (rank =
    /// index). Merges are read as llama.cpp reads them: split at the first space after the first
    /// byte, the first occurrence of a pair wins. Merges that cannot apply (no space, or a part
    /// or the result missing from the vocabulary) are skipped and reported in `warnings`.
    pub fn new(
        vocab: &Vocab,
        merges: &[String],
        pre: PreTokenizer,
        warnings: &mut Vec<String>,
    ) -> Result<Self, TokenizerError> {
        // Fast path for well-formed files: hand the merges over unchecked (the `tokenizers`
        // builder checks them against the vocabulary itself). Only when that fails, or when
        // repeats must be dropped, do the checks here.
        let model = match fast_pairs(merges).map(|pairs| build_model(vocab, pairs, pre)) {
            Some(Ok(model)) => model,
            _ => {
                let pairs = checked_pairs(vocab, merges, warnings);
                build_model(vocab, pairs, pre)?
            }
        };
        let mut steps = Vec::new();
        for re in pre.regexes() {
            let split = Split::new(
                SplitPattern::Regex((*re).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TokenizerError::Build(format!("split regex {re:?}: {e}")))?;
            steps.push(PreTokenizerWrapper::Split(split));
        }
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, true, false,
        )));
        let mut inner = tokenizers::Tokenizer::new(model);
        inner.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(steps))));
        Ok(Self { inner })
    }

    /// Tokenizes one plain-text fragment and appends the ids.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }
}

fn build_model(
    vocab: &Vocab,
    pairs: Vec<(String, String)>,
    pre: PreTokenizer,
) -> Result<BPE, TokenizerError> {
    let hf_vocab: HfVocab = vocab.index.iter().map(|(k, &v)| (k.clone(), v)).collect();
    BPE::builder()
        .vocab_and_merges(hf_vocab, pairs)
        .ignore_merges(pre.ignore_merges())
        .build()
        .map_err(|e| TokenizerError::Build(e.to_string()))
}

/// All merges as pairs, or `None` when one has no space or a merge string may be repeated.
fn fast_pairs(merges: &[String]) -> Option<Vec<(String, String)>> {
    let mut hashes: Vec<u64> = merges
        .iter()
        .map(|m| {
            let mut h = FastHasher::default();
            m.hash(&mut h);
            h.finish()
        })
        .collect();
    hashes.sort_unstable();
    if hashes.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    merges
        .iter()
        .map(|m| split_merge(m).map(|(a, b)| (a.to_string(), b.to_string())))
        .collect()
}

/// The merges that can apply, first occurrence of each pair only; counts the rest in `warnings`.
fn checked_pairs(
    vocab: &Vocab,
    merges: &[String],
    warnings: &mut Vec<String>,
) -> Vec<(String, String)> {
    let mut seen: HashSet<(u32, u32), BuildHasherDefault<FastHasher>> =
        HashSet::with_capacity_and_hasher(merges.len(), Default::default());
    let mut pairs = Vec::with_capacity(merges.len());
    let (mut unusable, mut repeated) = (0usize, 0usize);
    let mut joined = String::new();
    for m in merges {
        let Some((a, b)) = split_merge(m) else {
            unusable += 1;
            continue;
        };
        joined.clear();
        joined.push_str(a);
        joined.push_str(b);
        let (Some(ia), Some(ib), Some(_)) = (vocab.id(a), vocab.id(b), vocab.id(&joined)) else {
            unusable += 1;
            continue;
        };
        if !seen.insert((ia, ib)) {
            repeated += 1;
            continue;
        }
        pairs.push((a.to_string(), b.to_string()));
    }
    if unusable > 0 {
        warnings.push(format!(
            "{unusable} merges of tokenizer.ggml.merges cannot apply and were skipped"
        ));
    }
    if repeated > 0 {
        warnings.push(format!(
            "{repeated} merges of tokenizer.ggml.merges are repeats; the first rank was kept"
        ));
    }
    pairs
}

/// Splits `"left right"` at the first space after the first byte, as llama.cpp does.
fn split_merge(m: &str) -> Option<(&str, &str)> {
    let first = m.chars().next()?;
    let pos = m[first.len_utf8()..].find(' ')? + first.len_utf8();
    Some((&m[..pos], &m[pos + 1..]))
}

#[cfg(test)]
mod tests {
    use super::split_merge;

    #[test]
    fn merge_strings() {
        assert_eq!(split_merge("Ġ t"), Some(("Ġ", "t")));
        assert_eq!(split_merge("a b c"), Some(("a", "b c")));
        assert_eq!(split_merge("  x"), Some((" ", "x")));
        assert_eq!(split_merge("ab"), None);
        assert_eq!(split_merge(""), None);
    }
}
