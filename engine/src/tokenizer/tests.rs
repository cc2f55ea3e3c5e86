//! Unit tests on tiny hand-made vocabularies (the golden tests against llama.cpp are in
//! `engine/tests/tokenizer_golden.rs`).

use super::*;
use crate::gguf::{Array, GgufBuilder, Value};

fn strings(v: &[&str]) -> Value {
    Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()))
}

fn load(b: GgufBuilder, pre: Option<PreTokenizer>) -> Tokenizer {
    let bytes = b.build();
    let g = Gguf::parse(&bytes).expect("test file parses");
    Tokenizer::from_gguf_with(&g, pre)
        .expect("builds")
        .expect("has a tokenizer")
}

const SPM_TOKENS: &[&str] = &[
    "<unk>",
    "<s>",
    "</s>",
    "\u{2581}",
    "a",
    "b",
    "c",
    "ab",
    "bc",
    "\u{2581}a",
    "<0xE2>",
    "<0x82>",
    "<0xAC>",
    "<x>",
];

/// A SentencePiece vocabulary; `ab_score` lets tests flip which merge wins.
fn spm(ab_score: f32, space_prefix: Option<bool>) -> GgufBuilder {
    let mut scores = vec![0.0f32; SPM_TOKENS.len()];
    scores[7] = ab_score; // "ab"
    scores[8] = -1.0; // "bc"
    scores[9] = -0.5; // "▁a"
    let mut types = vec![1i32; SPM_TOKENS.len()];
    types[0] = 2;
    types[1] = 3;
    types[2] = 3;
    types[10..13].fill(6);
    types[13] = 4;
    let mut b = GgufBuilder::new()
        .kv("tokenizer.ggml.model", Value::String("llama".into()))
        .kv("tokenizer.ggml.tokens", strings(SPM_TOKENS))
        .kv("tokenizer.ggml.scores", Value::Array(Array::F32(scores)))
        .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    if let Some(p) = space_prefix {
        b = b.kv("tokenizer.ggml.add_space_prefix", Value::Bool(p));
    }
    b
}

#[test]
fn spm_merges_highest_score_first() {
    // "bc" (-1) beats "ab" (-2): a + bc.
    let t = load(spm(-2.0, Some(false)), None);
    assert_eq!(t.encode("abc", false, false).expect("encode"), [4, 8]);
    // "ab" (-1) ties "bc" (-1): the leftmost pair wins.
    let t = load(spm(-1.0, Some(false)), None);
    assert_eq!(t.encode("abc", false, false).expect("encode"), [7, 6]);
}

#[test]
fn spm_space_prefix_and_bos() {
    let t = load(spm(-2.0, None), None);
    assert_eq!(t.pre_tokenizer(), PreTokenizer::Spm);
    assert_eq!((t.bos(), t.add_bos()), (Some(1), true));
    // "▁abc": "▁a" (-0.5) first, then "bc" (-1).
    assert_eq!(t.encode("abc", true, false).expect("encode"), [1, 9, 8]);
    assert_eq!(t.decode(&[9, 8]), "abc");
    assert_eq!(t.token_bytes(9), b" a");
    assert!(t.describe().contains("space prefix on"), "{}", t.describe());
    // Text that goes on from earlier text gets no prefix, no BOS, and control text as text.
    assert_eq!(t.encode_continuation("abc").expect("encode"), [4, 8]);
    assert_ne!(t.encode_continuation("a</s>").expect("encode"), [4, 2]);
}

#[test]
fn spm_byte_fallback_and_unknown() {
    let t = load(spm(-2.0, Some(false)), None);
    assert_eq!(t.encode("€", false, false).expect("encode"), [10, 11, 12]);
    assert_eq!(t.decode(&[10, 11, 12]), "€");
    // No <0xC3>/<0xA9> tokens for "é": the unknown token (id 0 by default) stands in.
    assert_eq!(t.encode("é", false, false).expect("encode"), [0, 0]);
}

#[test]
fn spm_special_tokens() {
    let t = load(spm(-2.0, None), None);
    // Control tokens only with parse_special; text after one gets the space prefix again.
    assert_eq!(t.encode("a</s>a", false, true).expect("encode"), [9, 2, 9]);
    assert_ne!(t.encode("a</s>a", false, false).expect("encode"), [9, 2, 9]);
    // User-defined tokens are matched either way.
    assert_eq!(t.encode("<x>a", false, false).expect("encode"), [13, 9]);
    assert!(t.is_end_of_generation(2));
    assert!(t.is_special(2) && t.is_special(0) && !t.is_special(13));
}

