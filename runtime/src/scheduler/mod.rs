//! Continuous batching: one scheduler owns the model and runs many sequences (a server's
//! requests) in steps. Each step evaluates one token of every generating sequence plus chunks
//! of prompts up to a token budget (so a long prompt does not stall the others), all in one
//! pass over the weights ([`Model::step_async`]); attention runs per sequence over its own KV
//! cache. Sequences join and leave between steps; a sequence whose receiver is gone (a client
//! that disconnected) is dropped at the next step. KV memory is one pool of positions (`pool`): a
//! sequence gets a session sized to what it needs, admission waits while the pool is full, and
//! finished sequences leave their KV caches to its prefix cache.
//!
//! Each sequence has its own seeded sampler, and on the CPU a row's logits do not depend on
//! the rows beside it, so a request's tokens are the same alone or among others. A sequence
//! may carry a [`Constraint`] (a grammar): its logits are masked before its sampler sees them,
//! and its batch-mates' are untouched.

mod pool;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hesper_engine::attention::AttentionConfig;
use hesper_engine::backend::Backend;
use hesper_engine::model::{Model, ModelError, Reload, SeqStep, Session};
use hesper_engine::sampler::{top_candidates, Sampler, SamplerConfig};
use hesper_engine::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::evaluator::ModelRef;
use pool::Pool;

/// How a scheduler runs.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Positions a sequence may use (prompt and answer).
    pub n_ctx: usize,
    /// Sequences that run at once.
    pub parallel: usize,
    /// Most tokens one step evaluates (at least `parallel`).
    pub batch: usize,
    /// Finished sequences' sessions kept for their prefixes.
    pub keep_idle: usize,
    /// KV positions of all sessions together (`None`: `n_ctx × parallel`); a sequence takes
    /// what its prompt and token limit need, and admission waits while the pool lacks room.
    pub kv_pool: Option<usize>,
    /// How KV caches are stored.
    pub attention: AttentionConfig,
}

/// One request's sequence.
pub struct Job {
    /// Prompt tokens (at least one, fewer than the context).
    pub prompt: Vec<u32>,
    /// Its sampler's settings (seed included).
    pub sampling: SamplerConfig,
    /// Most tokens to generate (clamped to the context).
    pub max_tokens: usize,
    /// With `Some(k)`, each token comes with its log-probability and the `k` most likely.
    pub top_logprobs: Option<usize>,
    /// Whether cached prefixes may be reused (llama-server's `cache_prompt`).
    pub cache_prompt: bool,
    /// Whether end-of-generation tokens are sampled as any other (llama-server's `ignore_eos`).
    pub ignore_eos: bool,
    /// What the answer must match (a JSON schema, a grammar), if anything. An
    /// end-of-generation token then ends the answer even with `ignore_eos`.
    pub constraint: Option<Box<dyn Constraint>>,
    /// Where the sequence's events go; dropping the receiver cancels the sequence.
    pub events: UnboundedSender<JobEvent>,
}

/// Which tokens a sequence may sample next, following the tokens sampled so far.
pub trait Constraint: Send {
    /// Sets the logits of the tokens not allowed next to −∞; an error ends the sequence.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String>;
    /// Advances over a sampled token; `Ok(true)` when nothing may follow it.
    fn accept(&mut self, token: u32) -> Result<bool, String>;
}

#[cfg(feature = "grammar")]
impl Constraint for crate::grammar::GrammarConstraint {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        crate::grammar::GrammarConstraint::mask(self, logits)
    }

    fn accept(&mut self, token: u32) -> Result<bool, String> {
        crate::grammar::GrammarConstraint::accept(self, token)
    }
}

/// What a sequence reports.
#[derive(Debug, Clone, PartialEq)]
pub enum JobEvent {
    /// Admitted: `cached_tokens` of the prompt came from the prefix cache.
    Started {
        /// Prompt tokens not evaluated again.
        cached_tokens: usize,
    },
    /// A generated token (end-of-generation tokens are not sent).
    Token {
        /// Its id.
        id: u32,
        /// Its log-probability and the most likely alternatives, when asked for.
        logprobs: Option<Logprobs>,
    },
    /// The sequence ended.
    Done(Finish),
    /// The model failed on this sequence.
    Failed(String),
}

