//! Hot-swap: a copy of a model is edited under a running model — one tensor's values, then a
//! tensor's type, then a shape, then a write cut short — and after each check the logits equal
//! those of a fresh load of the file as it is on disk, bit for bit (CPU with each instruction
//! set this machine runs, GPU), the refused edits keep the previous logits, and the resident
//! set stays flat over 1,000 swaps.

use std::path::{Path, PathBuf};

use hesper_cpu::{CpuBackend, Isa};
use hesper_engine::backend::Backend;
use hesper_engine::file::ModelFile;
use hesper_engine::gguf::{Gguf, GgufBuilder};
use hesper_engine::model::{LoadOptions, Logits, Model, Reload, ReloadError};
use hesper_engine::quantize::{self, QuantType};
use hesper_tests::golden_dir;
use hesper_tests::scratch::Scratch;

const TOKENS: [u32; 6] = [1, 15, 200, 7, 99, 3];

/// One test at a time: the memory test reads the process's resident set, which the others'
/// allocations would move.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn model_path(name: &str) -> PathBuf {
    golden_dir().join("models").join(name)
}

fn logits<B: Backend>(model: &Model<B>) -> Vec<u32> {
    let mut s = model.new_session(TOKENS.len(), 8).expect("session");
    let v = model.eval(&mut s, &TOKENS, Logits::All).expect("eval");
    v.iter().map(|x| x.to_bits()).collect()
}

/// `bytes` with tensor `dst`'s data replaced by `src`'s (same type and size).
fn copy_tensor(bytes: &[u8], src: &str, dst: &str) -> Vec<u8> {
    let g = Gguf::parse(bytes).expect("parse");
    let (s, d) = (g.tensor(src).expect("src"), g.tensor(dst).expect("dst"));
    let len = s.nbytes.expect("size") as usize;
    assert_eq!(Some(len as u64), d.nbytes);
    let at = |t: &hesper_engine::gguf::TensorInfo| t.start as usize;
    let mut out = bytes.to_vec();
    out.copy_within(at(s)..at(s) + len, at(d));
    out
}

/// `bytes` with tensor `name` converted to `to` by `hesper-rs quantize`'s writer.
fn retype(bytes: &[u8], name: &str, to: QuantType) -> Vec<u8> {
    let file = ModelFile::from_bytes(bytes.to_vec(), "in memory").expect("parse");
    // Only `name` changes type: every other tensor is copied as it is.
    let mut plans = quantize::plan(file.header().tensors(), to, &[]);
    for p in &mut plans {
        if p.info.name != name {
            p.to = None;
        }
    }
    let mut out = Vec::new();
    quantize::write(&file, &plans, QuantType::Q8_0, &mut out, &mut |_, _| {}).expect("write");
    out
}

/// `bytes` rebuilt with tensor `name` given dims `ne` (the same number of values).
fn reshape(bytes: &[u8], name: &str, ne: &[u64]) -> Vec<u8> {
    let g = Gguf::parse(bytes).expect("parse");
    let mut b = GgufBuilder::new();
    for (k, v) in g.metadata() {
        b = b.kv(k, v.clone());
    }
    for t in g.tensors() {
        let data = g.tensor_bytes(bytes, t).expect("data").to_vec();
        let dims = if t.name == name { ne } else { t.dims() };
        b = b.tensor(&t.name, dims, t.ty.id(), data);
    }
    b.build()
}

fn fresh<B: Backend>(backend: B, path: &Path) -> Vec<u32> {
    let file = ModelFile::open(path).expect("open");
    logits(&Model::load(backend, file, LoadOptions::default()).expect("fresh load"))
}

fn swapped(r: Result<Reload, ReloadError>) -> Vec<(String, String, String)> {
    match r.unwrap_or_else(|e| panic!("{e}")) {
        Reload::Swapped(s) => s.tensors,
        Reload::Unchanged => panic!("the edit was not seen"),
    }
}

