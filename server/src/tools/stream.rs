//! An answer with tools streamed as the model writes it, as OpenAI streams one: a reply's text
//! as it comes, each call's name as soon as it is whole, then its arguments piece by piece,
//! exactly the text the finished answer's `arguments` holds. A reply is told from calls as
//! the format tells them: the generic format's `{"response": "…"}` (its string decoded as it
//! arrives) or `{"tool_calls": …}`; in a model's own format, text up to its marker (held back
//! while what arrived may be the marker's beginning, and trailing white space while calls may
//! follow, which the finished answer's content leaves out), then calls: a JSON
//! `"name": "…"` followed by `"arguments": {…}` (or Llama's `"parameters"`), or Mistral's
//! `[TOOL_CALLS]name[ARGS]{…}`, or Harmony's `to=functions.NAME…<|message|>{…}`.

use super::format::HARMONY_CALL;
use super::Family;
use crate::stop::partial_suffix;

/// What an answer's text adds to what was streamed of it.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// More of the reply (or of the text before the calls).
    Content(String),
    /// A call, or more of one.
    Call(Delta),
}

/// Where an answer's reader is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reading {
    /// Not yet known whether it is a reply or calls.
    Undecided,
    /// Text, sent up to the format's marker.
    Text,
    /// The generic format's reply: a JSON string, decoded up to this byte.
    JsonReply(usize),
    /// Calls, read up to this byte.
    Calls(usize),
    /// Nothing more to stream: a JSON reply closed, or a generic answer of no known shape
    /// (the finished answer says what it is).
    Done,
}

/// Reads an answer with tools as it arrives.
#[derive(Debug, Clone)]
pub struct AnswerStream {
    family: Family,
    text: String,
    /// Bytes of the text sent as content (while reading text).
    sent: usize,
    reading: Reading,
    calls: CallStream,
}

impl AnswerStream {
    /// A reader of an answer in `family`'s format that may be a reply (`may_reply`) or only
    /// calls.
    pub fn new(family: Family, may_reply: bool) -> Self {
        let reading = match family {
            _ if !may_reply => Reading::Calls(0),
            Family::Hermes | Family::MistralList | Family::MistralArgs | Family::Harmony => {
                Reading::Text
            }
            Family::Generic | Family::Llama3 => Reading::Undecided,
        };
        Self {
            family,
            text: String::new(),
            sent: 0,
            reading,
            calls: CallStream::new(family),
        }
    }

    /// Adds `piece` of the answer; returns what it completes.
    pub fn push(&mut self, piece: &str) -> Vec<Piece> {
        self.text.push_str(piece);
        let mut out = Vec::new();
        if self.reading == Reading::Undecided {
            self.reading = match self.decide() {
                Some(r) => r,
                None => return out,
            };
        }
        match self.reading {
            Reading::Undecided | Reading::Done => {}
            Reading::Text => {
                let marker = self.marker();
                let rest = &self.text[self.sent..];
                match marker.and_then(|m| rest.find(m)) {
                    Some(at) => {
                        let before = rest[..at].trim_end();
                        if !before.is_empty() {
                            out.push(Piece::Content(before.to_string()));
                        }
                        let start = self.sent + at;
                        self.sent = start;
                        self.reading = Reading::Calls(start);
                        out.extend(self.feed_calls());
                    }
                    None => {
                        // Hold what may begin the marker, and white space calls may follow.
                        let held = marker.map_or(0, |m| partial_suffix(rest, m));
                        let sendable = rest[..rest.len() - held].trim_end();
                        if !sendable.is_empty() {
                            out.push(Piece::Content(sendable.to_string()));
                            self.sent += sendable.len();
                        }
                    }
                }
            }
            Reading::JsonReply(from) => {
                let (text, used, closed) = json_string_prefix(&self.text[from..]);
                self.reading = if closed {
                    Reading::Done
                } else {
                    Reading::JsonReply(from + used)
                };
                if !text.is_empty() {
                    out.push(Piece::Content(text));
                }
            }
            Reading::Calls(_) => out.extend(self.feed_calls()),
        }
        out
    }

    /// What was held back when the answer ends: the end of a reply's text.
    pub fn finish(&mut self) -> Vec<Piece> {
        if self.reading != Reading::Text || self.sent == self.text.len() {
            return Vec::new();
        }
        let rest = self.text[self.sent..].to_string();
        self.sent = self.text.len();
        vec![Piece::Content(rest)]
    }

