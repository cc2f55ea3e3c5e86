//! How a model writes tool calls, chosen from its chat template as llama.cpp chooses: the
//! template that renders `<tool_call>` is Hermes' format (Qwen2.5, Qwen3, QwQ, Hermes 2/3),
//! `[TOOL_CALLS]` Mistral's (Nemo: a JSON list; Small 3.x with `[ARGS]`: name, then arguments),
//! an `ipython` turn Llama 3.x's JSON, Harmony's channels gpt-oss's (a `commentary` message to
//! `functions.NAME` whose body is the arguments). Those models are given the tools through their own
//! template and read back in their own format; any other model (or none: the built-in model)
//! gets the generic format of the parent module.
//!
//! `tool_choice: "required"` or a named function constrains the answer to the format's calls
//! (a Lark grammar: the format's markers around JSON valid against each tool's `parameters`);
//! `auto` to a reply that holds no marker, or text up to the first marker and then calls (as
//! llama.cpp's grammar triggered by the marker, but the reply cannot write a marker that
//! begins no valid call). What the answer says is read back afterwards: text without the
//! format's marker is a reply; a marker followed by what does not parse (a call cut short by
//! `max_tokens`) is returned as the text with a warning.

use hesper_engine::chat::{ChatTemplate, TemplateOrigin};
use hesper_engine::tokenizer::Tokenizer;
use hesper_runtime::grammar::prepared_schema;

use crate::reasoning::{harmony_lark, HARMONY_JSON_TYPE};
use std::collections::BTreeMap;

use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::{Call, Tool};

/// The families of formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// The tools in a system turn, the answer a JSON object (the parent module).
    Generic,
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, one per call.
    Hermes,
    /// `{"name": …, "parameters": {…}}`, after `<|python_tag|>` or not; one call.
    Llama3,
    /// `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`.
    MistralList,
    /// `[TOOL_CALLS]name[ARGS]{…}`, once per call.
    MistralArgs,
    /// gpt-oss's `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}`,
    /// one call a turn (`<|call|>` ends it, and the answer).
    Harmony,
}

/// A marker a format writes: its text, and its id when it is one control token (which the
/// answer's text would otherwise leave out, and a grammar names by id).
#[derive(Debug, Clone, PartialEq)]
struct Marker {
    text: &'static str,
    control: Option<u32>,
}

impl Marker {
    fn new(text: &'static str, tok: &Tokenizer) -> Self {
        let control = tok.token_id(text).filter(|&id| tok.is_special(id));
        Self { text, control }
    }

    /// The marker in a Lark rule: its token, or its text.
    fn lark(&self) -> String {
        match self.control {
            Some(id) => format!("<[{id}]>"),
            None => Value::from(self.text).to_string(),
        }
    }
}

/// A model's tool-call format.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolFormat {
    family: Family,
    markers: Vec<Marker>,
}

impl ToolFormat {
    /// The format `template` teaches, with its markers' tokens in `tok`.
    pub fn of(template: &ChatTemplate, tok: &Tokenizer) -> Self {
        let family = match template.origin() {
            TemplateOrigin::File | TemplateOrigin::User(_) => family_of(template.source()),
            _ => Family::Generic,
        };
        let texts: &[&'static str] = match family {
            Family::Generic => &[],
            Family::Hermes => &["<tool_call>", "</tool_call>"],
            Family::Llama3 => &["<|python_tag|>"],
            Family::MistralList => &["[TOOL_CALLS]"],
            Family::MistralArgs => &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
            Family::Harmony => &[],
        };
        Self {
            family,
            markers: texts.iter().map(|t| Marker::new(t, tok)).collect(),
        }
    }

    /// The generic format.
    pub fn generic() -> Self {
        Self {
            family: Family::Generic,
            markers: Vec::new(),
        }
    }

