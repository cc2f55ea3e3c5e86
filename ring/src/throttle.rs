//! At most one report per interval: a flood of refused datagrams is one line a second with a
//! count, not a line each.

use std::time::{Duration, Instant};

/// Reports of one kind, admitted at most once per `every`; the ones held back in between are
/// counted and named by the next admitted one.
#[derive(Debug)]
pub(crate) struct Throttle {
    every: Duration,
    last: Option<Instant>,
    held: u64,
}

impl Throttle {
    /// A throttle admitting one report per `every`.
    pub(crate) fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            held: 0,
        }
    }

    /// Whether a report at `now` is shown: `Some(n)` with the `n` held back since the last
    /// one shown, `None` when it is held back itself.
    pub(crate) fn admit(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < self.every)
        {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_report_per_interval_then_the_count_held_back() {
        let mut t = Throttle::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(t.admit(t0), Some(0));
        for i in 1..=500 {
            assert_eq!(t.admit(t0 + Duration::from_micros(i)), None);
        }
        assert_eq!(t.admit(t0 + Duration::from_millis(999)), None);
        assert_eq!(t.admit(t0 + Duration::from_millis(1000)), Some(501));
        assert_eq!(t.admit(t0 + Duration::from_millis(1500)), None);
        assert_eq!(t.admit(t0 + Duration::from_millis(2500)), Some(1));
    }
}