    /// The format's marker of calls in the text, if it has one.
    fn marker(&self) -> Option<&'static str> {
        match self.family {
            Family::Hermes => Some("<tool_call>"),
            Family::MistralList | Family::MistralArgs => Some("[TOOL_CALLS]"),
            Family::Harmony => Some(HARMONY_CALL),
            Family::Generic | Family::Llama3 => None,
        }
    }

    /// Whether the answer so far is a reply or calls (`None`: not yet known).
    fn decide(&self) -> Option<Reading> {
        let t = self.text.trim_start();
        let lead = self.text.len() - t.len();
        let (call_starts, reply): (&[&str], &str) = match self.family {
            Family::Generic => (&["{\"tool_calls\""], "{\"response\": \""),
            Family::Llama3 => (&["{", "<|python_tag|>"], ""),
            _ => return Some(Reading::Text),
        };
        if call_starts.iter().any(|s| t.starts_with(s)) {
            return Some(Reading::Calls(0));
        }
        if !reply.is_empty() && t.starts_with(reply) {
            return Some(Reading::JsonReply(lead + reply.len()));
        }
        let undecided = t.is_empty()
            || call_starts
                .iter()
                .chain([&reply])
                .any(|s| !s.is_empty() && s.starts_with(t));
        match self.family {
            _ if undecided => None,
            // Llama's reply is any text that is not a call; a generic answer of another
            // shape is not streamed (the finished answer says what it is).
            Family::Llama3 => Some(Reading::Text),
            _ => Some(Reading::Done),
        }
    }

    /// Feeds the text not yet read to the call reader.
    fn feed_calls(&mut self) -> Vec<Piece> {
        let Reading::Calls(from) = self.reading else {
            return Vec::new();
        };
        self.reading = Reading::Calls(self.text.len());
        self.calls
            .push(&self.text[from..])
            .into_iter()
            .map(Piece::Call)
            .collect()
    }
}

/// The decoded text of the JSON string whose body starts `s` (after its opening quote), as
/// far as whole characters and escapes go; the bytes of `s` read, and whether the string was
/// closed.
pub fn json_string_prefix(s: &str) -> (String, usize, bool) {
    let mut out = String::new();
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (out, i + 1, true),
            '\\' => {
                let Some((_, e)) = chars.next() else {
                    return (out, i, false);
                };
                let simple = match e {
                    'n' => Some('\n'),
                    't' => Some('\t'),
                    'r' => Some('\r'),
                    'b' => Some('\u{8}'),
                    'f' => Some('\u{c}'),
                    '/' | '\\' | '"' => Some(e),
                    _ => None,
                };
                if let Some(c) = simple {
                    out.push(c);
                    continue;
                }
                // `\uXXXX`, a surrogate pair as two.
                let Some((code, len)) = unicode_escape(&s[i..]) else {
                    return (out, i, false);
                };
                out.push(code);
                for _ in 2..len {
                    chars.next();
                }
            }
            c => out.push(c),
        }
    }
    (out, s.len(), false)
}

/// The character of the `\uXXXX` escape (or pair of them) that starts `s`, and the characters
/// it takes; `None` until it is whole (or when it is not valid: the string stops there).
fn unicode_escape(s: &str) -> Option<(char, usize)> {
    let unit = |at: usize| {
        let hex = s.get(at..at + 6)?.strip_prefix("\\u")?;
        u32::from_str_radix(hex, 16).ok()
    };
    let high = unit(0)?;
    if !(0xD800..0xDC00).contains(&high) {
        return char::from_u32(high).map(|c| (c, 6));
    }
    let low = unit(6).filter(|l| (0xDC00..0xE000).contains(l))?;
    char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)).map(|c| (c, 12))
}

/// What the text written so far adds to the calls.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// Call `index` is to `name`.
    Begin {
        /// The call's place in the answer.
        index: usize,
        /// The function.
        name: String,
    },
    /// More of call `index`'s arguments.
    Arguments {
        /// The call's place in the answer.
        index: usize,
        /// The text.
        text: String,
    },
}

/// Where the reader is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum At {
    /// Looking for the next call's name.
    Name,
    /// Looking for where its arguments begin.
    Key,
    /// Inside its arguments: object depth, and whether inside a string (after a `\`).
    Arguments {
        depth: usize,
        string: bool,
        escaped: bool,
    },
}

/// Reads calls out of an answer as it arrives.
#[derive(Debug, Clone)]
struct CallStream {
    text: String,
    pos: usize,
    at: At,
    index: usize,
    family: Family,
}

impl CallStream {
    /// A reader of `family`'s calls.
    fn new(family: Family) -> Self {
        Self {
            text: String::new(),
            pos: 0,
            at: At::Name,
            index: 0,
            family,
        }
    }

