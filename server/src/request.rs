//! Request bodies of `/v1/chat/completions` and `/v1/completions` (OpenAI's fields and
//! llama-server's extras), read with the field at fault named when one has the wrong type.
//! Unknown fields are accepted and ignored.

use std::collections::HashMap;

use hesper_engine::sampler::SamplerConfig;
use hesper_runtime::settings;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::ApiError;
pub use crate::tools::{FunctionDef, ToolDef};

/// The largest bias `logit_bias` adds or takes away, OpenAI's range: larger values are
/// brought to it (llama-server clients send larger ones to force or ban a token, which ±100
/// does as well). Past it, two forced tokens would be +∞ alike and no seed could choose.
pub const LOGIT_BIAS_LIMIT: f64 = 100.0;

/// Both endpoints' body: chat sends `messages`, text completion `prompt`.
#[derive(Debug, Default, Deserialize)]
pub struct CompletionBody {
    /// The model asked for (answers carry it back; one model is served).
    pub model: Option<String>,
    /// Chat messages.
    pub messages: Option<Vec<Message>>,
    /// Text completion's prompt.
    pub prompt: Option<Prompt>,
    /// Most tokens to generate.
    pub max_tokens: Option<i64>,
    /// Chat's newer name for `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    /// Sampling temperature (0: greedy).
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Seed of the sampler (-1: from the clock).
    pub seed: Option<i64>,
    /// Text that ends the answer (not included).
    pub stop: Option<Stop>,
    /// Answers per prompt.
    pub n: Option<u32>,
    /// Chat: `true` for log-probabilities; completions: how many alternatives.
    pub logprobs: Option<LogprobsField>,
    /// Chat: alternatives per token with `logprobs`.
    pub top_logprobs: Option<u32>,
    /// Token id (as a string) → bias added to its logit (within ±[`LOGIT_BIAS_LIMIT`]).
    pub logit_bias: Option<HashMap<String, f64>>,
    /// OpenAI's presence penalty.
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Stream the answer as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// llama-server's top-k.
    pub top_k: Option<i64>,
    /// llama-server's min-p.
    pub min_p: Option<f32>,
    /// llama-server's repeat penalty.
    pub repeat_penalty: Option<f32>,
    /// llama-server's window of the penalties.
    pub repeat_last_n: Option<i64>,
    /// llama-server's: reuse the cached KV of a shared prefix (default true).
    pub cache_prompt: Option<bool>,
    /// llama-server's: go on past end-of-generation tokens (benchmarks).
    pub ignore_eos: Option<bool>,
    /// OpenAI's output format: `text`, `json_object` or `json_schema`.
    pub response_format: Option<ResponseFormat>,
    /// llama-server's: a JSON schema the answer follows.
    pub json_schema: Option<serde_json::Value>,
    /// llama-server's: a grammar the answer follows (GBNF, or Lark after `%llguidance`).
    pub grammar: Option<String>,
    /// Tools the model may call.
    pub tools: Option<Vec<ToolDef>>,
    /// `auto`, `none`, `required` or a function.
    pub tool_choice: Option<serde_json::Value>,
    /// Whether an answer may call several tools (default true).
    pub parallel_tool_calls: Option<bool>,
    /// The older name of `tools` (functions only).
    pub functions: Option<Vec<FunctionDef>>,
    /// The older name of `tool_choice`.
    pub function_call: Option<serde_json::Value>,
    /// llama-server's: `auto`, `deepseek` (thoughts to `reasoning_content`) or `none`.
    pub reasoning_format: Option<String>,
    /// llama-server's: more variables for the chat template (`{"enable_thinking": false}`).
    pub chat_template_kwargs: Option<serde_json::Value>,
    /// OpenAI's reasoning effort, given to the chat template as `reasoning_effort`.
    pub reasoning_effort: Option<String>,
}

