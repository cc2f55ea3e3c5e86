//! The 2B4T-geometry golden model (20 query heads, 5 KV heads, head width 128, FFN 6912, two
//! layers, context 1056, TQ2_0 weights, F16 embedding), rebuilt in memory byte for byte as
//! `golden-values/generate.py geometry` writes it. At ~38 MB the file is not committed: its
//! content is a counter-based function of (tensor index, element index), stated in both
//! languages, and the SHA-256 that generate.py recorded beside llama.cpp's outputs proves the
//! bytes are the ones llama.cpp ran.
//!
//! [`attention_model`] is the same recipe with one layer and an FFN of one TQ2_0 block: the
//! attention of 2B4T at a seventh of the work per token, for the GPU's full-context test
//! (`golden_geometry.rs`), where the CPU backend is the reference.

use std::sync::{Arc, OnceLock};

use half::f16;
use hesper_engine::file::ModelFile;
use hesper_engine::gguf::{GgufBuilder, Value};
use sha2::{Digest, Sha256};

const N_VOCAB: u64 = 512;
const N_EMBD: u64 = 2560;
const N_FF: u64 = 6912;
/// The FFN width of [`attention_model`]: one TQ2_0 block.
const N_FF_NARROW: u64 = 256;
const N_HEAD: u32 = 20;
const N_HEAD_KV: u32 = 5;
const N_LAYER: u64 = 2;
const N_CTX: u32 = 1056;
const SEED: u64 = 0x2B4_7E57_9E0D;
const BETA_STREAM: u64 = 1000;
const GGML_F32: u32 = 0;
const GGML_F16: u32 = 1;
const GGML_TQ2_0: u32 = 35;

