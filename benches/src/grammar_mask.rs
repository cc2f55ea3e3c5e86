//! `grammar_mask`: what constrained decoding costs a sequence per token. The tokenizer of
//! VOCAB (default: llama.cpp's Llama 3 vocabulary, 128 256 tokens) becomes llguidance's token
//! trie; then, for each grammar, a valid answer is tokenized and walked token by token, timing
//! the mask of every step (what the scheduler computes before each constrained sample) and the
//! advance over the token. Rounds alternate the grammars; the median of the per-round means is
//! printed with the slowest single mask.
//!
//! Usage: `cargo run --release -p hesper-benches --bin grammar_mask -- [VOCAB] [ROUNDS]`

use std::sync::Arc;
use std::time::Instant;

use hesper_engine::gguf::Gguf;
use hesper_engine::tokenizer::Tokenizer;
use hesper_runtime::grammar::{gbnf_to_lark, GrammarSpec, Grammars};
use serde_json::json;

fn main() {
    let mut args = std::env::args().skip(1);
    let vocab = args.next().unwrap_or_else(|| {
        format!(
            "{}/../golden-values/tokenizer/ggml-vocab-llama-bpe.gguf",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let bytes = std::fs::read(&vocab).expect("read the vocabulary file");
    let gguf = Gguf::parse(&bytes).expect("a GGUF file");
    let tok = Arc::new(
        Tokenizer::from_gguf(&gguf)
            .expect("tokenizer")
            .expect("the file has a tokenizer"),
    );
    let start = Instant::now();
    let grammars = Grammars::new(tok.clone()).expect("token trie");
    println!(
        "vocabulary {vocab}: {} tokens, token trie and slices built in {:.0} ms",
        tok.vocab_size(),
        start.elapsed().as_secs_f64() * 1e3
    );
    let person = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "format": "email"},
            "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}},
            "address": {"type": "object", "properties": {
                "street": {"type": "string"}, "city": {"type": "string"}},
                "required": ["street", "city"]}
        },
        "required": ["name", "age", "email", "tags", "address"]
    });
    let person_answer = r#"{"name": "Abraham son of Terah", "age": 99, "email": "abraham@ur.example", "tags": ["admin", "user"], "address": {"street": "Oaks of Mamre 1", "city": "Hebron"}}"#;
    let gbnf = "root ::= item (\", \" item)*\nitem ::= [a-z]+ \"=\" [0-9]+\n";
    // `tool_choice: "auto"` in Hermes' format as the server writes it: free text that holds no
    // `<tool_call>`, or text up to the first one and a call of a tool.
    let tool_auto = r#"start: REPLY? | LEAD rest
rest: "\n" %json {"anyOf": [{"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"], "additionalProperties": false}}, "required": ["name", "arguments"], "additionalProperties": false}], "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}} "\n" "</tool_call>"
REPLY: /(.|\n)+/ & ~(/(.|\n)*/ "<tool_call>" /(.|\n)*/)
LEAD: /(.|\n)*/ "<tool_call>" & ~(/(.|\n)*/ "<tool_call>" /(.|\n)+/)
"#;
    let tool_answer = "I shall look the weather up for you; one moment, please.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Jerusalem\", \"days\": 3}}\n</tool_call>";
    let cases = [
        (
            "json_schema (person)",
            GrammarSpec::JsonSchema(person),
            person_answer.to_string(),
        ),
        (
            "json_object",
            GrammarSpec::JsonObject,
            person_answer.to_string(),
        ),
        (
            "GBNF (key=value list)",
            GrammarSpec::Lark(gbnf_to_lark(gbnf).expect("GBNF")),
            "alpha=1, beta=22, gamma=333, delta=4444, epsilon=55555".to_string(),
        ),
        (
            "tool call, auto (Hermes: text, then a call)",
            GrammarSpec::Lark(tool_auto.to_string()),
            tool_answer.to_string(),
        ),
    ];
    let mut means: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut worst = vec![0f64; cases.len()];
    let mut compile_ms = vec![Vec::new(); cases.len()];
    let mut n_tokens = vec![0; cases.len()];
    let mut row = vec![0f32; tok.vocab_size()];
    for _ in 0..rounds {
        for (k, (name, spec, answer)) in cases.iter().enumerate() {
            let t = Instant::now();
            let mut c = grammars.compile(spec).expect("compiles");
            compile_ms[k].push(t.elapsed().as_secs_f64() * 1e3);
            let tokens = tok.encode_continuation(answer).expect("tokenize");
            n_tokens[k] = tokens.len();
            let mut total = 0.0;
            for (i, &id) in tokens.iter().enumerate() {
                row.fill(0.0);
                let t = Instant::now();
                c.mask(&mut row).expect("mask");
                let us = t.elapsed().as_secs_f64() * 1e6;
                assert!(
                    row[id as usize].is_finite(),
                    "{name}: the answer's token {:?} after {:?} was masked",
                    tok.decode(&[id]),
                    tok.decode(&tokens[..i])
                );
                c.accept(id).expect("accept");
                total += us;
                worst[k] = worst[k].max(us);
            }
            means[k].push(total / tokens.len() as f64);
        }
    }
    println!("| grammar | tokens | compile ms | mask µs/token (median of {rounds} rounds) | slowest mask µs |");
    println!("|---|---:|---:|---:|---:|");
    for (k, (name, _, _)) in cases.iter().enumerate() {
        println!(
            "| {name} | {} | {:.1} | {:.0} | {:.0} |",
            n_tokens[k],
            median(&mut compile_ms[k]),
            median(&mut means[k]),
            worst[k]
        );
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
