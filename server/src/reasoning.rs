//! Thoughts apart from the answer: a model that thinks in `<think>…</think>` before it answers
//! (DeepSeek-R1's distills, Qwen3, QwQ) gets its thought in `message.reasoning_content` and
//! only the answer in `content` (streamed as `delta.reasoning_content`, then `delta.content`),
//! as llama-server's `--reasoning-format deepseek` does. A template that opens the thought in
//! the prompt (`…<think>\n`) starts the answer inside it. gpt-oss writes Harmony's channels
//! instead (`<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…`):
//! the analysis channel is the thought, the final one (and a commentary preamble) the answer, the
//! messages' headers dropped, as llama-server parses them; a call's header keeps its recipient
//! (`to=functions.NAME…<|message|>`) for the tool reader.

use std::str::FromStr;

use crate::tools::format::HARMONY_CALL;

/// `--reasoning-format` / `reasoning_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningFormat {
    /// `deepseek` where the model's vocabulary has `<think>` and `</think>`, else `none`.
    #[default]
    Auto,
    /// Thoughts go to `reasoning_content`.
    Deepseek,
    /// Thoughts stay in `content`.
    None,
}

impl FromStr for ReasoningFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "deepseek" => Ok(Self::Deepseek),
            "none" => Ok(Self::None),
            other => Err(format!("{other:?}: auto, deepseek or none")),
        }
    }
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// How a model writes its thoughts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// `<think>…</think>` before the answer; `opened`: the prompt ended inside the thought.
    Think {
        /// Whether the prompt opened the thought.
        opened: bool,
    },
    /// gpt-oss's Harmony channels.
    Harmony,
}

impl Syntax {
    /// The syntax of a vocabulary that has the token `has(text)`: Harmony's where it has
    /// `<|channel|>` and `<|message|>`, `<think>`'s where it has both tags (`None`: neither).
    pub fn of_vocabulary(has: impl Fn(&str) -> bool, opened: bool) -> Option<Self> {
        if has("<|channel|>") && has("<|message|>") {
            Some(Self::Harmony)
        } else if has(OPEN) && has(CLOSE) {
            Some(Self::Think { opened })
        } else {
            None
        }
    }
}

/// Splits an answer's text into thought and answer as its [`Syntax`] says.
#[derive(Debug, Clone)]
pub enum Splitter {
    /// `<think>` tags.
    Think(Thoughts),
    /// Harmony's channels.
    Harmony(Channels),
}

impl Splitter {
    /// A splitter for `syntax`.
    pub fn new(syntax: Syntax) -> Self {
        match syntax {
            Syntax::Think { opened } => Self::Think(Thoughts::new(opened)),
            Syntax::Harmony => Self::Harmony(Channels::default()),
        }
    }

    /// Takes the next piece of text; returns the thought and the answer to send now.
    pub fn push(&mut self, piece: &str) -> (String, String) {
        match self {
            Self::Think(t) => t.push(piece),
            Self::Harmony(c) => c.push(piece),
        }
    }

    /// The answer has ended: what is still held, as thought or answer.
    pub fn finish(&mut self) -> (String, String) {
        match self {
            Self::Think(t) => t.finish(),
            Self::Harmony(c) => c.finish(),
        }
    }
}

const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
/// What a Harmony header starts with: the first message's (the prompt ends with
/// `<|start|>assistant`: its channel, or a call's recipient), then the next ones'.
const HEADERS: [&str; 3] = ["<|channel|>", " to=", "<|start|>"];

/// The Lark grammar of a Harmony answer that ends in `last` (a Lark expression that may name
/// the rule `channel`: `<|channel|>analysis` or `commentary`) after any analysis and
/// commentary messages, as llama.cpp's. Harmony's markers are text here: gpt-oss's vocabulary
/// renders them (as llama.cpp marks them), so a message's body is one lexeme ending at `<|end|>`.
pub fn harmony_lark(last: &str) -> String {
    format!(
        "start: (message \"<|start|>assistant\")* last\n\
         message: channel \"<|message|>\" BODY\n\
         channel: \"<|channel|>\" (\"analysis\" | \"commentary\")\n\
         last: {last}\n\
         BODY: /(.|\\n)*/ \"<|end|>\" & ~(/(.|\\n)*/ \"<|end|>\" /(.|\\n)+/)\n"
    )
}

/// The type a Harmony header may give a JSON body (` <|constrain|>json`, ` json` or none), in Lark.
pub const HARMONY_JSON_TYPE: &str = "(\" \" \"<|constrain|>\"? \"json\")?";

