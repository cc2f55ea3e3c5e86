//! What the scheduler's tests share: the built-in trained model on the CPU.

use hesper_cpu::CpuBackend;
use hesper_engine::file::ModelFile;
use hesper_engine::model::{LoadOptions, Model};
use hesper_engine::tokenizer::Tokenizer;

/// The built-in model (`models/hesper-kjv.gguf`) on two CPU threads, and its tokenizer.
pub fn kjv() -> (Model<CpuBackend>, Tokenizer) {
    let path = format!("{}/../models/hesper-kjv.gguf", env!("CARGO_MANIFEST_DIR"));
    let file = ModelFile::from_bytes(std::fs::read(path).expect("model"), "kjv").expect("parse");
    let tok = Tokenizer::from_gguf(file.header())
        .expect("tokenizer")
        .expect("has one");
    let model = Model::load(
        CpuBackend::new(2).expect("cpu"),
        file,
        LoadOptions::default(),
    )
    .expect("load");
    (model, tok)
}
