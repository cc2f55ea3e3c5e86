//! Detokenization against llama.cpp, every id of every shipped vocabulary.
//!
//! `golden-values/tokenizer/detok.json` holds, for every id of llama.cpp's llama-bpe and
//! llama-spm test vocabularies and of the built-in hesper-kjv model, SHA-256 digests of what
//! llama.cpp 0c1e57098's `llama_token_to_piece` returns (special = true and false), in blocks of
//! 256 ids (written by `make_detok_golden.py`).

use hesper_engine::gguf::Gguf;
use hesper_engine::tokenizer::Tokenizer;
use serde_json::Value;
use sha2::{Digest, Sha256};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../golden-values/tokenizer/");

fn json(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{DIR}{name}"))
        .unwrap_or_else(|e| panic!("cannot read {DIR}{name}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn tokenizer(rel: &str) -> Tokenizer {
    let bytes = std::fs::read(format!("{DIR}{rel}")).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let g = Gguf::parse(&bytes).expect("vocabulary parses");
    Tokenizer::from_gguf(&g)
        .expect("tokenizer builds")
        .expect("file has a tokenizer")
}

/// The digest of ids `range` as make_detok_golden.py forms it.
fn block_digest(t: &Tokenizer, range: std::ops::Range<u32>, special: bool) -> String {
    let mut h = Sha256::new();
    for id in range {
        let p = t.token_piece(id, special);
        h.update((p.len() as u32).to_le_bytes());
        h.update(&p);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn every_token_detokenizes_as_llama_cpp_does() {
    let golden = json("detok.json");
    let vocabs = golden["vocabs"].as_object().expect("vocabs");
    assert_eq!(vocabs.len(), 3, "llama-bpe, llama-spm and hesper-kjv");
    for (name, v) in vocabs {
        let t = tokenizer(v["file"].as_str().expect("file"));
        let n = v["n_tokens"].as_u64().expect("n_tokens") as u32;
        let block = v["block"].as_u64().expect("block") as u32;
        assert_eq!(t.vocab_size(), n as usize, "{name}: vocabulary size");
        for (key, special) in [("special", true), ("plain", false)] {
            let digests = v[key].as_array().expect("digests");
            assert_eq!(digests.len() as u32, n.div_ceil(block), "{name} {key}");
            for (k, want) in digests.iter().enumerate() {
                let start = k as u32 * block;
                let range = start..(start + block).min(n);
                if block_digest(&t, range.clone(), special) != want.as_str().unwrap_or("") {
                    let ours: Vec<String> = range
                        .map(|id| format!("{id}={:?}", t.token_piece(id, special)))
                        .collect();
                    panic!(
                        "{name} (special = {special}): ids {start}..{} detokenize differently from llama.cpp; ours: {}",
                        start + block,
                        ours.join(" ")
                    );
                }
            }
        }
        println!("{name}: {n} ids equal llama.cpp's token_to_piece (special = true and false)");
    }
}
