//! The sessions a scheduler runs sequences in, and the prefix cache they make: a finished
//! sequence's session goes back to the pool with the tokens its KV cache holds, and a later
//! request that starts with some of those tokens takes it and evaluates only the rest, whichever
//! sequence computed them. Idle sessions are evicted least recently used first.

use hesper_engine::attention::AttentionConfig;
use hesper_engine::backend::Backend;
use hesper_engine::model::{Model, ModelError, Session};

/// An idle session and the tokens its KV cache holds.
struct Idle<B: Backend> {
    session: Session<B>,
    tokens: Vec<u32>,
}

/// Sessions for a scheduler's sequences: at most `max` alive, idle ones kept for their prefix.
pub(crate) struct Pool<B: Backend> {
    idle: Vec<Idle<B>>,
    /// Sessions alive (running and idle).
    alive: usize,
    max: usize,
    n_ctx: usize,
    attention: AttentionConfig,
}

impl<B: Backend> Pool<B> {
    /// A pool of at most `max` sessions of `n_ctx` positions each, holding one already (so a
    /// context or KV type that cannot be held is refused before any request).
    pub(crate) fn new(
        model: &Model<B>,
        max: usize,
        n_ctx: usize,
        attention: AttentionConfig,
    ) -> Result<Self, ModelError> {
        let first = model.new_session_with(n_ctx, 1, &attention)?;
        Ok(Self {
            idle: vec![Idle {
                session: first,
                tokens: Vec::new(),
            }],
            alive: 1,
            max: max.max(1),
            n_ctx,
            attention,
        })
    }

    /// A session for `prompt`, and how many of its first tokens the session holds already
    /// (never all: the last one is evaluated for its logits). With `reuse` off nothing is
    /// reused. The idle session sharing the longest prefix is taken; without one, an idle
    /// session holding nothing, a new session while fewer than `max` are alive, else the least
    /// recently used idle one.
    /// `None` when every session is running.
    pub(crate) fn take(
        &mut self,
        model: &Model<B>,
        prompt: &[u32],
        reuse: bool,
    ) -> Result<Option<(Session<B>, usize)>, ModelError> {
        let best = self
            .idle
            .iter()
            .enumerate()
            .map(|(i, s)| (i, common_prefix(&s.tokens, prompt).min(prompt.len() - 1)))
            .filter(|&(_, n)| reuse && n > 0)
            .max_by_key(|&(i, n)| (n, i));
        if let Some((i, n)) = best {
            let mut s = self.idle.remove(i).session;
            s.truncate(n);
            return Ok(Some((s, n)));
        }
        if let Some(i) = self.idle.iter().position(|s| s.tokens.is_empty()) {
            return Ok(Some((self.idle.remove(i).session, 0)));
        }
        if self.alive < self.max {
            let s = model.new_session_with(self.n_ctx, 1, &self.attention)?;
            self.alive += 1;
            return Ok(Some((s, 0)));
        }
        if self.idle.is_empty() {
            return Ok(None);
        }
        let mut s = self.idle.remove(0).session;
        s.truncate(0);
        Ok(Some((s, 0)))
    }

    /// Gives back a session whose KV cache holds `tokens`, most recently used.
    pub(crate) fn give_back(&mut self, session: Session<B>, tokens: Vec<u32>) {
        self.idle.push(Idle { session, tokens });
    }

    /// Drops a session that must not be reused (its step failed).
    pub(crate) fn forget(&mut self, session: Session<B>) {
        drop(session);
        self.alive -= 1;
    }

    /// Drops idle sessions beyond `keep`, least recently used first (their memory is freed).
    pub(crate) fn evict_to(&mut self, keep: usize) {
        while self.idle.len() > keep {
            self.idle.remove(0);
            self.alive -= 1;
        }
    }

    /// Positions the idle sessions hold.
    pub(crate) fn cached_positions(&self) -> usize {
        self.idle.iter().map(|s| s.tokens.len()).sum()
    }
}

/// How many leading tokens `a` and `b` share.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
