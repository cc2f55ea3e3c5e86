//! Hot-swap (`serve --hot-swap`): `GET /health` and `POST /reload` ask the scheduler to swap in
//! the tensors that changed in the model file, between two steps (ik_llama.cpp's trigger is
//! the health check). The answer names what changed; `/metrics` counts checks, swaps, tensors
//! and refusals.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State as Ext;
use axum::http::StatusCode;
use axum::Json;
use hesper_engine::model::Reload;
use hesper_runtime::scheduler::SubmitError;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::State;

/// Hot-swap counters for `/metrics`.
#[derive(Debug, Default)]
pub struct SwapCounters {
    /// Checks run.
    pub checks: AtomicU64,
    /// Checks that swapped tensors in.
    pub swaps: AtomicU64,
    /// Tensors swapped in.
    pub tensors: AtomicU64,
    /// Checks refused (the weights loaded before stayed).
    pub refused: AtomicU64,
}

/// Runs one check between steps and says what it found: `{"swapped": [...], "ms": N}`, or
/// the reason a changed file was refused as a 409 (the model goes on with the weights it had).
pub async fn check(state: &State) -> Result<Value, ApiError> {
    let ready = state.ready()?;
    let answer = match ready.submitter.reload() {
        Ok(rx) => rx.await.map_err(|_| stopped())?,
        Err(SubmitError::Full) => {
            return Err(ApiError::unavailable("too many hot-swap checks waiting", 1))
        }
        Err(SubmitError::Closed) => return Err(stopped()),
    };
    let c = &state.metrics.swaps;
    c.checks.fetch_add(1, Ordering::Relaxed);
    match answer.result {
        Ok(Reload::Unchanged) => Ok(json!({"swapped": [], "ms": answer.millis})),
        Ok(Reload::Swapped(swap)) => {
            c.swaps.fetch_add(1, Ordering::Relaxed);
            c.tensors
                .fetch_add(swap.tensors.len() as u64, Ordering::Relaxed);
            let tensors: Vec<Value> = swap
                .tensors
                .iter()
                .map(|(name, from, to)| json!({"name": name, "from": from, "to": to}))
                .collect();
            Ok(json!({"swapped": tensors, "ms": answer.millis}))
        }
        Err(why) => {
            c.refused.fetch_add(1, Ordering::Relaxed);
            Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("hot-swap refused: {why}; the weights loaded before stay"),
            ))
        }
    }
}

fn stopped() -> ApiError {
    ApiError::unavailable("the scheduler has stopped", 1)
}

/// `POST /reload`: one check, answered with what it found.
pub async fn reload(Ext(state): Ext<Arc<State>>) -> Result<Json<Value>, ApiError> {
    if !state.config.hot_swap {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "/reload: start the server with --hot-swap to swap in changed tensors",
        ));
    }
    Ok(Json(check(&state).await?))
}
