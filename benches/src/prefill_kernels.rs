//! `prefill_kernels`: how many multiply-adds per second the CPU backend's matrix products
//! reach on a batch of tokens (prompt processing is these products, compute-bound): the I2_S
//! layout as in the file and interleaved sixteen rows deep, or Q8_0, F16 or a K-quant.
//!
//! Usage: `cargo run --release -p hesper-benches --bin prefill_kernels -- [THREADS] [TOKENS]
//! [i2s|q8_0|f16|q4_k|q5_k|q6_k]` For each 2B4T matrix shape (random weights), TOKENS tokens (default 512),
//! best of 5 products, on THREADS threads (default: all cores), with every instruction set
//! this CPU runs.

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
    let format = match args.next().as_deref() {
        None | Some("i2s") => Format::I2S { beta: 1.0 },
        Some("q8_0") => Format::Q8_0,
        Some("f16") => Format::F16,
        Some("q4_k") => Format::Q4K,
        Some("q5_k") => Format::Q5K,
        Some("q6_k") => Format::Q6K,
        Some(other) => {
            eprintln!("prefill_kernels: no format {other:?} (i2s, q8_0, f16, q4_k, q5_k or q6_k)");
            std::process::exit(1);
        }
    };
    for isa in Isa::supported().into_iter().filter(|&i| i != Isa::Scalar) {
        let backend = match CpuBackend::with_isa(threads, isa) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("prefill_kernels: {e}");
                std::process::exit(1);
            }
        };
        let interleaves = match format {
            Format::I2S { .. } => isa.interleaves_i2s(),
            Format::Q8_0 => isa.interleaves_q8_0(),
            Format::F16 => isa.interleaves_f16(),
            Format::Q4K | Format::Q5K => isa.interleaves_q4_k(),
            Format::Q6K => isa.interleaves_q6_k(),
            _ => false,
        };
        let layouts: &[bool] = if interleaves {
            &[false, true]
        } else {
            &[false]
        };
        for &tiled in layouts {
            for (name, rows, cols) in SHAPES {
                let d = desc(format, rows, cols);
                let matrix = CpuMatrix::owned(weights(format, d.range.end), d, None);
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
                    match (format, tiled) {
                        (Format::I2S { .. }, true) => "interleaved",
                        (Format::I2S { .. }, false) => "as in file",
                        (_, true) => "inter.",
                        _ => "as in file",
                    },
                    backend.threads(),
                    gmacs / backend.threads() as f64
                );
            }
        }
    }
}

/// `n` bytes of weights in `format`: random codes, with finite, normal halves where the format
/// stores floats (a NaN or subnormal would time the CPU's slow paths, not the kernel).
fn weights(format: Format, n: usize) -> Vec<u8> {
    let mut bytes = random_bytes(n);
    let normal_half = |b: &mut [u8]| b[1] = (b[1] & 0x83) | 0x30;
    match format {
        Format::F16 => bytes.chunks_exact_mut(2).for_each(normal_half),
        Format::Q8_0 => bytes
            .chunks_exact_mut(34)
            .for_each(|b| normal_half(&mut b[..2])),
        // d and dmin lead a Q4_K or Q5_K block; d ends a Q6_K one.
        Format::Q4K | Format::Q5K => {
            let block = if format == Format::Q4K { 144 } else { 176 };
            for b in bytes.chunks_exact_mut(block) {
                normal_half(&mut b[..2]);
                normal_half(&mut b[2..4]);
            }
        }
        Format::Q6K => bytes
            .chunks_exact_mut(210)
            .for_each(|b| normal_half(&mut b[208..])),
        _ => {}
    }
    bytes
}
