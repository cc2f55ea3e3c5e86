//! Incremental detokenization for streaming output.
//!
//! One token may end in the middle of a UTF-8 character (an emoji is often 2–4 byte tokens), so
//! bytes are held back until the character they start is complete.

use super::Tokenizer;

/// Turns generated tokens into text as it becomes valid UTF-8.
///
/// The text equals [`Tokenizer::decode`] of all pushed ids except that nothing is stripped:
/// the stream usually continues a prompt, so a leading space is meaningful. A stream made by
/// [`TextStream::for_display`] also leaves out control and unknown tokens, except those it is
/// told to keep ([`TextStream::keeping`]).
#[derive(Debug)]
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
    hide_special: bool,
    kept: &'a [u32],
}

impl<'a> TextStream<'a> {
    /// A stream with nothing pending.
    pub fn new(t: &'a Tokenizer) -> Self {
        Self {
            tokenizer: t,
            pending: Vec::new(),
            hide_special: false,
            kept: &[],
        }
    }

    /// A stream for showing generated text to a person: control and unknown tokens (`<s>`,
    /// `<unk>`, `<|begin_of_text|>` …) print nothing, as llama.cpp's `token_to_piece` with
    /// `special = false` leaves out control tokens.
    pub fn for_display(t: &'a Tokenizer) -> Self {
        Self {
            hide_special: true,
            ..Self::new(t)
        }
    }

    /// The stream, writing the control tokens `ids` even for display (a tool-call format's
    /// markers, such as Mistral's `[TOOL_CALLS]`, which a reader of the answer must see).
    pub fn keeping(self, ids: &'a [u32]) -> Self {
        Self { kept: ids, ..self }
    }

    /// Adds token `id`; returns the text completed by it (possibly empty). Bytes that can never
    /// become valid UTF-8 come out as U+FFFD.
    pub fn push(&mut self, id: u32) -> String {
        let piece = self
            .tokenizer
            .token_piece(id, !self.hide_special || self.kept.contains(&id));
        if piece.is_empty() {
            return String::new();
        }
        self.pending.extend(piece);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..good]));
                    match e.error_len() {
                        // An incomplete character at the end: wait for the next token.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Ends the stream: whatever is still pending, with U+FFFD for an unfinished character.
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}
