//! Sizing a session before anything is allocated: every size a user can set (context, batch)
//! is multiplied out with checked arithmetic and held against what the backend can give, so an
//! absurd flag gets one clear error naming it and the largest value that fits, instead of a
//! wrapped size, a panic or an aborted allocation.

use thiserror::Error;

/// What a backend can give a session, in bytes; `None` where it does not know.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryLimits {
    /// The most one buffer may hold (a GPU's largest storage binding).
    pub max_buffer: Option<u64>,
    /// The most all of a session's buffers may hold together (memory free now).
    pub available: Option<u64>,
}

/// A session's buffers, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSize {
    /// Context positions.
    pub n_ctx: usize,
    /// Tokens per step.
    pub batch: usize,
    /// The whole KV cache.
    pub kv_bytes: u64,
    /// K or V of one layer: the largest KV buffer a backend holds separately.
    pub kv_layer_bytes: u64,
    /// Scratch activations for one step of `batch` tokens.
    pub scratch_bytes: u64,
    /// The largest scratch buffer.
    pub scratch_max_buffer: u64,
}

/// The shape that decides a session's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionShape {
    /// Layers this model instance holds.
    pub n_layer: usize,
    /// Of them, the layers whose caches hold a sliding window's slots, not the context, and
    /// those slots.
    pub windowed: Option<(usize, usize)>,
    /// Keys (and values) per position and layer.
    pub kv_dim: usize,
    /// Bytes a cached key or value takes.
    pub kv_bytes: usize,
    /// Widths of one token's scratch rows (residual, FFN, logits …).
    pub row_widths: [usize; 10],
}

/// A session that cannot be held.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SizeError {
    /// Zero positions.
    #[error("-c/--ctx-size: a context of 0 positions holds nothing")]
    EmptyContext,
    /// The KV cache does not fit.
    #[error("-c/--ctx-size {n_ctx}: {what} would take {}, more than {limit}; the largest context that fits is {max}", show_bytes(*needed))]
    Context {
        /// Positions asked for.
        n_ctx: usize,
        /// What does not fit: "the KV cache", "one layer's K or V cache".
        what: &'static str,
        /// Bytes needed (`None`: more than 2^64).
        needed: Option<u64>,
        /// What limits it, e.g. "the 21.3 GiB of memory available".
        limit: String,
        /// The largest context that fits.
        max: usize,
    },
    /// One step's scratch buffers do not fit.
    #[error("-b/--batch-size {batch}: one step's activations would take {}, more than {limit}; the largest batch that fits is {max}", show_bytes(*needed))]
    Batch {
        /// Tokens per step asked for.
        batch: usize,
        /// Bytes needed (`None`: more than 2^64).
        needed: Option<u64>,
        /// What limits it.
        limit: String,
        /// The largest batch that fits.
        max: usize,
    },
}

impl SessionShape {
    /// Sizes a session of `n_ctx` positions stepping `batch` tokens (clamped to `n_ctx`: a step
    /// never holds more tokens than the context) and checks it against `limits`.
    pub fn size(
        &self,
        n_ctx: usize,
        batch: usize,
        limits: MemoryLimits,
    ) -> Result<SessionSize, SizeError> {
        if n_ctx == 0 {
            return Err(SizeError::EmptyContext);
        }
        let batch = batch.clamp(1, n_ctx);
        let row_bytes: u64 = self.row_widths.iter().map(|&w| w as u64 * 4).sum();
        let widest_row = self.row_widths.iter().max().copied().unwrap_or(0) as u64 * 4;
        // K and V of every layer that holds the context, and of the windowed ones' slots.
        let (n_windowed, slots) = self.windowed.unwrap_or((0, 0));
        let layer_per_pos = self.kv_dim as u64 * 2 * self.kv_bytes as u64;
        let kv_per_pos = (self.n_layer - n_windowed) as u64 * layer_per_pos;
        let windowed = n_windowed as u64 * slots as u64 * layer_per_pos;
        let kv_layer_per_pos = self.kv_dim as u64 * self.kv_bytes as u64;
        let scratch = (batch as u64).checked_mul(row_bytes);
        let scratch_max = (batch as u64).checked_mul(widest_row);
        if let Some(avail) = limits.available {
            if scratch.is_none_or(|b| b > avail) {
                return Err(SizeError::Batch {
                    batch,
                    needed: scratch,
                    limit: format!("the {} of memory available", show(avail)),
                    max: fit(avail, row_bytes),
                });
            }
        }
        if let Some(limit) = limits.max_buffer {
            if scratch_max.is_none_or(|b| b > limit) {
                return Err(SizeError::Batch {
                    batch,
                    needed: scratch_max,
                    limit: format!("the device's largest buffer ({})", show(limit)),
                    max: fit(limit, widest_row),
                });
            }
        }
        let scratch = scratch.unwrap_or(u64::MAX);
        let kv = (n_ctx as u64)
            .checked_mul(kv_per_pos)
            .and_then(|b| b.checked_add(windowed));
        let kv_layer = (n_ctx as u64).checked_mul(kv_layer_per_pos);
        if let Some(avail) = limits.available {
            let left = avail.saturating_sub(scratch);
            if kv.is_none_or(|b| b > left) {
                return Err(SizeError::Context {
                    n_ctx,
                    what: "the KV cache",
                    needed: kv,
                    limit: format!("the {} of memory available", show(avail)),
                    max: fit(left.saturating_sub(windowed), kv_per_pos),
                });
            }
        }
        if let Some(limit) = limits.max_buffer {
            if kv_layer.is_none_or(|b| b > limit) {
                return Err(SizeError::Context {
                    n_ctx,
                    what: "one layer's K or V cache",
                    needed: kv_layer,
                    limit: format!("the device's largest buffer ({})", show(limit)),
                    max: fit(limit, kv_layer_per_pos),
                });
            }
        }
        // Both fit in u64 here: checked above or bounded by `usize` sizes of a few terms.
        Ok(SessionSize {
            n_ctx,
            batch,
            kv_bytes: kv.unwrap_or(u64::MAX),
            kv_layer_bytes: kv_layer.unwrap_or(u64::MAX),
            scratch_bytes: scratch,
            scratch_max_buffer: scratch_max.unwrap_or(u64::MAX),
        })
    }
}

