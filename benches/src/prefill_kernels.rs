//! `prefill_kernels`: how many multiply-adds per second the CPU backend's ternary matrix
//! products reach on a batch of tokens (prompt processing is these products, compute-bound),
//! for the I2_S layout as in the file and interleaved sixteen rows deep.
//!
//! Usage: `cargo run --release -p hesper-benches --bin prefill_kernels -- [THREADS] [TOKENS]`
//! For each 2B4T matrix shape (random codes), TOKENS tokens (default 512), best of 5 products,
//! on THREADS threads (default: all cores), with every instruction set this CPU runs.

use std::time::Instant;

use hesper_cpu::{CpuBackend, CpuMatrix, Isa};
use hesper_engine::weights::Format;

mod common;
use common::{desc, random_bytes};

/// The 2B4T projections: (name, rows, cols).
const SHAPES: [(&str, usize, usize); 3] = [
    ("q/o (2560 × 2560)", 2560, 2560),
    ("gate/up (6912 × 2560)", 6912, 2560),
    ("down (2560 × 6912)", 2560, 6912),
];

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(512);
    for isa in Isa::supported().into_iter().filter(|&i| i != Isa::Scalar) {
        let backend = match CpuBackend::with_isa(threads, isa) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("prefill_kernels: {e}");
                std::process::exit(1);
            }
        };
        let layouts: &[bool] = if isa.interleaves_i2s() {
            &[false, true]
        } else {
            &[false]
        };
        for &tiled in layouts {
            for (name, rows, cols) in SHAPES {
                let d = desc(Format::I2S { beta: 1.0 }, rows, cols);
                let matrix = CpuMatrix::owned(random_bytes(d.range.end), d, None);
                let matrix = if tiled { matrix.interleaved() } else { matrix };
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                    .collect();
                let mut out = vec![0.0; n * rows];
                let best = backend.install(|| {
                    (0..5)
                        .map(|_| {
                            let t0 = Instant::now();
                            matrix.matmul(isa, &x, n, &mut out);
                            t0.elapsed().as_secs_f64()
                        })
                        .fold(f64::INFINITY, f64::min)
                });
                std::hint::black_box(&out);
                let gmacs = (rows * cols * n) as f64 / best / 1e9;
                println!(
                    "{:<12} {:<12} {name:<22} {n} tokens, {} threads: {gmacs:>6.1} GMAC/s ({:.1} per thread)",
                    isa.name(),
                    if tiled { "interleaved" } else { "as in file" },
                    backend.threads(),
                    gmacs / backend.threads() as f64
                );
            }
        }
    }
}
