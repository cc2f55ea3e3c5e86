//! How a model writes tool calls, chosen from its chat template as llama.cpp chooses: the
//! template that renders `<tool_call>` is Hermes' format (Qwen2.5, Qwen3, QwQ, Hermes 2/3),
//! `[TOOL_CALLS]` Mistral's (Nemo: a JSON list; Small 3.x with `[ARGS]`: name, then arguments),
//! an `ipython` turn Llama 3.x's JSON. Those models are given the tools through their own
//! template and read back in their own format; any other model (or none: the built-in model)
//! gets the generic format of the parent module.
//!
//! `tool_choice: "required"` or a named function constrains the answer to the format's calls
//! (a Lark grammar: the format's markers around JSON valid against each tool's `parameters`);
//! `auto` leaves the answer free, and what it says is read back afterwards: text without the
//! format's marker is a reply, a marker followed by what does not parse is returned as the
//! text with a warning.

use hesper_engine::chat::{ChatTemplate, TemplateOrigin};
use hesper_engine::tokenizer::Tokenizer;
use hesper_runtime::grammar::prepared_schema;
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
    /// `parallel`); `None` for the generic format, which has its own.
    pub fn grammar(&self, tools: &[&Tool], parallel: bool) -> Option<String> {
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
        let repeat = |call: &str, sep: &str| {
            if parallel {
                format!("start: call ({sep} call)*\ncall: {call}\n")
            } else {
                format!("start: call\ncall: {call}\n")
            }
        };
        Some(match self.family {
            Family::Generic => return None,
            Family::Hermes => repeat(
                &format!(
                    "{} \"\\n\" %json {} \"\\n\" {}",
                    self.marker("<tool_call>").lark(),
                    prepared_schema(call_schema("arguments")),
                    self.marker("</tool_call>").lark()
                ),
                "\"\\n\"",
            ),
            Family::Llama3 => format!(
                "start: %json {}\n",
                prepared_schema(call_schema("parameters"))
            ),
            Family::MistralList => {
                let mut list = json!({"type": "array", "items": call_schema("arguments"),
                                      "minItems": 1});
                if !parallel {
                    list["maxItems"] = json!(1);
                }
                format!(
                    "start: {} %json {}\n",
                    self.marker("[TOOL_CALLS]").lark(),
                    prepared_schema(list)
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
                repeat(
                    &format!(
                        "{} ({})",
                        self.marker("[TOOL_CALLS]").lark(),
                        one.join(" | ")
                    ),
                    "\"\"",
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
        }
    }
}

/// An answer's calls and the text before them.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The text before the first call, trimmed (`None` when empty).
    pub content: Option<String>,
    /// The calls.
    pub calls: Vec<Call>,
}

impl Parsed {
    fn new(before: &str, calls: Vec<Call>) -> Self {
        let before = before.trim();
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
    let arguments = arguments.trim();
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(_)) if !name.is_empty() => Ok(Call {
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
            ("google-gemma-2-2b-it.jinja", Family::Generic),
            ("microsoft-Phi-3.5-mini-instruct.jinja", Family::Generic),
        ] {
            let source = std::fs::read_to_string(dir.join(file)).expect("template");
            assert_eq!(family_of(&source), family, "{file}");
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
            Some(Ok(Parsed { content: Some("Checking.".into()), calls: vec![weather, time] }))
        );
        assert!(matches!(
            small.parse("[TOOL_CALLS]get_weather{}"),
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
