//! `membw`: measures this machine's memory read bandwidth, the ceiling of token generation
//! (decode reads every weight once per token).
//!
//! Usage: `cargo run --release -p hesper-benches --bin membw -- [THREADS] [GIB]`
//! Prints GB/s for 1..=THREADS threads (best of 6 passes over a GIB-sized buffer).

fn main() {
    let mut args = std::env::args().skip(1);
    let max_threads: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let gib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    for threads in 1..=max_threads {
        let best = hesper_cpu::membw::read_bandwidth(threads, gib << 30, 6);
        println!("read bandwidth, {threads} thread(s): {best:.1} GB/s");
    }
}
