//! `GET /slots`, llama-server's monitoring endpoint: each of the `-np` sequence slots, with the
//! request running in it (its prompt and what it has generated, tokens evaluated and taken
//! from the prefix cache, the sampling settings, the KV positions its cache holds), taken
//! from the scheduler between two steps. `?fail_on_no_slot=1` answers 503 when every slot is
//! busy (a load balancer's probe). Off with `--no-slots` (501), as llama-server's.

use std::sync::Arc;

use axum::extract::{Query, State as Ext};
use axum::http::StatusCode;
use axum::Json;
use hesper_engine::tokenizer::Tokenizer;
use hesper_runtime::scheduler::{Slot, SlotSeq, SubmitError};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::State;

/// `GET /slots`' query.
#[derive(Deserialize)]
pub struct SlotsQuery {
    /// Any value: a 503 when no slot is idle.
    fail_on_no_slot: Option<String>,
}

/// `GET /slots`.
pub async fn slots(
    Ext(state): Ext<Arc<State>>,
    Query(q): Query<SlotsQuery>,
) -> Result<Json<Value>, ApiError> {
    if !state.config.slots {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "the slots endpoint is off: start the server without --no-slots",
        ));
    }
    let ready = state.ready()?;
    let stopped = || {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the model's scheduler stopped",
        )
    };
    let reply = ready.submitter.slots().map_err(|e| match e {
        SubmitError::Full => ApiError::unavailable("too many /slots requests at once", 1),
        SubmitError::Closed => stopped(),
    })?;
    let slots = reply.await.map_err(|_| stopped())?;
    if q.fail_on_no_slot.is_some() && slots.idle() == 0 {
        return Err(ApiError::unavailable("no slot available", 1));
    }
    let shown = slots
        .slots
        .iter()
        .map(|s| slot(s, slots.n_ctx, &ready.tok))
        .collect();
    Ok(Json(Value::Array(shown)))
}

/// One slot as llama-server shows it (`n_kv_positions`: the KV positions its cache holds in
/// the shared pool, hesper-rs' own).
fn slot(s: &Slot, n_ctx: usize, tok: &Tokenizer) -> Value {
    let mut v = json!({
        "id": s.id,
        "n_ctx": n_ctx,
        "speculative": false,
        "is_processing": s.seq.is_some(),
    });
    if let Some(seq) = &s.seq {
        let fields = running(seq, tok);
        if let (Some(v), Value::Object(f)) = (v.as_object_mut(), fields) {
            v.extend(f);
        }
    }
    v
}

/// The fields of a slot with a sequence.
fn running(seq: &SlotSeq, tok: &Tokenizer) -> Value {
    let n_prompt = seq.prompt.len();
    let generated = tok.decode(&seq.generated);
    let c = &seq.sampling;
    json!({
        "id_task": seq.id,
        "n_prompt_tokens": n_prompt,
        "n_prompt_tokens_processed": seq.evaluated.min(n_prompt).saturating_sub(seq.cached),
        "n_prompt_tokens_cache": seq.cached,
        "n_kv_positions": seq.kv_positions,
        "params": {
            "n_predict": seq.generated.len() + seq.remaining,
            "seed": c.seed,
            "temperature": c.temperature,
            "top_k": c.top_k,
            "top_p": c.top_p,
            "min_p": c.min_p,
            "repeat_last_n": c.repeat_last_n,
            "repeat_penalty": c.repeat_penalty,
            "presence_penalty": c.presence_penalty,
            "frequency_penalty": c.frequency_penalty,
        },
        "next_token": [{
            "has_next_token": seq.remaining > 0,
            "has_new_line": generated.contains('\n'),
            "n_remain": seq.remaining,
            "n_decoded": seq.generated.len(),
        }],
        "prompt": tok.decode(&seq.prompt),
        "generated": generated,
    })
}