/// The whole sequence of edits on the Llama-shaped Q8_0 model, on `backend()`'s backend.
fn edits<B: Backend>(tag: &str, backend: impl Fn() -> B) {
    let base = std::fs::read(model_path("tiny-llama-q8_0.gguf")).expect("model");
    let copy = Scratch::new(
        &format!("hot-swap-{tag}"),
        &model_path("tiny-llama-q8_0.gguf"),
    );
    let mut model = Model::load_hot_swap(backend(), &copy.0, LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let original = logits(&model);
    assert_eq!(original, fresh(backend(), &copy.0));
    assert_eq!(model.reload_changed().expect("check"), Reload::Unchanged);

    // 1. One tensor's values, written in place over the old ones.
    let edited = copy_tensor(&base, "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight");
    copy.write(&edited);
    let names = swapped(model.reload_changed());
    assert_eq!(
        names,
        [("blk.0.ffn_up.weight".into(), "Q8_0".into(), "Q8_0".into())]
    );
    let after_values = logits(&model);
    assert_ne!(after_values, original, "the edit changes the logits");
    assert_eq!(after_values, fresh(backend(), &copy.0), "{tag}: same type");

    // 2. A type change (the file rewritten, every offset after the tensor moved).
    let retyped = retype(&edited, "blk.1.ffn_down.weight", QuantType::F16);
    copy.write(&retyped);
    let names = swapped(model.reload_changed());
    assert_eq!(
        names,
        [("blk.1.ffn_down.weight".into(), "Q8_0".into(), "F16".into())]
    );
    let after_type = logits(&model);
    assert_ne!(after_type, after_values);
    assert_eq!(after_type, fresh(backend(), &copy.0), "{tag}: type change");
    let bytes_f16 = model.bytes_per_token();

    // 3. A shape change is refused; the weights stay.
    copy.write(&reshape(&retyped, "blk.0.attn_norm.weight", &[32, 2]));
    let err = model
        .reload_changed()
        .expect_err("a shape change is refused");
    assert!(matches!(err, ReloadError::Shape { .. }), "{err}");
    assert_eq!(logits(&model), after_type);

    // 4. A write cut short: refused, weights kept, and tried again at the next check.
    let back = &base;
    copy.write(&back[..back.len() / 2]);
    let err = model.reload_changed().expect_err("half a file is refused");
    assert!(matches!(err, ReloadError::Header(_)), "{err}");
    assert_eq!(logits(&model), after_type);
    copy.write(back);
    let mut names = swapped(model.reload_changed());
    names.sort();
    assert_eq!(
        names,
        [
            ("blk.0.ffn_up.weight".into(), "Q8_0".into(), "Q8_0".into()),
            ("blk.1.ffn_down.weight".into(), "F16".into(), "Q8_0".into()),
        ]
    );
    assert_eq!(logits(&model), original, "{tag}: back to the first file");
    assert!(
        model.bytes_per_token() < bytes_f16,
        "F16 reads more than Q8_0"
    );
    assert_eq!(model.reload_changed().expect("check"), Reload::Unchanged);
}

#[test]
fn cpu_edits_swap_in_as_a_fresh_load_of_the_file() {
    let _serial = serial();
    for isa in Isa::supported() {
        edits(isa.name(), || {
            CpuBackend::with_isa(2, isa).unwrap_or_else(|e| panic!("{e}"))
        });
    }
}

#[test]
fn gpu_edits_swap_in_as_a_fresh_load_of_the_file() {
    let _serial = serial();
    edits("gpu", || {
        hesper_gpu_backend::GpuBackend::new().unwrap_or_else(|e| panic!("{e}"))
    });
}

/// A ternary model (I2_S, repacked for the CPU's kernels): a same-type edit of a joined
/// gate/up pair swaps in as a fresh load.
#[test]
fn a_ternary_edit_swaps_in_on_cpu_and_gpu() {
    let _serial = serial();
    let path = model_path("tiny-i2s-bitnet.gguf");
    let base = std::fs::read(&path).expect("model");
    let edited = copy_tensor(&base, "blk.1.ffn_up.weight", "blk.1.ffn_gate.weight");
    let cpu = || CpuBackend::with_isa(2, Isa::detect()).unwrap_or_else(|e| panic!("{e}"));
    let gpu = || hesper_gpu_backend::GpuBackend::new().unwrap_or_else(|e| panic!("{e}"));
    let copy = Scratch::new("hot-swap-i2s", &path);
    let mut on_cpu = Model::load_hot_swap(cpu(), &copy.0, LoadOptions::default()).expect("load");
    let mut on_gpu = Model::load_hot_swap(gpu(), &copy.0, LoadOptions::default()).expect("load");
    let before = logits(&on_cpu);
    copy.write(&edited);
    assert_eq!(swapped(on_cpu.reload_changed()).len(), 1);
    assert_eq!(swapped(on_gpu.reload_changed()).len(), 1);
    let after = logits(&on_cpu);
    assert_ne!(after, before);
    assert_eq!(after, fresh(cpu(), &copy.0));
    assert_eq!(logits(&on_gpu), fresh(gpu(), &copy.0));
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .expect("rss")
        .parse()
        .expect("number");
    pages * 4096
}

/// 1,000 swaps of one tensor (the file replaced by a rename each time, as an editor saves):
/// the resident set does not grow with them.
#[test]
fn memory_stays_flat_over_a_thousand_swaps() {
    let _serial = serial();
    let path = model_path("tiny-llama-q8_0.gguf");
    let base = std::fs::read(&path).expect("model");
    let name = "blk.0.ffn_up.weight";
    let tensor_bytes = Gguf::parse(&base)
        .expect("parse")
        .tensor(name)
        .expect("tensor")
        .nbytes
        .expect("size");
    let edited = copy_tensor(&base, "blk.0.ffn_gate.weight", name);
    let copy = Scratch::new("hot-swap-rss", &path);
    let backend = CpuBackend::with_isa(2, Isa::detect()).expect("cpu");
    let mut model = Model::load_hot_swap(backend, &copy.0, LoadOptions::default()).expect("load");
    let next = copy.0.with_extension("next");
    let mut swap = |i: usize| {
        std::fs::write(&next, if i.is_multiple_of(2) { &edited } else { &base }).expect("write");
        std::fs::rename(&next, &copy.0).expect("rename");
        assert_eq!(swapped(model.reload_changed()).len(), 1, "swap {i}");
    };
    // The allocator's pools settle over the first swaps.
    (0..100).for_each(&mut swap);
    let settled = resident_bytes();
    (100..1000).for_each(&mut swap);
    let grown = resident_bytes().saturating_sub(settled);
    // A leak of the replaced tensor would grow the set by 900 tensors (~0.9 × 900 × its
    // size); allocator noise over the copies each check reads is a few of them.
    eprintln!("resident set after 100 swaps {settled} bytes, grown by {grown} over 900 more ({tensor_bytes} bytes per tensor)");
    assert!(
        grown < 16 * tensor_bytes,
        "the resident set grew by {grown} bytes over 900 swaps of a {tensor_bytes}-byte tensor"
    );
}