/// Where a Harmony answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Channel {
    /// In a message's header (up to `<|message|>`).
    #[default]
    Header,
    /// In a message's body (up to `<|end|>`): the analysis channel's is thought.
    Body {
        /// Whether the body is the analysis channel's.
        thought: bool,
    },
    /// Text that is not Harmony's: all answer.
    Plain,
}

/// Splits a gpt-oss answer into its analysis channel (thought) and its final and commentary
/// channels (answer); text that may be the start of a marker is held until the next piece says.
#[derive(Debug, Clone, Default)]
pub struct Channels {
    part: Channel,
    held: String,
}

impl Channels {
    /// Takes the next piece of text; returns the thought and the answer to send now.
    pub fn push(&mut self, piece: &str) -> (String, String) {
        self.held.push_str(piece);
        let (mut thought, mut answer) = (String::new(), String::new());
        loop {
            match self.part {
                Channel::Header => match self.held.find(MESSAGE) {
                    Some(at) => {
                        let header = &self.held[..at];
                        // A call to a function: its recipient onwards goes on with the answer,
                        // where the tool reader finds it.
                        let call = header.find(HARMONY_CALL);
                        let thought = call.is_none() && header.contains("<|channel|>analysis");
                        if let Some(to) = call {
                            answer.push_str(&self.held[to..at + MESSAGE.len()]);
                        }
                        self.held.drain(..at + MESSAGE.len());
                        self.part = Channel::Body { thought };
                    }
                    None => {
                        let harmony = HEADERS
                            .iter()
                            .any(|h| self.held.starts_with(h) || h.starts_with(self.held.as_str()));
                        if !harmony {
                            self.part = Channel::Plain;
                            continue;
                        }
                        return (thought, answer);
                    }
                },
                Channel::Body {
                    thought: is_thought,
                } => {
                    let to = if is_thought {
                        &mut thought
                    } else {
                        &mut answer
                    };
                    if !take_until(&mut self.held, END, to) {
                        return (thought, answer);
                    }
                    self.part = Channel::Header;
                }
                Channel::Plain => {
                    answer.push_str(&self.held);
                    self.held.clear();
                    return (thought, answer);
                }
            }
        }
    }

    /// The answer has ended: what is still held (a cut-short thought, an unfinished header or
    /// marker) as thought or answer.
    pub fn finish(&mut self) -> (String, String) {
        let held = std::mem::take(&mut self.held);
        match self.part {
            Channel::Body { thought: true } => (held, String::new()),
            _ => (String::new(), held),
        }
    }
}

/// Where an answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Nothing but blanks yet: a thought may still open.
    Start,
    /// Inside the thought.
    Thought,
    /// After the thought (or with none): the answer.
    Answer,
}

/// Splits an answer's text, piece by piece, into thought and answer; text that may be the
/// start of a tag is held until the next piece says.
#[derive(Debug, Clone)]
pub struct Thoughts {
    part: Part,
    held: String,
    /// The answer's blanks right after the thought are dropped.
    after_close: bool,
}

impl Thoughts {
    /// A splitter for an answer whose prompt ended inside an opened thought (`opened`) or not.
    pub fn new(opened: bool) -> Self {
        Self {
            part: if opened { Part::Thought } else { Part::Start },
            held: String::new(),
            after_close: false,
        }
    }

    /// Takes the next piece of text; returns the thought and the answer to send now.
    pub fn push(&mut self, piece: &str) -> (String, String) {
        self.held.push_str(piece);
        let (mut thought, mut answer) = (String::new(), String::new());
        loop {
            match self.part {
                Part::Start => {
                    let rest = self.held.trim_start();
                    if rest.starts_with(OPEN) {
                        let at = self.held.len() - rest.len() + OPEN.len();
                        self.held.drain(..at);
                        self.part = Part::Thought;
                    } else if OPEN.starts_with(rest) {
                        return (thought, answer); // blanks, or a tag's start: wait
                    } else {
                        self.part = Part::Answer;
                    }
                }
                Part::Thought => {
                    if !take_until(&mut self.held, CLOSE, &mut thought) {
                        return (thought, answer);
                    }
                    self.part = Part::Answer;
                    self.after_close = true;
                }
                Part::Answer => {
                    if self.after_close {
                        let rest = self.held.trim_start();
                        if rest.is_empty() {
                            self.held.clear();
                            return (thought, answer);
                        }
                        self.held = rest.to_string();
                        self.after_close = false;
                    }
                    answer.push_str(&self.held);
                    self.held.clear();
                    return (thought, answer);
                }
            }
        }
    }

    /// The answer has ended: what is still held, as thought (an unclosed thought) or answer.
    pub fn finish(&mut self) -> (String, String) {
        let held = std::mem::take(&mut self.held);
        match self.part {
            Part::Thought => (held, String::new()),
            Part::Answer if self.after_close => (String::new(), held.trim_start().to_string()),
            _ => (String::new(), held),
        }
    }
}

