//! Tool calls streamed as the model writes them, as OpenAI streams them: each call's name as
//! soon as it is whole, then its arguments piece by piece, exactly the text the finished
//! answer's `arguments` holds. Used where the grammar admits only calls (`tool_choice`
//! `required` or a named function), so the text is known to be calls of the format: a JSON
//! `"name": "…"` followed by `"arguments": {…}` (or Llama's `"parameters"`), or Mistral's
//! `[TOOL_CALLS]name[ARGS]{…}`.

use super::Family;

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
pub struct CallStream {
    text: String,
    pos: usize,
    at: At,
    index: usize,
    /// Mistral's `[TOOL_CALLS]name[ARGS]` instead of JSON keys.
    args_marker: bool,
}

impl CallStream {
    /// A reader of `family`'s calls.
    pub fn new(family: Family) -> Self {
        Self {
            text: String::new(),
            pos: 0,
            at: At::Name,
            index: 0,
            args_marker: family == Family::MistralArgs,
        }
    }

    /// Adds `piece` of the answer; returns what it completes.
    pub fn push(&mut self, piece: &str) -> Vec<Delta> {
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
                    let keys: &[&str] = if self.args_marker {
                        &["[ARGS]"]
                    } else {
                        &["\"arguments\": ", "\"parameters\": "]
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
        if self.args_marker {
            let start = rest.find("[TOOL_CALLS]")? + "[TOOL_CALLS]".len();
            let end = ["[ARGS]", "[CALL_ID]"]
                .iter()
                .filter_map(|m| rest[start..].find(m))
                .min()?;
            return Some((rest[start..start + end].trim().to_string(), start + end));
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
        let llama = r#"{"name": "get_time", "parameters": {"zone": "é"}}"#;
        assert_eq!(
            streamed(Family::Llama3, llama, 1),
            vec![("get_time".to_string(), r#"{"zone": "é"}"#.to_string())]
        );
    }
}