/// Log-probabilities of the model's distribution at one position.
#[derive(Debug, Clone, PartialEq)]
pub struct Logprobs {
    /// The chosen token's.
    pub logprob: f32,
    /// The most likely tokens with theirs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token.
    Stop,
    /// Its token limit or a full context.
    Length,
}

/// What a scheduler shows while it runs (for `/metrics`).
#[derive(Debug, Default)]
pub struct Gauges {
    /// Jobs submitted and not yet admitted.
    pub queued: AtomicUsize,
    /// Sequences running.
    pub running: AtomicUsize,
    /// KV positions allocated to sessions: running sequences and the prefix cache.
    pub kv_positions: AtomicUsize,
    /// KV positions of the pool.
    pub kv_capacity: AtomicUsize,
    /// Steps run.
    pub steps: AtomicU64,
    /// Prompt tokens evaluated.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens taken from the prefix cache.
    pub cached_tokens: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
}

/// Why a job was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    /// The admission queue is full.
    Full,
    /// The scheduler has stopped.
    Closed,
}

/// Hands jobs to a scheduler through a bounded admission queue.
#[derive(Clone)]
pub struct Submitter {
    tx: SyncSender<Job>,
    capacity: usize,
    reloads: SyncSender<tokio::sync::oneshot::Sender<Reloaded>>,
    embeds: SyncSender<HiddenStates>,
    gauges: Arc<Gauges>,
}

/// The final hidden states of tokens ([`Submitter::hidden_states`]), or why not.
pub type HiddenStatesReply = tokio::sync::oneshot::Receiver<Result<Vec<f32>, String>>;

/// A request for the final hidden states of tokens, answered between steps.
struct HiddenStates {
    tokens: Vec<u32>,
    reply: tokio::sync::oneshot::Sender<Result<Vec<f32>, String>>,
}

/// What a hot-swap check found, and how long it took (the scheduler waited for the step
/// running when it was asked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// The swap, or why nothing was swapped (the weights loaded before stay).
    pub result: Result<Reload, String>,
    /// Milliseconds the check took.
    pub millis: u64,
}

/// The scheduler's end of a [`queue`]: jobs, and hot-swap checks asked for.
pub struct Inbox {
    jobs: Receiver<Job>,
    reloads: Receiver<tokio::sync::oneshot::Sender<Reloaded>>,
    embeds: Receiver<HiddenStates>,
}

/// How long an idle scheduler waits for a job before it looks for hot-swap checks.
const IDLE_POLL: Duration = Duration::from_millis(20);

impl Submitter {
    /// Queues `job`, or says why not (never waits).
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        self.gauges.queued.fetch_add(1, Ordering::Relaxed);
        self.tx.try_send(job).map_err(|e| {
            self.gauges.queued.fetch_sub(1, Ordering::Relaxed);
            match e {
                TrySendError::Full(_) => SubmitError::Full,
                TrySendError::Disconnected(_) => SubmitError::Closed,
            }
        })
    }

    /// Asks the scheduler to swap in the tensors that changed in the model file between two
    /// steps ([`Model::reload_changed`]); the answer comes on the receiver. Running sequences
    /// are then evaluated again from their start and the prefix cache is emptied, so every
    /// token after the swap comes from the new weights over the whole context.
    pub fn reload(&self) -> Result<tokio::sync::oneshot::Receiver<Reloaded>, SubmitError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.reloads.try_send(tx).map_err(|e| match e {
            TrySendError::Full(_) => SubmitError::Full,
            TrySendError::Disconnected(_) => SubmitError::Closed,
        })?;
        Ok(rx)
    }

    /// Asks for the final normalized hidden states `[n][n_embd]` of `tokens` evaluated alone
    /// from position 0 ([`Model::hidden_states_async`]: what an embedding pools), computed
    /// between steps in a session of their own (outside the KV pool, sized to the tokens);
    /// the answer comes on the receiver.
    pub fn hidden_states(&self, tokens: Vec<u32>) -> Result<HiddenStatesReply, SubmitError> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.embeds
            .try_send(HiddenStates { tokens, reply })
            .map_err(|e| match e {
                TrySendError::Full(_) => SubmitError::Full,
                TrySendError::Disconnected(_) => SubmitError::Closed,
            })?;
        Ok(rx)
    }

    /// Jobs the admission queue holds at most: a request of more answers can never be
    /// queued whole.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The scheduler's gauges.
    pub fn gauges(&self) -> &Arc<Gauges> {
        &self.gauges
    }
}