    /// Its family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// Its name, for the log and `/props`.
    pub fn name(&self) -> &'static str {
        match self.family {
            Family::Generic => "generic JSON",
            Family::Hermes => "Hermes <tool_call>",
            Family::Llama3 => "Llama 3.x JSON",
            Family::MistralList => "Mistral [TOOL_CALLS] list",
            Family::MistralArgs => "Mistral [TOOL_CALLS] [ARGS]",
            Family::Harmony => "Harmony (gpt-oss)",
        }
    }

    /// Control tokens the format writes: the answer's text keeps them.
    pub fn kept_tokens(&self) -> Vec<u32> {
        self.markers.iter().filter_map(|m| m.control).collect()
    }

    /// Whether a call's id must be 9 letters and digits (Mistral's templates refuse others).
    pub fn short_ids(&self) -> bool {
        matches!(self.family, Family::MistralList | Family::MistralArgs)
    }

    fn marker(&self, text: &str) -> &Marker {
        self.markers
            .iter()
            .find(|m| m.text == text)
            .expect("a marker of the family")
    }

    /// The Lark grammar of an answer that calls `tools` (at most one call unless
    /// `parallel`), or, where it `may_reply`, says anything that does not begin a call: text
    /// up to the format's first marker (which, when it is text, the reply cannot contain)
    /// followed by calls, or text alone. `None` for the generic format, which has its own.
    pub fn grammar(&self, tools: &[&Tool], parallel: bool, may_reply: bool) -> Option<String> {
        let args = |t: &Tool| prepared_schema(t.parameters.clone());
        let call_schema = |key: &str| {
            let calls: Vec<Value> = tools
                .iter()
                .map(|t| {
                    json!({"type": "object",
                           "properties": {"name": {"const": t.name}, key: args(t)},
                           "required": ["name", key], "additionalProperties": false})
                })
                .collect();
            json!({"anyOf": calls})
        };
        // Each family's first marker, what a call writes after it, and what comes between
        // two calls (`None`: one marker opens all the calls).
        let (marker, rest, between) = match self.family {
            Family::Generic => return None,
            Family::Harmony => return Self::harmony_grammar(tools, may_reply),
            Family::Llama3 => {
                let call = format!("%json {}", prepared_schema(call_schema("parameters")));
                let reply = r#"REPLY: /(.|\n)+/ & ~(/[ \t\r\n]*/ "{" /(.|\n)*/)"#;
                return Some(if may_reply {
                    format!("start: REPLY? | call\ncall: {call}\n{reply}\n")
                } else {
                    format!("start: call\ncall: {call}\n")
                });
            }
            Family::Hermes => (
                self.marker("<tool_call>"),
                format!(
                    "\"\\n\" %json {} \"\\n\" {}",
                    prepared_schema(call_schema("arguments")),
                    self.marker("</tool_call>").lark()
                ),
                Some("\"\\n\""),
            ),
            Family::MistralList => {
                let mut list = json!({"type": "array", "items": call_schema("arguments"),
                                      "minItems": 1});
                if !parallel {
                    list["maxItems"] = json!(1);
                }
                (
                    self.marker("[TOOL_CALLS]"),
                    format!("%json {}", prepared_schema(list)),
                    None,
                )
            }
            Family::MistralArgs => {
                let one: Vec<String> = tools
                    .iter()
                    .map(|t| {
                        format!(
                            "{} {} %json {}",
                            Value::from(t.name.as_str()),
                            self.marker("[ARGS]").lark(),
                            args(t)
                        )
                    })
                    .collect();
                (
                    self.marker("[TOOL_CALLS]"),
                    format!("({})", one.join(" | ")),
                    Some("\"\""),
                )
            }
        };
        let more = match between {
            Some(sep) if parallel => format!(" ({sep} call)*"),
            _ => String::new(),
        };
        let call = format!("call: {} rest\n", marker.lark());
        let rest = format!("rest: {rest}\n");
        if !may_reply {
            return Some(format!("start: call{more}\n{call}{rest}"));
        }
        let any = "/(.|\\n)*/";
        Some(match marker.control {
            // The reply's text cannot hold a control token: the marker ends it.
            Some(_) => format!("start: REPLY? (call{more})?\n{call}{rest}REPLY: /(.|\\n)+/\n"),
            // Text that holds no marker, or text up to the first marker and the rest of the
            // call after it.
            None => {
                let m = Value::from(marker.text).to_string();
                format!(
                    "start: REPLY? | LEAD rest{more}\n{call}{rest}\
                     REPLY: /(.|\\n)+/ & ~({any} {m} {any})\n\
                     LEAD: {any} {m} & ~({any} {m} /(.|\\n)+/)\n"
                )
            }
        })
    }

    /// What an answer in this format says: `None` when it calls nothing (a reply).
    pub fn parse(&self, text: &str) -> Option<Result<Parsed, String>> {
        match self.family {
            Family::Generic => None,
            Family::Hermes => {
                let start = text.find("<tool_call>")?;
                Some(hermes(&text[start..]).map(|calls| Parsed::new(&text[..start], calls)))
            }
            Family::Llama3 => {
                let body = text.trim_start();
                let body = body.strip_prefix("<|python_tag|>").unwrap_or(body);
                if !body.starts_with('{') {
                    return None;
                }
                Some(json_call(body.trim(), "parameters").map(|c| Parsed::new("", vec![c])))
            }
            Family::MistralList => {
                let start = text.find("[TOOL_CALLS]")?;
                let list = text[start + "[TOOL_CALLS]".len()..].trim();
                let calls = match serde_json::from_str::<Vec<RawCall>>(list) {
                    Ok(items) => items
                        .iter()
                        .map(|v| call_from(v, "arguments"))
                        .collect::<Result<Vec<_>, _>>(),
                    Err(e) => Err(format!("the list of calls is not JSON: {e}")),
                };
                Some(calls.map(|c| Parsed::new(&text[..start], c)))
            }
            Family::MistralArgs => {
                let start = text.find("[TOOL_CALLS]")?;
                let calls = text[start..]
                    .split("[TOOL_CALLS]")
                    .skip(1)
                    .map(mistral_args_call)
                    .collect::<Result<Vec<_>, _>>();
                Some(calls.map(|c| Parsed::new(&text[..start], c)))
            }
            Family::Harmony => {
                let start = text.find(HARMONY_CALL)?;
                Some(
                    harmony_call(&text[start..])
                        .map(|c| Parsed::new(harmony_before(text, start), vec![c])),
                )
            }
        }
    }

    /// Harmony's grammar of a turn that calls one of `tools`, as llama.cpp's: any analysis
    /// and commentary messages, then the call, its recipient in the channel's header or the
    /// role's; `None` where it may reply instead: the model writes its channels freely then,
    /// and the call is read back from what it wrote.
    fn harmony_grammar(tools: &[&Tool], may_reply: bool) -> Option<String> {
        if may_reply {
            return None;
        }
        let calls: Vec<String> = tools
            .iter()
            .map(|t| {
                let to = Value::from(format!(" {HARMONY_CALL}{}", t.name));
                format!(
                    "(channel {to} | {to} channel) {HARMONY_JSON_TYPE} \"<|message|>\" %json {}",
                    prepared_schema(t.parameters.clone())
                )
            })
            .collect();
        Some(harmony_lark(&calls.join(" | ")))
    }
}

