//! Hot-swap (`serve --hot-swap`): `GET /health` and `POST /reload` ask the scheduler to swap in
//! the tensors that changed in the model file, between two steps (ik_llama.cpp's trigger is
//! the health check). The answer names what changed; `/metrics` counts checks, swaps, tensors
//! and refusals. `/health` is public, so the checks it triggers are shared and spaced out
//! ([`HealthChecks`]); `POST /reload` (behind the API key) checks every time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

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

/// The least time between the end of one check that `/health` triggered and the start of the
/// next: keyless clients polling `/health` cannot make the scheduler pause for checks more than
/// once a second, however many they are (a monitor polls every few seconds).
pub const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The checks `/health` triggers, run one at a time. A `/health` answers with the result of a
/// check that started after it arrived — never an older one, so a file replaced before the
/// call is seen — and shares that check with every call waiting alongside it; a new check
/// starts no sooner than [`HEALTH_CHECK_INTERVAL`] after the last ended.
#[derive(Debug, Default)]
pub struct HealthChecks {
    last: Mutex<Option<HealthCheck>>,
}

/// One check `/health` ran.
#[derive(Debug)]
struct HealthCheck {
    started: Instant,
    ended: Instant,
    found: Value,
}

/// What `/health` reports under `hot_swap`: a check's answer, or its refusal under `error`.
pub async fn health_check(state: &State) -> Value {
    let arrived = Instant::now();
    let mut last = state.health_checks.last.lock().await;
    if let Some(previous) = last.as_ref() {
        if previous.started >= arrived {
            return previous.found.clone();
        }
        tokio::time::sleep_until(previous.ended + HEALTH_CHECK_INTERVAL).await;
    }
    let started = Instant::now();
    let found = match check(state).await {
        Ok(found) => found,
        Err(e) => json!({"error": e.body()["error"]["message"]}),
    };
    *last = Some(HealthCheck {
        started,
        ended: Instant::now(),
        found: found.clone(),
    });
    found
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
