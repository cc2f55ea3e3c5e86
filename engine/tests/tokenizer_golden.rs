//! Our tokenizer against llama.cpp, id for id.
//!
//! Vocabularies and expected ids live in `golden-values/tokenizer/`:
//! * `ggml-vocab-{llama-bpe,llama-spm,qwen2,phi-3}.gguf(.inp/.out)`: llama.cpp's own tokenizer
//!   test files (from the
//!   llama-cpp-python 0.3.36 sdist, `vendor/llama.cpp/models`, llama.cpp commit 0c1e57098);
//! * `llama-bpe.json`, `llama-spm.json`, `llama-bpe-nopre.json`, `llama-bpe-gpt4o.json`: ids
//!   from that llama.cpp for more strings and flag combinations, and `random.json` (1000 random
//!   strings, all four configurations), written by `make_tokenizer_golden.py`.

use std::sync::OnceLock;

use proptest::prelude::*;

use hesper_engine::gguf::{Array, Gguf, GgufBuilder, Value};
use hesper_engine::tokenizer::{PreTokenizer, TextStream, Tokenizer, TokenizerError};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../golden-values/tokenizer/");
const BPE_VOCAB: &str = "ggml-vocab-llama-bpe.gguf";
const SPM_VOCAB: &str = "ggml-vocab-llama-spm.gguf";
const QWEN2_VOCAB: &str = "ggml-vocab-qwen2.gguf";
const PHI3_VOCAB: &str = "ggml-vocab-phi-3.gguf";

fn read(name: &str) -> Vec<u8> {
    std::fs::read(format!("{DIR}{name}")).unwrap_or_else(|e| panic!("cannot read {DIR}{name}: {e}"))
}

fn build(bytes: &[u8], pre: Option<PreTokenizer>) -> Tokenizer {
    let g = Gguf::parse(bytes).expect("golden vocabulary parses");
    Tokenizer::from_gguf_with(&g, pre)
        .expect("tokenizer builds")
        .expect("file has a tokenizer")
}

fn bpe() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| build(&read(BPE_VOCAB), None))
}

fn spm() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| build(&read(SPM_VOCAB), None))
}

/// The llama-bpe vocabulary with `tokenizer.ggml.pre` removed (like the official BitNet file).
fn stripped_bpe_bytes() -> &'static [u8] {
    static B: OnceLock<Vec<u8>> = OnceLock::new();
    B.get_or_init(|| {
        let bytes = read(BPE_VOCAB);
        let g = Gguf::parse(&bytes).expect("golden vocabulary parses");
        let mut b = GgufBuilder::new();
        for (key, value) in g.metadata() {
            if key != "tokenizer.ggml.pre" {
                b = b.kv(key, value.clone());
            }
        }
        b.build()
    })
}

/// The llama-bpe vocabulary with `tokenizer.ggml.pre = gpt-4o` (gpt-oss's split over Llama 3's
/// merges: llama.cpp has no `o200k` vocabulary among its test files).
fn gpt4o_bpe() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let bytes = read(BPE_VOCAB);
        let g = Gguf::parse(&bytes).expect("golden vocabulary parses");
        let mut b = GgufBuilder::new();
        for (key, value) in g.metadata() {
            let value = match key.as_str() {
                "tokenizer.ggml.pre" => Value::String("gpt-4o".into()),
                _ => value.clone(),
            };
            b = b.kv(key, value);
        }
        build(&b.build(), None)
    })
}

/// `.inp`/`.out` pairs as llama.cpp's `test-tokenizer-0` reads them.
fn inp_out(vocab: &str) -> Vec<(String, Vec<u32>)> {
    let raw = String::from_utf8(read(&format!("{vocab}.inp"))).expect("utf-8 .inp");
    let sep = "\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut rest = raw.as_str();
    while !rest.is_empty() {
        match rest.find(sep) {
            Some(p) => {
                texts.push(rest[..p].to_string());
                rest = &rest[p + sep.len()..];
            }
            None => {
                texts.push(rest.to_string());
                rest = "";
            }
        }
    }
    let out = String::from_utf8(read(&format!("{vocab}.out"))).expect("utf-8 .out");
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("id"))
                .collect()
        })
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{vocab}: .inp and .out disagree on the number of tests"
    );
    texts.into_iter().zip(ids).collect()
}

