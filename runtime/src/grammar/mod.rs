//! Constrained decoding: a JSON schema, a Lark grammar or a regular expression becomes, at each
//! step, the set of tokens a sequence may sample next. The grammars are llguidance's (the
//! library behind llama.cpp's, vLLM's, SGLang's and OpenAI's structured outputs), run over a
//! token trie of the model's own tokenizer; the scheduler applies the mask to a sequence's
//! logits before its sampler sees them ([`crate::scheduler::Constraint`]).

mod gbnf;

use std::sync::Arc;

use hesper_engine::tokenizer::Tokenizer;
use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use thiserror::Error;

pub use gbnf::gbnf_to_lark;

/// What an answer must match.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A value valid against a JSON schema.
    JsonSchema(Value),
    /// A Lark grammar as llguidance reads it (its `start` rule is the answer).
    Lark(String),
    /// A regular expression the whole answer matches.
    Regex(String),
}

/// Why a grammar cannot be used.
#[derive(Debug, Error)]
pub enum GrammarError {
    /// The tokenizer could not be made into a token trie.
    #[error("constrained decoding is not available for this tokenizer: {0}")]
    Tokenizer(String),
    /// The schema or grammar does not compile (a syntax error, an unsupported keyword, a
    /// limit passed); the message names what.
    #[error("{0}")]
    Invalid(String),
}

/// Separators of constrained JSON, as Python's `json.dumps` writes them: fixed, so that an
/// answer cannot run on in whitespace (a model that wanders would otherwise never finish).
const JSON_OPTIONS: &str = r#"{"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "lenient": false}"#;

/// The grammars of one tokenizer: its token trie, built once, and the limits every grammar
/// runs within (llguidance's defaults: a hostile grammar runs out of fuel, it does not hang).
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab", &self.factory.tok_env().tok_trie().vocab_size())
            .finish()
    }
}

impl Grammars {
    /// The token trie of `tok`: each token's bytes, control tokens marked as special (a
    /// grammar never produces them as text), the end-of-generation tokens as its ends.
    pub fn new(tok: Arc<Tokenizer>) -> Result<Self, GrammarError> {
        let n = tok.vocab_size();
        let ends: Vec<u32> = (0..n as u32)
            .filter(|&t| tok.is_end_of_generation(t))
            .collect();
        let Some(&eos) = tok.eos().as_ref().or(ends.first()) else {
            return Err(GrammarError::Tokenizer(
                "it has no end-of-generation token".into(),
            ));
        };
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|t| {
                let bytes = tok.token_bytes(t);
                if tok.is_special(t) && !bytes.is_empty() {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend(bytes);
                    w
                } else {
                    bytes
                }
            })
            .collect();
        let mut info = TokRxInfo::new(n as u32, eos);
        info.tok_bos = tok.bos();
        let mut all_ends = ends;
        if !all_ends.contains(&eos) {
            all_ends.push(eos);
        }
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&all_ends);
        let env: TokEnv = Arc::new(Env { tok, trie });
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| GrammarError::Tokenizer(e.to_string()))?;
        factory.set_stderr_log_level(0);
        *factory.limits_mut() = ParserLimits {
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(Self {
            factory: Arc::new(factory),
        })
    }

    /// Compiles `spec` into the constraint of one answer; [`GrammarConstraint::clone`] gives
    /// more answers the same constraint from the start.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<GrammarConstraint, GrammarError> {
        let grammar = match spec {
            GrammarSpec::JsonObject => json_grammar(json!({"type": "object"})),
            GrammarSpec::JsonSchema(schema) => json_grammar(schema.clone()),
            GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| GrammarError::Invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Invalid(e));
        }
        Ok(GrammarConstraint { matcher })
    }
}

/// `schema` as a grammar: [`prepared_schema`].
fn json_grammar(schema: Value) -> TopLevelGrammar {
    TopLevelGrammar::from_json_schema(prepared_schema(schema))
}

/// `schema` as every answer here follows it: with the separators of [`JSON_OPTIONS`] unless it
/// sets its own (`x-guidance`), its objects closed as [`close_objects`] says. A Lark grammar's
/// `%json { … }` takes it as it is.
pub fn prepared_schema(mut schema: Value) -> Value {
    close_objects(&mut schema);
    if let Value::Object(map) = &mut schema {
        let mut options: Value = serde_json::from_str(JSON_OPTIONS).expect("constant JSON");
        if let Some(own) = map.get("x-guidance") {
            llguidance::json_merge(&mut options, own);
        }
        map.insert("x-guidance".into(), options);
    }
    schema
}

