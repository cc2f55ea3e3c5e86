//! The generation library on the demo model (CPU backend): a completion stops where it should
//! and says why, and a conversation trims or refuses what does not fit and goes on.

use std::sync::Arc;

use hesper_cpu::CpuBackend;
use hesper_engine::chat::{ChatTemplate, Role};
use hesper_engine::file::ModelFile;
use hesper_engine::model::{LoadOptions, Model};
use hesper_engine::sampler::{Sampler, SamplerConfig};
use hesper_engine::tokenizer::Tokenizer;
use hesper_runtime::chat::{ChatContext, Conversation, Turn};
use hesper_runtime::settings;
use hesper_runtime::{complete, Event, Flow, Local, Stats};

fn demo() -> (Model<CpuBackend>, Tokenizer) {
    let path = format!("{}/../models/hesper-tiny.gguf", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(path).expect("demo model");
    let file = ModelFile::from_bytes(bytes, "demo").expect("parse");
    let tok = Tokenizer::from_gguf(file.header())
        .expect("tokenizer")
        .expect("the demo model has one");
    let cpu = CpuBackend::new(2).expect("cpu");
    let model = Model::load(cpu, Arc::clone(&file), LoadOptions::default()).expect("load");
    (model, tok)
}

fn greedy() -> Sampler {
    settings::sampler(SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    })
    .expect("valid")
}

/// What a run printed: the text and the other events.
#[derive(Default)]
struct Log {
    text: String,
    events: Vec<String>,
}

impl Log {
    fn take(&mut self, e: Event<'_>) {
        match e {
            Event::Text(t) => self.text.push_str(t),
            other => self.events.push(format!("{other:?}")),
        }
    }
}

#[test]
fn a_completion_stops_at_its_limit_or_a_full_context() {
    let (model, tok) = demo();
    let prompt = tok.encode("Once upon a time", true, true).unwrap();
    let mut sampler = greedy();
    // At most five tokens.
    let mut session = model.new_session(64, 16).unwrap();
    let mut stats = Stats::default();
    let mut log = Log::default();
    let mut on_event = |e: Event<'_>| {
        log.take(e);
        Ok(Flow::Continue)
    };
    let done = pollster::block_on(complete(
        &mut Local {
            model: &model,
            session: &mut session,
        },
        &tok,
        &mut sampler,
        &prompt,
        5,
        &mut stats,
        &mut on_event,
    ))
    .unwrap();
    assert_eq!((stats.prompt_tokens, stats.gen_tokens), (prompt.len(), 5));
    assert_eq!(done.text, log.text);
    assert!(log.events.is_empty(), "{:?}", log.events);
    // No limit and three positions left: three generated tokens fill them, and a fourth is
    // sampled from the last position's logits (it needs no position); then the context is
    // full, and says so.
    let n_ctx = prompt.len() + 3;
    let mut session = model.new_session(n_ctx, 16).unwrap();
    let mut stats = Stats::default();
    let mut log = Log::default();
    let mut on_event = |e: Event<'_>| {
        log.take(e);
        Ok(Flow::Continue)
    };
    pollster::block_on(complete(
        &mut Local {
            model: &model,
            session: &mut session,
        },
        &tok,
        &mut sampler,
        &prompt,
        -1,
        &mut stats,
        &mut on_event,
    ))
    .unwrap();
    assert_eq!(stats.gen_tokens, 4);
    assert_eq!(log.events, [format!("ContextFull {{ n_ctx: {n_ctx} }}")]);
}

#[test]
fn a_conversation_trims_and_refuses_and_goes_on() {
    let (model, tok) = demo();
    let mut sampler = greedy();
    let mut session = model.new_session(96, 32).unwrap();
    let mut stats = Stats::default();
    let mut local = Local {
        model: &model,
        session: &mut session,
    };
    let template = ChatTemplate::from_gguf(model.file.header(), &tok).expect("template");
    let mut cx = ChatContext {
        eval: &mut local,
        tok: &tok,
        template: &template,
        sampler: &mut sampler,
        n_predict: 24,
        stats: &mut stats,
    };
    let mut chat = Conversation::new(Some("Be brief.".into()));
    let mut log = Log::default();
    let mut send =
        |chat: &mut Conversation, cx: &mut ChatContext<'_, Local<'_, CpuBackend>>, msg: &str| {
            let mut on_event = |e: Event<'_>| {
                log.take(e);
                Ok(Flow::Continue)
            };
            pollster::block_on(chat.send(cx, msg, &mut on_event)).unwrap()
        };
    assert!(matches!(
        send(&mut chat, &mut cx, "Hello there"),
        Turn::Answered(_)
    ));
    assert_eq!(chat.history().len(), 2);
    // Far longer than the context: refused, and the history stays.
    let long = "word ".repeat(200);
    assert_eq!(send(&mut chat, &mut cx, &long), Turn::Refused);
    assert_eq!(chat.history().len(), 2);
    // Turns until the context overflows: the oldest are dropped, the conversation goes on.
    for _ in 0..6 {
        assert!(matches!(
            send(&mut chat, &mut cx, "Tell me more"),
            Turn::Answered(_)
        ));
    }
    let events = log.events;
    assert!(
        events.iter().any(|e| e.starts_with("Refused")),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e.starts_with("Trimmed")),
        "{events:?}"
    );
    assert_eq!(chat.history().last().map(|t| t.0), Some(Role::Assistant));
}

#[test]
fn a_completion_stops_when_the_front_end_says_so() {
    let (model, tok) = demo();
    let prompt = tok.encode("Once upon a time", true, true).unwrap();
    let mut sampler = greedy();
    let mut session = model.new_session(64, 16).unwrap();
    let mut stats = Stats::default();
    let mut pieces = 0;
    // Stop after the third piece of text, as a stop button pressed mid-generation does.
    let mut on_event = |e: Event<'_>| {
        assert!(matches!(e, Event::Text(_)), "{e:?}");
        pieces += 1;
        Ok(if pieces == 3 {
            Flow::Stop
        } else {
            Flow::Continue
        })
    };
    let done = pollster::block_on(complete(
        &mut Local {
            model: &model,
            session: &mut session,
        },
        &tok,
        &mut sampler,
        &prompt,
        20,
        &mut stats,
        &mut on_event,
    ))
    .unwrap();
    assert!(done.stopped && done.end.is_none());
    assert_eq!(stats.gen_tokens, 3);
    // The stopped tokens are in the context: prompt + 2 fed back (the third was only sampled).
    assert_eq!(session.pos(), prompt.len() + 2);
}
