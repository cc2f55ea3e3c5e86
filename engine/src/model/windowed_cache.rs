//! A sliding-window layer's KV cache bounded by its window (as llama.cpp's SWA cache): it holds
//! `min(n_ctx, window + step − 1)` positions, position `p` in slot `p % slots`, where `step` is
//! the most tokens one attention call writes (the session's batch, and at least
//! [`WINDOW_STEP`]); a layer that attends every position holds the whole context. What the
//! windowed caches no longer hold bounds how far a session may be truncated and how many
//! positions a context shift may discard. Both are decided from the model's config, not from
//! the layers one model instance holds, so every node of a ring decides alike.

use crate::config::Config;

/// The fewest tokens one attention call may write into a windowed layer's cache: llama.cpp's
/// default micro-batch, so a server's prompt steps fit whole.
pub const WINDOW_STEP: usize = 512;

/// The positions the KV cache of each of `config`'s layers holds in a session of `n_ctx`
/// positions stepping up to `batch` tokens: the context, or where a layer attends a sliding
/// window (and `full` does not ask for full-size caches) its window and one step.
pub fn cache_slots(config: &Config, n_ctx: usize, batch: usize, full: bool) -> Vec<usize> {
    let windows = WindowedCache::new(config, n_ctx, batch, full);
    (0..config.n_layer)
        .map(|il| WindowedCache::slots_of(windows.as_ref(), config, il, n_ctx))
        .collect()
}

/// The state of a session's windowed caches, where they are smaller than its context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowedCache {
    /// Positions a windowed layer's query attends, its own included.
    window: usize,
    /// Slots a windowed layer's cache holds.
    slots: usize,
    /// The first position every windowed layer's cache still holds (those before it were
    /// overwritten by later ones).
    held_from: usize,
}

impl WindowedCache {
    /// The windowed caches of a session of `n_ctx` positions stepping up to `batch` tokens, or
    /// `None` where nothing is bounded: the model has no windowed layer, `full` asks for
    /// full-size caches, or the window and a step fill the context.
    pub fn new(config: &Config, n_ctx: usize, batch: usize, full: bool) -> Option<Self> {
        let window = config.window.filter(|_| config.windowed.contains(&true))?;
        let slots = window.saturating_add(batch.max(WINDOW_STEP) - 1);
        (!full && slots < n_ctx).then_some(Self {
            window,
            slots,
            held_from: 0,
        })
    }

    /// Slots the cache of layer `il` holds: a windowed layer's bound, else the context.
    pub fn slots_of(this: Option<&Self>, config: &Config, il: usize, n_ctx: usize) -> usize {
        match this {
            Some(w) if config.window_of(il).is_some() => w.slots,
            _ => n_ctx,
        }
    }

    /// Slots a windowed layer's cache holds.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The most tokens one attention call may write: more would overwrite keys the step's
    /// first query attends.
    pub fn step(&self) -> usize {
        self.slots + 1 - self.window
    }

    /// Records that positions before `end` are written.
    pub fn wrote(&mut self, end: usize) {
        self.held_from = self.held_from.max(end.saturating_sub(self.slots));
    }

    /// Whether the caches hold every key a query at `pos` attends below it.
    fn holds(&self, pos: usize) -> bool {
        (pos + 1).saturating_sub(self.window) >= self.held_from
    }

    /// The position a session truncated to `pos` keeps: `pos` where the caches still hold
    /// what its next query attends, else 0 (everything is evaluated again).
    pub fn truncate(&mut self, pos: usize) -> usize {
        if pos > 0 && self.holds(pos) {
            return pos;
        }
        self.held_from = 0;
        0
    }

    /// The most positions a context shift keeping `keep` of `used` may discard: after it the
    /// next query's window must not reach a position the caches lost (`None`: no bound).
    pub fn max_discard(&self, keep: usize, used: usize) -> Option<usize> {
        (self.held_from > 0)
            .then(|| (used + 1).saturating_sub(self.window + self.held_from.min(keep)))
    }

    /// Records a context shift that kept `keep` positions and discarded the `discard` after
    /// them: later held positions moved down with the rest.
    pub fn shifted(&mut self, keep: usize, discard: usize) {
        if self.held_from > keep {
            self.held_from = self.held_from.max(keep + discard) - discard;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(window: usize, slots: usize) -> WindowedCache {
        WindowedCache {
            window,
            slots,
            held_from: 0,
        }
    }

    #[test]
    fn a_truncation_keeps_a_position_only_while_its_window_is_held() {
        // Window 4 in 6 slots: after 20 positions, 14..20 are held; a query at 17 attends
        // 14..=17 (kept), one at 16 would need 13 (lost).
        let mut c = cache(4, 6);
        c.wrote(20);
        assert_eq!(c.step(), 3);
        assert_eq!(c.truncate(17), 17);
        assert_eq!(c.truncate(16), 0);
        // Everything is evaluated again from 0: nothing is lost until the slots wrap.
        c.wrote(6);
        assert_eq!(c.truncate(3), 3);
    }

    #[test]
    fn a_shift_discards_no_more_than_the_window_still_reaches() {
        let mut c = cache(4, 6);
        c.wrote(20);
        // Keeping 2 of 20: the next query, at 20 − d, attends 17 − d ..; the sinks 0, 1 are
        // lost, so 17 − d ≥ 2.
        assert_eq!(c.max_discard(2, 20), Some(15));
        c.shifted(2, 15);
        assert!(c.holds(5));
        assert_eq!(c.held_from, 2);
        // Nothing lost yet: no bound.
        assert_eq!(cache(4, 6).max_discard(2, 5), None);
    }
}
