//! Constrained decoding on the built-in trained model (CPU), through the scheduler: a model that
//! knows nothing of JSON answers valid JSON of a schema, a GBNF grammar and a regular expression
//! are followed to the end, unconstrained batch-mates get their tokens unchanged, and a schema
//! that cannot be followed is refused with its reason.

use std::sync::Arc;

use hesper_cpu::CpuBackend;
use hesper_engine::attention::AttentionConfig;
use hesper_engine::model::Model;
use hesper_engine::sampler::SamplerConfig;
use hesper_engine::tokenizer::Tokenizer;
use hesper_runtime::grammar::{gbnf_to_lark, GrammarSpec, Grammars};
use hesper_runtime::scheduler::{self, Constraint, Finish, Job, JobEvent, SchedulerConfig};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

mod common;

fn kjv() -> (Model<CpuBackend>, Arc<Tokenizer>) {
    let (model, tok) = common::kjv();
    (model, Arc::new(tok))
}

/// A person: nested array of an enum, bounded strings and numbers, every field required.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 10},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tribe": {"enum": ["Judah", "Levi", "Benjamin"]},
            "sons": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
            "alive": {"type": "boolean"}
        },
        "required": ["name", "age", "tribe", "sons", "alive"],
        "additionalProperties": false
    })
}

/// Checks `v` against [`person_schema`] by hand.
fn is_person(v: &Value) -> bool {
    let Some(o) = v.as_object() else { return false };
    o.len() == 5
        && o["name"].as_str().is_some_and(|s| s.chars().count() <= 10)
        && o["age"].as_i64().is_some_and(|a| (0..=150).contains(&a))
        && ["Judah", "Levi", "Benjamin"].contains(&o["tribe"].as_str().unwrap_or(""))
        && o["sons"].as_array().is_some_and(|a| {
            a.len() <= 2
                && a.iter()
                    .all(|s| s.as_str().is_some_and(|s| s.chars().count() <= 6))
        })
        && o["alive"].is_boolean()
}

fn job(
    tok: &Tokenizer,
    prompt: &str,
    seed: u64,
    constraint: Option<Box<dyn Constraint>>,
) -> (Job, UnboundedReceiver<JobEvent>) {
    let (events, rx) = unbounded_channel();
    let job = Job {
        prompt: tok.encode(prompt, tok.add_bos(), true).expect("encode"),
        sampling: SamplerConfig {
            seed,
            ..Default::default()
        },
        max_tokens: 200,
        top_logprobs: None,
        cache_prompt: false,
        ignore_eos: false,
        constraint,
        events,
    };
    (job, rx)
}

fn drain(rx: &mut UnboundedReceiver<JobEvent>) -> (Vec<u32>, Finish) {
    let mut tokens = Vec::new();
    loop {
        match rx.blocking_recv().expect("the sequence ends with an event") {
            JobEvent::Started { .. } => {}
            JobEvent::Token { id, .. } => tokens.push(id),
            JobEvent::Done(f) => return (tokens, f),
            JobEvent::Failed(e) => panic!("sequence failed: {e}"),
        }
    }
}

/// Runs `jobs` together on one scheduler (4 sequences at once) and returns each one's tokens.
fn run_together(
    model: &Model<CpuBackend>,
    tok: &Tokenizer,
    jobs: Vec<(Job, UnboundedReceiver<JobEvent>)>,
) -> Vec<(Vec<u32>, Finish)> {
    let config = SchedulerConfig {
        n_ctx: 256,
        parallel: 4,
        batch: 64,
        keep_idle: 0,
        kv_pool: None,
        attention: AttentionConfig::default(),
    };
    let (submitter, inbox) = scheduler::queue(jobs.len());
    let gauges = submitter.gauges().clone();
    std::thread::scope(|s| {
        s.spawn(|| scheduler::run(model, tok, &config, inbox, &gauges).expect("scheduler"));
        let mut rxs = Vec::new();
        for (j, rx) in jobs {
            submitter.submit(j).expect("queued");
            rxs.push(rx);
        }
        drop(submitter);
        rxs.iter_mut().map(drain).collect()
    })
}

