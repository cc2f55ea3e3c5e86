//! What a server's `/slots` shows: each of the scheduler's `parallel` sequence slots with the
//! sequence running in it, if any, and the KV pool they share, taken between two steps when
//! asked ([`Submitter::slots`](super::Submitter::slots)).

use hesper_engine::sampler::SamplerConfig;

/// The scheduler's slots and its KV pool, as they were between two steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Slots {
    /// Every slot, by number (`0..parallel`).
    pub slots: Vec<Slot>,
    /// Positions one sequence may use.
    pub n_ctx: usize,
    /// KV positions of the pool.
    pub kv_capacity: usize,
    /// KV positions allocated to caches: running sequences' and the prefix cache's.
    pub kv_held: usize,
    /// Tokens held by each cache kept for its prefix (finished sequences'), least recently
    /// used first.
    pub cached_prefixes: Vec<usize>,
}

impl Slots {
    /// Slots without a sequence.
    pub fn idle(&self) -> usize {
        self.slots.iter().filter(|s| s.seq.is_none()).count()
    }
}

/// One sequence slot.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    /// Its number.
    pub id: usize,
    /// The sequence running in it.
    pub seq: Option<SlotSeq>,
}

/// A sequence running in a slot.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotSeq {
    /// The sequence's number in the scheduler (llama-server's task id).
    pub id: u64,
    /// Its prompt's tokens.
    pub prompt: Vec<u32>,
    /// The tokens generated so far.
    pub generated: Vec<u32>,
    /// Prompt tokens taken from the prefix cache.
    pub cached: usize,
    /// Positions its KV cache holds evaluated.
    pub evaluated: usize,
    /// Positions its KV cache can hold.
    pub kv_positions: usize,
    /// Tokens it may still generate.
    pub remaining: usize,
    /// Its sampler's settings.
    pub sampling: SamplerConfig,
}

/// The lowest slot number of `0..parallel` that no running sequence holds (`used`).
pub(crate) fn free_slot(used: impl Iterator<Item = usize>, parallel: usize) -> usize {
    let mut taken = vec![false; parallel.max(1)];
    for s in used {
        if let Some(t) = taken.get_mut(s) {
            *t = true;
        }
    }
    taken.iter().position(|t| !t).unwrap_or(parallel)
}

#[cfg(test)]
mod tests {
    use super::free_slot;

    #[test]
    fn the_lowest_free_slot_is_given() {
        assert_eq!(free_slot([].into_iter(), 4), 0);
        assert_eq!(free_slot([0, 1, 3].into_iter(), 4), 2);
        assert_eq!(free_slot([1, 0].into_iter(), 4), 2);
        assert_eq!(free_slot([0, 1, 2, 3].into_iter(), 4), 4);
    }
}
