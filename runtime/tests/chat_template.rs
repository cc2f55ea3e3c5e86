//! A conversation feeds the model exactly what the chat template renders for the whole
//! conversation: the first message as a fresh context, each later one as the text it adds
//! (the template's end of the last answer, then the new turn); a template whose rendering of
//! the past changes (DeepSeek-R1 drops past reasoning, Mistral Nemo moves the system prompt
//! to the latest message) makes the conversation evaluated afresh.
//! The model is a script that answers with fixed tokens, on Llama 3's real vocabulary.

use hesper_engine::chat::{ChatTemplate, Role, TemplateOrigin};
use hesper_engine::gguf::Gguf;
use hesper_engine::model::{Prediction, Readout};
use hesper_engine::sampler::SamplerConfig;
use hesper_engine::tokenizer::Tokenizer;
use hesper_runtime::chat::{ChatContext, Conversation, Turn};
use hesper_runtime::{settings, Evaluator, Flow, RuntimeError, Stats};

fn golden(path: &str) -> String {
    format!("{}/../golden-values/{path}", env!("CARGO_MANIFEST_DIR"))
}

fn llama3_vocab() -> Tokenizer {
    let bytes = std::fs::read(golden("tokenizer/ggml-vocab-llama-bpe.gguf")).expect("vocab");
    let g = Gguf::parse(&bytes).expect("parses");
    Tokenizer::from_gguf(&g)
        .expect("tokenizer")
        .expect("has one")
}

/// Answers every prompt with `answer` then `end`, and records what the context holds.
struct Scripted {
    answer: Vec<u32>,
    end: u32,
    next: usize,
    context: Vec<u32>,
    n_ctx: usize,
    /// Times the context was emptied after it held something.
    restarts: usize,
}

impl Evaluator for Scripted {
    fn pos(&self) -> usize {
        self.context.len()
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn truncate(&mut self, pos: usize) {
        if pos == 0 && !self.context.is_empty() {
            self.restarts += 1;
        }
        self.context.truncate(pos);
    }

    async fn predict(&mut self, input: &[u32], _: Readout) -> Result<Prediction, RuntimeError> {
        self.context.extend_from_slice(input);
        let t = match self.answer.get(self.next) {
            Some(&t) => t,
            None => self.end,
        };
        self.next = if t == self.end { 0 } else { self.next + 1 };
        Ok(Prediction::Token(t))
    }
}

/// Three turns with `template_file`, answering `answer`; returns the restarts after the first.
fn converse(template_file: &str, answer: &str) -> usize {
    let tok = llama3_vocab();
    let source = std::fs::read_to_string(golden(&format!("chat/templates/{template_file}")))
        .expect("template");
    let template = ChatTemplate::from_source(source, template_file.into(), &tok).expect("compiles");
    assert_eq!(
        template.origin(),
        &TemplateOrigin::User(template_file.into())
    );
    let mut eval = Scripted {
        answer: tok.encode(answer, false, true).expect("encodes"),
        end: tok.token_id("<|eot_id|>").expect("eot"),
        next: 0,
        context: Vec::new(),
        n_ctx: 4096,
        restarts: 0,
    };
    let mut sampler = settings::sampler(SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    })
    .expect("greedy");
    let mut stats = Stats::default();
    let mut chat = Conversation::new(Some("Be brief.".into()));
    let bos = tok.decode(&[tok.bos().expect("bos")]);
    for (i, message) in ["Hi", "What is 2+2?", "  And 3+3?\n"]
        .into_iter()
        .enumerate()
    {
        let mut cx = ChatContext {
            eval: &mut eval,
            tok: &tok,
            template: &template,
            sampler: &mut sampler,
            n_predict: -1,
            stats: &mut stats,
        };
        let turn = pollster::block_on(chat.send(&mut cx, message, &mut |_| Ok(Flow::Continue)))
            .expect("answered");
        assert!(
            matches!(turn, Turn::Answered(ref a) if a == answer),
            "{turn:?}"
        );
        // What the model read equals the whole conversation rendered at once, then the answer.
        let mut turns = vec![(Role::System, "Be brief.".to_string())];
        turns.extend(chat.history()[..chat.history().len() - 1].iter().cloned());
        let rendered = template.render(&turns, true).expect("renders");
        assert_eq!(
            tok.decode(&eval.context),
            format!("{bos}{rendered}{answer}"),
            "{template_file}, turn {i}"
        );
        if i == 0 {
            eval.restarts = 0;
        }
    }
    eval.restarts
}

#[test]
fn each_message_adds_only_what_the_template_adds() {
    for file in [
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        // no system role: the system prompt goes into the first user message
        "google-gemma-2-2b-it.jinja",
    ] {
        assert_eq!(converse(file, "Sure, friend."), 0, "{file} restarted");
    }
}

#[test]
fn a_template_that_renders_the_past_differently_restarts_the_context() {
    for file in [
        // past answers lose their reasoning and the `<think>` the generation prompt opened
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
        // the system prompt moves to the latest user message
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    ] {
        assert_eq!(converse(file, "<think>Easy.</think>Four."), 2, "{file}");
    }
}
