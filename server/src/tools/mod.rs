//! Tool calls: a request's tools and `tool_choice`, and the answer read back as calls. A model
//! whose chat template has a tool format of its own is given the tools through the template
//! and answers in that format ([`format`]); any other model gets llama.cpp's generic format,
//! which every model can follow: the tools are described in a system turn, and the answer is constrained to a JSON object that is either a
//! call of the given tools (`{"tool_calls": [{"name": …, "arguments": {…}}]}`, the arguments
//! valid against the tool's `parameters`) or, where `tool_choice` allows it, a reply
//! (`{"response": "…"}`). `tool_choice` is enforced by that grammar: `required` admits only
//! calls, a named function only calls of it, `none` leaves the answer unconstrained and the
//! tools undescribed; `parallel_tool_calls: false` admits one call. Earlier calls and their
//! results go back to the model in the same JSON. The older `functions` and `function_call`
//! fields are read as tools, and answered with one `function_call` as they were.

pub mod format;
pub mod stream;

use hesper_runtime::grammar::GrammarSpec;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::request::{CompletionBody, ToolCallIn};
pub use format::{Family, ToolFormat};

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// The function's name.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// The JSON schema of its arguments.
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// Call tools or reply, as the model chooses.
    Auto,
    /// Reply only.
    None,
    /// Call at least one tool.
    Required,
    /// Call this function.
    Named(String),
}

/// The tools of a request and how they may be called.
#[derive(Debug, Clone)]
pub struct Tools {
    tools: Vec<Tool>,
    choice: ToolChoice,
    parallel: bool,
    legacy: bool,
    format: ToolFormat,
}

/// A call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The function.
    pub name: String,
    /// Its arguments, as the JSON text OpenAI sends.
    pub arguments: String,
}

/// What an answer says.
#[derive(Debug, Clone, PartialEq)]
pub enum Said {
    /// Tool calls, and the text the model wrote before them.
    Calls {
        /// The text before the calls, if any.
        content: Option<String>,
        /// The calls.
        calls: Vec<Call>,
    },
    /// A reply.
    Reply(String),
    /// A call begun that does not parse (cut short by `max_tokens`): the
    /// answer is returned as its text, and this says why it is not a call.
    Unparsed(String),
}

/// OpenAI's `tools[i]`: `{"type": "function", "function": {...}}`.
#[derive(Debug, Deserialize)]
pub struct ToolDef {
    /// `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: Option<FunctionDef>,
}

/// A function's definition (`tools[i].function`, or the older `functions[i]`).
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionDef {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// The JSON schema of its arguments.
    pub parameters: Option<Value>,
    /// Whether the arguments must follow the schema exactly (they always do here).
    pub strict: Option<bool>,
}

/// The tools `b` offers and how they may be called in `format`, or `None` without tools (or
/// with `tool_choice: "none"`, which leaves the answer as without them).
pub fn requested(b: &CompletionBody, format: &ToolFormat) -> Result<Option<Tools>, ApiError> {
    let mut tools = Vec::new();
    for (i, t) in b.tools.iter().flatten().enumerate() {
        let param = format!("tools[{i}]");
        if t.kind != "function" {
            return Err(ApiError::bad_param(
                &format!("{param}.type"),
                format!("{param}.type {:?}: function is the only kind", t.kind),
            ));
        }
        let Some(f) = &t.function else {
            return Err(ApiError::bad_param(
                &format!("{param}.function"),
                format!("{param} has no function"),
            ));
        };
        tools.push(tool(f, &format!("{param}.function"))?);
    }
    for (i, f) in b.functions.iter().flatten().enumerate() {
        tools.push(tool(f, &format!("functions[{i}]"))?);
    }
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|u| u.name == t.name) {
            return Err(ApiError::bad_param(
                "tools",
                format!("two tools are named {:?}", t.name),
            ));
        }
    }
    let (choice_value, param) = match (&b.tool_choice, &b.function_call) {
        (Some(c), _) => (Some(c), "tool_choice"),
        (None, Some(c)) => (Some(c), "function_call"),
        (None, None) => (None, "tool_choice"),
    };
    let choice = match choice_value {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" if param == "tool_choice" => ToolChoice::Required,
            other => {
                return Err(ApiError::bad_param(
                    param,
                    format!("{param} {other:?}: auto, none, required or a function"),
                ))
            }
        },
        // {"type": "function", "function": {"name": …}}, or function_call's {"name": …}.
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| o.get("name"))
                .and_then(Value::as_str);
            let Some(name) = name else {
                return Err(ApiError::bad_param(
                    param,
                    format!("{param}: name a function as {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"),
                ));
            };
            if !tools.iter().any(|t| t.name == name) {
                return Err(ApiError::bad_param(
                    param,
                    format!("{param} names {name:?}, which is not among the tools"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(_) => {
            return Err(ApiError::bad_param(
                param,
                format!("{param}: a string or an object"),
            ))
        }
    };
    if tools.is_empty() {
        return match choice {
            ToolChoice::Auto | ToolChoice::None if choice_value.is_none() => Ok(None),
            ToolChoice::None => Ok(None),
            _ => Err(ApiError::bad_param(param, format!("{param} needs tools"))),
        };
    }
    if choice == ToolChoice::None {
        return Ok(None);
    }
    // The older `functions` answer one `function_call`.
    let legacy = b.tools.is_none();
    Ok(Some(Tools {
        tools,
        choice,
        parallel: b.parallel_tool_calls.unwrap_or(true) && !legacy,
        legacy,
        format: format.clone(),
    }))
}

/// A function definition checked: a name OpenAI accepts, parameters an object schema.
fn tool(f: &FunctionDef, param: &str) -> Result<Tool, ApiError> {
    let valid = !f.name.is_empty()
        && f.name.len() <= 64
        && f.name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Err(ApiError::bad_param(
            &format!("{param}.name"),
            format!("{param}.name {:?}: 1 to 64 letters, digits, _ or -", f.name),
        ));
    }
    let parameters = match &f.parameters {
        None => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(ApiError::bad_param(
                &format!("{param}.parameters"),
                format!("{param}.parameters: a JSON schema is an object"),
            ))
        }
    };
    Ok(Tool {
        name: f.name.clone(),
        description: f.description.clone(),
        parameters,
    })
}