/// What begins a Harmony call: its recipient, in the role's header or the channel's.
pub(crate) const HARMONY_CALL: &str = "to=functions.";

/// The text before a Harmony call whose recipient is at `start`: the header that holds it cut
/// off (a raw answer's: from its `<|start|>`, or the first message's `<|channel|>`; the
/// channels' splitter passes on only the recipient onwards).
fn harmony_before(text: &str, start: usize) -> &str {
    let before = &text[..start];
    let header = before
        .rfind("<|start|>")
        .or_else(|| before.rfind("<|channel|>"));
    header.map_or(before, |at| &before[..at])
}

/// `to=functions.NAME…<|message|>{…}`: the name up to white space or a marker, the arguments
/// after `<|message|>` (up to `<|call|>`, which the answer's text does not hold).
fn harmony_call(text: &str) -> Result<Call, String> {
    let after = &text[HARMONY_CALL.len()..];
    let name_end = after
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(after.len());
    let name = &after[..name_end];
    let (_, body) = after
        .split_once("<|message|>")
        .ok_or_else(|| format!("a call to {name:?} without <|message|>"))?;
    named_call(
        name,
        body.split("<|call|>").next().unwrap_or_default().trim(),
    )
}

/// An answer's calls and the text before them.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The text before the first call, its end trimmed (`None` when only white space).
    pub content: Option<String>,
    /// The calls.
    pub calls: Vec<Call>,
}

impl Parsed {
    fn new(before: &str, calls: Vec<Call>) -> Self {
        let before = before.trim_end();
        Self {
            content: (!before.is_empty()).then(|| before.to_string()),
            calls,
        }
    }
}

