//! Fill-in-the-middle tokens (code models' prefix, suffix and middle markers, and the
//! repository and file separators of the repo-level pattern), as llama.cpp finds them: the
//! `tokenizer.ggml.fim_*_token_id` keys (the older `prefix_token_id`, `suffix_token_id` and
//! `middle_token_id` win where present), else a token whose text is one that code models use.

use super::vocab::Vocab;

/// A vocabulary's fill-in-the-middle tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FimTokens {
    /// Before the text ahead of the cursor (`<|fim_prefix|>`).
    pub pre: Option<u32>,
    /// Before the text after the cursor (`<|fim_suffix|>`).
    pub suf: Option<u32>,
    /// Where the middle is written (`<|fim_middle|>`).
    pub mid: Option<u32>,
    /// Padding (`<|fim_pad|>`).
    pub pad: Option<u32>,
    /// Before a repository's name (`<|repo_name|>`).
    pub rep: Option<u32>,
    /// Before each file of a repository (`<|file_sep|>`).
    pub sep: Option<u32>,
}

/// Texts of each kind of token, in llama.cpp's order (Qwen, Granite, DeepSeek, CodeLlama,
/// GLM-4.5, Falcon-H1 and others).
const PRE: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const SUF: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const MID: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const PAD: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const REP: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const SEP: &[&str] = &["<|file_sep|>"];

impl FimTokens {
    /// The tokens the metadata names (`given`), the rest found in `vocab` by their text.
    pub(crate) fn find(given: FimTokens, vocab: &Vocab) -> Self {
        // llama.cpp goes through the vocabulary in its hash map's order and takes the first
        // match; a vocabulary holds at most one of each kind in practice, so the first text
        // of the list that it holds is taken.
        let by_text = |texts: &[&str]| texts.iter().find_map(|t| vocab.id(t));
        Self {
            pre: given.pre.or_else(|| by_text(PRE)),
            suf: given.suf.or_else(|| by_text(SUF)),
            mid: given.mid.or_else(|| by_text(MID)),
            pad: given.pad.or_else(|| by_text(PAD)),
            rep: given.rep.or_else(|| by_text(REP)),
            sep: given.sep.or_else(|| by_text(SEP)),
        }
    }

    /// Whether the prefix, suffix and middle tokens are all there (what infill needs), or
    /// the names of those missing.
    pub fn infill(&self) -> Result<(u32, u32, u32), String> {
        match (self.pre, self.suf, self.mid) {
            (Some(p), Some(s), Some(m)) => Ok((p, s, m)),
            _ => {
                let missing: Vec<&str> = [
                    ("prefix", self.pre),
                    ("suffix", self.suf),
                    ("middle", self.mid),
                ]
                .iter()
                .filter(|(_, t)| t.is_none())
                .map(|(n, _)| *n)
                .collect();
                let names = match missing.split_last() {
                    Some((last, [])) => format!("{last} token"),
                    Some((last, rest)) => format!("{} and {last} tokens", rest.join(", ")),
                    None => unreachable!("one is missing"),
                };
                Err(format!("the model has no fill-in-the-middle {names}"))
            }
        }
    }
}