impl Tools {
    /// Whether the request used the older `functions`: its answer is one `function_call`.
    pub fn legacy(&self) -> bool {
        self.legacy
    }

    /// The format the model is asked to call in.
    pub fn format(&self) -> &ToolFormat {
        &self.format
    }

    /// Whether the tools go to the model through its own template (not the generic format).
    pub fn native(&self) -> bool {
        self.format.family() != Family::Generic
    }

    /// The tools as a template's `tools` reads them (OpenAI's definitions).
    pub fn definitions(&self) -> Value {
        let list: Vec<Value> = self
            .tools
            .iter()
            .map(|t| {
                let mut f = json!({"name": t.name});
                if let Some(d) = &t.description {
                    f["description"] = json!(d);
                }
                f["parameters"] = t.parameters.clone();
                json!({"type": "function", "function": f})
            })
            .collect();
        Value::Array(list)
    }

    /// What the answer is constrained to: the generic format's schema, or the model's own
    /// format (calls only, or under `auto` a reply or text followed by calls).
    pub fn grammar(&self) -> Option<GrammarSpec> {
        if !self.native() {
            return Some(GrammarSpec::JsonSchema(self.schema()));
        }
        let callable: Vec<&Tool> = self.callable().collect();
        self.format
            .grammar(&callable, self.parallel, self.may_reply())
            .map(GrammarSpec::Lark)
    }

    /// The tools a call may name under `tool_choice`.
    fn callable(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter().filter(move |t| match &self.choice {
            ToolChoice::Named(n) => &t.name == n,
            _ => true,
        })
    }

    /// Whether the answer may be a reply instead of calls.
    pub fn may_reply(&self) -> bool {
        self.choice == ToolChoice::Auto
    }

    /// The system turn that describes the tools and the answer's form.
    pub fn system_prompt(&self) -> String {
        let list: Vec<Value> = self
            .callable()
            .map(|t| {
                let mut v = json!({"name": t.name, "parameters": t.parameters});
                if let Some(d) = &t.description {
                    v["description"] = json!(d);
                }
                v
            })
            .collect();
        let mut s = String::from("You can call these tools:\n");
        for t in &list {
            s.push_str(&t.to_string());
            s.push('\n');
        }
        s.push_str(
            "\nTo call tools, answer with a JSON object: \
             {\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": {<its arguments>}}]}",
        );
        if self.may_reply() {
            s.push_str("\nTo answer directly, answer with {\"response\": \"<your answer>\"}");
        }
        s
    }

    /// The JSON schema every answer follows (enforcing `tool_choice` and
    /// `parallel_tool_calls`).
    pub fn schema(&self) -> Value {
        let calls: Vec<Value> = self
            .callable()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let mut array = json!({"type": "array", "items": {"anyOf": calls}, "minItems": 1});
        if !self.parallel {
            array["maxItems"] = json!(1);
        }
        let call = json!({
            "type": "object",
            "properties": {"tool_calls": array},
            "required": ["tool_calls"],
            "additionalProperties": false,
        });
        if !self.may_reply() {
            return call;
        }
        json!({"anyOf": [call, {
            "type": "object",
            "properties": {"response": {"type": "string"}},
            "required": ["response"],
            "additionalProperties": false,
        }]})
    }

    /// What a finished answer says; `None` when it is plain text: in the generic format, not
    /// a whole answer (cut by `max_tokens`) other than a reply's beginning; in a native one,
    /// no call begun.
    pub fn parse(&self, text: &str) -> Option<Said> {
        if self.native() {
            return match self.format.parse(text)? {
                Ok(p) => Some(Said::Calls {
                    content: p.content,
                    calls: p.calls,
                }),
                Err(why) => Some(Said::Unparsed(why)),
            };
        }
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            // A reply cut short is the text it has.
            let body = text.trim_start().strip_prefix(r#"{"response": ""#)?;
            return Some(Said::Reply(stream::json_string_prefix(body).0));
        };
        if let Some(r) = v.get("response").and_then(Value::as_str) {
            return Some(Said::Reply(r.to_string()));
        }
        /// The generic format's calls, each value as the model wrote it.
        #[derive(Deserialize)]
        struct Calls<'a> {
            #[serde(borrow)]
            tool_calls: Vec<format::RawCall<'a>>,
        }
        let calls: Calls = serde_json::from_str(text).ok()?;
        let calls = calls
            .tool_calls
            .iter()
            .map(|c| format::call_from(c, "arguments").ok())
            .collect::<Option<Vec<_>>>()?;
        Some(Said::Calls {
            content: None,
            calls,
        })
    }
}