/// GPT-2 style vocabulary: the 256 byte characters (id = byte), then `extra`, then specials.
fn gpt2(extra: &[&str], merges: &[&str], pre: Option<&str>) -> GgufBuilder {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| byte_level::byte_to_char(b).to_string())
        .collect();
    tokens.extend(extra.iter().map(|s| s.to_string()));
    let mut types = vec![1i32; tokens.len()];
    for special in ["<|begin_of_text|>", "<|eot_id|>"] {
        tokens.push(special.to_string());
        types.push(3);
    }
    tokens.push("<user>".to_string());
    types.push(4);
    let mut b = GgufBuilder::new()
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
        .kv("tokenizer.ggml.merges", strings(merges));
    if let Some(p) = pre {
        b = b.kv("tokenizer.ggml.pre", Value::String(p.into()));
    }
    b
}

#[test]
fn ignore_merges_only_with_llama3_split() {
    // "abc" is a token but no merge builds it from "ab" + "c".
    let b = gpt2(&["ab", "abc"], &["a b"], Some("llama-v3"));
    let t = load(b.clone(), None);
    assert_eq!(t.pre_tokenizer(), PreTokenizer::Llama3);
    assert!(
        t.add_bos(),
        "llama.cpp turns add_bos on for the Llama-3 split"
    );
    assert_eq!(t.encode("abc", false, false).expect("encode"), [257]);
    let t = load(b, Some(PreTokenizer::LlamaCppDefault));
    assert!(t.describe().contains("forced"), "{}", t.describe());
    assert_eq!(
        t.encode("abc", false, false).expect("encode"),
        [256, u32::from(b'c')]
    );
}

#[test]
fn missing_pre_on_small_vocab_uses_default_split() {
    let t = load(gpt2(&["ab"], &["a b"], None), None);
    assert_eq!(t.pre_tokenizer(), PreTokenizer::LlamaCppDefault);
    assert!(!t.add_bos());
    assert_eq!(t.bos(), None, "no llama.cpp-style default BOS for gpt2");
    assert!(
        t.describe().contains("tokenizer.ggml.pre missing"),
        "{}",
        t.describe()
    );
}

#[test]
fn bpe_special_tokens_and_bytes() {
    let t = load(gpt2(&["ab"], &["a b"], Some("llama3")), None);
    let eot = t.token_id("<|eot_id|>").expect("eot");
    assert!(t.is_end_of_generation(eot), "found by text");
    assert_eq!(
        t.encode("ab<|eot_id|>", false, true).expect("encode"),
        [256, eot]
    );
    assert!(
        t.encode("ab<|eot_id|>", false, false)
            .expect("encode")
            .len()
            > 2
    );
    let user = t.token_id("<user>").expect("user");
    assert_eq!(
        t.encode("<user>ab", false, false).expect("encode"),
        [user, 256]
    );
    assert_eq!(t.token_bytes(u32::from(b'!')), b"!");
    assert_eq!(t.token_bytes(eot), b"<|eot_id|>");
    assert!(t.token_bytes(99_999).is_empty());
    assert_eq!(
        t.decode(&t.encode("x é €\n", false, false).expect("encode")),
        "x é €\n"
    );
}

#[test]
fn bad_merges_are_skipped_with_warnings() {
    // "a b" twice (the first rank is kept), one merge without a space, one with an unknown part.
    let t = load(
        gpt2(
            &["ab", "bc"],
            &["b c", "a b", "a b", "nospace", "a zz"],
            Some("llama3"),
        ),
        None,
    );
    assert_eq!(t.warnings().len(), 2, "{:?}", t.warnings());
    assert!(t
        .warnings()
        .iter()
        .any(|w| w.contains("2 merges") && w.contains("cannot apply")));
    assert!(t
        .warnings()
        .iter()
        .any(|w| w.contains("1 merges") && w.contains("repeats")));
    // "b c" (rank 0) beats "a b" (rank 1).
    assert_eq!(
        t.encode("abc", false, false).expect("encode"),
        [u32::from(b'a'), 257]
    );
}

#[test]
fn stream_handles_invalid_and_split_bytes() {
    let t = load(spm(-2.0, Some(false)), None);
    let mut s = TextStream::new(&t);
    assert_eq!(s.push(10), "");
    assert_eq!(s.push(11), "");
    assert_eq!(s.push(12), "€");
    // 0xE2 followed by "a" can never complete: U+FFFD, then the "a".
    assert_eq!(s.push(10), "");
    assert_eq!(s.push(4), "\u{FFFD}a");
    assert_eq!(s.push(10), "");
    assert_eq!(s.finish(), "\u{FFFD}");
}