/// The family a template's source teaches.
fn family_of(source: &str) -> Family {
    if source.contains("[TOOL_CALLS]") {
        if source.contains("[ARGS]") {
            Family::MistralArgs
        } else {
            Family::MistralList
        }
    } else if source.contains("<tool_call>") {
        Family::Hermes
    } else if source.contains("<|channel|>") && source.contains("<|call|>") {
        Family::Harmony
    } else if source.contains("<|start_header_id|>ipython<|end_header_id|>")
        || source.contains("<|start_header_id|>ipython")
    {
        Family::Llama3
    } else {
        Family::Generic
    }
}

/// `<tool_call>…</tool_call>` blocks (the last may lack its end), nothing after them.
fn hermes(mut text: &str) -> Result<Vec<Call>, String> {
    let mut calls = Vec::new();
    while let Some(after) = text.trim_start().strip_prefix("<tool_call>") {
        let (body, rest) = after.split_once("</tool_call>").unwrap_or((after, ""));
        calls.push(json_call(body.trim(), "arguments")?);
        text = rest;
    }
    match text.trim() {
        "" => Ok(calls),
        rest => Err(format!("text follows the calls: {:?}", clip(rest))),
    }
}

/// `name[ARGS]{…}` or `name[CALL_ID]id[ARGS]{…}`.
fn mistral_args_call(segment: &str) -> Result<Call, String> {
    let (head, arguments) = segment
        .split_once("[ARGS]")
        .ok_or_else(|| format!("a call without [ARGS]: {:?}", clip(segment)))?;
    let name = head.split("[CALL_ID]").next().unwrap_or_default().trim();
    named_call(name, arguments.trim())
}

/// A call to `name` (not empty) with `arguments`, the JSON text of an object.
fn named_call(name: &str, arguments: &str) -> Result<Call, String> {
    if name.is_empty() {
        return Err("a call without a name".into());
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(_)) => Ok(Call {
            name: name.to_string(),
            arguments: arguments.to_string(),
        }),
        Ok(_) => Err(format!("the arguments of {name:?} are not an object")),
        Err(e) => Err(format!("the arguments of {name:?} are not JSON: {e}")),
    }
}

/// A call's JSON object, each value as the model wrote it.
pub(crate) type RawCall<'a> = BTreeMap<String, &'a RawValue>;

/// One JSON call `{"name": …, key: {…}}`.
fn json_call(text: &str, key: &str) -> Result<Call, String> {
    let v: RawCall = serde_json::from_str(text)
        .map_err(|e| format!("the call is not a JSON object ({e}): {:?}", clip(text)))?;
    call_from(&v, key)
}

/// A call from its JSON: a name, and arguments under `key` (or `arguments`): an object, kept
/// as the model wrote it (what streaming sends piece by piece), or the JSON text of one.
pub(crate) fn call_from(v: &RawCall, key: &str) -> Result<Call, String> {
    let name = v
        .get("name")
        .and_then(|r| serde_json::from_str::<String>(r.get()).ok())
        .filter(|n| !n.is_empty())
        .ok_or("a call without a name")?;
    let raw = v
        .get(key)
        .or_else(|| v.get("arguments"))
        .map(|r| r.get().trim());
    let arguments = match raw {
        None | Some("null") => "{}".to_string(),
        Some(a) if a.starts_with('{') => a.to_string(),
        Some(a) => match serde_json::from_str::<String>(a) {
            Ok(s) if serde_json::from_str::<Value>(&s).is_ok_and(|o| o.is_object()) => s,
            _ => {
                return Err(format!(
                    "the arguments of {name:?} are not an object: {}",
                    clip(a)
                ))
            }
        },
    };
    Ok(Call { name, arguments })
}

