//! The KV memory of a scheduler's sequences as one pool of positions, and the prefix cache it
//! makes. A sequence gets a session sized to what it needs (its prompt and token limit, rounded
//! up, at most the context), not a fixed share; sessions are made until the pool's positions are
//! spent, and admission waits beyond that. A finished sequence's session goes back with the
//! tokens its KV cache holds, and a later request that starts with some of those tokens takes
//! it and evaluates only the rest, whichever sequence computed them. Idle sessions are evicted
//! least recently used first, when their memory is needed or beyond a count.

use hesper_engine::model::ModelError;

use super::runner::{SeqCache, StepRunner};

/// Sessions are sized in steps of this many positions (so that they can be reused).
const GRAIN: usize = 256;

/// An idle session and the tokens its KV cache holds.
struct Idle<C> {
    session: C,
    tokens: Vec<u32>,
}

/// Sessions (a runner's caches) for a scheduler's sequences, within `budget` positions in all.
pub(crate) struct Pool<C> {
    /// Least recently used first.
    idle: Vec<Idle<C>>,
    /// Positions of the sessions alive (running and idle).
    held: usize,
    budget: usize,
    n_ctx: usize,
}

impl<C: SeqCache> Pool<C> {
    /// A pool of `budget` positions (at least one context's) for sessions of at most `n_ctx`
    /// positions. One session of `n_ctx` is made now, so a context or KV type that cannot be
    /// held is refused before any request.
    pub(crate) fn new<R: StepRunner<Cache = C>>(
        runner: &mut R,
        budget: usize,
        n_ctx: usize,
    ) -> Result<Self, ModelError> {
        let first = runner.new_cache(n_ctx)?;
        Ok(Self {
            idle: vec![Idle {
                session: first,
                tokens: Vec::new(),
            }],
            held: n_ctx,
            budget: budget.max(n_ctx),
            n_ctx,
        })
    }

    /// The positions a sequence of `need` positions is given.
    pub(crate) fn size_for(&self, need: usize) -> usize {
        need.div_ceil(GRAIN)
            .saturating_mul(GRAIN)
            .clamp(1, self.n_ctx)
    }

    /// A session of at least `need` positions for `prompt`, and how many of its first tokens
    /// it holds already (never all: the last one is evaluated for its logits; none with `reuse`
    /// off). In order: the idle session large enough that shares the longest prefix; one
    /// large enough that holds nothing, or the least recently used large enough; a new one,
    /// evicting idle sessions while the pool lacks room. `None`: the running sessions hold too
    /// much of the pool; wait for one to finish.
    pub(crate) fn take<R: StepRunner<Cache = C>>(
        &mut self,
        runner: &mut R,
        prompt: &[u32],
        need: usize,
        reuse: bool,
    ) -> Result<Option<(C, usize)>, ModelError> {
        let fits = |s: &Idle<C>| s.session.n_ctx() >= need;
        let best = self
            .idle
            .iter()
            .enumerate()
            .filter(|(_, s)| reuse && fits(s))
            .map(|(i, s)| (i, common_prefix(&s.tokens, prompt).min(prompt.len() - 1)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, i));
        if let Some((i, n)) = best {
            let mut s = self.idle.remove(i).session;
            // A sliding-window cache may keep less than the common prefix.
            s.truncate(n);
            let n = s.pos();
            return Ok(Some((s, n)));
        }
        let empty = self
            .idle
            .iter()
            .position(|s| fits(s) && s.tokens.is_empty());
        if let Some(i) = empty.or_else(|| self.idle.iter().position(fits)) {
            let mut s = self.idle.remove(i).session;
            s.truncate(0);
            return Ok(Some((s, 0)));
        }
        let size = self.size_for(need);
        while self.held + size > self.budget && !self.idle.is_empty() {
            self.evict_oldest(runner);
        }
        if self.held + size > self.budget {
            return Ok(None);
        }
        let s = runner.new_cache(size)?;
        self.held += size;
        Ok(Some((s, 0)))
    }

    /// Gives back a session whose KV cache holds `tokens`, most recently used.
    pub(crate) fn give_back(&mut self, session: C, tokens: Vec<u32>) {
        self.idle.push(Idle { session, tokens });
    }

    /// Forgets what every idle session's KV cache holds (the weights that computed it were
    /// swapped out); the sessions stay, to be reused empty.
    pub(crate) fn forget_prefixes(&mut self) {
        for s in &mut self.idle {
            s.tokens.clear();
        }
    }

    /// Drops a session that must not be reused (its step failed).
    pub(crate) fn forget<R: StepRunner<Cache = C>>(&mut self, runner: &mut R, session: C) {
        self.held -= session.n_ctx();
        runner.free_cache(session);
    }

    /// Drops idle sessions beyond `keep`, least recently used first (their memory is freed).
    pub(crate) fn evict_to<R: StepRunner<Cache = C>>(&mut self, runner: &mut R, keep: usize) {
        while self.idle.len() > keep {
            self.evict_oldest(runner);
        }
    }

    fn evict_oldest<R: StepRunner<Cache = C>>(&mut self, runner: &mut R) {
        let s = self.idle.remove(0);
        self.held -= s.session.n_ctx();
        runner.free_cache(s.session);
    }

    /// Tokens each idle session holds for its prefix, least recently used first.
    pub(crate) fn idle_tokens(&self) -> Vec<usize> {
        self.idle.iter().map(|i| i.tokens.len()).collect()
    }

    /// Positions allocated to sessions, running and idle.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// The pool's positions.
    pub(crate) fn budget(&self) -> usize {
        self.budget
    }
}

/// How many leading tokens `a` and `b` share.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