    /// Adds `piece` of the answer; returns what it completes.
    fn push(&mut self, piece: &str) -> Vec<Delta> {
        self.text.push_str(piece);
        let mut out = Vec::new();
        loop {
            let rest = &self.text[self.pos..];
            match self.at {
                At::Name => {
                    let Some((name, used)) = self.name(rest) else {
                        break;
                    };
                    out.push(Delta::Begin {
                        index: self.index,
                        name,
                    });
                    self.pos += used;
                    self.at = At::Key;
                }
                At::Key => {
                    let keys: &[&str] = match self.family {
                        Family::MistralArgs => &["[ARGS]"],
                        Family::Harmony => &["<|message|>"],
                        _ => &["\"arguments\": ", "\"parameters\": "],
                    };
                    let found = keys
                        .iter()
                        .filter_map(|k| rest.find(k).map(|i| i + k.len()))
                        .min();
                    let Some(after) = found else { break };
                    let Some(open) = rest[after..].find('{') else {
                        break;
                    };
                    self.pos += after + open;
                    self.at = At::Arguments {
                        depth: 0,
                        string: false,
                        escaped: false,
                    };
                }
                At::Arguments { .. } => {
                    let (text, done) = self.arguments();
                    if !text.is_empty() {
                        out.push(Delta::Arguments {
                            index: self.index,
                            text,
                        });
                    }
                    if !done {
                        break;
                    }
                    self.index += 1;
                    self.at = At::Name;
                }
            }
        }
        out
    }

    /// The next call's name in `rest`, and the bytes read up to its end.
    fn name(&self, rest: &str) -> Option<(String, usize)> {
        match self.family {
            Family::MistralArgs => {
                let start = rest.find("[TOOL_CALLS]")? + "[TOOL_CALLS]".len();
                let end = ["[ARGS]", "[CALL_ID]"]
                    .iter()
                    .filter_map(|m| rest[start..].find(m))
                    .min()?;
                return Some((rest[start..start + end].trim().to_string(), start + end));
            }
            // The name ends where white space or a marker does.
            Family::Harmony => {
                let start = rest.find(HARMONY_CALL)? + HARMONY_CALL.len();
                let end = rest[start..].find(|c: char| c.is_whitespace() || c == '<')?;
                return Some((rest[start..start + end].to_string(), start + end));
            }
            _ => {}
        }
        const KEY: &str = "\"name\": \"";
        let start = rest.find(KEY)? + KEY.len();
        let end = rest[start..].find('"')?;
        Some((rest[start..start + end].to_string(), start + end + 1))
    }

