//! The machine's memory read bandwidth: the ceiling of token generation, which reads every
//! weight once per token (`roofline t/s = bandwidth / bytes per token`).

use std::time::Instant;

/// Best read bandwidth in GB/s of `threads` threads summing a buffer of `bytes` (rounded down
/// to whole 64-byte lines) over `passes` passes.
pub fn read_bandwidth(threads: usize, bytes: usize, passes: usize) -> f64 {
    let words = (bytes / 64 * 8).max(8);
    let data: Vec<u64> = (0..words as u64).collect();
    let threads = threads.max(1);
    let mut best = 0.0f64;
    for _ in 0..passes.max(1) {
        let t0 = Instant::now();
        let sum: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = data
                .chunks(words.div_ceil(threads))
                .map(|part| s.spawn(move || read_sum(part)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        std::hint::black_box(sum);
        best = best.max((words * 8) as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// Sums a slice with eight independent lanes so the loop is bound by memory, not by adds.
fn read_sum(part: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    for chunk in part.chunks_exact(8) {
        for (l, &v) in lanes.iter_mut().zip(chunk) {
            *l = l.wrapping_add(v);
        }
    }
    lanes.iter().fold(0, |a, &b| a.wrapping_add(b))
}

#[cfg(test)]
mod tests {
    #[test]
    fn bandwidth_is_a_positive_finite_rate() {
        let gbs = super::read_bandwidth(2, 1 << 20, 2);
        assert!(gbs.is_finite() && gbs > 0.0, "{gbs}");
    }
}