/// Moves `held`'s text before `tag` to `out` and drops the tag: `true`. Where `held` has no
/// `tag`, moves all but an end that may start one (kept for the next piece): `false`.
fn take_until(held: &mut String, tag: &str, out: &mut String) -> bool {
    match held.find(tag) {
        Some(at) => {
            out.push_str(&held[..at]);
            held.drain(..at + tag.len());
            true
        }
        None => {
            let send = held.len() - partial_suffix(held, tag);
            out.push_str(&held[..send]);
            held.drain(..send);
            false
        }
    }
}

/// The length of the longest end of `s` that is a proper start of `tag`.
fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| {
            s.len() >= n && s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{Splitter, Syntax};

    /// `text` fed to a splitter of `syntax` in pieces of `n` characters.
    fn pieces(syntax: Syntax, text: &str, n: usize) -> (String, String) {
        let mut t = Splitter::new(syntax);
        let (mut thought, mut answer) = (String::new(), String::new());
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(n) {
            let (a, b) = t.push(&piece.iter().collect::<String>());
            thought.push_str(&a);
            answer.push_str(&b);
        }
        let (a, b) = t.finish();
        (thought + &a, answer + &b)
    }

    #[test]
    fn thought_and_answer_in_any_pieces() {
        for n in 1..12 {
            let s = |a: &str, b: &str| (a.to_string(), b.to_string());
            assert_eq!(
                split("<think>\nHmm, x.\n</think>\n\nYes.", false, n),
                s("\nHmm, x.\n", "Yes.")
            );
            assert_eq!(split("  <think>a</think>b", false, n), s("a", "b"));
            assert_eq!(split("Hmm.</think>\nNo.", true, n), s("Hmm.", "No."));
            assert_eq!(
                split("No thought <think>x</think>", false, n),
                s("", "No thought <think>x</think>")
            );
            assert_eq!(split("<thi", false, n), s("", "<thi"));
            assert_eq!(split("<think>cut short", false, n), s("cut short", ""));
            assert_eq!(split("<think>a</thin", false, n), s("a</thin", ""));
            assert_eq!(split("", true, n), s("", ""));
        }
    }

    /// `<think>` text split in pieces of `n` characters.
    fn split(text: &str, opened: bool, n: usize) -> (String, String) {
        pieces(Syntax::Think { opened }, text, n)
    }

    /// Harmony's text split in pieces of `n` characters.
    fn channels(text: &str, n: usize) -> (String, String) {
        pieces(Syntax::Harmony, text, n)
    }

    #[test]
    fn harmony_channels_in_any_pieces() {
        for n in 1..14 {
            let s = |a: &str, b: &str| (a.to_string(), b.to_string());
            assert_eq!(
                channels(
                    "<|channel|>analysis<|message|>User says hi.<|end|>\
                     <|start|>assistant<|channel|>final<|message|>Hello!",
                    n
                ),
                s("User says hi.", "Hello!")
            );
            // A commentary preamble is answer, as llama-server reads it.
            assert_eq!(
                channels(
                    "<|channel|>analysis<|message|>a<|end|><|start|>assistant\
                     <|channel|>commentary<|message|>b<|end|>\
                     <|start|>assistant<|channel|>final<|message|>c",
                    n
                ),
                s("a", "bc")
            );
            // No channels at all: the text is the answer.
            assert_eq!(
                channels("Plain <|end|> text", n),
                s("", "Plain <|end|> text")
            );
            // Cut short inside the thought, or inside a header.
            assert_eq!(
                channels("<|channel|>analysis<|message|>Hmm <|en", n),
                s("Hmm <|en", "")
            );
            assert_eq!(channels("<|channel|>fin", n), s("", "<|channel|>fin"));
            // A call keeps its recipient onwards, in either header's spelling.
            assert_eq!(
                channels(
                    "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant\
                     <|channel|>commentary to=functions.get_weather <|constrain|>json\
                     <|message|>{\"city\": \"Ur\"}",
                    n
                ),
                s(
                    "Look it up.",
                    "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Ur\"}"
                )
            );
            assert_eq!(
                channels(
                    "<|channel|>commentary<|message|>Checking.<|end|>\
                     <|start|>assistant to=functions.get_time<|channel|>commentary json\
                     <|message|>{}",
                    n
                ),
                s(
                    "",
                    "Checking.to=functions.get_time<|channel|>commentary json<|message|>{}"
                )
            );
            assert_eq!(
                channels(
                    " to=functions.get_time<|channel|>commentary json<|message|>{}",
                    n
                ),
                s(
                    "",
                    "to=functions.get_time<|channel|>commentary json<|message|>{}"
                )
            );
        }
    }
}
