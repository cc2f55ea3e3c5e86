//! Structured outputs: OpenAI's `response_format` and llama-server's `json_schema` and `grammar`
//! read into one grammar and compiled against the model's tokenizer. The scheduler then masks
//! the answer's tokens at every step, so the answer follows the schema whatever the model
//! would have said; a schema or grammar that cannot be followed exactly is a 400 naming why.

use std::sync::Arc;

use axum::http::StatusCode;
use hesper_runtime::grammar::{
    gbnf_to_lark, prepared_schema, GrammarConstraint, GrammarError, GrammarSpec, Grammars,
};
use serde_json::Value;

use crate::error::ApiError;
use crate::reasoning::{harmony_lark, HARMONY_JSON_TYPE};
use crate::request::CompletionBody;
use crate::Ready;

/// What a request's answer must follow, and the field that asked for it.
#[derive(Debug, Clone)]
pub struct Structure {
    /// The grammar.
    pub spec: GrammarSpec,
    /// `response_format`, `json_schema` or `grammar`.
    pub param: &'static str,
}

impl Structure {
    /// A JSON structure as the body of a Harmony answer's final channel, after any analysis
    /// and commentary messages (as llama.cpp constrains gpt-oss); a grammar of the client's
    /// own is left as it is.
    pub fn in_final_channel(self) -> Self {
        let schema = match &self.spec {
            GrammarSpec::JsonObject => serde_json::json!({"type": "object"}),
            GrammarSpec::JsonSchema(schema) => schema.clone(),
            _ => return self,
        };
        let last = format!(
            "\"<|channel|>final\" {HARMONY_JSON_TYPE} \"<|message|>\" %json {}",
            prepared_schema(schema)
        );
        Self {
            spec: GrammarSpec::Lark(harmony_lark(&last)),
            param: self.param,
        }
    }
}

/// The structure `b` asks for, if any; more than one field asking is a 400.
pub fn requested(b: &CompletionBody) -> Result<Option<Structure>, ApiError> {
    let mut found = Vec::new();
    if let Some(f) = &b.response_format {
        let spec = match f.kind.as_str() {
            "text" => None,
            "json_object" => Some(match &f.schema {
                Some(schema) => {
                    GrammarSpec::JsonSchema(schema_object(schema, "response_format.schema")?)
                }
                None => GrammarSpec::JsonObject,
            }),
            "json_schema" => {
                let Some(js) = &f.json_schema else {
                    return Err(ApiError::bad_param(
                        "response_format.json_schema",
                        "response_format of type json_schema needs json_schema",
                    ));
                };
                Some(match &js.schema {
                    Some(schema) => GrammarSpec::JsonSchema(schema_object(
                        schema,
                        "response_format.json_schema.schema",
                    )?),
                    None => GrammarSpec::JsonSchema(serde_json::json!({})),
                })
            }
            other => {
                return Err(ApiError::bad_param(
                    "response_format.type",
                    format!("response_format type {other:?}: text, json_object or json_schema"),
                ))
            }
        };
        if let Some(spec) = spec {
            found.push(Structure {
                spec,
                param: "response_format",
            });
        }
    }
    if let Some(schema) = &b.json_schema {
        found.push(Structure {
            spec: GrammarSpec::JsonSchema(schema_object(schema, "json_schema")?),
            param: "json_schema",
        });
    }
    if let Some(text) = &b.grammar {
        let spec = if text.trim_start().starts_with("%llguidance") {
            GrammarSpec::Lark(text.clone())
        } else {
            GrammarSpec::Lark(
                gbnf_to_lark(text)
                    .map_err(|e| ApiError::bad_param("grammar", format!("grammar (GBNF): {e}")))?,
            )
        };
        found.push(Structure {
            spec,
            param: "grammar",
        });
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(ApiError::bad_param(
            found[1].param,
            format!(
                "{} and {} both constrain the answer: give one",
                found[0].param, found[1].param
            ),
        )),
    }
}

/// A schema must be a JSON object (or `true`, any value).
fn schema_object(schema: &Value, param: &str) -> Result<Value, ApiError> {
    match schema {
        Value::Object(_) => Ok(schema.clone()),
        Value::Bool(true) => Ok(serde_json::json!({})),
        _ => Err(ApiError::bad_param(
            param,
            format!("{param}: a JSON schema is an object"),
        )),
    }
}

/// Compiles `structure` for `ready`'s tokenizer (the tokenizer's trie is built by the first
/// request that needs it), off the async workers: a large schema takes milliseconds.
pub async fn compile(
    ready: &Arc<Ready>,
    structure: Structure,
) -> Result<GrammarConstraint, ApiError> {
    let r = Arc::clone(ready);
    let spec = structure.spec;
    let compiled = tokio::task::spawn_blocking(move || {
        let grammars = r
            .grammars
            .get_or_init(|| Grammars::new(r.tok.clone()).map_err(|e| e.to_string()));
        match grammars {
            Ok(g) => g.compile(&spec),
            Err(why) => Err(GrammarError::Tokenizer(why.clone())),
        }
    })
    .await
    .map_err(|_| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "compiling the grammar failed",
        )
    })?;
    compiled.map_err(|e| {
        let why = e.to_string();
        ApiError::bad_param(
            structure.param,
            format!("{}: {}", structure.param, first_line(&why)),
        )
    })
}

/// llguidance's messages may go on with the grammar's text: the first line says what.
fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s).trim()
}