/// The first 80 characters of `s`, for a message.
fn clip(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hesper_runtime::grammar::{GrammarSpec, Grammars};

    fn format(family: Family) -> ToolFormat {
        let texts: &[&'static str] = match family {
            Family::Hermes => &["<tool_call>", "</tool_call>"],
            Family::MistralArgs => &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
            Family::MistralList => &["[TOOL_CALLS]"],
            _ => &[],
        };
        ToolFormat {
            family,
            markers: texts
                .iter()
                .map(|t| Marker {
                    text: t,
                    control: None,
                })
                .collect(),
        }
    }

    fn call(name: &str, arguments: &str) -> Call {
        Call {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn the_family_comes_from_the_template() {
        let dir = hesper_tests_dir();
        for (file, family) in [
            ("Qwen-Qwen2.5-7B-Instruct.jinja", Family::Hermes),
            ("Qwen-Qwen3-0.6B.jinja", Family::Hermes),
            (
                "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
                Family::Hermes,
            ),
            ("meta-llama-Llama-3.1-8B-Instruct.jinja", Family::Llama3),
            ("meta-llama-Llama-3.2-3B-Instruct.jinja", Family::Llama3),
            ("meta-llama-Llama-3.3-70B-Instruct.jinja", Family::Llama3),
            (
                "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                Family::MistralList,
            ),
            (
                "Mistral-Small-3.2-24B-Instruct-2506.jinja",
                Family::MistralArgs,
            ),
            ("openai-gpt-oss-120b.jinja", Family::Harmony),
            ("google-gemma-2-2b-it.jinja", Family::Generic),
            ("microsoft-Phi-3.5-mini-instruct.jinja", Family::Generic),
        ] {
            let source = std::fs::read_to_string(dir.join(file)).expect("template");
            assert_eq!(family_of(&source), family, "{file}");
        }
    }

    /// A piece of an answer: text, or one control token.
    enum Piece<'a> {
        Text(&'a str),
        Token(u32),
    }

    /// Whether `pieces` make a whole answer that `grammar` admits, on `tok`'s vocabulary.
    fn admits(g: &Grammars, tok: &Tokenizer, grammar: &str, pieces: &[Piece]) -> bool {
        let mut c = g
            .compile(&GrammarSpec::Lark(grammar.to_string()))
            .unwrap_or_else(|e| panic!("{e}\n{grammar}"));
        let mut ended = false;
        for p in pieces {
            let ids = match p {
                Piece::Text(t) => tok.encode_continuation(t).expect("encodes"),
                Piece::Token(id) => vec![*id],
            };
            for id in ids {
                match c.accept(id) {
                    Ok(_) if ended => return false,
                    Ok(end) => ended = end,
                    Err(_) => return false,
                }
            }
        }
        // Complete: nothing may follow, or the end of generation may.
        let mut logits = vec![0.0f32; tok.vocab_size()];
        ended
            || (c.mask(&mut logits).is_ok() && logits[tok.eos().expect("eos") as usize].is_finite())
    }

    #[test]
    fn auto_admits_replies_and_valid_calls_and_nothing_else() {
        use hesper_engine::gguf::Gguf;
        let bytes =
            std::fs::read(hesper_tests_dir().join("../../tokenizer/ggml-vocab-llama-bpe.gguf"))
                .expect("Llama 3's vocabulary");
        let tok = Tokenizer::from_gguf(&Gguf::parse(&bytes).expect("parses"))
            .expect("tokenizer")
            .expect("has one");
        let tok = std::sync::Arc::new(tok);
        let g = Grammars::new(tok.clone()).expect("grammars");
        let weather = Tool {
            name: "get_weather".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}),
        };
        let time = Tool {
            name: "get_time".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {}}),
        };
        let tools = [&weather, &time];
        let weather_call = r#"{"name": "get_weather", "arguments": {"city": "Ur"}}"#;
        let time_call = r#"{"name": "get_time", "arguments": {}}"#;
        let unknown_call = r#"{"name": "smite", "arguments": {}}"#;
        let text = |f: &ToolFormat, parallel, reply, s: &str| {
            admits(
                &g,
                &tok,
                &f.grammar(&tools, parallel, reply).unwrap(),
                &[Piece::Text(s)],
            )
        };

        // Markers that are text: a reply cannot hold one.
        let hermes = format(Family::Hermes);
        let hermes_calls = format!(
            "Let me look.\n<tool_call>\n{weather_call}\n</tool_call>\n<tool_call>\n{time_call}\n</tool_call>"
        );
        for (answer, parallel, reply, want) in [
            ("", false, true, true),
            ("It is sunny.\nIn Ur.", false, true, true),
            (&hermes_calls, true, true, true),
            (&hermes_calls, false, true, false),
            (
                &format!("<tool_call>\n{time_call}\n</tool_call>"),
                false,
                true,
                true,
            ),
            (
                &format!("<tool_call>\n{unknown_call}\n</tool_call>"),
                false,
                true,
                false,
            ),
            ("Hm <tool_call> no.", false, true, false),
            (
                &format!("<tool_call>\n{time_call}\n</tool_call> Done."),
                false,
                true,
                false,
            ),
            ("It is sunny.", false, false, false),
            (
                &format!("<tool_call>\n{time_call}\n</tool_call>"),
                false,
                false,
                true,
            ),
        ] {
            assert_eq!(
                text(&hermes, parallel, reply, answer),
                want,
                "{answer:?} {parallel} {reply}"
            );
        }
        let small = format(Family::MistralArgs);
        for (answer, want) in [
            ("Sunny.", true),
            (
                "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Ur\"}",
                true,
            ),
            ("[TOOL_CALLS]smite[ARGS]{}", false),
            ("Checking.[TOOL_CALLS]", false),
        ] {
            assert_eq!(text(&small, true, true, answer), want, "{answer:?}");
        }
        let nemo = format(Family::MistralList);
        let list = format!("[TOOL_CALLS][{time_call}]");
        assert!(text(&nemo, false, true, &list));
        assert!(text(&nemo, false, true, "No [TOOL_CALL] here."));
        assert!(!text(&nemo, false, true, "No [TOOL_CALLS] here."));
        // Harmony's markers are text in gpt-oss's vocabulary (it renders them).
        let harmony = format(Family::Harmony);
        assert_eq!(harmony.grammar(&tools, false, true), None, "auto is free");
        let weather_args = r#"{"city": "Ur"}"#;
        for (answer, want) in [
            (
                format!("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{weather_args}"),
                true,
            ),
            (
                "<|channel|>analysis<|message|>Need the time.<|end|><|start|>assistant\
                 <|channel|>commentary to=functions.get_time<|message|>{}"
                    .to_string(),
                true,
            ),
            (
                " to=functions.get_time<|channel|>commentary json<|message|>{}".to_string(),
                true,
            ),
            (
                "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant\
                 <|channel|>analysis to=functions.get_time<|message|>{}"
                    .to_string(),
                true,
            ),
            (
                "<|channel|>commentary to=functions.get_weather<|message|>{}".to_string(),
                false,
            ),
            (
                "<|channel|>commentary to=functions.smite<|message|>{}".to_string(),
                false,
            ),
            ("<|channel|>final<|message|>Sunny.".to_string(), false),
            (
                "<|channel|>analysis<|message|>a<|end|> b<|end|><|start|>assistant\
                 <|channel|>commentary to=functions.get_time<|message|>{}"
                    .to_string(),
                false,
            ),
        ] {
            assert_eq!(text(&harmony, false, false, &answer), want, "{answer:?}");
        }

        // A JSON schema shapes gpt-oss's final channel, after any analysis.
        let structure = crate::structured::Structure {
            spec: GrammarSpec::JsonSchema(json!({"type": "object",
                "properties": {"a": {"type": "integer"}}, "required": ["a"]})),
            param: "response_format",
        };
        let GrammarSpec::Lark(json_final) = structure.in_final_channel().spec else {
            panic!("a Lark grammar")
        };
        for (answer, want) in [
            (r#"<|channel|>final<|message|>{"a": 1}"#, true),
            (
                r#"<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final <|constrain|>json<|message|>{"a": 1}"#,
                true,
            ),
            (r#"{"a": 1}"#, false),
            (r#"<|channel|>final<|message|>{"b": 1}"#, false),
        ] {
            assert_eq!(
                admits(&g, &tok, &json_final, &[Piece::Text(answer)]),
                want,
                "{answer:?}"
            );
        }

        let llama = format(Family::Llama3);
        for (answer, want) in [
            ("It is hot.", true),
            (r#"{"name": "get_time", "parameters": {}}"#, true),
            (r#"{"name": "smite", "parameters": {}}"#, false),
            (r#" {"a": 1}"#, false),
        ] {
            assert_eq!(text(&llama, false, true, answer), want, "{answer:?}");
        }

        // Markers that are control tokens: the text of one is only text.
        let control = |name: &str| {
            let id = tok.token_id(name).expect("a reserved token");
            assert!(tok.is_special(id));
            id
        };
        let (open, close) = (
            control("<|reserved_special_token_3|>"),
            control("<|reserved_special_token_4|>"),
        );
        let hermes = ToolFormat {
            family: Family::Hermes,
            markers: vec![
                Marker {
                    text: "<tool_call>",
                    control: Some(open),
                },
                Marker {
                    text: "</tool_call>",
                    control: Some(close),
                },
            ],
        };
        let grammar = hermes.grammar(&tools, false, true).unwrap();
        let call = format!("\n{time_call}\n");
        for (pieces, want) in [
            (
                vec![
                    Piece::Text("Let me look.\n"),
                    Piece::Token(open),
                    Piece::Text(&call),
                    Piece::Token(close),
                ],
                true,
            ),
            (
                vec![Piece::Token(open), Piece::Text(&call), Piece::Token(close)],
                true,
            ),
            (vec![Piece::Text("A <tool_call> is text here.")], true),
            (
                vec![Piece::Text("Hm"), Piece::Token(open), Piece::Text("\nno")],
                false,
            ),
            (vec![Piece::Text("Hm"), Piece::Token(close)], false),
        ] {
            assert_eq!(admits(&g, &tok, &grammar, &pieces), want, "{grammar}");
        }
    }

    fn hesper_tests_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../golden-values/chat/templates")
    }

    #[test]
    fn each_family_reads_its_own_calls() {
        let weather = call("get_weather", r#"{"city": "Ur"}"#);
        let time = call("get_time", "{}");
        let hermes = format(Family::Hermes);
        assert_eq!(
            hermes.parse("Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Ur\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"),
            Some(Ok(Parsed { content: Some("Let me look.".into()), calls: vec![weather.clone(), time.clone()] }))
        );
        // The last call's end may be cut by the end of generation.
        assert_eq!(
            hermes.parse("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}"),
            Some(Ok(Parsed {
                content: None,
                calls: vec![time.clone()]
            }))
        );
        assert_eq!(hermes.parse("It is sunny."), None);
        assert!(matches!(
            hermes.parse("<tool_call>\n{\"name\": \"get_"),
            Some(Err(_))
        ));

        let llama = format(Family::Llama3);
        for text in [
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Ur\"}}",
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Ur\"}}",
        ] {
            assert_eq!(
                llama.parse(text),
                Some(Ok(Parsed {
                    content: None,
                    calls: vec![weather.clone()]
                })),
                "{text}"
            );
        }
        assert_eq!(llama.parse("Ur is hot."), None);

        let nemo = format(Family::MistralList);
        assert_eq!(
            nemo.parse("[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Ur\"}, \"id\": \"a1b2c3d4e\"}, {\"name\": \"get_time\", \"arguments\": {}}]"),
            Some(Ok(Parsed { content: None, calls: vec![weather.clone(), time.clone()] }))
        );
        assert!(matches!(
            nemo.parse("[TOOL_CALLS][{\"name\": "),
            Some(Err(_))
        ));

        let small = format(Family::MistralArgs);
        assert_eq!(
            small.parse("Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Ur\"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{}"),
            Some(Ok(Parsed { content: Some("Checking.".into()), calls: vec![weather.clone(), time.clone()] }))
        );
        assert!(matches!(
            small.parse("[TOOL_CALLS]get_weather{}"),
            Some(Err(_))
        ));
        let harmony = format(Family::Harmony);
        assert_eq!(
            harmony.parse(
                "Checking.to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Ur\"}"
            ),
            Some(Ok(Parsed {
                content: Some("Checking.".into()),
                calls: vec![weather.clone()]
            }))
        );
        // A raw answer (no channels' splitter): the call's header is not content.
        assert_eq!(
            harmony.parse("<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}"),
            Some(Ok(Parsed { content: Some("<|channel|>analysis<|message|>x<|end|>".into()), calls: vec![time] }))
        );
        assert_eq!(harmony.parse("Sunny in to=wn."), None);
        assert!(matches!(
            harmony.parse("to=functions.get_time<|message|>{\"a\""),
            Some(Err(_))
        ));
        assert!(matches!(
            harmony.parse("to=functions.get_time json"),
            Some(Err(_))
        ));
        // Arguments are an object.
        assert!(matches!(
            format(Family::Hermes)
                .parse("<tool_call>{\"name\": \"a\", \"arguments\": 3}</tool_call>"),
            Some(Err(_))
        ));
    }
}
