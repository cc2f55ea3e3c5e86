//! The tokens of a perplexity text: all of them, or with a chunk limit only a prefix's — so
//! `--chunks 2` over a 20 MB file tokenizes a few kilobytes, not the file (which took 43 s and
//! 1.4 GB).
//!
//! Tokenization is local: cutting the text changes only the tokens near the cut (a pre-token
//! or a merge spans a few bytes), so a prefix cut at a line end gives the whole text's tokens
//! except the last few. A prefix is used only when it gives [`MARGIN`] tokens more than the
//! chunks need; it doubles until it does, or is the whole text.

use hesper_engine::tokenizer::{Tokenizer, TokenizerError};

/// Tokens a prefix must give beyond the ones used, so the cut cannot reach them.
pub const MARGIN: usize = 256;

/// Tokens of `text` (with BOS when the tokenizer adds one) enough for `needed` tokens (`None`:
/// the whole text), and the bytes of `text` they came from.
pub fn tokenize_for(
    tok: &Tokenizer,
    text: &str,
    needed: Option<usize>,
) -> Result<(Vec<u32>, usize), TokenizerError> {
    let whole = |text: &str| Ok((tok.encode(text, tok.add_bos(), false)?, text.len()));
    let Some(needed) = needed else {
        return whole(text);
    };
    // Some four bytes a token in English; start with twice that.
    let mut len = needed.saturating_add(MARGIN).saturating_mul(8);
    while len < text.len() {
        let mut end = len;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let cut = text[..end].rfind('\n').map_or(end, |i| i + 1);
        let tokens = tok.encode(&text[..cut], tok.add_bos(), false)?;
        if tokens.len() >= needed.saturating_add(MARGIN) {
            return Ok((tokens, cut));
        }
        len = len.saturating_mul(2);
    }
    whole(text)
}