/// How many units of `unit` bytes fit in `bytes` (as a `usize`).
fn fit(bytes: u64, unit: u64) -> usize {
    usize::try_from(bytes / unit.max(1)).unwrap_or(usize::MAX)
}

/// `bytes` for people: `512 B`, `3.2 MiB`, `47.7 GiB`.
pub fn show(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// [`show`] for a size that may have overflowed.
fn show_bytes(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "more than 16 EiB".into(), show)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> SessionShape {
        SessionShape {
            n_layer: 2,
            windowed: None,
            kv_dim: 64,
            kv_bytes: 4,
            row_widths: [128, 128, 128, 64, 64, 128, 256, 256, 256, 1000],
        }
    }

    #[test]
    fn batch_is_clamped_to_the_context() {
        let s = shape().size(16, 1 << 40, MemoryLimits::default()).unwrap();
        assert_eq!((s.n_ctx, s.batch), (16, 16));
        assert_eq!(s.kv_bytes, 16 * 2 * 64 * 8);
        assert_eq!(s.kv_layer_bytes, 16 * 64 * 4);
    }

    #[test]
    fn a_windowed_layer_holds_its_slots_whatever_the_context() {
        let windowed = SessionShape {
            windowed: Some((1, 600)),
            ..shape()
        };
        let s = windowed.size(1 << 16, 1, MemoryLimits::default()).unwrap();
        assert_eq!(s.kv_bytes, ((1 << 16) + 600) * 64 * 8);
    }

    #[test]
    fn a_context_past_u64_is_an_error_not_a_wrap() {
        let limits = MemoryLimits {
            max_buffer: None,
            available: Some(1 << 30),
        };
        let e = shape().size(1 << 58, 1, limits).unwrap_err();
        let SizeError::Context { needed, max, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(*needed, None);
        // The largest context that fits really fits, and one more does not.
        assert!(shape().size(*max, 1, limits).is_ok());
        assert!(shape().size(*max + 1, 1, limits).is_err());
        assert!(e.to_string().contains("more than 16 EiB"), "{e}");
    }

    #[test]
    fn the_device_buffer_limit_bounds_one_layer_and_the_batch() {
        let limits = MemoryLimits {
            max_buffer: Some(1 << 20),
            available: None,
        };
        let e = shape().size(1 << 20, 1, limits).unwrap_err();
        assert!(matches!(e, SizeError::Context { max: 4096, .. }), "{e}");
        let e = shape().size(4096, 4096, limits).unwrap_err();
        // The logits row (1000 floats) is the widest.
        assert!(matches!(e, SizeError::Batch { max: 262, .. }), "{e}");
        assert!(shape().size(4096, 262, limits).is_ok());
    }

    #[test]
    fn zero_positions_is_an_error() {
        assert_eq!(
            shape().size(0, 1, MemoryLimits::default()),
            Err(SizeError::EmptyContext)
        );
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(show(512), "512 B");
        assert_eq!(show(3 << 20), "3.0 MiB");
        assert_eq!(show(51_200_000_000), "47.7 GiB");
    }
}
