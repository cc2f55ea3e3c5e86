//! Real chat templates (llama.cpp's `models/templates/`, the ones published GGUFs carry) rendered
//! by hesper-rs equal Python jinja2's rendering as transformers does it
//! (`golden-values/chat_templates.py` → `golden-values/chat/expected.json`): every conversation,
//! with and without the generation prompt, and every conversation with tools or template
//! variables, byte for byte; where jinja2 fails (a template's own refusal, a tag or variable
//! only some other tool has), hesper-rs fails too.

use hesper_engine::chat::{ChatTemplate, RenderOptions, Role, TemplateOrigin, TemplateTokens};
use hesper_tests::golden_dir;
use serde_json::Value;

fn role(name: &str) -> Role {
    match name {
        "system" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        other => panic!("no role {other}"),
    }
}

#[test]
fn templates_render_as_jinja2_renders_them() {
    let dir = golden_dir().join("chat");
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("expected.json")).expect("expected.json"),
    )
    .expect("JSON");
    let text = |v: &Value| v.as_str().expect("a string").to_string();
    let conversations: Vec<Vec<(Role, String)>> = expected["conversations"]
        .as_array()
        .expect("conversations")
        .iter()
        .map(|c| {
            c.as_array()
                .expect("messages")
                .iter()
                .map(|m| (role(m["role"].as_str().expect("role")), text(&m["content"])))
                .collect()
        })
        .collect();
    let clock: jiff::civil::DateTime = expected["clock"]
        .as_str()
        .expect("clock")
        .parse()
        .expect("ISO date");
    let tool_conversations: Vec<(Vec<Value>, RenderOptions)> = expected["tool_conversations"]
        .as_array()
        .expect("tool_conversations")
        .iter()
        .map(|c| {
            let options = RenderOptions {
                tools: c.get("tools").cloned(),
                variables: c
                    .get("variables")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default(),
            };
            (c["messages"].as_array().expect("messages").clone(), options)
        })
        .collect();
    let templates = expected["templates"].as_object().expect("templates");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir.join("templates"))
        .expect("templates/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let listed: Vec<String> = templates.keys().cloned().collect();
    assert_eq!(
        on_disk, listed,
        "expected.json is stale: run chat_templates.py"
    );

    let (mut rendered, mut refused) = (0, 0);
    let mut failures = Vec::new();
    for (name, golden) in templates {
        let source = std::fs::read_to_string(dir.join("templates").join(name)).expect("template");
        let tokens = TemplateTokens {
            bos: text(&expected["bos_token"]),
            eos: text(&expected["eos_token"]),
            strip_bos: false,
        };
        let compiled = ChatTemplate::with_tokens(
            source,
            TemplateOrigin::User(name.clone()),
            tokens,
            Some(clock),
        );
        let Some(cases) = golden["cases"].as_array() else {
            // jinja2 cannot parse it either
            if compiled.is_ok() {
                failures.push(format!("{name}: jinja2 refuses it, we parse it"));
            }
            refused += 1;
            continue;
        };
        let template = match compiled {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let with_tools = golden["tool_cases"].as_array().expect("tool_cases");
        for case in cases.iter().chain(with_tools) {
            let i = case["conversation"].as_u64().expect("index") as usize;
            let (ours, label) = match case.get("add_generation_prompt") {
                Some(gen) => {
                    let gen = gen.as_bool().expect("bool");
                    (
                        template.render(&conversations[i], gen),
                        format!("{name}, conversation {i}, generation prompt {gen}"),
                    )
                }
                None => {
                    let (messages, options) = &tool_conversations[i];
                    (
                        template.render_messages(messages, options, true),
                        format!("{name}, conversation with tools {i}"),
                    )
                }
            };
            match (case.get("text"), ours) {
                (Some(want), Ok(got)) if want.as_str() == Some(got.as_str()) => rendered += 1,
                (Some(want), Ok(got)) => {
                    failures.push(format!("{label}:\n  jinja2: {want}\n  ours:   {got:?}"))
                }
                (Some(_), Err(e)) => {
                    failures.push(format!("{label}: jinja2 renders it, we fail: {e}"))
                }
                (None, Err(_)) => refused += 1,
                (None, Ok(got)) => failures.push(format!(
                    "{label}: jinja2 fails ({}), we render {got:?}",
                    case["error"]
                )),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The goldens hold real renderings, not only refusals.
    assert!(
        rendered >= 10 * templates.len() / 2,
        "{rendered} rendered, {refused} refused"
    );
}