/// SplitMix64's output function.
fn mix64(z: u64) -> u64 {
    let z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn value(tensor: u64, i: u64) -> u64 {
    mix64(SEED ^ ((tensor << 40) | i))
}

/// The top 24 bits as a float in [0, 1), exact in f32.
fn unit(v: u64) -> f32 {
    (v >> 40) as f32 * (1.0 / 16_777_216.0)
}

/// One TQ2_0 block (66 bytes) of 256 codes in {0, 1, 2}: element `128h + 32l + m` sits in
/// byte `32h + m` at bits `2l`, then the f16 scale.
fn tq2_0_block(codes: &[u8], d: f16, out: &mut Vec<u8>) {
    for h in 0..2 {
        for m in 0..32 {
            let c = |l: usize| codes[128 * h + 32 * l + m];
            out.push(c(0) | (c(1) << 2) | (c(2) << 4) | (c(3) << 6));
        }
    }
    out.extend(d.to_le_bytes());
}

fn tensor_bytes(index: u64, name: &str, ty: u32, n: u64) -> Vec<u8> {
    match ty {
        GGML_F16 => (0..n)
            .flat_map(|i| f16::from_f32((unit(value(index, i)) - 0.5) * 0.25).to_le_bytes())
            .collect(),
        GGML_F32 => (0..n)
            .flat_map(|i| (0.875 + 0.25 * unit(value(index, i))).to_le_bytes())
            .collect(),
        _ => {
            let step = if name.contains(".ffn_down.") {
                1.0 / 64.0
            } else {
                1.0 / 32.0
            };
            let d = f16::from_f32((1.0 + unit(value(index + BETA_STREAM, 0))) * step);
            let mut out = Vec::with_capacity((n / 256 * 66) as usize);
            let mut codes = [0u8; 256];
            for block in 0..n / 256 {
                for (j, c) in codes.iter_mut().enumerate() {
                    *c = (value(index, block * 256 + j as u64) % 3) as u8;
                }
                tq2_0_block(&codes, d, &mut out);
            }
            out
        }
    }
}

/// (name, ne, type) of every tensor in file order, for `n_layer` layers of FFN width `n_ff`.
fn tensors(n_ff: u64, n_layer: u64) -> Vec<(String, Vec<u64>, u32)> {
    let kv = N_EMBD / u64::from(N_HEAD) * u64::from(N_HEAD_KV);
    let mut t = vec![
        (
            "token_embd.weight".to_string(),
            vec![N_EMBD, N_VOCAB],
            GGML_F16,
        ),
        ("output_norm.weight".to_string(), vec![N_EMBD], GGML_F32),
    ];
    for il in 0..n_layer {
        let p = |s: &str| format!("blk.{il}.{s}.weight");
        t.extend([
            (p("attn_norm"), vec![N_EMBD], GGML_F32),
            (p("attn_q"), vec![N_EMBD, N_EMBD], GGML_TQ2_0),
            (p("attn_k"), vec![N_EMBD, kv], GGML_TQ2_0),
            (p("attn_v"), vec![N_EMBD, kv], GGML_TQ2_0),
            (p("attn_output"), vec![N_EMBD, N_EMBD], GGML_TQ2_0),
            (p("attn_sub_norm"), vec![N_EMBD], GGML_F32),
            (p("ffn_norm"), vec![N_EMBD], GGML_F32),
            (p("ffn_gate"), vec![N_EMBD, n_ff], GGML_TQ2_0),
            (p("ffn_up"), vec![N_EMBD, n_ff], GGML_TQ2_0),
            (p("ffn_down"), vec![n_ff, N_EMBD], GGML_TQ2_0),
            (p("ffn_sub_norm"), vec![n_ff], GGML_F32),
        ]);
    }
    t
}

/// The file's bytes, as generate.py writes them (keys of llama.cpp's `bitnet` arch).
pub fn build() -> Vec<u8> {
    build_with(N_FF, N_LAYER)
}

/// The bytes of the recipe with `n_layer` layers of FFN width `n_ff`.
fn build_with(n_ff: u64, n_layer: u64) -> Vec<u8> {
    let a = |k: &str| format!("bitnet.{k}");
    let mut b = GgufBuilder::new()
        .kv("general.architecture", Value::String("bitnet".into()))
        .kv(
            "general.name",
            Value::String("geo-2b4t (synthetic, hesper-rs)".into()),
        )
        .kv(&a("vocab_size"), Value::U32(N_VOCAB as u32))
        .kv(&a("context_length"), Value::U32(N_CTX))
        .kv(&a("embedding_length"), Value::U32(N_EMBD as u32))
        .kv(&a("block_count"), Value::U32(n_layer as u32))
        .kv(&a("feed_forward_length"), Value::U32(n_ff as u32))
        .kv(&a("attention.head_count"), Value::U32(N_HEAD))
        .kv(&a("attention.head_count_kv"), Value::U32(N_HEAD_KV))
        .kv(&a("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
        .kv(&a("rope.freq_base"), Value::F32(500_000.0))
        .kv(
            &a("rope.dimension_count"),
            Value::U32(N_EMBD as u32 / N_HEAD),
        )
        .kv("general.file_type", Value::U32(37))
        .kv("general.quantization_version", Value::U32(2))
        .kv("tokenizer.ggml.model", Value::String("none".into()));
    for (index, (name, ne, ty)) in tensors(n_ff, n_layer).into_iter().enumerate() {
        let data = tensor_bytes(index as u64, &name, ty, ne.iter().product());
        b = b.tensor(&name, &ne, ty, data);
    }
    b.build()
}

/// The model, built once per process; panics unless its SHA-256 is `sha256` (hex).
pub fn model(sha256: &str) -> Arc<ModelFile> {
    static FILE: OnceLock<(String, Arc<ModelFile>)> = OnceLock::new();
    let (got, file) = FILE.get_or_init(|| {
        let bytes = build();
        let hex: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let file = ModelFile::from_bytes(bytes, "geo-2b4t-tq2_0.gguf (generated)")
            .unwrap_or_else(|e| panic!("{e}"));
        (hex, file)
    });
    assert_eq!(
        got, sha256,
        "the rebuilt 2B4T-geometry model differs from the one llama.cpp ran (generate.py geometry)"
    );
    file.clone()
}

/// 2B4T's attention (widths, head counts, head width, context 1056) in one layer whose FFN is
/// one TQ2_0 block wide, built once per process. No reference engine ran it: tests compare
/// backends on it.
pub fn attention_model() -> Arc<ModelFile> {
    static FILE: OnceLock<Arc<ModelFile>> = OnceLock::new();
    FILE.get_or_init(|| {
        ModelFile::from_bytes(build_with(N_FF_NARROW, 1), "geo-2b4t-attention (generated)")
            .unwrap_or_else(|e| panic!("{e}"))
    })
    .clone()
}
