//! A conversation on a ring (master and worker in one process, over 127.0.0.1) says what the
//! same conversation says on one model: trimming the context truncates the ring's caches
//! (the next frame's first position), and replies go on from there.

use std::net::TcpListener;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use hesper_cpu::CpuBackend;
use hesper_engine::chat::ChatTemplate;
use hesper_engine::file::ModelFile;
use hesper_engine::model::{LoadOptions, Model};
use hesper_engine::sampler::SamplerConfig;
use hesper_engine::tokenizer::Tokenizer;
use hesper_ring::{Dtype, NetConfig, Timing, TransportKind};
use hesper_runtime::chat::{ChatContext, Conversation};
use hesper_runtime::ring::{max_payload, serve, NodeSettings, RingEvaluator};
use hesper_runtime::{settings, Evaluator, Event, Flow, Local, Stats};

fn demo(layers: Option<Range<usize>>) -> (Model<CpuBackend>, Tokenizer) {
    let path = format!("{}/../models/hesper-tiny.gguf", env!("CARGO_MANIFEST_DIR"));
    let file = ModelFile::from_bytes(std::fs::read(path).expect("demo"), "demo").expect("parse");
    let tok = Tokenizer::from_gguf(file.header())
        .expect("tokenizer")
        .expect("one");
    let opts = LoadOptions {
        layers,
        ..LoadOptions::default()
    };
    let model = Model::load(CpuBackend::new(1).expect("cpu"), Arc::clone(&file), opts);
    (model.expect("load"), tok)
}

fn node(model: &Model<CpuBackend>, listen: u16, next: u16) -> NodeSettings {
    NodeSettings {
        listen: ([127, 0, 0, 1], listen).into(),
        next: ([127, 0, 0, 1], next).into(),
        net: NetConfig {
            transport: TransportKind::Tcp,
            timing: Timing::default(),
            max_payload: max_payload(&model.config),
            chaos: None,
            key: None,
        },
        wire: Dtype::F32,
        form_wait: Duration::from_secs(30),
        log: |_| {},
    }
}

/// Every reply and event of a conversation that outgrows a 96-position context.
fn converse(eval: &mut impl Evaluator, tok: &Tokenizer, template: &ChatTemplate) -> Vec<String> {
    let mut sampler = settings::sampler(SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    })
    .expect("greedy");
    let mut stats = Stats::default();
    let mut cx = ChatContext {
        eval,
        tok,
        template,
        sampler: &mut sampler,
        n_predict: 24,
        stats: &mut stats,
    };
    let mut chat = Conversation::new(Some("Be brief.".into()));
    let mut log = Vec::new();
    for msg in [
        "Hello there",
        "Tell me more",
        "Tell me more",
        "And then?",
        "Tell me more",
    ] {
        let mut on_event = |e: Event<'_>| {
            log.push(format!("{e:?}"));
            Ok(Flow::Continue)
        };
        let turn = pollster::block_on(chat.send(&mut cx, msg, &mut on_event)).expect("turn");
        log.push(format!("{turn:?}"));
    }
    log
}

#[test]
fn a_conversation_on_a_ring_is_the_conversation_on_one_model() {
    let (whole, tok) = demo(None);
    let template = ChatTemplate::from_gguf(whole.file.header(), &tok).expect("template");
    let mut session = whole.new_session(96, 32).expect("session");
    let expected = converse(
        &mut Local {
            model: &whole,
            session: &mut session,
        },
        &tok,
        &template,
    );
    assert!(
        expected.iter().any(|e| e.starts_with("Trimmed")),
        "{expected:?}"
    );

    let ports: Vec<u16> = (0..2)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect::<Vec<_>>()
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    let (p0, p1) = (ports[0], ports[1]);
    let worker = std::thread::spawn(move || {
        let (model, _) = demo(Some(1..2));
        serve(&model, &node(&model, p1, p0), 32, false)
    });
    let (master, _) = demo(Some(0..1));
    let mut ring =
        RingEvaluator::form(&master, &node(&master, p0, p1), 96, 32, None).expect("ring");
    let got = converse(&mut ring, &tok, &template);
    ring.close("");
    worker.join().expect("worker thread").expect("worker");
    assert_eq!(got, expected);
}