struct Case {
    text: String,
    add_special: bool,
    parse_special: bool,
    ids: Vec<u32>,
}

fn json_cases(name: &str) -> Vec<Case> {
    let doc: serde_json::Value = serde_json::from_slice(&read(name)).expect("valid JSON");
    let cases = doc["cases"].as_array().expect("cases array");
    cases
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().expect("text").to_string(),
            add_special: c["add_special"].as_bool().expect("add_special"),
            parse_special: c["parse_special"].as_bool().expect("parse_special"),
            ids: c["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|v| u32::try_from(v.as_u64().expect("id")).expect("u32 id"))
                .collect(),
        })
        .collect()
}

/// Checks every case; reports all mismatches at once.
fn check_cases(t: &Tokenizer, cases: &[Case], what: &str) {
    assert!(cases.len() >= 60, "{what}: only {} cases", cases.len());
    let mut bad = Vec::new();
    for c in cases {
        let got = t
            .encode(&c.text, c.add_special && t.add_bos(), c.parse_special)
            .expect("encode");
        if got != c.ids {
            bad.push(format!(
                "{:?} (add_special {}, parse_special {}):\n  ours      {:?}\n  llama.cpp {:?}",
                c.text, c.add_special, c.parse_special, got, c.ids
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{what}: {}/{} cases differ from llama.cpp:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

fn check_inp_out(t: &Tokenizer, vocab: &str) {
    let tests = inp_out(vocab);
    assert_eq!(tests.len(), 46);
    let cases: Vec<Case> = tests
        .into_iter()
        .map(|(text, ids)| Case {
            text,
            add_special: false,
            parse_special: false,
            ids,
        })
        .collect();
    let mut bad = Vec::new();
    for c in &cases {
        let got = t.encode(&c.text, false, false).expect("encode");
        if got != c.ids {
            bad.push(format!(
                "{:?}: ours {:?} llama.cpp {:?}",
                c.text, got, c.ids
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{vocab}: {}/{} differ:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

#[test]
fn llama_bpe_matches_llama_cpp_test_file() {
    assert_eq!(bpe().pre_tokenizer(), PreTokenizer::Llama3);
    check_inp_out(bpe(), BPE_VOCAB);
}

#[test]
fn qwen2_matches_llama_cpp_test_file() {
    let t = build(&read(QWEN2_VOCAB), None);
    assert_eq!(t.pre_tokenizer(), PreTokenizer::Qwen2);
    check_inp_out(&t, QWEN2_VOCAB);
}

#[test]
fn phi3_matches_llama_cpp_test_file() {
    // Phi-3's SentencePiece vocabulary: Llama 2's with its chat tokens (`<|user|>`,
    // `<|end|>`, ...) past id 32000.
    let t = build(&read(PHI3_VOCAB), None);
    assert_eq!(t.pre_tokenizer(), PreTokenizer::Spm);
    check_inp_out(&t, PHI3_VOCAB);
    // A chat turn: llama.cpp (its `llama_tokenize`, BOS and specials on, and off) takes the
    // whitespace after each chat token with it, by the model's name, but not after
    // `<|endoftext|>`.
    let cases: [(&str, &[u32], &[u32]); 2] = [
        (
            "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>",
            &[
                1, 32010, 1724, 338, 29871, 29906, 29974, 29906, 29973, 32007, 32001,
            ],
            &[
                529, 29989, 1792, 29989, 29958, 13, 5618, 338, 29871, 29906, 29974, 29906, 29973,
                29966, 29989, 355, 29989, 29958, 13, 29966, 29989, 465, 22137, 29989, 29958,
            ],
        ),
        (
            " <|system|> hi <|endoftext|>",
            &[1, 259, 32006, 7251, 29871, 32000],
            &[
                29871, 529, 29989, 5205, 29989, 29958, 7251, 529, 29989, 355, 974, 726, 29989,
                29958,
            ],
        ),
    ];
    for (text, special, plain) in cases {
        assert_eq!(
            t.encode(text, true, true).expect("encodes"),
            special,
            "{text:?}"
        );
        assert_eq!(
            t.encode(text, false, false).expect("encodes"),
            plain,
            "{text:?}"
        );
    }
    // Another model's vocabulary keeps the whitespace: Llama 2's `</s>` then a newline
    // (llama.cpp's ids).
    assert_eq!(
        spm().encode("</s>\nHi", false, true).expect("encodes"),
        [2, 29871, 13, 18567]
    );
}

#[test]
fn llama_spm_matches_llama_cpp_test_file() {
    assert_eq!(spm().pre_tokenizer(), PreTokenizer::Spm);
    check_inp_out(spm(), SPM_VOCAB);
}

#[test]
fn llama_bpe_matches_llama_cpp_json() {
    check_cases(bpe(), &json_cases("llama-bpe.json"), "llama-bpe");
}

#[test]
fn llama_spm_matches_llama_cpp_json() {
    check_cases(spm(), &json_cases("llama-spm.json"), "llama-spm");
}

#[test]
fn the_gpt4o_split_matches_llama_cpp_json() {
    let t = gpt4o_bpe();
    assert_eq!(t.pre_tokenizer(), PreTokenizer::Gpt4o);
    assert!(!t.add_bos(), "llama.cpp adds no BOS with the GPT-4o split");
    check_cases(t, &json_cases("llama-bpe-gpt4o.json"), "llama-bpe-gpt4o");
    // Where it parts from Llama 3's split: a lowercase letter before a capitalized run ends a
    // word (" iPhone" is one piece of Llama 3's, " i" and "Phone" here).
    assert_eq!(
        bpe().encode(" iPhone", false, false).expect("encode"),
        [12443]
    );
    assert_eq!(
        t.encode(" iPhone", false, false).expect("encode"),
        [602, 7084]
    );
}

#[test]
fn forced_default_split_emulates_llama_cpp_without_pre() {
    let t = build(stripped_bpe_bytes(), Some(PreTokenizer::LlamaCppDefault));
    assert_eq!(t.pre_tokenizer(), PreTokenizer::LlamaCppDefault);
    assert!(
        !t.add_bos(),
        "llama.cpp adds no BOS with the default split and no add_bos_token key"
    );
    check_cases(
        &t,
        &json_cases("llama-bpe-nopre.json"),
        "llama-bpe-nopre (forced default split)",
    );
}

#[test]
fn missing_pre_on_llama3_vocab_chooses_llama3() {
    let t = build(stripped_bpe_bytes(), None);
    assert_eq!(t.pre_tokenizer(), PreTokenizer::Llama3);
    assert!(t.add_bos());
    let d = t.describe();
    assert!(
        d.contains("tokenizer.ggml.pre missing") && d.contains("llama3"),
        "{d}"
    );
    // Same ids as llama.cpp gives the file that names its pre-tokenizer.
    check_cases(
        &t,
        &json_cases("llama-bpe.json"),
        "llama-bpe without pre, auto-chosen split",
    );
}

/// 1000 seeded random strings mixing scripts, emoji, digits, punctuation and odd whitespace.
#[test]
fn random_strings_match_llama_cpp() {
    let doc: serde_json::Value = serde_json::from_slice(&read("random.json")).expect("valid JSON");
    let texts: Vec<&str> = doc["texts"]
        .as_array()
        .expect("texts")
        .iter()
        .map(|t| t.as_str().expect("str"))
        .collect();
    assert_eq!(texts.len(), 1000);
    let forced_default = build(stripped_bpe_bytes(), Some(PreTokenizer::LlamaCppDefault));
    for (name, t) in [
        ("llama-bpe", bpe()),
        ("llama-bpe-nopre", &forced_default),
        ("llama-spm", spm()),
        ("llama-bpe-gpt4o", gpt4o_bpe()),
    ] {
        let expected = doc[name].as_array().expect("ids per text");
        let cases: Vec<Case> = texts
            .iter()
            .zip(expected)
            .map(|(text, ids)| Case {
                text: text.to_string(),
                add_special: false,
                parse_special: false,
                ids: ids
                    .as_array()
                    .expect("ids")
                    .iter()
                    .map(|v| u32::try_from(v.as_u64().expect("id")).expect("u32 id"))
                    .collect(),
            })
            .collect();
        check_cases(t, &cases, &format!("random.json {name}"));
    }
}

#[test]
fn llama3_and_default_splits_really_differ() {
    let t = build(stripped_bpe_bytes(), Some(PreTokenizer::LlamaCppDefault));
    assert_eq!(bpe().encode(" (", false, false).expect("encode"), [320]);
    assert_eq!(t.encode(" (", false, false).expect("encode"), [220, 7]);
    assert_eq!(
        bpe().encode("a\r\nb", false, false).expect("encode"),
        [64, 319, 65]
    );
    assert_eq!(
        t.encode("a\r\nb", false, false).expect("encode"),
        [64, 201, 198, 65]
    );
}

#[test]
fn special_tokens_and_metadata() {
    let t = bpe();
    assert_eq!(t.vocab_size(), 128_256);
    assert_eq!(t.bos(), Some(128_000));
    assert_eq!(t.token_id("<|eot_id|>"), Some(128_009));
    assert!(t.is_end_of_generation(128_001), "EOS");
    assert!(t.is_end_of_generation(128_009), "<|eot_id|> found by text");
    assert!(!t.is_end_of_generation(128_000));
    assert!(!t.is_end_of_generation(9906));
    assert!(
        t.describe()
            .starts_with("gpt2 BPE, 128256 tokens, Llama-3 split"),
        "{}",
        t.describe()
    );
    assert_eq!(
        t.encode("Hi<|eot_id|>", true, true).expect("encode"),
        [128_000, 13_347, 128_009]
    );
    assert_eq!(t.encode("", true, false).expect("encode"), [128_000]);
    assert!(t.encode("", false, false).expect("encode").is_empty());

    let s = spm();
    assert_eq!((s.bos(), s.add_bos()), (Some(1), true));
    assert!(s.is_end_of_generation(2));
    assert_eq!(s.token_bytes(13), b"\n", "<0x0A>");
    assert_eq!(s.encode("<s>", false, true).expect("encode"), [1]);
}

fn round_trip_texts() -> Vec<String> {
    let mut v: Vec<String> = json_cases("llama-bpe.json")
        .into_iter()
        .map(|c| c.text)
        .collect();
    v.dedup();
    v
}

#[test]
fn byte_level_decode_round_trips() {
    let t = bpe();
    for text in round_trip_texts() {
        for parse_special in [false, true] {
            let ids = t.encode(&text, false, parse_special).expect("encode");
            assert_eq!(t.decode(&ids), text, "parse_special {parse_special}");
        }
    }
    // Invalid UTF-8 cut from the middle of an emoji decodes lossily, not as a panic.
    let ids = t.encode("🦙", false, false).expect("encode");
    assert!(ids.len() > 1);
    assert!(t.decode(&ids[..1]).contains('\u{FFFD}'));
}

#[test]
fn spm_decode_round_trips() {
    let t = spm();
    for text in round_trip_texts() {
        let ids = t.encode(&text, false, false).expect("encode");
        assert_eq!(t.decode(&ids), text);
    }
}

#[test]
fn stream_reassembles_split_characters() {
    for t in [bpe(), spm()] {
        let text = "Llamas 🦙 and rockets 🚀, 东京, naïve 👨‍👩‍👧 done";
        let ids = t.encode(text, false, false).expect("encode");
        let mut stream = TextStream::new(t);
        let mut out = String::new();
        let mut held_back = 0;
        for &id in &ids {
            let piece = stream.push(id);
            if piece.is_empty() && !t.token_bytes(id).is_empty() {
                held_back += 1;
            }
            out.push_str(&piece);
        }
        out.push_str(&stream.finish());
        assert!(
            held_back > 0,
            "no token ended inside a character; the test text is too easy"
        );
        assert_eq!(out.trim_start(), text);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_text_round_trips(text in "\\PC{0,40}|[ \t\r\n<|>a-z0-9_]{0,40}") {
        for parse_special in [false, true] {
            let ids = bpe().encode(&text, false, parse_special).expect("encode");
            prop_assert_eq!(bpe().decode(&ids), text.clone());
        }
        // (With parse_special, SentencePiece text after `<s>` gets a second space prefix.)
        let ids = spm().encode(&text, false, false).expect("encode");
        prop_assert_eq!(spm().decode(&ids), text.clone());
    }
}

#[test]
fn tokenizer_is_shareable_across_threads() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
}

#[test]
fn stream_flushes_unfinished_character_on_finish() {
    let t = bpe();
    let ids = t.encode("🦙", false, false).expect("encode");
    let mut stream = TextStream::new(t);
    assert_eq!(stream.push(ids[0]), "");
    assert_eq!(stream.finish(), "\u{FFFD}");
}

#[test]
fn loads_fast() {
    let bytes = read(BPE_VOCAB);
    let g = Gguf::parse(&bytes).expect("parses");
    let start = std::time::Instant::now();
    let t = Tokenizer::from_gguf(&g)
        .expect("builds")
        .expect("has tokenizer");
    let took = start.elapsed();
    assert_eq!(t.vocab_size(), 128_256);
    // Generous bound: unoptimised or loaded CI machines; release builds take far less.
    assert!(
        took.as_secs_f64() < 5.0,
        "building the 128k-token tokenizer took {took:?}"
    );
}

// ---- bad metadata ----

fn tiny_gpt2() -> GgufBuilder {
    let tokens: Vec<String> = ["a", "b", "ab"].iter().map(|s| s.to_string()).collect();
    GgufBuilder::new()
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .kv(
            "tokenizer.ggml.merges",
            Value::Array(Array::String(vec!["a b".into()])),
        )
}

fn build_err(b: GgufBuilder) -> TokenizerError {
    let bytes = b.build();
    let g = Gguf::parse(&bytes).expect("test file parses");
    match Tokenizer::from_gguf(&g) {
        Ok(_) => panic!("bad metadata was accepted"),
        Err(e) => e,
    }
}

#[test]
fn no_tokenizer_is_none() {
    let bytes = GgufBuilder::new()
        .kv("general.architecture", Value::String("bitnet".into()))
        .build();
    assert!(Tokenizer::from_gguf(&Gguf::parse(&bytes).expect("parses"))
        .expect("ok")
        .is_none());
    let bytes = GgufBuilder::new()
        .kv("tokenizer.ggml.model", Value::String("none".into()))
        .build();
    assert!(Tokenizer::from_gguf(&Gguf::parse(&bytes).expect("parses"))
        .expect("ok")
        .is_none());
}

#[test]
fn tiny_vocab_builds() {
    let bytes = tiny_gpt2().build();
    let t = build(&bytes, None);
    assert_eq!(t.pre_tokenizer(), PreTokenizer::LlamaCppDefault);
    assert_eq!(t.encode("ab", false, false).expect("encode"), [2]);
}

#[test]
fn missing_tokens_array_is_an_error() {
    let b = GgufBuilder::new().kv("tokenizer.ggml.model", Value::String("gpt2".into()));
    let e = build_err(b).to_string();
    assert!(
        e.contains("tokenizer.ggml.tokens") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn merges_of_wrong_type_is_an_error() {
    let tokens: Vec<String> = vec!["a".into(), "b".into()];
    let b = GgufBuilder::new()
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .kv(
            "tokenizer.ggml.merges",
            Value::Array(Array::I32(vec![1, 2])),
        );
    let e = build_err(b);
    assert!(
        matches!(
            e,
            TokenizerError::WrongType {
                key: "tokenizer.ggml.merges",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("array of i32"), "{e}");
}

#[test]
fn missing_merges_is_an_error() {
    let tokens: Vec<String> = vec!["a".into()];
    let b = GgufBuilder::new()
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    assert!(build_err(b).to_string().contains("tokenizer.ggml.merges"));
}

#[test]
fn unknown_model_is_an_error() {
    let b = GgufBuilder::new().kv("tokenizer.ggml.model", Value::String("bert".into()));
    let e = build_err(b).to_string();
    assert!(
        e.contains("tokenizer.ggml.model") && e.contains("\"bert\""),
        "{e}"
    );
}

#[test]
fn unknown_pre_is_an_error() {
    let e = build_err(tiny_gpt2().kv("tokenizer.ggml.pre", Value::String("falcon-h1".into())))
        .to_string();
    assert!(
        e.contains("tokenizer.ggml.pre") && e.contains("falcon-h1"),
        "{e}"
    );
}

#[test]
fn short_token_types_are_an_error() {
    let e = build_err(tiny_gpt2().kv(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![1])),
    ));
    assert!(
        matches!(
            e,
            TokenizerError::TooShort {
                key: "tokenizer.ggml.token_type",
                len: 1,
                n_tokens: 3
            }
        ),
        "{e}"
    );
}

#[test]
fn wrongly_typed_keys_are_errors() {
    let e = build_err(GgufBuilder::new().kv("tokenizer.ggml.model", Value::U32(2)));
    assert!(
        matches!(
            e,
            TokenizerError::WrongType {
                key: "tokenizer.ggml.model",
                ..
            }
        ),
        "{e}"
    );
    let e = build_err(tiny_gpt2().kv("tokenizer.ggml.bos_token_id", Value::String("1".into())));
    assert!(
        matches!(
            e,
            TokenizerError::WrongType {
                key: "tokenizer.ggml.bos_token_id",
                ..
            }
        ),
        "{e}"
    );
    let e = build_err(tiny_gpt2().kv("tokenizer.ggml.scores", Value::Array(Array::String(vec![]))));
    assert!(
        matches!(
            e,
            TokenizerError::WrongType {
                key: "tokenizer.ggml.scores",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn duplicate_tokens_are_an_error() {
    let tokens: Vec<String> = vec!["a".into(), "b".into(), "a".into()];
    let b = GgufBuilder::new()
        .kv("tokenizer.ggml.model", Value::String("llama".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    assert!(matches!(
        build_err(b),
        TokenizerError::DuplicateToken {
            first: 0,
            second: 2,
            ..
        }
    ));
}

#[test]
fn forcing_a_split_of_the_other_family_is_an_error() {
    let bytes = tiny_gpt2().build();
    let g = Gguf::parse(&bytes).expect("parses");
    assert!(matches!(
        Tokenizer::from_gguf_with(&g, Some(PreTokenizer::Spm)),
        Err(TokenizerError::PreMismatch { .. })
    ));
    let bytes = read(SPM_VOCAB);
    let g = Gguf::parse(&bytes).expect("parses");
    let r = Tokenizer::from_gguf_with(&g, Some(PreTokenizer::Llama3));
    assert!(matches!(r, Err(TokenizerError::PreMismatch { .. })));
}

#[test]
fn out_of_range_special_id_is_tolerated() {
    let t = build(
        &tiny_gpt2()
            .kv("tokenizer.ggml.eos_token_id", Value::U32(99))
            .build(),
        None,
    );
    assert!(!t.is_end_of_generation(99));
    assert_eq!(t.warnings().len(), 1);
    assert!(t.warnings()[0].contains("tokenizer.ggml.eos_token_id"));
}
