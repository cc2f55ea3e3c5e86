//! How attention stores and reads the KV cache: the element type of the cache and, opt-in, a
//! sparse pattern of the positions each query attends. Every backend implements exactly what
//! is defined here; [`SparsePattern::keys`] is the definition its tests compare against.

use std::fmt;

/// Element type of the KV cache (llama.cpp's `-ctk`/`-ctv`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    /// f32: exact, 4 bytes a value.
    #[default]
    F32,
    /// f16 (IEEE half, rounded to nearest even when stored; arithmetic stays f32): 2 bytes a
    /// value, half the memory. Values past ±65504 become ±∞.
    F16,
}

impl KvType {
    /// Bytes one value takes.
    pub fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }

    /// Name as the flags spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which earlier positions a query attends besides itself, when not all of them: the sparse
/// pattern of the seed (`ruvllm_sparse_attention`), with its landmarks kept out of the window.
/// For the query at position `i` (causal):
///
/// * the **window**: the `window` most recent positions `i + 1 − window ..= i` (all of `0..=i`
///   while `i < window`; the seed's `window` counts one more);
/// * the **globals**: each listed position `g ≤ i` outside the window;
/// * the **log-stride** positions `i − 2^k` (k = 0, 1, …) outside the window;
/// * **landmarks**: a key and value that are the means of a whole block of `block` positions
///   (kept as positions are appended, never rebuilt), scored like any key. With `p` the last
///   whole block that ends before the window starts, the blocks `p` and `p − 1`, and with
///   log-stride on also `p − 2^k`: so a query attends O(log i) keys outside its window.
///   Blocks reaching into the window get none (the seed's do, counting those positions
///   twice, so with a window over the whole context it does not equal dense attention; this
///   pattern does).
///
/// Exact positions are attended once each, however many rules name them; a block's landmark
/// is attended even when some of its positions are also attended exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparsePattern {
    /// Most recent positions attended (≥ 1).
    pub window: usize,
    /// Positions always attended, ascending.
    pub globals: Vec<usize>,
    /// Positions a landmark summarises (≥ 1).
    pub block: usize,
    /// Whether the log-stride positions are attended.
    pub log_stride: bool,
    /// Whether landmarks are attended.
    pub landmarks: bool,
}

impl Default for SparsePattern {
    fn default() -> Self {
        Self {
            window: 128,
            globals: vec![0],
            block: 64,
            log_stride: true,
            landmarks: true,
        }
    }
}

impl SparsePattern {
    /// The first position of the window of the query at `i`.
    pub fn window_start(&self, i: usize) -> usize {
        (i + 1).saturating_sub(self.window.max(1))
    }

    /// The exact positions the query at `i` attends outside its window, ascending (the
    /// window `window_start(i)..=i` is attended whole besides these).
    pub fn scattered(&self, i: usize, out: &mut Vec<usize>) {
        out.clear();
        let start = self.window_start(i);
        out.extend(self.globals.iter().copied().filter(|&g| g < start));
        if self.log_stride {
            let mut step = 1usize;
            while step <= i {
                if i - step < start {
                    out.push(i - step);
                }
                step = match step.checked_mul(2) {
                    Some(s) => s,
                    None => break,
                };
            }
        }
        out.sort_unstable();
        out.dedup();
    }

    /// The blocks whose landmarks the query at `i` attends, ascending (see the type's docs).
    pub fn landmark_blocks(&self, i: usize, out: &mut Vec<usize>) {
        out.clear();
        let before = self.window_start(i) / self.block.max(1);
        if !self.landmarks || before == 0 {
            return;
        }
        let p = before - 1;
        out.push(p);
        let mut step = 1usize;
        while step <= p && (self.log_stride || step == 1) {
            out.push(p - step);
            step = match step.checked_mul(2) {
                Some(s) => s,
                None => break,
            };
        }
        out.reverse();
    }

    /// Every key the query at `i` attends, in the order backends visit them: the window
    /// ascending, the scattered positions ascending, then the landmarks.
    pub fn keys(&self, i: usize) -> Vec<Key> {
        let (mut scattered, mut blocks) = (Vec::new(), Vec::new());
        self.scattered(i, &mut scattered);
        self.landmark_blocks(i, &mut blocks);
        (self.window_start(i)..=i)
            .chain(scattered)
            .map(Key::Position)
            .chain(blocks.into_iter().map(Key::Landmark))
            .collect()
    }

