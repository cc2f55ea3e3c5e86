//! A hyperparameter stored with the wrong type is refused naming its key, never read as if it
//! were missing (a string `rope.scaling.factor` was taken as 1: positions unscaled, exit 0).

use hesper_cpu::{CpuBackend, Isa};
use hesper_engine::file::ModelFile;
use hesper_engine::gguf::{Gguf, GgufBuilder, Value};
use hesper_engine::model::{LoadOptions, Model};
use hesper_tests::golden_dir;

/// tiny-llama-f16 with linear RoPE scaling whose factor is `factor`.
fn with_scaling(factor: Value) -> Vec<u8> {
    let bytes = std::fs::read(golden_dir().join("models/tiny-llama-f16.gguf")).expect("model");
    let g = Gguf::parse(&bytes).expect("parse");
    let mut b = GgufBuilder::new();
    for (k, v) in g.metadata() {
        b = b.kv(k, v.clone());
    }
    b = b
        .kv("llama.rope.scaling.type", Value::String("linear".into()))
        .kv("llama.rope.scaling.factor", factor);
    for t in g.tensors() {
        let data = g.tensor_bytes(&bytes, t).expect("data").to_vec();
        b = b.tensor(&t.name, t.dims(), t.ty.id(), data);
    }
    b.build()
}

fn load(bytes: Vec<u8>) -> Result<(), String> {
    let file = ModelFile::from_bytes(bytes, "crafted").map_err(|e| e.to_string())?;
    let backend = CpuBackend::with_isa(2, Isa::detect()).map_err(|e| e.to_string())?;
    Model::load(backend, file, LoadOptions::default())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn a_string_rope_scaling_factor_is_refused_naming_the_key() {
    load(with_scaling(Value::F32(2.0))).expect("a numeric factor loads");
    let err = load(with_scaling(Value::String("2".into()))).expect_err("a string factor");
    assert!(
        err.contains("llama.rope.scaling.factor") && err.contains("must be a number"),
        "{err}"
    );
}
