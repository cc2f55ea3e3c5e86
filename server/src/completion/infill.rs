//! `POST /infill`, llama-server's fill-in-the-middle completion for code models: the text
//! around the cursor (`input_prefix`, `input_suffix`), other files (`input_extra`, each
//! `{"filename", "text"}`) and the start of the middle (`prompt`) become one prompt of the
//! model's FIM tokens, laid out as llama-server lays it out; the rest of the request and the
//! answer are `/completion`'s. A model without prefix, suffix and middle tokens is a 400.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State as Ext;
use axum::response::{IntoResponse, Response};
use hesper_engine::tokenizer::{FimTokens, Tokenizer};
use serde_json::{json, Value};

use super::native;
use crate::error::ApiError;
use crate::State;

/// `POST /infill`.
pub async fn create(Ext(state): Ext<Arc<State>>, body: Body) -> Response {
    let ready = match state.ready() {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let layout = Layout {
        n_batch: ready.n_batch,
        n_ctx: ready.n_ctx,
    };
    native::respond(state, body, |r| infill_body(&ready.tok, layout, r)).await
}

/// The `/completion` request an infill request asks for: its prompt the FIM tokens' layout.
fn infill_body(tok: &Tokenizer, layout: Layout, r: &Value) -> Result<Value, ApiError> {
    let fim = tok.fim();
    fim.infill()
        .map_err(|why| ApiError::bad_request(format!("this model cannot infill: {why}")))?;
    let obj = r
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object"))?;
    let encode = |field: &str, text: &str, special: bool| {
        tok.encode(text, false, special)
            .map_err(|e| ApiError::bad_param(field, format!("{field}: {e}")))
    };
    let mixed = |field: &str| -> Result<Vec<u32>, ApiError> {
        let bad = || {
            ApiError::bad_param(
                field,
                format!("{field} is required: a string, or a list of strings and token ids"),
            )
        };
        match obj.get(field) {
            Some(Value::String(s)) => encode(field, s, false),
            Some(Value::Array(parts)) => {
                let mut ids = Vec::new();
                for p in parts {
                    match p {
                        Value::String(s) => ids.extend(encode(field, s, false)?),
                        Value::Number(n) => {
                            let id = n.as_u64().filter(|&i| (i as usize) < tok.vocab_size());
                            ids.push(id.ok_or_else(bad)? as u32);
                        }
                        _ => return Err(bad()),
                    }
                }
                Ok(ids)
            }
            _ => Err(bad()),
        }
    };
    let prefix = mixed("input_prefix")?;
    let suffix = mixed("input_suffix")?;
    let prompt = match obj.get("prompt") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => encode("prompt", s, true)?,
        Some(_) => return Err(ApiError::bad_param("prompt", "prompt must be a string")),
    };
    let extra = extra_files(obj.get("input_extra"))?;
    let mut extra_tokens = Vec::new();
    for (name, text) in &extra {
        extra_tokens.push((
            encode("input_extra", name, false)?,
            encode("input_extra", text, false)?,
        ));
    }
    let pieces = Pieces {
        prefix,
        suffix,
        prompt,
        extra: extra_tokens,
        repo: encode("input_extra", "myproject\n", false)?,
        snippet: encode("input_extra", SNIPPET, false)?,
        current: encode("input_extra", "filename\n", false)?,
    };
    let bos = tok.add_bos().then(|| tok.bos()).flatten();
    let ids = layout.prompt(fim, bos, pieces);
    let mut body = obj.clone();
    for k in ["input_prefix", "input_suffix", "input_extra"] {
        body.remove(k);
    }
    body.insert("prompt".into(), json!(ids));
    native::completion_body(&Value::Object(body))
}

/// What separates the other files where the model has no file separator.
const SNIPPET: &str = "\n\n--- snippet ---\n\n";

/// `input_extra`'s files as (file name and a newline, text); a file without a name is
/// `tmp`, as llama-server names it.
fn extra_files(v: Option<&Value>) -> Result<Vec<(String, String)>, ApiError> {
    let bad = || {
        ApiError::bad_param(
            "input_extra",
            "input_extra: a list of {\"filename\": string, \"text\": string}",
        )
    };
    let files = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(files)) => files,
        Some(_) => return Err(bad()),
    };
    files
        .iter()
        .map(|f| {
            let text = f.get("text").and_then(Value::as_str).ok_or_else(bad)?;
            let name = match f.get("filename") {
                None => "tmp",
                Some(n) => n.as_str().ok_or_else(bad)?,
            };
            Ok((format!("{name}\n"), text.to_string()))
        })
        .collect()
}

