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
mod runner;
mod slots;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hesper_engine::attention::AttentionConfig;
use hesper_engine::backend::Backend;
use hesper_engine::model::{ModelError, Prediction, Readout, Reload};
use hesper_engine::sampler::{top_candidates, Sampler, SamplerConfig};
use hesper_engine::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::evaluator::ModelRef;
use pool::Pool;
pub use runner::{Landed, LocalRunner, RunStep, SeqCache, StepError, StepRunner};
pub use slots::{Slot, SlotSeq, Slots};

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
    /// Why no step can run now (a ring that lost a node and has not formed again), if so:
    /// requests are then refused with this reason.
    pub outage: std::sync::Mutex<Option<String>>,
}

impl Gauges {
    /// Why no step can run now, if so (see [`Gauges::outage`]).
    pub fn outage(&self) -> Option<String> {
        self.outage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
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
    slots: SyncSender<tokio::sync::oneshot::Sender<Slots>>,
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
    slots: Receiver<tokio::sync::oneshot::Sender<Slots>>,
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

    /// Asks for the scheduler's slots and KV pool ([`Slots`]), taken between two steps; the
    /// answer comes on the receiver.
    pub fn slots(&self) -> Result<tokio::sync::oneshot::Receiver<Slots>, SubmitError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.slots.try_send(tx).map_err(|e| match e {
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
    let (slots_tx, slots) = std::sync::mpsc::sync_channel(queue);
    let gauges = Arc::new(Gauges::default());
    (
        Submitter {
            tx,
            capacity: queue,
            reloads: reloads_tx,
            embeds: embeds_tx,
            slots: slots_tx,
            gauges,
        },
        Inbox {
            jobs,
            reloads,
            embeds,
            slots,
        },
    )
}

/// A running sequence.
struct Seq<C> {
    /// Its number, unique in the scheduler (steps in flight name their sequences by it).
    id: u64,
    /// Its slot, `0..parallel` (`/slots`).
    slot: usize,
    /// Prompt tokens taken from the prefix cache.
    cached: usize,
    cache: C,
    /// Every token its KV cache holds or will hold: prompt, then generated; those from the
    /// cache's position on are still to be evaluated.
    history: Vec<u32>,
    sampler: Sampler,
    produced: usize,
    /// Steps in flight that hold some of its tokens.
    in_flight: usize,
    /// Whether a step in flight asks for its logits (nothing more is sent until they come).
    awaiting: bool,
    job: Job,
}

/// A step in flight: its sequences, and whether each asked for logits.
struct Flight {
    seqs: Vec<(u64, bool)>,
}

/// What the scheduler owns while it runs.
struct Sched<'a, R: StepRunner> {
    runner: R,
    tok: &'a Tokenizer,
    config: &'a SchedulerConfig,
    gauges: &'a Gauges,
    pool: Pool<R::Cache>,
    running: Vec<Seq<R::Cache>>,
    /// Steps in flight, oldest first.
    flights: std::collections::VecDeque<Flight>,
    next_id: u64,
    batch: usize,
    parallel: usize,
    /// Hot-swap checks and hidden states asked for, run once nothing is in flight.
    reloads: Vec<tokio::sync::oneshot::Sender<Reloaded>>,
    embeds: Vec<HiddenStates>,
}

/// Runs jobs from `jobs` on `model` until every [`Submitter`] is dropped and nothing runs.
/// `gauges` is the submitters' ([`Submitter::gauges`]). On the CPU, call it on one of the
/// backend's threads (`run_model!`).
pub fn run<B: Backend, M: ModelRef<B>>(
    model: M,
    tok: &Tokenizer,
    config: &SchedulerConfig,
    inbox: Inbox,
    gauges: &Gauges,
) -> Result<(), ModelError> {
    let parallel = config.parallel.max(1);
    let batch = config.batch.max(parallel);
    let runner = LocalRunner::new(model, batch, parallel, config.attention.clone())?;
    run_on(runner, tok, config, inbox, gauges)
}

/// Runs jobs from `jobs` on `runner` (a model here, or a ring) until every [`Submitter`] is
/// dropped and nothing runs. The running sequences are split into as many micro-batches as
/// the runner keeps in flight: while one step is evaluated, the next is started.
pub fn run_on<R: StepRunner>(
    mut runner: R,
    tok: &Tokenizer,
    config: &SchedulerConfig,
    inbox: Inbox,
    gauges: &Gauges,
) -> Result<(), ModelError> {
    let parallel = config.parallel.max(1);
    let budget = config
        .kv_pool
        .unwrap_or(config.n_ctx.saturating_mul(parallel));
    let pool = Pool::new(&mut runner, budget, config.n_ctx)?;
    gauges.kv_capacity.store(pool.budget(), Ordering::Relaxed);
    let mut sched = Sched {
        runner,
        tok,
        config,
        gauges,
        pool,
        running: Vec::new(),
        flights: Default::default(),
        next_id: 0,
        batch: config.batch.max(parallel),
        parallel,
        reloads: Vec::new(),
        embeds: Vec::new(),
    };
    sched.serve(&inbox)
}

impl<R: StepRunner> Sched<'_, R> {
    fn serve(&mut self, inbox: &Inbox) -> Result<(), ModelError> {
        let jobs = &inbox.jobs;
        // A job taken from the queue that waits for room in the pool (the queue stays in order).
        let mut waiting: Option<Job> = None;
        loop {
            while let Ok(reply) = inbox.slots.try_recv() {
                let _ = reply.send(self.slots());
            }
            if let Some(why) = self.gauges.outage() {
                if !self.recover(inbox, &mut waiting, &why) {
                    return Ok(());
                }
                continue;
            }
            // Between steps (nothing in flight): hot-swap checks and hidden states asked for.
            // While some wait, no step starts, so the steps in flight drain.
            while let Ok(reply) = inbox.reloads.try_recv() {
                self.reloads.push(reply);
            }
            while let Ok(h) = inbox.embeds.try_recv() {
                self.embeds.push(h);
            }
            if self.flights.is_empty() {
                if let Err(e) = self.runner.poll() {
                    self.lose_flights(e);
                    continue;
                }
            }
            let between = !self.reloads.is_empty() || !self.embeds.is_empty();
            if between && self.flights.is_empty() {
                for reply in std::mem::take(&mut self.reloads) {
                    self.reload(reply);
                }
                for h in std::mem::take(&mut self.embeds) {
                    let _ = h.reply.send(self.hidden_states(&h.tokens));
                }
            }
            // Admit jobs while sequences are free; wait for one when nothing runs.
            while self.running.len() < self.parallel {
                let job = match waiting.take() {
                    Some(job) => job,
                    None if self.running.is_empty() => match jobs.recv_timeout(IDLE_POLL) {
                        Ok(job) => job,
                        Err(RecvTimeoutError::Timeout) => break,
                        Err(RecvTimeoutError::Disconnected) => return Ok(()),
                    },
                    None => match jobs.try_recv() {
                        Ok(job) => job,
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                    },
                };
                match self.admit(job)? {
                    Admission::Running(seq) => self.running.push(*seq),
                    Admission::Ended => {}
                    Admission::Wait(job) => {
                        waiting = Some(job);
                        break;
                    }
                }
            }
            // Clients that went away free their sequences (their caches stay for later
            // prefixes) once no step in flight holds them.
            for i in (0..self.running.len()).rev() {
                let s = &self.running[i];
                if s.job.events.is_closed() && s.in_flight == 0 {
                    let seq = self.running.remove(i);
                    self.finish(seq);
                }
            }
            if self.running.is_empty() && self.flights.is_empty() {
                self.show();
                continue;
            }
            if !between {
                while self.flights.len() < self.runner.in_flight().max(1) {
                    if !self.start_flight() {
                        break;
                    }
                }
            }
            if !self.flights.is_empty() {
                self.land_flight();
            }
            self.pool.evict_to(&mut self.runner, self.config.keep_idle);
            self.show();
        }
    }

    /// While the runner is down: tries to recover it, and meanwhile ends every job that
    /// comes (and answers every check) with `why`. `false`: every submitter is gone.
    fn recover(&mut self, inbox: &Inbox, waiting: &mut Option<Job>, why: &str) -> bool {
        let recovered = self.runner.recover();
        let refuse = |job: Job| {
            self.gauges.queued.fetch_sub(1, Ordering::Relaxed);
            let _ = job.events.send(JobEvent::Failed(why.to_string()));
        };
        if let Some(job) = waiting.take() {
            refuse(job);
        }
        loop {
            match inbox.jobs.try_recv() {
                Ok(job) => refuse(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
        while let Ok(reply) = inbox.reloads.try_recv() {
            self.reloads.push(reply);
        }
        while let Ok(h) = inbox.embeds.try_recv() {
            self.embeds.push(h);
        }
        for reply in std::mem::take(&mut self.reloads) {
            let _ = reply.send(Reloaded {
                result: Err(why.to_string()),
                millis: 0,
            });
        }
        for h in std::mem::take(&mut self.embeds) {
            let _ = h.reply.send(Err(why.to_string()));
        }
        if recovered.is_ok() {
            *self.gauges.outage.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        true
    }

    /// The final hidden states of `tokens`, between steps.
    fn hidden_states(&mut self, tokens: &[u32]) -> Result<Vec<f32>, String> {
        if tokens.is_empty() || tokens.len() > self.config.n_ctx {
            return Err(format!(
                "{} tokens: an input holds 1 to {} (the context)",
                tokens.len(),
                self.config.n_ctx
            ));
        }
        match self.runner.hidden_states(tokens) {
            Ok(states) => Ok(states),
            Err(StepError::Failed(why)) => Err(why),
            Err(e) => {
                let why = match &e {
                    StepError::Reformed(w) | StepError::Down(w) | StepError::Failed(w) => w.clone(),
                };
                self.lose_flights(e);
                Err(why)
            }
        }
    }

    /// The slots and the KV pool as they are now.
    fn slots(&self) -> Slots {
        let mut slots: Vec<Slot> = (0..self.parallel)
            .map(|id| Slot { id, seq: None })
            .collect();
        for s in &self.running {
            let n_prompt = s.job.prompt.len();
            let seq = SlotSeq {
                id: s.id,
                prompt: s.job.prompt.clone(),
                generated: s.history.get(n_prompt..).unwrap_or_default().to_vec(),
                cached: s.cached,
                evaluated: s.cache.pos(),
                kv_positions: s.cache.n_ctx(),
                remaining: s.job.max_tokens.saturating_sub(s.produced),
                sampling: s.job.sampling.clone(),
            };
            if let Some(slot) = slots.get_mut(s.slot) {
                slot.seq = Some(seq);
            }
        }
        Slots {
            slots,
            n_ctx: self.config.n_ctx,
            kv_capacity: self.pool.budget(),
            kv_held: self.pool.held(),
            cached_prefixes: self.pool.idle_tokens(),
        }
    }

    /// Sets the gauges that follow the running sequences and the pool.
    fn show(&self) {
        let g = self.gauges;
        g.running.store(self.running.len(), Ordering::Relaxed);
        g.kv_positions.store(self.pool.held(), Ordering::Relaxed);
    }

    /// Runs a hot-swap check and answers it. After a swap, running sequences are evaluated
    /// again from their start and the prefix cache forgets what it holds: their KV caches
    /// were computed with the old weights.
    fn reload(&mut self, reply: tokio::sync::oneshot::Sender<Reloaded>) {
        let start = Instant::now();
        let result = self.runner.reload();
        if let Ok(Reload::Swapped(_)) = result {
            self.restart_running();
        }
        let millis = start.elapsed().as_millis() as u64;
        let _ = reply.send(Reloaded { result, millis });
    }

    /// Every running sequence evaluated again from its start (its cache holds nothing
    /// usable), and the prefix cache emptied.
    fn restart_running(&mut self) {
        for s in &mut self.running {
            s.cache.truncate(0);
            s.in_flight = 0;
            s.awaiting = false;
        }
        self.flights.clear();
        self.pool.forget_prefixes();
    }

    /// Starts `job`'s sequence in a session from the pool, refuses it with an event, or hands
    /// it back to wait for room.
    fn admit(&mut self, job: Job) -> Result<Admission<R::Cache>, ModelError> {
        let (config, gauges) = (self.config, self.gauges);
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
        let taken = self
            .pool
            .take(&mut self.runner, &job.prompt, need, job.cache_prompt)?;
        let Some((cache, cached)) = taken else {
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
        self.next_id += 1;
        let slot = slots::free_slot(self.running.iter().map(|s| s.slot), self.parallel);
        Ok(Admission::Running(Box::new(Seq {
            id: self.next_id,
            slot,
            cached,
            cache,
            history: job.prompt.clone(),
            sampler,
            produced: 0,
            in_flight: 0,
            awaiting: false,
            job,
        })))
    }

    /// Starts a step (a micro-batch) over the sequences that wait for none in flight: one
    /// token of each generating sequence first, then prompt chunks within the batch, up to
    /// the running sequences' share of one micro-batch. `false`: none was ready.
    fn start_flight(&mut self) -> bool {
        let in_flight = self.runner.in_flight().max(1);
        let share = self.running.len().div_ceil(in_flight).max(1);
        let ready = |s: &Seq<R::Cache>| !s.awaiting && s.history.len() > s.cache.pos();
        // Tokens each sequence evaluates now: generating ones first, then prompts in order.
        let mut take = vec![0; self.running.len()];
        let (mut budget, mut count) = (self.batch, 0);
        for (i, s) in self.running.iter().enumerate() {
            if count < share && ready(s) && s.history.len() - s.cache.pos() == 1 {
                take[i] = 1;
                budget -= 1;
                count += 1;
            }
        }
        for (i, s) in self.running.iter().enumerate() {
            let want = s.history.len() - s.cache.pos();
            if count < share && ready(s) && want > 1 && budget > 0 {
                take[i] = want.min(budget);
                budget -= take[i];
                count += 1;
            }
        }
        if count == 0 {
            return false;
        }
        let mut steps = Vec::with_capacity(count);
        let mut seqs = Vec::with_capacity(count);
        for (i, s) in self.running.iter_mut().enumerate() {
            if take[i] == 0 {
                continue;
            }
            let pos = s.cache.pos();
            let logits = pos + take[i] == s.history.len();
            if s.produced == 0 {
                self.gauges
                    .prompt_tokens
                    .fetch_add(take[i] as u64, Ordering::Relaxed);
            }
            s.in_flight += 1;
            s.awaiting = logits;
            seqs.push((s.id, logits));
            let readout = logits.then(|| readout_for(s));
            steps.push(RunStep {
                cache: &mut s.cache,
                tokens: &s.history[pos..pos + take[i]],
                readout,
            });
        }
        self.gauges.steps.fetch_add(1, Ordering::Relaxed);
        let started = self.runner.start(&mut steps);
        drop(steps);
        let flight = Flight { seqs };
        match started {
            Ok(()) => self.flights.push_back(flight),
            Err(StepError::Failed(why)) => self.fail(flight, &why),
            Err(e) => self.lose_flights(e),
        }
        true
    }

    /// Waits for the oldest step in flight and takes its logits.
    fn land_flight(&mut self) {
        let done = self.runner.finish();
        self.land(done);
    }

    /// Takes what came of the oldest step in flight: samples each sequence whose logits
    /// came, ends those that finished, or handles a failure.
    fn land(&mut self, done: Result<Landed, StepError>) {
        let Some(flight) = self.flights.pop_front() else {
            return;
        };
        let rows = match done {
            Ok(rows) => rows,
            Err(StepError::Failed(why)) => return self.fail(flight, &why),
            Err(e) => return self.lose_flights(e),
        };
        for ((id, _), row) in flight.seqs.into_iter().zip(rows) {
            let Some(i) = self.running.iter().position(|s| s.id == id) else {
                continue;
            };
            let s = &mut self.running[i];
            s.in_flight -= 1;
            let Some(prediction) = row else { continue };
            s.awaiting = false;
            let ended = match sample(s, self.tok, prediction, self.gauges) {
                Ok(None) => false,
                Ok(Some(finish)) => {
                    let _ = s.job.events.send(JobEvent::Done(finish));
                    true
                }
                Err(why) => {
                    let _ = s.job.events.send(JobEvent::Failed(why));
                    true
                }
            };
            if ended && s.in_flight == 0 {
                let seq = self.running.remove(i);
                self.finish(seq);
            }
        }
    }

    /// Ends the sequences of a step that failed; their caches are not reused.
    fn fail(&mut self, flight: Flight, why: &str) {
        for (id, _) in flight.seqs {
            if let Some(i) = self.running.iter().position(|s| s.id == id) {
                let seq = self.running.remove(i);
                let _ = seq.job.events.send(JobEvent::Failed(why.to_string()));
                self.pool.forget(&mut self.runner, seq.cache);
            }
        }
    }

    /// Every step in flight is lost (`e` is [`StepError::Reformed`] or [`StepError::Down`]):
    /// running sequences start again, or end and the runner is down.
    fn lose_flights(&mut self, e: StepError) {
        self.flights.clear();
        match e {
            StepError::Down(why) => {
                for seq in std::mem::take(&mut self.running) {
                    let _ = seq.job.events.send(JobEvent::Failed(why.clone()));
                    self.pool.give_back(seq.cache, Vec::new());
                }
                self.pool.forget_prefixes();
                *self.gauges.outage.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                self.show();
            }
            _ => self.restart_running(),
        }
    }

    /// Gives a finished sequence's session back to the pool with the tokens its cache holds.
    fn finish(&mut self, seq: Seq<R::Cache>) {
        let mut history = seq.history;
        history.truncate(seq.cache.pos());
        self.pool.give_back(seq.cache, history);
    }
}

/// What became of a job taken from the queue.
enum Admission<C> {
    /// Its sequence runs.
    Running(Box<Seq<C>>),
    /// It ended before running (refused, or its client went away).
    Ended,
    /// The pool lacks room until a running sequence finishes.
    Wait(Job),
}

/// What a sequence's sampler needs of the logits: the most likely token when it is greedy, the
/// top k when it draws among them alone, else the whole row (a grammar masks it, penalties
/// or biases change it, or log-probabilities are asked for). Each gives the token the whole
/// row would ([`Sampler::sample_top`]).
fn readout_for<C>(s: &Seq<C>) -> Readout {
    if s.job.constraint.is_some() || s.job.top_logprobs.is_some() {
        return Readout::Logits;
    }
    if s.sampler.is_greedy() {
        return Readout::Argmax;
    }
    s.sampler
        .backend_top_k()
        .map_or(Readout::Logits, Readout::Top)
}

/// Samples `s`'s next token from its `prediction` (a row masked by its constraint), sends it,
/// and says whether the sequence ended; an error is its constraint's.
fn sample<C: SeqCache>(
    s: &mut Seq<C>,
    tok: &Tokenizer,
    prediction: Prediction,
    gauges: &Gauges,
) -> Result<Option<Finish>, String> {
    let row = match prediction {
        Prediction::Logits(row) => row,
        Prediction::Top(top) => {
            let id = s.sampler.sample_top(top);
            return emit(s, tok, id, None, gauges);
        }
        Prediction::Token(id) => return emit(s, tok, id, None, gauges),
    };
    let (id, complete) = match &mut s.job.constraint {
        None => (s.sampler.sample(&row), false),
        Some(c) => {
            let mut masked = row.clone();
            c.mask(&mut masked)?;
            let id = s.sampler.sample(&masked);
            if tok.is_end_of_generation(id) {
                return Ok(Some(Finish::Stop));
            }
            (id, c.accept(id)?)
        }
    };
    let logprobs = s.job.top_logprobs.map(|k| logprobs(&row, id, k));
    let ended = emit(s, tok, id, logprobs, gauges)?;
    // A constraint that admits nothing after this token makes it the last.
    Ok(if complete { Some(Finish::Stop) } else { ended })
}

/// Takes sampled token `id` into `s` and sends it (with its log-probabilities), and says
/// whether the sequence ended: an end-of-generation token (unless ignored), its token limit,
/// a full context, or a client gone.
fn emit<C: SeqCache>(
    s: &mut Seq<C>,
    tok: &Tokenizer,
    id: u32,
    logprobs: Option<Logprobs>,
    gauges: &Gauges,
) -> Result<Option<Finish>, String> {
    if tok.is_end_of_generation(id) && !s.job.ignore_eos {
        return Ok(Some(Finish::Stop));
    }
    s.sampler.accept(id);
    s.history.push(id);
    s.produced += 1;
    gauges.generated_tokens.fetch_add(1, Ordering::Relaxed);
    if s.job.events.send(JobEvent::Token { id, logprobs }).is_err() {
        return Ok(Some(Finish::Stop));
    }
    let full = s.history.len() >= s.cache.n_ctx();
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