    /// The arguments' text from the reader's place to the end of what arrived, or to the
    /// brace that closes them (then `true`).
    fn arguments(&mut self) -> (String, bool) {
        let At::Arguments {
            mut depth,
            mut string,
            mut escaped,
        } = self.at
        else {
            return (String::new(), false);
        };
        let rest = &self.text[self.pos..];
        for (i, c) in rest.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if string => escaped = true,
                '"' => string = !string,
                '{' | '[' if !string => depth += 1,
                '}' | ']' if !string => {
                    depth -= 1;
                    if depth == 0 {
                        let end = i + c.len_utf8();
                        let text = rest[..end].to_string();
                        self.pos += end;
                        return (text, true);
                    }
                }
                _ => {}
            }
        }
        let text = rest.to_string();
        self.pos = self.text.len();
        self.at = At::Arguments {
            depth,
            string,
            escaped,
        };
        (text, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `n` bytes (on character boundaries), returning each call's
    /// name and its arguments put together.
    fn streamed(family: Family, text: &str, n: usize) -> Vec<(String, String)> {
        let mut s = CallStream::new(family);
        let mut calls: Vec<(String, String)> = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(n) {
            for d in s.push(&piece.iter().collect::<String>()) {
                match d {
                    Delta::Begin { index, name } => {
                        assert_eq!(index, calls.len());
                        calls.push((name, String::new()));
                    }
                    Delta::Arguments { index, text } => calls[index].1.push_str(&text),
                }
            }
        }
        calls
    }

    #[test]
    fn pieces_of_any_size_put_together_the_calls() {
        let generic = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "U}r \"{", "days": [1, {"a": 2}]}}, {"name": "get_time", "arguments": {}}]}"#;
        let hermes = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"U}r \\\"{\", \"days\": [1, {\"a\": 2}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let mistral = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"U}r \\\"{\", \"days\": [1, {\"a\": 2}]}[TOOL_CALLS]get_time[ARGS]{}";
        let want = vec![
            (
                "get_weather".to_string(),
                r#"{"city": "U}r \"{", "days": [1, {"a": 2}]}"#.to_string(),
            ),
            ("get_time".to_string(), "{}".to_string()),
        ];
        for n in [1, 2, 3, 7, 1000] {
            assert_eq!(streamed(Family::Generic, generic, n), want, "generic, {n}");
            assert_eq!(streamed(Family::Hermes, hermes, n), want, "hermes, {n}");
            assert_eq!(
                streamed(Family::MistralArgs, mistral, n),
                want,
                "mistral, {n}"
            );
        }
        let harmony = "to=functions.get_time <|constrain|>json<|message|>{\"zone\": \"é\"}";
        for n in [1, 2, 5, 1000] {
            assert_eq!(
                streamed(Family::Harmony, harmony, n),
                vec![("get_time".to_string(), r#"{"zone": "é"}"#.to_string())]
            );
        }
        let llama = r#"{"name": "get_time", "parameters": {"zone": "é"}}"#;
        assert_eq!(
            streamed(Family::Llama3, llama, 1),
            vec![("get_time".to_string(), r#"{"zone": "é"}"#.to_string())]
        );
    }

    /// Feeds `text` to an answer reader in pieces of `n` characters: the content and each
    /// call's name and arguments put together.
    fn answered(
        family: Family,
        may_reply: bool,
        text: &str,
        n: usize,
    ) -> (String, Vec<(String, String)>) {
        let mut s = AnswerStream::new(family, may_reply);
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        let mut pieces: Vec<Piece> = Vec::new();
        for piece in chars.chunks(n) {
            pieces.extend(s.push(&piece.iter().collect::<String>()));
        }
        pieces.extend(s.finish());
        for p in pieces {
            match p {
                Piece::Content(t) => {
                    assert!(calls.is_empty(), "content after a call: {t:?}");
                    content.push_str(&t);
                }
                Piece::Call(Delta::Begin { index, name }) => {
                    assert_eq!(index, calls.len());
                    calls.push((name, String::new()));
                }
                Piece::Call(Delta::Arguments { index, text }) => calls[index].1.push_str(&text),
            }
        }
        (content, calls)
    }

    #[test]
    fn replies_stream_as_text_and_calls_as_calls() {
        let weather = ("get_weather".to_string(), r#"{"city": "Ur"}"#.to_string());
        let time = ("get_time".to_string(), "{}".to_string());
        let hermes = "\nLet me <look>.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Ur\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let small =
            "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Ur\"}[TOOL_CALLS]get_time[ARGS]{}";
        let generic = r#"{"response": "Line\n\"q\" \u00e9 \ud83d\ude00 \\ end"}"#;
        for n in [1, 2, 5, 1000] {
            // The content is what the finished answer's is: the text before the calls, its
            // end trimmed; a reply whole.
            assert_eq!(
                answered(Family::Hermes, true, hermes, n),
                (
                    "\nLet me <look>.".into(),
                    vec![weather.clone(), time.clone()]
                ),
                "{n}"
            );
            for reply in ["  It is <sunny>.\n", "A <tool_c", "[TOOL_CALL] "] {
                assert_eq!(
                    answered(Family::Hermes, true, reply, n),
                    (reply.into(), vec![])
                );
                assert_eq!(
                    answered(Family::MistralArgs, true, reply, n),
                    (reply.into(), vec![])
                );
                assert_eq!(
                    answered(Family::Llama3, true, reply, n),
                    (reply.into(), vec![])
                );
            }
            // gpt-oss: a preamble (the channels' splitter's answer), then the call.
            assert_eq!(
                answered(
                    Family::Harmony,
                    true,
                    "Checking. to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Ur\"}",
                    n
                ),
                ("Checking.".into(), vec![weather.clone()])
            );
            assert_eq!(
                answered(Family::Harmony, true, "It is sunny in to=wn.", n),
                ("It is sunny in to=wn.".into(), vec![])
            );
            assert_eq!(
                answered(Family::MistralArgs, true, small, n),
                ("Checking.".into(), vec![weather.clone(), time.clone()])
            );
            assert_eq!(
                answered(
                    Family::Llama3,
                    true,
                    r#" {"name": "get_time", "parameters": {}}"#,
                    n
                ),
                (String::new(), vec![time.clone()])
            );
            assert_eq!(
                answered(Family::Generic, true, generic, n),
                ("Line\n\"q\" é 😀 \\ end".into(), vec![])
            );
            let calls = r#"{"tool_calls": [{"name": "get_time", "arguments": {}}]}"#;
            assert_eq!(
                answered(Family::Generic, true, calls, n),
                (String::new(), vec![time.clone()])
            );
        }
        // A string cut short is decoded as far as it is whole.
        assert_eq!(json_string_prefix(r"ab\u00e"), ("ab".into(), 2, false));
        assert_eq!(json_string_prefix(r#"ab\"c"d"#), ("ab\"c".into(), 6, true));
    }
}