    /// Whether the query at `i` attends exactly the positions dense attention does (no
    /// position is left out, so no landmark is needed either).
    pub fn is_dense_at(&self, i: usize) -> bool {
        self.window_start(i) == 0
    }
}

/// One key a sparse query attends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    /// The cached key and value at a position.
    Position(usize),
    /// The mean key and value of a block of positions.
    Landmark(usize),
}

/// How a session's attention stores and reads its cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttentionConfig {
    /// Element type of the KV cache.
    pub kv_type: KvType,
    /// The sparse pattern, or `None` for dense attention (every earlier position).
    pub sparse: Option<SparsePattern>,
    /// Whether a sliding-window layer's cache holds the whole context (llama.cpp's
    /// `--swa-full`) instead of its window and one step: more memory, and a session can be
    /// truncated to any position it holds (a prompt's cached prefix is always reused).
    pub swa_full: bool,
}

impl AttentionConfig {
    /// A one-line description, e.g. `dense, f32 KV` or
    /// `sparse (window 128, globals [0], block 64, log-stride, landmarks), f16 KV`.
    pub fn describe(&self) -> String {
        let mode = match &self.sparse {
            None => "dense".to_string(),
            Some(p) => {
                let mut parts = vec![
                    format!("window {}", p.window),
                    format!("globals {:?}", p.globals),
                    format!("block {}", p.block),
                ];
                if p.log_stride {
                    parts.push("log-stride".into());
                }
                if p.landmarks {
                    parts.push("landmarks".into());
                }
                format!("sparse ({})", parts.join(", "))
            }
        };
        let swa = if self.swa_full {
            ", full-size sliding-window caches"
        } else {
            ""
        };
        format!("{mode}, {} KV{swa}", self.kv_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_inside_its_window_attends_every_earlier_position() {
        let p = SparsePattern::default();
        assert!(p.is_dense_at(127));
        assert_eq!(
            p.keys(127),
            (0..=127).map(Key::Position).collect::<Vec<_>>()
        );
        assert!(!p.is_dense_at(128));
    }

    #[test]
    fn the_pattern_names_window_globals_strides_and_whole_blocks() {
        let p = SparsePattern {
            window: 4,
            globals: vec![0, 9],
            block: 3,
            log_stride: true,
            landmarks: true,
        };
        // i = 12: window 9..=12; strides 11, 10, 8, 4 (only 8, 4 outside); global 0 (9 is
        // in the window); whole blocks before 9: 0, 1, 2, so p = 2 and p − 1, p − 2.
        let (mut s, mut b) = (Vec::new(), Vec::new());
        p.scattered(12, &mut s);
        assert_eq!(s, vec![0, 4, 8]);
        p.landmark_blocks(12, &mut b);
        assert_eq!(b, vec![0, 1, 2]);
        let keys = p.keys(12);
        assert_eq!(keys.len(), 4 + 3 + 3);
        assert_eq!(keys[4], Key::Position(0));
        assert_eq!(keys[7], Key::Landmark(0));
        // i = 10: window 7..=10, block 2 (6..9) reaches into it: only blocks 0 and 1.
        p.landmark_blocks(10, &mut b);
        assert_eq!(b, vec![0, 1]);
        // Far out, landmarks thin out by powers of two: window 299..=302, p = 98.
        p.landmark_blocks(302, &mut b);
        assert_eq!(b, vec![34, 66, 82, 90, 94, 96, 97, 98]);
        let no_stride = SparsePattern {
            log_stride: false,
            ..p.clone()
        };
        no_stride.landmark_blocks(302, &mut b);
        assert_eq!(b, vec![97, 98]);
    }

    #[test]
    fn off_switches_leave_only_the_window_and_globals() {
        let p = SparsePattern {
            window: 2,
            globals: vec![1],
            block: 4,
            log_stride: false,
            landmarks: false,
        };
        assert_eq!(
            p.keys(20),
            vec![Key::Position(19), Key::Position(20), Key::Position(1)]
        );
    }

    #[test]
    fn the_description_names_the_mode_and_cache_type() {
        let dense = AttentionConfig::default();
        assert_eq!(dense.describe(), "dense, f32 KV");
        let sparse = AttentionConfig {
            swa_full: false,
            kv_type: KvType::F16,
            sparse: Some(SparsePattern::default()),
        };
        assert_eq!(
            sparse.describe(),
            "sparse (window 128, globals [0], block 64, log-stride, landmarks), f16 KV"
        );
    }
}
