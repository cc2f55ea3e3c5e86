//! Time per operation kind, for `bench --profile`: each backend call is timed while
//! profiling is on (one clock read before and after: nothing measurable beside a matrix
//! product).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// The operation kinds the backend times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Matrix products, activation quantization included.
    Matmul,
    /// Attention: the KV cache write, scores, softmax and weighted sums.
    Attention,
    /// RMSNorm.
    RmsNorm,
    /// RoPE.
    Rope,
    /// The gated activation (ReLU² or SiLU times up).
    Glu,
    /// Residual adds.
    Add,
    /// Embedding rows and row copies.
    Copy,
}

impl Op {
    /// Every kind, in the order a profile lists them.
    pub const ALL: [Op; 7] = [
        Op::Matmul,
        Op::Attention,
        Op::RmsNorm,
        Op::Rope,
        Op::Glu,
        Op::Add,
        Op::Copy,
    ];

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Matmul => "matmul",
            Op::Attention => "attention",
            Op::RmsNorm => "rms_norm",
            Op::Rope => "rope",
            Op::Glu => "glu",
            Op::Add => "add",
            Op::Copy => "embed/copy",
        }
    }
}

/// Calls and time of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpTime {
    /// The kind.
    pub op: Op,
    /// Backend calls.
    pub calls: u64,
    /// Wall time in nanoseconds.
    pub ns: u64,
}

/// Counters per kind, off until [`OpProfile::set`] turns them on.
#[derive(Default)]
pub struct OpProfile {
    on: AtomicBool,
    calls: [AtomicU64; Op::ALL.len()],
    ns: [AtomicU64; Op::ALL.len()],
}

impl OpProfile {
    /// Turns timing on (counters cleared) or off.
    pub fn set(&self, on: bool) {
        for c in self.calls.iter().chain(&self.ns) {
            c.store(0, Ordering::Relaxed);
        }
        self.on.store(on, Ordering::Relaxed);
    }

    /// Runs `f`, timing it as `op` when profiling is on.
    pub fn time<R>(&self, op: Op, f: impl FnOnce() -> R) -> R {
        if !self.on.load(Ordering::Relaxed) {
            return f();
        }
        let t0 = Instant::now();
        let r = f();
        let i = op as usize;
        self.calls[i].fetch_add(1, Ordering::Relaxed);
        self.ns[i].fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    /// The counters since profiling was turned on.
    pub fn times(&self) -> Vec<OpTime> {
        Op::ALL
            .iter()
            .map(|&op| OpTime {
                op,
                calls: self.calls[op as usize].load(Ordering::Relaxed),
                ns: self.ns[op as usize].load(Ordering::Relaxed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_while_on() {
        let p = OpProfile::default();
        p.time(Op::Add, || ());
        assert!(p.times().iter().all(|t| t.calls == 0));
        p.set(true);
        p.time(Op::Add, || {
            std::thread::sleep(std::time::Duration::from_millis(2))
        });
        p.time(Op::Add, || ());
        let add = p.times()[Op::Add as usize];
        assert_eq!((add.op, add.calls), (Op::Add, 2));
        assert!(add.ns >= 2_000_000);
        p.set(false);
        assert!(p.times().iter().all(|t| t.calls == 0));
    }
}