/// The tokens an infill prompt is made of.
struct Pieces {
    /// The text before the cursor, after the cursor, and the start of the middle.
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    prompt: Vec<u32>,
    /// Each other file's name (with its newline) and text.
    extra: Vec<(Vec<u32>, Vec<u32>)>,
    /// `myproject\n`, `SNIPPET` and `filename\n`: the repository's name, the separator of
    /// files without a separator token, and the current file's name.
    repo: Vec<u32>,
    snippet: Vec<u32>,
    current: Vec<u32>,
}

/// The sizes that bound an infill prompt.
#[derive(Clone, Copy)]
struct Layout {
    /// Tokens per step (`-b`): the prefix may take three quarters, the suffix the rest.
    n_batch: usize,
    /// Positions of a sequence: the other files fill what the batch leaves.
    n_ctx: usize,
}

impl Layout {
    /// llama-server's layout: the other files (the repo-level pattern where the model has its
    /// tokens), BOS, `PRE prefix prompt`, `SUF suffix`, `MID`; the prefix keeps its end and
    /// the suffix its start when they are cut to the batch.
    fn prompt(self, fim: FimTokens, bos: Option<u32>, p: Pieces) -> Vec<u32> {
        let (pre, suf, mid) = fim.infill().expect("checked by the caller");
        let mut extra = Vec::new();
        if let Some(rep) = fim.rep {
            extra.push(rep);
            extra.extend(&p.repo);
        }
        for (name, text) in &p.extra {
            match fim.sep {
                Some(sep) => {
                    extra.push(sep);
                    extra.extend(name);
                }
                None => extra.extend(&p.snippet),
            }
            extra.extend(text);
        }
        if let Some(sep) = fim.sep {
            extra.push(sep);
            extra.extend(&p.current);
        }
        let quarter = self.n_batch / 4;
        let prefix_take = p.prefix.len().min(3 * quarter);
        let suffix_take = p
            .suffix
            .len()
            .min(quarter.saturating_sub(2 + p.prompt.len()));
        // The server's own token limit is llama-server's default, -1: two positions.
        let extra_take = (self.n_ctx + 2)
            .saturating_sub(self.n_batch)
            .min(extra.len());
        let mut out = extra[extra.len() - extra_take..].to_vec();
        out.extend(bos);
        out.push(pre);
        out.extend(&p.prefix[p.prefix.len() - prefix_take..]);
        out.extend(&p.prompt);
        out.push(suf);
        out.extend(&p.suffix[..suffix_take]);
        out.push(mid);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fim(rep: Option<u32>, sep: Option<u32>) -> FimTokens {
        FimTokens {
            pre: Some(1000),
            suf: Some(1001),
            mid: Some(1002),
            pad: None,
            rep,
            sep,
        }
    }

    fn pieces() -> Pieces {
        Pieces {
            prefix: (0..10).collect(),
            suffix: (20..30).collect(),
            prompt: vec![40, 41],
            extra: vec![(vec![50], vec![51, 52]), (vec![60], vec![61])],
            repo: vec![70],
            snippet: vec![80, 81],
            current: vec![90],
        }
    }

    #[test]
    fn the_layout_is_llama_servers() {
        let roomy = Layout {
            n_batch: 2048,
            n_ctx: 4096,
        };
        // No repository tokens: the other files after snippet separators, then BOS.
        assert_eq!(
            roomy.prompt(fim(None, None), Some(7), pieces()),
            [
                &[80, 81, 51, 52, 80, 81, 61][..],
                &[7, 1000],
                &(0..10).collect::<Vec<_>>(),
                &[40, 41, 1001],
                &(20..30).collect::<Vec<_>>(),
                &[1002]
            ]
            .concat()
        );
        // The repo-level pattern: the repository, each file after its name, the current file.
        assert_eq!(
            roomy.prompt(fim(Some(2000), Some(2001)), None, pieces())[..12],
            [2000, 70, 2001, 50, 51, 52, 2001, 60, 61, 2001, 90, 1000]
        );
    }

    #[test]
    fn a_small_batch_keeps_the_prefixs_end_and_the_suffixs_start() {
        // Batch 16: the prefix keeps 12 (all 10), the suffix 4 - (2 + 2) = 0 tokens; a
        // context of 20 leaves room for 6 tokens of the other files, the last ones.
        let small = Layout {
            n_batch: 16,
            n_ctx: 20,
        };
        let got = small.prompt(fim(None, None), None, pieces());
        assert_eq!(&got[..6], [81, 51, 52, 80, 81, 61]);
        assert_eq!(&got[got.len() - 4..], [40, 41, 1001, 1002]);
        // Batch 8: the prefix keeps its last 6 tokens, the suffix none; a context of 8 leaves
        // the other files 8 - 8 + 2 tokens.
        let tiny = Layout {
            n_batch: 8,
            n_ctx: 8,
        };
        let got = tiny.prompt(fim(None, None), None, pieces());
        assert_eq!(got, [81, 61, 1000, 4, 5, 6, 7, 8, 9, 40, 41, 1001, 1002]);
    }
}