/// An admission queue of `queue` jobs: the submitting end, and the end [`run`] takes.
pub fn queue(queue: usize) -> (Submitter, Inbox) {
    let (tx, jobs) = std::sync::mpsc::sync_channel(queue);
    let (reloads_tx, reloads) = std::sync::mpsc::sync_channel(queue);
    let (embeds_tx, embeds) = std::sync::mpsc::sync_channel(queue);
    let gauges = Arc::new(Gauges::default());
    (
        Submitter {
            tx,
            capacity: queue,
            reloads: reloads_tx,
            embeds: embeds_tx,
            gauges,
        },
        Inbox {
            jobs,
            reloads,
            embeds,
        },
    )
}

/// A running sequence.
struct Seq<B: Backend> {
    session: Session<B>,
    /// Every token its KV cache holds or will hold: prompt, then generated; those from the
    /// session's position on are still to be evaluated.
    history: Vec<u32>,
    sampler: Sampler,
    produced: usize,
    job: Job,
}

/// Runs jobs from `jobs` on `model` until every [`Submitter`] is dropped and nothing runs.
/// `gauges` is the submitters' ([`Submitter::gauges`]). On the CPU, call it on one of the
/// backend's threads (`run_model!`).
pub fn run<B: Backend, M: ModelRef<B>>(
    mut model: M,
    tok: &Tokenizer,
    config: &SchedulerConfig,
    inbox: Inbox,
    gauges: &Gauges,
) -> Result<(), ModelError> {
    let jobs = &inbox.jobs;
    let parallel = config.parallel.max(1);
    let batch = config.batch.max(parallel);
    let mut scratch = model.get().new_batch_scratch(batch, parallel)?;
    let budget = config
        .kv_pool
        .unwrap_or(config.n_ctx.saturating_mul(parallel));
    let mut pool = Pool::new(model.get(), budget, config.n_ctx, config.attention.clone())?;
    gauges.kv_capacity.store(pool.budget(), Ordering::Relaxed);
    let mut running: Vec<Seq<B>> = Vec::new();
    // A job taken from the queue that waits for room in the pool (the queue stays in order).
    let mut waiting: Option<Job> = None;
    loop {
        // Between steps: hot-swap checks asked for.
        while let Ok(reply) = inbox.reloads.try_recv() {
            reload(&mut model, &mut running, &mut pool, reply);
        }
        // Between steps: hidden states asked for (embeddings).
        while let Ok(h) = inbox.embeds.try_recv() {
            let _ = h
                .reply
                .send(hidden_states(model.get(), config, batch, &h.tokens));
        }
        // Admit jobs while sequences are free; wait for one when nothing runs.
        while running.len() < parallel {
            let job = match waiting.take() {
                Some(job) => job,
                None if running.is_empty() => match jobs.recv_timeout(IDLE_POLL) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return Ok(()),
                },
                None => match jobs.try_recv() {
                    Ok(job) => job,
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                },
            };
            match admit(model.get(), &mut pool, config, job, gauges)? {
                Admission::Running(seq) => running.push(*seq),
                Admission::Ended => {}
                Admission::Wait(job) => {
                    waiting = Some(job);
                    break;
                }
            }
        }
        // Clients that went away free their sequences (their caches stay for later prefixes).
        for i in (0..running.len()).rev() {
            if running[i].job.events.is_closed() {
                finish(&mut pool, running.remove(i));
            }
        }
        if running.is_empty() {
            show(gauges, &running, &pool);
            continue;
        }
        let (ended, failed) = step(model.get(), tok, &mut scratch, &mut running, batch, gauges);
        for i in ended.into_iter().rev() {
            let seq = running.remove(i);
            if failed {
                pool.forget(seq.session);
            } else {
                finish(&mut pool, seq);
            }
        }
        pool.evict_to(config.keep_idle);
        show(gauges, &running, &pool);
    }
}

