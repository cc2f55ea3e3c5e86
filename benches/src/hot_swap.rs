//! `hot_swap`: what swapping in one layer's FFN tensors costs against loading the whole model.
//! A copy of MODEL is loaded for hot-swap; each round rewrites layer L's `ffn_gate`, `ffn_up`
//! and `ffn_down` in place (gate and up exchanged, down taken from the next layer), then puts
//! them back, timing [`Model::reload_changed`] each time, interleaved with full loads (the
//! mapped load every command does, and the hot-swap load that reads and hashes every tensor),
//! a check of an untouched file (one `stat()`) and of a file touched but not changed (every
//! tensor read and hashed, none prepared: what a swap costs before its tensors).
//!
//! Usage: `cargo run --release -p hesper-benches --bin hot_swap -- MODEL [cpu|gpu] [ROUNDS] [THREADS]`
//! (MODEL: `bench-2b4t-i2s.gguf` from `python golden-values/generate.py --bench-2b4t DIR`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use hesper_cpu::CpuBackend;
use hesper_engine::backend::Backend;
use hesper_engine::file::ModelFile;
use hesper_engine::gguf::Gguf;
use hesper_engine::model::{LoadOptions, Model, Reload};
use hesper_gpu_backend::GpuBackend;

/// The layer whose FFN is swapped.
const LAYER: usize = 10;

fn main() {
    let mut args = std::env::args().skip(1);
    let model = PathBuf::from(
        args.next()
            .expect("usage: hot_swap MODEL [cpu|gpu] [ROUNDS] [THREADS]"),
    );
    let on = args.next().unwrap_or_else(|| "cpu".into());
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let copy =
        std::env::temp_dir().join(format!("hesper-hot-swap-bench-{}.gguf", std::process::id()));
    std::fs::copy(&model, &copy).expect("copy the model");
    match on.as_str() {
        "gpu" => run(|| GpuBackend::new().expect("a GPU"), &copy, rounds),
        _ => run(
            || CpuBackend::new(threads).expect("CPU backend"),
            &copy,
            rounds,
        ),
    }
    let _ = std::fs::remove_file(&copy);
}

/// The byte ranges of `names` in the file at `path`.
fn ranges(path: &Path, names: &[String]) -> Vec<std::ops::Range<usize>> {
    let file = ModelFile::open(path).expect("open");
    let g: &Gguf = file.header();
    names
        .iter()
        .map(|n| {
            let t = g.tensor(n).unwrap_or_else(|| panic!("no tensor {n}"));
            t.start as usize..(t.start + t.nbytes.expect("size")) as usize
        })
        .collect()
}

fn run<B: Backend>(backend: impl Fn() -> B, path: &Path, rounds: usize) {
    let blk = |il: usize, n: &str| format!("blk.{il}.{n}.weight");
    let names = [
        blk(LAYER, "ffn_gate"),
        blk(LAYER, "ffn_up"),
        blk(LAYER, "ffn_down"),
        blk(LAYER + 1, "ffn_down"),
    ];
    let r = ranges(path, &names);
    let original = std::fs::read(path).expect("read");
    let mut edited = original.clone();
    edited[r[0].clone()].copy_from_slice(&original[r[1].clone()]);
    edited[r[1].clone()].copy_from_slice(&original[r[0].clone()]);
    edited[r[2].clone()].copy_from_slice(&original[r[3].clone()]);
    let ffn_bytes: usize = r[..3].iter().map(|r| r.len()).sum();

    let start = Instant::now();
    let mut model = Model::load_hot_swap(backend(), path, LoadOptions::default()).expect("load");
    let first_load = start.elapsed().as_secs_f64();
    println!(
        "{} | {} | {:.1} MB file, layer {LAYER}'s FFN {:.1} MB",
        path.display(),
        model.backend.name(),
        original.len() as f64 / 1e6,
        ffn_bytes as f64 / 1e6
    );
    println!("first hot-swap load (cold): {:.0} ms", first_load * 1e3);
    let (mut swaps, mut mapped, mut hashed, mut checks) = (vec![], vec![], vec![], vec![]);
    let mut touched = vec![];
    for round in 0..rounds {
        for bytes in [&edited, &original] {
            // In place, as a script that patches tensors writes; the file's times move on.
            std::thread::sleep(std::time::Duration::from_millis(20));
            write_in_place(path, bytes, &r[..3]);
            let t = Instant::now();
            match model.reload_changed().expect("reload") {
                Reload::Swapped(s) => assert_eq!(s.tensors.len(), 3, "round {round}"),
                Reload::Unchanged => panic!("round {round}: the edit was not seen"),
            }
            swaps.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            assert_eq!(model.reload_changed().expect("check"), Reload::Unchanged);
            checks.push(t.elapsed().as_secs_f64());
        }
        // A file rewritten alike: every tensor read and hashed, none prepared.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let f = std::fs::File::options()
            .write(true)
            .open(path)
            .expect("open");
        f.set_modified(std::time::SystemTime::now()).expect("touch");
        let t = Instant::now();
        assert_eq!(model.reload_changed().expect("check"), Reload::Unchanged);
        touched.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let file = ModelFile::open(path).expect("open");
        drop(Model::load(backend(), file, LoadOptions::default()).expect("load"));
        mapped.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        drop(Model::load_hot_swap(backend(), path, LoadOptions::default()).expect("load"));
        hashed.push(t.elapsed().as_secs_f64());
    }
    let ms = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2] * 1e3, v[0] * 1e3, v[v.len() - 1] * 1e3)
    };
    println!("| what | median ms | min | max | runs |\n|---|---:|---:|---:|---:|");
    for (what, v) in [
        ("swap layer FFN (3 tensors)", &mut swaps),
        ("check, file untouched (stat)", &mut checks),
        (
            "check, file touched (read + hash every tensor)",
            &mut touched,
        ),
        ("full load (mapped file)", &mut mapped),
        ("full load for hot-swap (read + hash)", &mut hashed),
    ] {
        let n = v.len();
        let (med, lo, hi) = ms(v);
        println!("| {what} | {med:.2} | {lo:.2} | {hi:.2} | {n} |");
    }
}

/// Writes `bytes`' `ranges` over the file at `path`, leaving the rest as it is.
fn write_in_place(path: &Path, bytes: &[u8], ranges: &[std::ops::Range<usize>]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    for r in ranges {
        f.write_all_at(&bytes[r.clone()], r.start as u64)
            .expect("write");
    }
}