/// Gives every object schema that lists `properties` but says nothing of other keys
/// `additionalProperties: false`, as llama.cpp reads a schema: a client that leaves it out (a
/// Pydantic model, most tool definitions) means the fields it lists, and a model left free to
/// add keys may write them without end. Subschemas are followed where JSON Schema puts them;
/// `allOf`'s parts are left open, as each may list only some of the fields.
fn close_objects(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    if map.get("properties").is_some_and(Value::is_object)
        && !map.contains_key("additionalProperties")
        && !map.contains_key("patternProperties")
        && !map.contains_key("unevaluatedProperties")
    {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, sub) in map.iter_mut() {
        match (key.as_str(), sub) {
            ("properties" | "patternProperties" | "$defs" | "definitions", Value::Object(m)) => {
                m.values_mut().for_each(close_objects)
            }
            ("anyOf" | "oneOf" | "prefixItems" | "items", Value::Array(a)) => {
                a.iter_mut().for_each(close_objects)
            }
            (
                "items"
                | "additionalProperties"
                | "additionalItems"
                | "not"
                | "if"
                | "then"
                | "else"
                | "contains",
                sub,
            ) => close_objects(sub),
            _ => {}
        }
    }
}

/// llguidance's view of the tokenizer.
struct Env {
    tok: Arc<Tokenizer>,
    trie: TokTrie,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        // Text a grammar forces; not valid UTF-8 only when cut inside a character, where the
        // trie's greedy split is as good as any.
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tok
                .encode_continuation(text)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// One answer's grammar state: which tokens may come next, advanced by each token sampled.
pub struct GrammarConstraint {
    matcher: Matcher,
}

impl Clone for GrammarConstraint {
    /// An independent copy (llguidance's own `clone` shares the lexer's state between the
    /// copies, and each answer advances its own).
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
        }
    }
}

impl GrammarConstraint {
    /// Sets the logits of the tokens the grammar does not allow next to −∞ (ids past the
    /// tokenizer's, a padded output row's, included).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self.matcher.compute_mask().map_err(|e| e.to_string())?;
        if allowed.is_zero() {
            return Err("the grammar allows no token here".into());
        }
        let words = allowed.as_slice();
        for (chunk, &bits) in logits.chunks_mut(32).zip(words) {
            match bits {
                0 => chunk.fill(f32::NEG_INFINITY),
                u32::MAX => {}
                _ => {
                    for (b, l) in chunk.iter_mut().enumerate() {
                        if bits & (1 << b) == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        let covered = words.len() * 32;
        if logits.len() > covered {
            logits[covered..].fill(f32::NEG_INFINITY);
        }
        Ok(())
    }

    /// Advances over a sampled token; `Ok(true)` when the answer is complete and nothing may
    /// follow it.
    pub fn accept(&mut self, token: u32) -> Result<bool, String> {
        self.matcher
            .consume_token(token)
            .map_err(|e| e.to_string())?;
        Ok(self.matcher.is_stopped())
    }
}

#[cfg(test)]
mod tests {
    use super::close_objects;
    use serde_json::json;

    #[test]
    fn objects_without_a_word_on_other_keys_are_closed() {
        let mut s = json!({
            "type": "object",
            "properties": {
                "properties": {"type": "object", "properties": {"a": {}}},
                "open": {"type": "object", "properties": {}, "additionalProperties": true},
                "list": {"type": "array", "items": {"properties": {"b": {}}}}
            },
            "$defs": {"d": {"anyOf": [{"properties": {"c": {}}}, {"type": "null"}]}},
            "allOf": [{"properties": {"x": {}}}]
        });
        close_objects(&mut s);
        assert_eq!(s["additionalProperties"], false);
        // A property named "properties" is a field, not a keyword: its schema is closed.
        assert_eq!(s["properties"]["properties"]["additionalProperties"], false);
        assert!(s["properties"].get("additionalProperties").is_none());
        assert_eq!(s["properties"]["open"]["additionalProperties"], true);
        assert_eq!(
            s["properties"]["list"]["items"]["additionalProperties"],
            false
        );
        assert_eq!(s["$defs"]["d"]["anyOf"][0]["additionalProperties"], false);
        assert!(s["allOf"][0].get("additionalProperties").is_none());
    }
}