/// An assistant turn that called tools, as the generic format asks the model to write it.
pub fn calls_text(calls: &[ToolCallIn]) -> String {
    let calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            let args = c
                .function
                .arguments
                .as_deref()
                .and_then(|a| serde_json::from_str::<Value>(a).ok())
                .unwrap_or_else(|| json!({}));
            json!({"name": c.function.name, "arguments": args})
        })
        .collect();
    json!({ "tool_calls": calls }).to_string()
}

/// An assistant turn's calls as a template reads them: OpenAI's, with each call's arguments
/// an object (as transformers' callers pass them) where they are JSON.
pub fn calls_json(calls: &[ToolCallIn]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            let arguments = c.function.arguments.as_deref().unwrap_or("{}");
            let arguments =
                serde_json::from_str::<Value>(arguments).unwrap_or_else(|_| json!(arguments));
            let mut v = json!({"type": "function",
                               "function": {"name": c.function.name, "arguments": arguments}});
            if let Some(id) = &c.id {
                v["id"] = json!(id);
            }
            v
        })
        .collect();
    Value::Array(calls)
}

/// A tool's result, as the model reads it in a user turn (the generic format).
pub fn result_text(name: Option<&str>, id: Option<&str>, content: &str) -> String {
    let mut v = json!({"content": content});
    if let Some(n) = name {
        v["name"] = json!(n);
    }
    if let Some(i) = id {
        v["tool_call_id"] = json!(i);
    }
    json!({ "tool_response": v }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse;

    fn body(v: Value) -> CompletionBody {
        parse(v.to_string().as_bytes()).expect("body")
    }

    fn requested(b: &CompletionBody) -> Result<Option<Tools>, ApiError> {
        super::requested(b, &ToolFormat::generic())
    }

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}},
               {"type": "function", "function": {"name": "get_time"}}])
    }

    #[test]
    fn tool_choice_shapes_the_schema() {
        let auto = requested(&body(json!({"tools": weather()})))
            .unwrap()
            .unwrap();
        assert!(auto.schema()["anyOf"].is_array());
        let req = requested(&body(json!({"tools": weather(), "tool_choice": "required",
                                         "parallel_tool_calls": false})))
        .unwrap()
        .unwrap();
        let s = req.schema();
        assert_eq!(s["properties"]["tool_calls"]["maxItems"], 1);
        assert_eq!(
            s["properties"]["tool_calls"]["items"]["anyOf"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        let named = requested(&body(json!({"tools": weather(), "tool_choice":
            {"type": "function", "function": {"name": "get_time"}}})))
        .unwrap()
        .unwrap();
        let items = &named.schema()["properties"]["tool_calls"]["items"]["anyOf"];
        assert_eq!(items.as_array().unwrap().len(), 1);
        assert_eq!(items[0]["properties"]["name"]["const"], "get_time");
        assert!(!named.system_prompt().contains("get_weather"));
        assert!(
            requested(&body(json!({"tools": weather(), "tool_choice": "none"})))
                .unwrap()
                .is_none()
        );
        assert!(requested(&body(json!({}))).unwrap().is_none());
    }

    #[test]
    fn mistakes_name_their_field() {
        for (v, param) in [
            (
                json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "fly"}}}),
                "tool_choice",
            ),
            (
                json!({"tools": weather(), "tool_choice": "sometimes"}),
                "tool_choice",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a", "parameters": 3}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"functions": [{"name": "a"}, {"name": "a"}]}),
                "tools",
            ),
        ] {
            let e = requested(&body(v.clone())).expect_err("refused");
            assert_eq!(e.param.as_deref(), Some(param), "{v}");
        }
    }

    #[test]
    fn answers_are_read_back() {
        let t = requested(&body(json!({"tools": weather()})))
            .unwrap()
            .unwrap();
        assert_eq!(
            t.parse(r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Ur"}}]}"#),
            Some(Said::Calls {
                content: None,
                calls: vec![Call {
                    name: "get_weather".into(),
                    arguments: r#"{"city": "Ur"}"#.into()
                }]
            })
        );
        assert_eq!(
            t.parse(r#"{"response": "Shalom"}"#),
            Some(Said::Reply("Shalom".into()))
        );
        assert_eq!(t.parse(r#"{"tool_calls": [{"name": "get_wea"#), None);
        // A reply cut short by max_tokens is what it says so far.
        assert_eq!(
            t.parse(r#"{"response": "Sha\u00e9 lo"#),
            Some(Said::Reply("Shaé lo".into()))
        );
    }
}