/// `response_format`.
#[derive(Debug, Deserialize)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// With `json_schema`: the schema, its name and strictness.
    pub json_schema: Option<JsonSchemaFormat>,
    /// llama-server's: a schema given with `json_object`.
    pub schema: Option<serde_json::Value>,
}

/// `response_format.json_schema`.
#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    /// The format's name (OpenAI requires one; it changes nothing here).
    pub name: Option<String>,
    /// The schema (absent: any JSON value).
    pub schema: Option<serde_json::Value>,
    /// Whether the schema is followed exactly (it always is here).
    pub strict: Option<bool>,
}

/// One chat message.
#[derive(Debug, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` (`developer` reads as `system`).
    pub role: String,
    /// Its text.
    pub content: Option<Content>,
    /// An assistant turn's tool calls.
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A `tool` turn: the call it answers.
    pub tool_call_id: Option<String>,
    /// A `tool` or `function` turn: the function that answered.
    pub name: Option<String>,
    /// An assistant turn's thought, as this server answered it.
    pub reasoning_content: Option<String>,
}

/// A tool call in the conversation's history.
#[derive(Debug, Deserialize)]
pub struct ToolCallIn {
    /// Its id.
    pub id: Option<String>,
    /// The function called.
    pub function: FunctionCallIn,
}

/// The function of a tool call in the history.
#[derive(Debug, Deserialize)]
pub struct FunctionCallIn {
    /// Its name.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: Option<String>,
}

/// A message's content: text, or parts of which the text ones are read.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<Part>),
}

/// A content part.
#[derive(Debug, Deserialize)]
pub struct Part {
    /// `text` (others are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// A completion's prompt: text, several texts (one answer set each), or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// `stop`: one string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `logprobs`: chat's flag or completions' count.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum LogprobsField {
    /// Chat's.
    Flag(bool),
    /// Completions'.
    Count(u32),
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the token counts.
    pub include_usage: Option<bool>,
}

/// Most stop strings (OpenAI allows 4; llama-server any).
const MAX_STOPS: usize = 16;
/// Most answers per prompt.
const MAX_N: u32 = 16;
/// Most alternatives per token (OpenAI: 20).
const MAX_TOP_LOGPROBS: u32 = 20;

