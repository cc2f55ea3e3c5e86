//! A perplexity text tokenized only as far as its chunks need gives the same tokens as the
//! whole text, for SentencePiece and byte-level BPE vocabularies (Llama 3's pre-tokenizer,
//! Qwen2's) and the shipped model's.

use std::path::PathBuf;

use hesper_engine::gguf::Gguf;
use hesper_engine::tokenizer::Tokenizer;
use hesper_runtime::perplexity::text::{tokenize_for, MARGIN};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tokenizer(path: &str) -> Tokenizer {
    let bytes = std::fs::read(root().join(path)).expect("vocabulary");
    let g = Gguf::parse(&bytes).expect("gguf");
    Tokenizer::from_gguf(&g)
        .expect("tokenizer")
        .expect("a vocabulary")
}

#[test]
fn a_prefix_gives_the_whole_texts_first_tokens() {
    let kjv = std::fs::read_to_string(root().join("models/kjv-valid.txt")).expect("text");
    // Runs of spaces, tabs and newlines, digits and accents at every cut a line end makes.
    let odd: String = (0..4000)
        .map(|i| match i % 7 {
            0 => "  \n\n\t x".to_string(),
            1 => format!("{i}{i} "),
            2 => "naïve café's ☕\n".to_string(),
            _ => "word, ".to_string(),
        })
        .collect();
    for vocab in [
        "models/hesper-kjv.gguf",
        "golden-values/tokenizer/ggml-vocab-llama-spm.gguf",
        "golden-values/tokenizer/ggml-vocab-llama-bpe.gguf",
        "golden-values/tokenizer/ggml-vocab-qwen2.gguf",
    ] {
        let tok = tokenizer(vocab);
        for text in [&kjv, &odd] {
            let (whole, bytes) = tokenize_for(&tok, text, None).expect("encode");
            assert_eq!(bytes, text.len());
            for needed in [1, 200, 2000] {
                let (tokens, bytes) = tokenize_for(&tok, text, Some(needed)).expect("encode");
                assert!(bytes < text.len(), "{vocab} {needed}: the whole text");
                assert!(tokens.len() >= needed + MARGIN, "{vocab} {needed}");
                assert_eq!(tokens[..needed], whole[..needed], "{vocab} {needed}");
            }
            let (all, _) = tokenize_for(&tok, text, Some(whole.len() + 1)).expect("encode");
            assert_eq!(all, whole, "{vocab}: more than the text holds");
        }
    }
}
