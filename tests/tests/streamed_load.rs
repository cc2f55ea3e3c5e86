//! A streamed load (the header read from the front of the file, then each tensor read on its
//! own, as the browser reads a `Blob`) builds the same model as a load from the whole file:
//! the logits are equal bit for bit on the CPU and on the GPU, each tensor is read once, and
//! no read is larger than the largest tensor or the header.

use std::path::Path;
use std::sync::Arc;

use hesper_cpu::{CpuBackend, Isa};
use hesper_engine::backend::Backend;
use hesper_engine::file::ModelFile;
use hesper_engine::model::{LoadOptions, Logits, Model};
use hesper_engine::source::{read_header, FileSource, ReadError, TensorSource};
use hesper_gpu_backend::GpuBackend;
use hesper_tests::{Golden, ALL, FAMILIES, QUANTS};

/// A file source that records its reads.
struct Counting {
    inner: FileSource,
    reads: Vec<(u64, usize)>,
}

impl TensorSource for Counting {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    async fn read(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, ReadError> {
        self.reads.push((offset, len));
        self.inner.read(offset, len).await
    }
}

/// Loads `path` streamed onto `backend`; returns the model and the reads made after the header.
fn streamed<B: Backend>(backend: B, path: &Path) -> (Model<B>, Vec<(u64, usize)>) {
    let mut source = Counting {
        inner: FileSource::open(path).unwrap_or_else(|e| panic!("{e}")),
        reads: Vec::new(),
    };
    let header = pollster::block_on(read_header(&mut source)).unwrap_or_else(|e| panic!("{e}"));
    let header_reads = source.reads.len();
    let model = pollster::block_on(Model::load_streamed(
        backend,
        header,
        &mut source,
        LoadOptions::default(),
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    (model, source.reads.split_off(header_reads))
}

fn logits<B: Backend>(model: &Model<B>, tokens: &[u32]) -> Vec<f32> {
    let mut session = model.new_session(tokens.len(), 8).expect("session");
    model.eval(&mut session, tokens, Logits::All).expect("eval")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every tensor the model uses is read exactly once, at its own range, and nothing else.
fn check_reads(file: &Arc<ModelFile>, reads: &[(u64, usize)]) {
    let tensors = file.header().tensors();
    let mut seen = std::collections::HashSet::new();
    for &(offset, len) in reads {
        let t = tensors
            .iter()
            .find(|t| t.start == offset)
            .unwrap_or_else(|| panic!("read at {offset} is not a tensor's start"));
        assert_eq!(Some(len as u64), t.nbytes, "{} read whole", t.name);
        assert!(seen.insert(offset), "{} read twice", t.name);
    }
    assert_eq!(seen.len(), tensors.len(), "every tensor read");
}

#[test]
fn a_streamed_load_equals_a_load_from_the_whole_file_on_the_cpu() {
    for stem in ALL.iter().chain(FAMILIES).chain(QUANTS) {
        let g = Golden::load(stem);
        let tokens = &g.sequences.last().expect("a sequence").tokens;
        let file = g.file();
        let backend = || CpuBackend::with_isa(2, Isa::detect()).expect("cpu");
        let whole = Model::load(backend(), file.clone(), LoadOptions::default()).expect("load");
        let (model, reads) = streamed(backend(), &g.model);
        check_reads(&file, &reads);
        assert_eq!(
            bits(&logits(&model, tokens)),
            bits(&logits(&whole, tokens)),
            "{stem}: streamed load differs on the cpu"
        );
    }
}

#[test]
fn a_streamed_load_equals_a_load_from_the_whole_file_on_the_gpu() {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/hesper-tiny.gguf");
    let mut cases: Vec<(String, std::path::PathBuf, Vec<u32>)> = ALL
        .iter()
        .chain(FAMILIES)
        .chain(QUANTS)
        .map(|stem| {
            let g = Golden::load(stem);
            let tokens = g.sequences.last().expect("a sequence").tokens.clone();
            (stem.to_string(), g.model, tokens)
        })
        .collect();
    // The demo model's embedding is Q8_0: its rows are decoded on the host from bytes the
    // streamed load keeps.
    cases.push(("hesper-tiny".into(), demo, vec![1, 15043, 3186, 29892, 920]));
    for (name, path, tokens) in cases {
        let file = ModelFile::open(&path).expect("open");
        let gpu = || GpuBackend::new().unwrap_or_else(|e| panic!("{e}"));
        let whole = Model::load(gpu(), file.clone(), LoadOptions::default()).expect("load");
        let (model, reads) = streamed(gpu(), &path);
        check_reads(&file, &reads);
        assert_eq!(
            bits(&logits(&model, &tokens)),
            bits(&logits(&whole, &tokens)),
            "{name}: streamed load differs on the gpu"
        );
    }
}