/// Reads a JSON body of type `T`; a malformed body or a field of the wrong type is a 400
/// naming the field.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() || path == "." {
            ApiError::bad_request(format!(
                "the body is not a JSON object of the expected form: {inner}"
            ))
        } else {
            ApiError::bad_param(&path, format!("{path}: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

impl CompletionBody {
    /// The stop strings (empty ones dropped).
    pub fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops: Vec<String> = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stops.len() > MAX_STOPS {
            return Err(ApiError::bad_param(
                "stop",
                format!("at most {MAX_STOPS} stop strings"),
            ));
        }
        Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
    }

    /// Answers per prompt.
    pub fn n(&self) -> Result<usize, ApiError> {
        match self.n.unwrap_or(1) {
            n @ 1..=MAX_N => Ok(n as usize),
            n => Err(ApiError::bad_param(
                "n",
                format!("n {n}: must be 1 to {MAX_N}"),
            )),
        }
    }

    /// The token limit asked for (`None`: until the context is full).
    pub fn max_tokens(&self) -> Result<Option<usize>, ApiError> {
        let (param, v) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(v), _) => ("max_completion_tokens", v),
            (None, Some(v)) => ("max_tokens", v),
            (None, None) => return Ok(None),
        };
        match v {
            -1 => Ok(None),
            v if v >= 0 => Ok(Some(v as usize)),
            v => Err(ApiError::bad_param(
                param,
                format!("{param} {v}: give a count, or -1 for until the context is full"),
            )),
        }
    }

    /// Alternatives per token wanted (`None`: no log-probabilities); `chat` reads chat's
    /// `logprobs` + `top_logprobs`, else completions' `logprobs` count.
    pub fn top_logprobs(&self, chat: bool) -> Result<Option<usize>, ApiError> {
        let k = match (self.logprobs, chat) {
            (None | Some(LogprobsField::Flag(false)), _) => {
                if self.top_logprobs.is_some_and(|k| k > 0) && chat {
                    return Err(ApiError::bad_param(
                        "top_logprobs",
                        "top_logprobs needs logprobs: true",
                    ));
                }
                return Ok(None);
            }
            (Some(LogprobsField::Flag(true)), true) => self.top_logprobs.unwrap_or(0),
            (Some(LogprobsField::Count(k)), false) => k,
            (Some(_), true) => {
                return Err(ApiError::bad_param(
                    "logprobs",
                    "logprobs: a boolean in chat",
                ))
            }
            (Some(LogprobsField::Flag(true)), false) => 1,
        };
        if k > MAX_TOP_LOGPROBS {
            let param = if chat { "top_logprobs" } else { "logprobs" };
            return Err(ApiError::bad_param(
                param,
                format!("{param} {k}: at most {MAX_TOP_LOGPROBS}"),
            ));
        }
        Ok(Some(k as usize))
    }

    /// The sampler's settings: OpenAI's names over llama.cpp's defaults; a seed from the
    /// clock when none (or -1) is given; `n_vocab` bounds `logit_bias`'s ids.
    pub fn sampling(&self, n_vocab: usize) -> Result<SamplerConfig, ApiError> {
        let d = SamplerConfig::default();
        let finite = |param: &str, v: Option<f32>, default: f32| match v {
            Some(x) if !x.is_finite() => Err(ApiError::bad_param(
                param,
                format!("{param}: must be a finite number"),
            )),
            Some(x) => Ok(x),
            None => Ok(default),
        };
        let top_k = match self.top_k {
            None => d.top_k,
            Some(k) if k <= 0 => 0,
            Some(k) => k as usize,
        };
        let repeat_last_n = match self.repeat_last_n {
            None => d.repeat_last_n,
            Some(-1) => usize::MAX,
            Some(k) if k >= 0 => k as usize,
            Some(k) => {
                return Err(ApiError::bad_param(
                    "repeat_last_n",
                    format!("repeat_last_n {k}: a count, or -1 for the whole context"),
                ))
            }
        };
        let mut logit_bias = Vec::new();
        for (id, &bias) in self.logit_bias.iter().flatten() {
            let t = id.parse::<u32>().ok().filter(|&t| (t as usize) < n_vocab);
            let Some(t) = t else {
                return Err(ApiError::bad_param(
                    "logit_bias",
                    format!("logit_bias: {id:?} is not a token id below {n_vocab}"),
                ));
            };
            if !bias.is_finite() {
                return Err(ApiError::bad_param(
                    "logit_bias",
                    format!("logit_bias: token {t}'s bias {bias} is not a finite number"),
                ));
            }
            let bias = bias.clamp(-LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT) as f32;
            logit_bias.push((t, bias));
        }
        logit_bias.sort_by_key(|&(t, _)| t);
        let c = SamplerConfig {
            temperature: finite("temperature", self.temperature, d.temperature)?,
            top_k,
            top_p: finite("top_p", self.top_p, d.top_p)?,
            min_p: finite("min_p", self.min_p, d.min_p)?,
            repeat_penalty: finite("repeat_penalty", self.repeat_penalty, d.repeat_penalty)?,
            repeat_last_n,
            frequency_penalty: finite("frequency_penalty", self.frequency_penalty, 0.0)?,
            presence_penalty: finite("presence_penalty", self.presence_penalty, 0.0)?,
            logit_bias,
            seed: match self.seed {
                None | Some(-1) => settings::clock_seed(),
                Some(s) => s as u64,
            },
        };
        settings::check(&c).map_err(|e| {
            let param = e.flag.trim_start_matches("--").replace('-', "_");
            let param = if param == "temp" {
                "temperature".into()
            } else {
                param
            };
            ApiError::bad_param(&param, format!("{param} {}: {}", e.value, e.why))
        })?;
        Ok(c)
    }
}