/// The final hidden states of `tokens`, in a session of their own with `batch` rows a pass.
fn hidden_states<B: Backend>(
    model: &Model<B>,
    config: &SchedulerConfig,
    batch: usize,
    tokens: &[u32],
) -> Result<Vec<f32>, String> {
    if tokens.is_empty() || tokens.len() > config.n_ctx {
        return Err(format!(
            "{} tokens: an input holds 1 to {} (the context)",
            tokens.len(),
            config.n_ctx
        ));
    }
    let mut s = model
        .new_session_with(tokens.len(), batch, &config.attention)
        .map_err(|e| e.to_string())?;
    model
        .hidden_states(&mut s, tokens)
        .map_err(|e| e.to_string())
}

/// Sets the gauges that follow the running sequences and the pool.
fn show<B: Backend>(gauges: &Gauges, running: &[Seq<B>], pool: &Pool<B>) {
    gauges.running.store(running.len(), Ordering::Relaxed);
    gauges.kv_positions.store(pool.held(), Ordering::Relaxed);
}

/// Runs a hot-swap check and answers it. After a swap, running sequences are evaluated again
/// from their start and the prefix cache forgets what it holds: their KV caches were computed
/// with the old weights.
fn reload<B: Backend, M: ModelRef<B>>(
    model: &mut M,
    running: &mut [Seq<B>],
    pool: &mut Pool<B>,
    reply: tokio::sync::oneshot::Sender<Reloaded>,
) {
    let start = Instant::now();
    let result = match model.get_mut() {
        Some(m) => m.reload_changed().map_err(|e| e.to_string()),
        None => Err("the model was not loaded for hot-swap".into()),
    };
    if let Ok(Reload::Swapped(_)) = result {
        for s in running.iter_mut() {
            s.session.truncate(0);
        }
        pool.forget_prefixes();
    }
    let millis = start.elapsed().as_millis() as u64;
    let _ = reply.send(Reloaded { result, millis });
}

/// What became of a job taken from the queue.
enum Admission<B: Backend> {
    /// Its sequence runs.
    Running(Box<Seq<B>>),
    /// It ended before running (refused, or its client went away).
    Ended,
    /// The pool lacks room until a running sequence finishes.
    Wait(Job),
}

/// Starts `job`'s sequence in a session from the pool, refuses it with an event, or hands it
/// back to wait for room.
fn admit<B: Backend>(
    model: &Model<B>,
    pool: &mut Pool<B>,
    config: &SchedulerConfig,
    job: Job,
    gauges: &Gauges,
) -> Result<Admission<B>, ModelError> {
    if job.events.is_closed() {
        gauges.queued.fetch_sub(1, Ordering::Relaxed);
        return Ok(Admission::Ended);
    }
    if job.prompt.is_empty() || job.prompt.len() >= config.n_ctx {
        let why = format!(
            "the prompt is {} tokens; it must hold 1 to {} (the context is {})",
            job.prompt.len(),
            config.n_ctx - 1,
            config.n_ctx
        );
        let _ = job.events.send(JobEvent::Failed(why));
        gauges.queued.fetch_sub(1, Ordering::Relaxed);
        return Ok(Admission::Ended);
    }
    let need = job
        .prompt
        .len()
        .saturating_add(job.max_tokens)
        .min(config.n_ctx);
    let Some((session, cached)) = pool.take(model, &job.prompt, need, job.cache_prompt)? else {
        return Ok(Admission::Wait(job));
    };
    gauges.queued.fetch_sub(1, Ordering::Relaxed);
    let mut sampler = Sampler::new(job.sampling.clone());
    for &t in &job.prompt {
        sampler.accept(t);
    }
    gauges
        .cached_tokens
        .fetch_add(cached as u64, Ordering::Relaxed);
    let _ = job.events.send(JobEvent::Started {
        cached_tokens: cached,
    });
    Ok(Admission::Running(Box::new(Seq {
        session,
        history: job.prompt.clone(),
        sampler,
        produced: 0,
        job,
    })))
}