#[test]
fn schema_answers_are_valid_and_unconstrained_batch_mates_are_unchanged() {
    let (model, tok) = kjv();
    let grammars = Grammars::new(tok.clone()).expect("trie");
    let person = grammars
        .compile(&GrammarSpec::JsonSchema(person_schema()))
        .expect("compiles");
    let prompts = [
        "In the beginning",
        "And God said",
        "The LORD is my shepherd",
    ];
    let free = |i: usize| job(&tok, prompts[i % 3], 10 + i as u64, None);
    let alone = run_together(&model, &tok, (0..3).map(free).collect());
    let mut mixed = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        mixed.push(free(i));
        let c = Box::new(person.clone()) as Box<dyn Constraint>;
        mixed.push(job(&tok, prompt, 20 + i as u64, Some(c)));
    }
    let got = run_together(&model, &tok, mixed);
    for i in 0..3 {
        assert_eq!(got[2 * i], alone[i], "unconstrained answer {i} changed");
        let (tokens, finish) = &got[2 * i + 1];
        let text = tok.decode(tokens);
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("answer {i} is not JSON ({e}): {text}"));
        assert!(
            is_person(&v),
            "answer {i} does not follow the schema: {text}"
        );
        assert_eq!(
            *finish,
            Finish::Stop,
            "the grammar ended answer {i}: {text}"
        );
    }
    // Unconstrained, the same seed does not give JSON: the mask is what made it.
    let (tokens, _) = &alone[0];
    assert!(serde_json::from_str::<Value>(&tok.decode(tokens)).is_err());
}

#[test]
fn a_gbnf_grammar_and_a_regular_expression_are_followed_to_their_end() {
    let (model, tok) = kjv();
    let grammars = Grammars::new(tok.clone()).expect("trie");
    // A list of one to three verses references, as llama.cpp writes grammars.
    let gbnf = r#"
        root ::= ref ("; " ref){0,2} "."
        ref  ::= book " " [1-9] [0-9]? ":" [1-9]   # chapter:verse
        book ::= "Genesis" | "Exodus" | "Psalms"
    "#;
    let lark = gbnf_to_lark(gbnf).expect("reads");
    let grammar = grammars
        .compile(&GrammarSpec::Lark(lark))
        .expect("compiles");
    let regex = grammars
        .compile(&GrammarSpec::Regex(
            "[A-Z][a-z]{2,8}, son of [A-Z][a-z]{2,8}".into(),
        ))
        .expect("compiles");
    let jobs = (0..4)
        .map(|i| {
            let c = if i % 2 == 0 {
                Box::new(grammar.clone()) as Box<dyn Constraint>
            } else {
                Box::new(regex.clone())
            };
            job(&tok, "And he said", 30 + i, Some(c))
        })
        .collect();
    for (i, (tokens, finish)) in run_together(&model, &tok, jobs).into_iter().enumerate() {
        let text = tok.decode(&tokens);
        let ok = if i % 2 == 0 {
            text.strip_suffix('.').is_some_and(|refs| {
                refs.split("; ").count() <= 3
                    && refs.split("; ").all(|r| {
                        let (book, cv) = r.split_once(' ').unwrap_or(("", ""));
                        let (c, v) = cv.split_once(':').unwrap_or(("", ""));
                        ["Genesis", "Exodus", "Psalms"].contains(&book)
                            && (1..=2).contains(&c.len())
                            && !c.starts_with('0')
                            && c.bytes().all(|b| b.is_ascii_digit())
                            && v.len() == 1
                            && v != "0"
                    })
            })
        } else {
            text.split_once(", son of ").is_some_and(|(a, b)| {
                [a, b].iter().all(|w| {
                    (3..=9).contains(&w.len())
                        && w.starts_with(|c: char| c.is_ascii_uppercase())
                        && w[1..].bytes().all(|b| b.is_ascii_lowercase())
                })
            })
        };
        assert!(ok, "answer {i} does not follow its grammar: {text:?}");
        assert_eq!(finish, Finish::Stop, "answer {i}: {text:?}");
    }
}

#[test]
fn what_cannot_be_followed_is_refused_with_its_reason() {
    let (_, tok) = kjv();
    let grammars = Grammars::new(tok).expect("trie");
    for (spec, why) in [
        (
            GrammarSpec::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 1})),
            "nsatisfiable",
        ),
        (
            GrammarSpec::JsonSchema(json!({"$ref": "#/$defs/missing"})),
            "missing",
        ),
        (GrammarSpec::Lark("start: ( \"a\"".into()), "1("),
        (GrammarSpec::Regex("[a-".into()), "regex"),
    ] {
        let err = grammars.compile(&spec).err().expect("refused").to_string();
        assert!(err.contains(why), "{spec:?}: {err}");
    }
}
