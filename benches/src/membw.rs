//! `membw`: measures this machine's memory read bandwidth, the ceiling of token generation
//! (decode reads every weight once per token).
//!
//! Usage: `cargo run --release -p hesper-benches --bin membw -- [THREADS] [GIB]`
//! Prints GB/s for 1..=THREADS threads (best of 6 passes over a GIB-sized buffer).

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let max_threads: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let gib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let words = gib << 27; // u64 words in `gib` GiB
    let data: Vec<u64> = (0..words as u64).collect();
    for threads in 1..=max_threads {
        let mut best = 0.0f64;
        for _ in 0..6 {
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
        println!("read bandwidth, {threads} thread(s): {best:.1} GB/s");
    }
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