/// Runs one step over `running`: one token of each generating sequence first, then prompt
/// chunks within `batch` tokens. Samples where a sequence's input is all evaluated and sends
/// its token. Returns the indices of sequences that ended, in order, and whether they ended
/// because the step failed (their caches are then not reused).
fn step<B: Backend>(
    model: &Model<B>,
    tok: &Tokenizer,
    scratch: &mut hesper_engine::model::BatchScratch<B>,
    running: &mut [Seq<B>],
    batch: usize,
    gauges: &Gauges,
) -> (Vec<usize>, bool) {
    // Tokens each sequence evaluates now: generating ones first, then prompts in order.
    let mut take = vec![0; running.len()];
    let mut budget = batch;
    for (i, s) in running.iter().enumerate() {
        if s.history.len() - s.session.pos() == 1 {
            take[i] = 1;
            budget -= 1;
        }
    }
    for (i, s) in running.iter().enumerate() {
        let want = s.history.len() - s.session.pos();
        if want > 1 && budget > 0 {
            take[i] = want.min(budget);
            budget -= take[i];
        }
    }
    let mut steps = Vec::new();
    let mut which = Vec::new();
    for (i, s) in running.iter_mut().enumerate() {
        if take[i] == 0 {
            continue;
        }
        let pos = s.session.pos();
        let logits = pos + take[i] == s.history.len();
        if s.produced == 0 {
            gauges
                .prompt_tokens
                .fetch_add(take[i] as u64, Ordering::Relaxed);
        }
        steps.push(SeqStep {
            session: &mut s.session,
            tokens: &s.history[pos..pos + take[i]],
            logits,
        });
        which.push(i);
    }
    gauges.steps.fetch_add(1, Ordering::Relaxed);
    let rows = match model.step(scratch, &mut steps) {
        Ok(rows) => rows,
        Err(e) => {
            drop(steps);
            for &i in &which {
                let _ = running[i].job.events.send(JobEvent::Failed(e.to_string()));
            }
            return (which, true);
        }
    };
    drop(steps);
    let mut ended = Vec::new();
    for (&i, row) in which.iter().zip(rows) {
        let Some(row) = row else { continue };
        let s = &mut running[i];
        match sample(s, tok, &row, gauges) {
            Ok(None) => {}
            Ok(Some(finish)) => {
                let _ = s.job.events.send(JobEvent::Done(finish));
                ended.push(i);
            }
            Err(why) => {
                let _ = s.job.events.send(JobEvent::Failed(why));
                ended.push(i);
            }
        }
    }
    (ended, false)
}

/// Samples `s`'s next token from `row` (masked by its constraint), sends it, and says whether
/// the sequence ended; an error is its constraint's.
fn sample<B: Backend>(
    s: &mut Seq<B>,
    tok: &Tokenizer,
    row: &[f32],
    gauges: &Gauges,
) -> Result<Option<Finish>, String> {
    let (id, complete) = match &mut s.job.constraint {
        None => (s.sampler.sample(row), false),
        Some(c) => {
            let mut masked = row.to_vec();
            c.mask(&mut masked)?;
            let id = s.sampler.sample(&masked);
            if tok.is_end_of_generation(id) {
                return Ok(Some(Finish::Stop));
            }
            (id, c.accept(id)?)
        }
    };
    if tok.is_end_of_generation(id) && !s.job.ignore_eos {
        return Ok(Some(Finish::Stop));
    }
    let logprobs = s.job.top_logprobs.map(|k| logprobs(row, id, k));
    s.sampler.accept(id);
    s.history.push(id);
    s.produced += 1;
    gauges.generated_tokens.fetch_add(1, Ordering::Relaxed);
    if s.job.events.send(JobEvent::Token { id, logprobs }).is_err() || complete {
        return Ok(Some(Finish::Stop));
    }
    let full = s.history.len() >= s.session.n_ctx();
    Ok((s.produced >= s.job.max_tokens || full).then_some(Finish::Length))
}

/// The log-probability of `id` and of the `k` most likely tokens under `row`'s softmax.
fn logprobs(row: &[f32], id: u32, k: usize) -> Logprobs {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&l| f64::from(l - max).exp()).sum();
    let lse = max + sum.ln() as f32;
    Logprobs {
        logprob: row[id as usize] - lse,
        top: top_candidates(row, k)
            .into_iter()
            .map(|(t, l)| (t, l - lse))
            .collect(),
    }
}

/// Gives a finished sequence's session back to the pool with the tokens its cache holds.
fn finish<B: Backend>(pool: &mut Pool<B>, seq: Seq<B>) {
    let mut history = seq.history;
    history.truncate(seq.session.pos());
    pool.give_back(seq.session, history);
}