#[test]
fn display_stream_leaves_out_control_and_unknown_tokens() {
    let t = load(spm(-2.0, None), None);
    // 0 <unk>, 1 <s>, 2 </s> are special; 13 is user-defined and 9 is "▁a".
    let mut shown = TextStream::for_display(&t);
    let text: String = [1, 9, 0, 2, 13].iter().map(|&id| shown.push(id)).collect();
    assert_eq!(text + &shown.finish(), " a<x>");
    let mut raw = TextStream::new(&t);
    let text: String = [1, 9].iter().map(|&id| raw.push(id)).collect();
    assert_eq!(text, "<s> a");
}

#[test]
fn pre_tokenizer_names() {
    for p in [
        PreTokenizer::Llama3,
        PreTokenizer::LlamaCppDefault,
        PreTokenizer::Qwen2,
        PreTokenizer::Spm,
    ] {
        assert_eq!(PreTokenizer::from_name(p.name()), Some(p));
    }
    assert_eq!(
        PreTokenizer::from_name("llama-bpe"),
        Some(PreTokenizer::Llama3)
    );
    assert_eq!(
        PreTokenizer::from_name("falcon3"),
        Some(PreTokenizer::Llama3)
    );
    assert_eq!(
        PreTokenizer::from_name("falcon_e"),
        Some(PreTokenizer::Llama3)
    );
    assert_eq!(PreTokenizer::from_name("falcon-h1"), None);
}

#[test]
fn fill_in_the_middle_tokens_from_metadata_or_their_text() {
    // Qwen's texts: found by their text (ids 256.. in the order given).
    let qwen = [
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        "<|file_sep|>",
    ];
    let t = load(gpt2(&qwen, &[], Some("llama-bpe")), None);
    let fim = t.fim();
    assert_eq!(
        (fim.pre, fim.suf, fim.mid, fim.sep, fim.rep, fim.pad),
        (Some(256), Some(257), Some(258), Some(259), None, None)
    );
    assert_eq!(fim.infill(), Ok((256, 257, 258)));
    // The metadata wins over the text; the older key over the newer one.
    let b = gpt2(&qwen, &[], Some("llama-bpe"))
        .kv("tokenizer.ggml.fim_pre_token_id", Value::U32(7))
        .kv("tokenizer.ggml.fim_mid_token_id", Value::U32(8))
        .kv("tokenizer.ggml.middle_token_id", Value::U32(9));
    let fim = load(b, None).fim();
    assert_eq!((fim.pre, fim.suf, fim.mid), (Some(7), Some(257), Some(9)));
    // A vocabulary without them cannot infill, and says which are missing.
    let none = load(gpt2(&["<|fim_suffix|>"], &[], Some("llama-bpe")), None).fim();
    assert_eq!(
        none.infill(),
        Err("the model has no fill-in-the-middle prefix and middle tokens".into())
    );
}

#[test]
fn harmony_ends_messages_with_end_and_generations_with_return_or_call() {
    // gpt-oss's vocabulary, as llama.cpp reads it: <|end|> is rendered and does not stop
    // generation where <|return|> and <|call|> do; the channel markers are rendered without
    // `special`.
    let extra = [
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
    ];
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| byte_level::byte_to_char(b).to_string())
        .collect();
    tokens.extend(extra.iter().map(|s| s.to_string()));
    // The file marks them all control tokens.
    let mut types = vec![1i32; 256];
    types.resize(tokens.len(), 3);
    let b = GgufBuilder::new()
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String("gpt-4o".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
        .kv("tokenizer.ggml.merges", strings(&[]));
    let t = load(b, None);
    let id = |text| t.token_id(text).expect("in the vocabulary");
    assert!(!t.is_end_of_generation(id("<|end|>")));
    assert!(t.is_end_of_generation(id("<|return|>")));
    assert!(t.is_end_of_generation(id("<|call|>")));
    for text in ["<|end|>", "<|channel|>", "<|message|>", "<|start|>"] {
        assert_eq!(t.token_piece(id(text), false), text.as_bytes(), "{text}");
    }
    assert!(t.token_piece(id("<|return|>"), false).is_empty());
    // Without <|call|> (another family's <|end|>: Phi-3's), <|end|> ends the generation.
    let phi = load(gpt2(&["<|end|>", "<|return|>"], &[], None), None);
    let end = phi.token_id("<|end|>").expect("in the vocabulary");
    assert!(phi.is_end_of_generation(end));
}
