//! `cpu_kernels`: how fast the CPU backend's matrix × vector products stream their weights
//! from memory, per layout, beside the machine's read bandwidth (decode is one such product
//! per weight matrix per token, so a layout's GB/s here is its share of the roofline).
//!
//! Usage: `cargo run --release -p hesper-benches --bin cpu_kernels -- [THREADS] [MIB] [TOKENS]
//! [LAYOUT] [KERNELS]`
//! For each layout, a random matrix of about MIB MiB (default 512, far above the caches) with
//! the 2B4T widths, best of 8 products, on THREADS threads (default: all cores), for each count
//! of tokens in TOKENS (default 1; e.g. `1,2,4,8`: a server's batched decode multiplies one
//! token of each sequence at once, and a good kernel reads the weights once for all of them),
//! from the file's layout and, where this CPU's kernels interleave the layout at load, from the
//! interleaved copy (TQ1_0: from the TQ2_0 copy the load rewrites it into). LAYOUT (`q4_k`,
//! say) measures only the cases whose name starts with it (`all` for every one); KERNELS names
//! an instruction set as `--cpu-kernels` does (`avx2` on an AVX-512 machine, say; default: the
//! best this CPU has).

use std::time::Instant;

use hesper_cpu::kernels::Isa;
use hesper_cpu::{CpuBackend, CpuMatrix};
use hesper_engine::weights::Format;

mod common;
use common::{desc, random_bytes};

/// The layouts decode streams, with the row width each has in the 2B4T model (Llama 3.2 1B's
/// for the types of llama.cpp's quantized files).
const CASES: [(&str, Format, usize); 10] = [
    ("i2_s (attn/up, 2560 cols)", Format::I2S { beta: 1.0 }, 2560),
    ("i2_s (down, 6912 cols)", Format::I2S { beta: 1.0 }, 6912),
    ("tq2_0 (attn/up, 2560 cols)", Format::TQ2_0, 2560),
    ("tq1_0 (attn/up, 2560 cols)", Format::TQ1_0, 2560),
    ("f16 (LM head)", Format::F16, 2560),
    ("q8_0 (LM head)", Format::Q8_0, 2560),
    ("q6_k (LM head)", Format::Q6K, 2560),
    ("q4_0 (Llama 1B, 2048 cols)", Format::Q4_0, 2048),
    ("q4_k (Llama 1B, 2048 cols)", Format::Q4K, 2048),
    ("q5_k (Llama 1B, 2048 cols)", Format::Q5K, 2048),
];

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(512);
    let counts: Vec<usize> = args
        .next()
        .map(|a| a.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| vec![1]);
    let only = args.next().filter(|o| o != "all");
    let isa = match args.next() {
        Some(name) => match Isa::from_name(&name) {
            Some(isa) => isa,
            None => {
                eprintln!("cpu_kernels: no kernels named {name:?}");
                std::process::exit(1);
            }
        },
        None => Isa::detect(),
    };
    let backend = match CpuBackend::with_isa(threads, isa) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("cpu_kernels: {e}");
            std::process::exit(1);
        }
    };
    let threads = backend.threads();
    let gbs = hesper_cpu::membw::read_bandwidth(threads, mib << 20, 6);
    println!(
        "{threads} thread(s), {} kernels; read bandwidth {gbs:.1} GB/s",
        backend.isa().name()
    );
    for (name, format, cols) in CASES {
        if only.as_ref().is_some_and(|o| !name.starts_with(o.as_str())) {
            continue;
        }
        let probe = desc(format, 1, cols);
        let rows = (mib << 20) / probe.row_bytes() / 16 * 16;
        let desc = desc(format, rows, cols);
        let bytes = desc.range.end as f64;
        let file = CpuMatrix::owned(random_bytes(desc.range.end), desc.clone(), None);
        let mut matrices = vec![(name.to_string(), file)];
        if interleaves(isa, format) {
            let copy =
                CpuMatrix::owned(random_bytes(desc.range.end), desc.clone(), None).interleaved();
            matrices.push((format!("{name}, interleaved"), copy));
        }
        if format == Format::TQ1_0 && isa.rewrites_tq1_0() {
            // GB/s of the file's bytes: the rewrite reads 22 % more.
            let copy = CpuMatrix::owned(random_bytes(desc.range.end), desc, None).as_tq2_0();
            matrices.push((format!("{name}, as TQ2_0"), copy));
        }
        for (name, matrix) in &matrices {
            measure(&backend, name, matrix, cols, rows, bytes, &counts, gbs);
        }
    }
}

/// Whether the backend's load interleaves a product matrix of `format` for `isa`.
fn interleaves(isa: Isa, format: Format) -> bool {
    match format {
        Format::I2S { .. } => isa.interleaves_i2s(),
        Format::Q8_0 => isa.interleaves_q8_0(),
        Format::Q4_0 => isa.interleaves_q4_0(),
        Format::Q4K | Format::Q5K => isa.interleaves_q4_k(),
        Format::Q6K => isa.interleaves_q6_k(),
        Format::F16 => isa.interleaves_f16(),
        _ => false,
    }
}

/// Prints the best of eight products of `matrix` (`bytes` of weights) with each count of
/// tokens in `counts`.
#[allow(clippy::too_many_arguments)]
fn measure(
    backend: &CpuBackend,
    name: &str,
    matrix: &CpuMatrix,
    cols: usize,
    rows: usize,
    bytes: f64,
    counts: &[usize],
    gbs: f64,
) {
    for &n in counts {
        let x: Vec<f32> = (0..cols * n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let mut out = vec![0.0; rows * n];
        let best = backend.install(|| {
            (0..8)
                .map(|_| {
                    let t0 = Instant::now();
                    matrix.matmul(backend.isa(), &x, n, &mut out);
                    t0.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        });
        std::hint::black_box(&out);
        let rate = bytes / best / 1e9;
        let tokens = if n == 1 {
            String::new()
        } else {
            format!(" × {n} tokens")
        };
        println!(
            "{:<40} {rate:>6.1} GB/s  ({:.0} % of the read bandwidth), {:.2} ms per token",
            format!("{name}{tokens}"),
            100.0 * rate / gbs,
            best * 1e3 / n as f64
        );
    }
}
