//! Chat prompts: the model's own chat template (`tokenizer.chat_template`, Hugging Face Jinja)
//! rendered as transformers renders it, through `minijinja`.
//!
//! Which template a file gets ([`ChatTemplate::from_gguf`]):
//!
//! * the file's `tokenizer.chat_template`, except bitnet.cpp's placeholder: its converter writes
//!   `Human: … BITNETAssistant:` into every BitNet file (the official 2B4T GGUF among them),
//!   while BitNet b1.58 2B4T was trained with `Role: content<|eot_id|>` turns and an
//!   `Assistant: ` generation prompt, so the placeholder stands for that trained format;
//! * without one: no chat format is forced on a model that was never taught one (a base model,
//!   the built-in one): the turns are plain text, each message going on from the text before
//!   on a new line and each answer going on from the message.
//!
//! The environment is transformers': blocks trimmed (`trim_blocks`, `lstrip_blocks`), `break` and
//! `continue`, `raise_exception(message)`, `strftime_now(format)`, Python's `str`/`dict` methods
//! (`.strip()`, `.startswith()`, `.items()`, …), `tojson` as Python's `json.dumps` writes
//! (tool definitions and call arguments go through it), and the variables `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, `tools` when a request has tools, and any
//! a request adds (`enable_thinking`, `reasoning_effort`: [`RenderOptions`]). A message is an
//! object as OpenAI's API writes it — `role`, `content`, and `tool_calls`, `tool_call_id`, `name`
//! where it has them — with a call's `arguments` an object, as transformers' callers pass them.
//! As llama.cpp does, a leading BOS the template writes is dropped when the tokenizer adds one
//! itself.
//!
//! Templates come inside downloaded files, so a template is treated as hostile. Only up to
//! [`MAX_TEMPLATE_BYTES`] of it is read, and no tag may hold more than [`MAX_TAG_TOKENS`]
//! tokens: a chain of 60 000 attribute lookups is 60 000 nested nodes, which would overflow
//! the stack as they are compiled, and a long chain of constants takes minutes to fold. It is
//! compiled and rendered on a thread of its own, with a stack that holds the deepest tag
//! allowed, and a rendering may spend at most [`render_fuel`] units of minijinja's fuel, which
//! counts both the instructions run and the bytes created: a loop over 10¹⁰ items or a string
//! doubled forty times ends with [`ChatError::Limit`] instead of hanging or exhausting memory.

mod pyjson;

use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::{json, Map, Value as Json};

use crate::gguf::Gguf;
use crate::tokenizer::Tokenizer;

/// The GGUF key holding the template.
pub const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// The format BitNet b1.58 2B4T was trained with (its Hugging Face `tokenizer_config.json`).
const BITNET_TEMPLATE: &str = "{% for message in messages %}{{ message.role | capitalize }}: \
{{ message.content }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}Assistant: {% endif %}";

/// Plain text for a file that names no template: the messages one after another, each
/// message on a new line and each answer going on from its message.
const PLAIN_TEXT_TEMPLATE: &str = "{% for message in messages %}{% if not loop.first and \
message.role != 'assistant' %}{{ '\\n' }}{% endif %}{{ message.content }}{% endfor %}";

/// The text bitnet.cpp's converter puts in every BitNet file's template.
const BITNET_PLACEHOLDER: &str = "BITNETAssistant";

/// The longest template read. Published templates are a few KiB (the largest llama.cpp tests,
/// Mistral Small 3.2's with tool calls, is 6.6 KiB).
pub const MAX_TEMPLATE_BYTES: usize = 256 << 10;

/// The most tokens one tag (`{{ … }}` or `{% … %}`) may hold: a bound on how deep its
/// expression can nest. The published templates tested hold at most 40.
pub const MAX_TAG_TOKENS: usize = 1024;

/// The stack of the thread a template is compiled and rendered on: many times what the
/// deepest tag [`MAX_TAG_TOKENS`] allows needs. Only the pages a template touches are used.
#[cfg(not(target_arch = "wasm32"))]
const TEMPLATE_STACK: usize = 64 << 20;

/// The fuel a rendering may spend before anything of the conversation is counted: minijinja
/// charges one unit per instruction and one per 64 bytes a template creates, so this is about
/// two million instructions or 128 MiB. The templates tested spend under 20 000 on their
/// longest conversation.
const RENDER_FUEL_BASE: u64 = 2_000_000;

/// The fuel a rendering may spend for `message_bytes` of messages: [`RENDER_FUEL_BASE`] and
/// room to copy each byte of the messages 16 times.
pub fn render_fuel(message_bytes: usize) -> u64 {
    RENDER_FUEL_BASE + message_bytes as u64 / 4
}

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A system prompt.
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
}

impl Role {
    /// The role's name in a template's `messages` (`"system"`, `"user"`, `"assistant"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
        }
    }
}

/// A template that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template does not parse.
    #[error("the chat template ({origin}) cannot be read: {detail}")]
    Syntax {
        /// Where it came from.
        origin: String,
        /// What the template engine says, with the line.
        detail: String,
    },
    /// Rendering failed (the template raised an exception or used what is not there).
    #[error("the chat template ({origin}) refused this conversation: {detail}")]
    Render {
        /// Where it came from.
        origin: String,
        /// What the template engine says.
        detail: String,
    },
    /// The template is longer than [`MAX_TEMPLATE_BYTES`].
    #[error(
        "the chat template ({origin}) is {bytes} bytes long; at most {MAX_TEMPLATE_BYTES} are read"
    )]
    TooLong {
        /// Where it came from.
        origin: String,
        /// Its length.
        bytes: usize,
    },
    /// A tag holds more than [`MAX_TAG_TOKENS`] tokens.
    #[error("the chat template ({origin}) has a tag of more than {MAX_TAG_TOKENS} tokens (line {line}): too deep to read safely")]
    TooDeep {
        /// Where it came from.
        origin: String,
        /// The line the tag starts on.
        line: u32,
    },
    /// Rendering this conversation needed more than its fuel ([`render_fuel`]).
    #[error(
        "the chat template ({origin}) ran out of its limit of {fuel} units of work (minijinja \
         fuel: instructions and bytes created) on this conversation"
    )]
    Limit {
        /// Where it came from.
        origin: String,
        /// The fuel it had.
        fuel: u64,
    },
    /// No thread could be started to compile or render the template on.
    #[error("no thread could be started for the chat template: {0}")]
    Thread(#[source] std::io::Error),
}

/// Where a template came from, for messages and `info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateOrigin {
    /// The file's `tokenizer.chat_template`.
    File,
    /// Given by the user (a path or a name).
    User(String),
    /// BitNet b1.58 2B4T's trained format (the file holds bitnet.cpp's placeholder).
    BitNet,
    /// None: the file names no template, and turns are plain text.
    PlainText,
}

impl std::fmt::Display for TemplateOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File => f.write_str("the file's tokenizer.chat_template"),
            Self::User(name) => f.write_str(name),
            Self::BitNet => f.write_str("BitNet b1.58's trained format"),
            Self::PlainText => f.write_str("none in the file: turns are plain text"),
        }
    }
}

/// The token texts a template refers to.
#[derive(Debug, Clone, Default)]
pub struct TemplateTokens {
    /// `bos_token`.
    pub bos: String,
    /// `eos_token`.
    pub eos: String,
    /// Drop a leading `bos` from the text: the tokenizer adds BOS itself.
    pub strip_bos: bool,
}

/// A compiled chat template with the tokens it refers to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    origin: TemplateOrigin,
    tokens: TemplateTokens,
}

impl ChatTemplate {
    /// The template for `g`'s chat (see the module docs for the choice), with `tok`'s BOS and
    /// EOS text.
    pub fn from_gguf(g: &Gguf, tok: &Tokenizer) -> Result<Self, ChatError> {
        match g.get_str(KEY_CHAT_TEMPLATE) {
            Some(src) if src.contains(BITNET_PLACEHOLDER) => {
                Self::new(BITNET_TEMPLATE.into(), TemplateOrigin::BitNet, tok)
            }
            Some(src) => Self::new(src.to_string(), TemplateOrigin::File, tok),
            None => Self::new(PLAIN_TEXT_TEMPLATE.into(), TemplateOrigin::PlainText, tok),
        }
    }

    /// A template given by the user (`origin` names it in messages), with `tok`'s BOS and EOS.
    pub fn from_source(source: String, origin: String, tok: &Tokenizer) -> Result<Self, ChatError> {
        Self::new(source, TemplateOrigin::User(origin), tok)
    }

    /// `source` with explicit token texts; `strftime_now` reads the local clock, or `clock`
    /// when given (for goldens that must not depend on the date).
    pub fn with_tokens(
        source: String,
        origin: TemplateOrigin,
        tokens: TemplateTokens,
        clock: Option<jiff::civil::DateTime>,
    ) -> Result<Self, ChatError> {
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(ChatError::TooLong {
                origin: origin.to_string(),
                bytes: source.len(),
            });
        }
        on_template_stack(move || Self::compile(source, origin, tokens, clock))?
    }

    /// [`Self::with_tokens`] on the template's thread.
    fn compile(
        source: String,
        origin: TemplateOrigin,
        tokens: TemplateTokens,
        clock: Option<jiff::civil::DateTime>,
    ) -> Result<Self, ChatError> {
        let syntax_error = |e: Error| ChatError::Syntax {
            origin: origin.to_string(),
            detail: describe(&e),
        };
        let mut env = Environment::new();
        let syntax = env
            .syntax()
            .to_builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(syntax_error)?;
        env.set_syntax(syntax.clone());
        if let Some(line) = tag_past_limit(&source, syntax) {
            return Err(ChatError::TooDeep {
                origin: origin.to_string(),
                line,
            });
        }
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", pyjson::tojson);
        env.add_function("strftime_now", move |format: String| {
            strftime_now(&format, clock)
        });
        env.add_template_owned("chat", source.clone())
            .map_err(syntax_error)?;
        Ok(Self {
            env,
            source,
            origin,
            tokens,
        })
    }

    fn new(source: String, origin: TemplateOrigin, tok: &Tokenizer) -> Result<Self, ChatError> {
        let text = |id: Option<u32>| {
            id.map(|t| String::from_utf8_lossy(&tok.token_piece(t, true)).into_owned())
                .unwrap_or_default()
        };
        let tokens = TemplateTokens {
            bos: text(tok.bos()),
            eos: text(tok.eos()),
            strip_bos: tok.add_bos(),
        };
        Self::with_tokens(source, origin, tokens, None)
    }

    /// Where the template came from.
    pub fn origin(&self) -> &TemplateOrigin {
        &self.origin
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The conversation as the model reads it; with `add_generation_prompt`, ending where the
    /// assistant's answer begins: [`Self::render_messages`] of plain text turns.
    ///
    /// Fails with [`ChatError::Limit`] when the template needs more than
    /// [`render_fuel`] of the messages' length. Blocks until the rendering ends (within its fuel).
    pub fn render(
        &self,
        messages: &[(Role, String)],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let messages: Vec<Json> = messages
            .iter()
            .map(|(role, content)| json!({"role": role.as_str(), "content": content}))
            .collect();
        self.render_messages(&messages, &RenderOptions::default(), add_generation_prompt)
    }

    /// `messages` (objects as OpenAI's API writes them: see the module docs) as the model
    /// reads them, with `options`' tools and variables. A template that rejects a leading
    /// system message (several do: "System role not supported") gets it prepended to the
    /// first user message instead, as llama.cpp does.
    ///
    /// Fails with [`ChatError::Limit`] when the template needs more than [`render_fuel`] of
    /// the messages' and tools' length. Blocks until the rendering ends (within its fuel).
    pub fn render_messages(
        &self,
        messages: &[Json],
        options: &RenderOptions,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        on_template_stack(|| self.render_with_fallback(messages, options, add_generation_prompt))?
    }

    /// [`Self::render_messages`] on the template's thread.
    fn render_with_fallback(
        &self,
        messages: &[Json],
        options: &RenderOptions,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let e = match self.render_exactly(messages, options, add_generation_prompt) {
            Ok(text) => return Ok(text),
            Err(e) => e,
        };
        let [system, user, rest @ ..] = messages else {
            return Err(e);
        };
        let (Some(s), Some(u)) = (text_of(system, "system"), text_of(user, "user")) else {
            return Err(e);
        };
        let mut merged = vec![json!({"role": "user", "content": format!("{s}\n\n{u}")})];
        merged.extend(rest.iter().cloned());
        self.render_exactly(&merged, options, add_generation_prompt)
            .map_err(|_| e)
    }

    fn render_exactly(
        &self,
        messages: &[Json],
        options: &RenderOptions,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let length: usize = messages
            .iter()
            .chain(&options.tools)
            .map(|m| m.to_string().len())
            .sum();
        let fuel = render_fuel(length);
        let mut cx: Vec<(&str, Value)> = vec![
            (
                "messages",
                Value::from(
                    messages
                        .iter()
                        .map(pyjson::value_from_json)
                        .collect::<Vec<_>>(),
                ),
            ),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", Value::from(self.tokens.bos.as_str())),
            ("eos_token", Value::from(self.tokens.eos.as_str())),
        ];
        if let Some(tools) = &options.tools {
            cx.push(("tools", pyjson::value_from_json(tools)));
        }
        for (k, v) in &options.variables {
            if !cx.iter().any(|(name, _)| name == k) {
                cx.push((k, pyjson::value_from_json(v)));
            }
        }
        let cx = Value::from_pairs(cx);
        // A clone shares the compiled template; only the fuel differs.
        let mut env = self.env.clone();
        env.set_fuel(Some(fuel));
        let text = env
            .get_template("chat")
            .and_then(|t| t.render(cx))
            .map_err(|e| match e.kind() {
                ErrorKind::OutOfFuel => ChatError::Limit {
                    origin: self.origin.to_string(),
                    fuel,
                },
                _ => ChatError::Render {
                    origin: self.origin.to_string(),
                    detail: describe(&e),
                },
            })?;
        Ok(match text.strip_prefix(self.tokens.bos.as_str()) {
            Some(rest) if self.tokens.strip_bos => rest.to_string(),
            _ => text,
        })
    }
}

/// What a rendering passes to the template besides the messages.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// `tools`: the request's tool definitions as OpenAI's API writes them
    /// (`[{"type": "function", "function": {...}}]`), as transformers passes them.
    pub tools: Option<Json>,
    /// More variables (llama-server's `chat_template_kwargs`: `enable_thinking`,
    /// `reasoning_effort`, …); they cannot replace `messages`, `add_generation_prompt`,
    /// `bos_token` or `eos_token`.
    pub variables: Map<String, Json>,
}

/// `m`'s content when it is a message of `role` with text content.
fn text_of<'a>(m: &'a Json, role: &str) -> Option<&'a str> {
    (m.get("role")?.as_str()? == role)
        .then(|| m.get("content")?.as_str())
        .flatten()
}

/// The line of the first tag in `source` that holds more than [`MAX_TAG_TOKENS`] tokens, by
/// minijinja's own lexer. A lexing error ends the scan: compiling reports it.
fn tag_past_limit(source: &str, syntax: minijinja::syntax::SyntaxConfig) -> Option<u32> {
    use minijinja::machinery::{tokenize, Token};
    // Tokens so far in the tag the lexer is in.
    let mut in_tag: Option<usize> = None;
    for token in tokenize(source, false, syntax) {
        let (token, span) = token.ok()?;
        match (token, &mut in_tag) {
            (Token::VariableStart | Token::BlockStart, _) => in_tag = Some(0),
            (Token::VariableEnd | Token::BlockEnd, _) => in_tag = None,
            (_, Some(n)) => {
                *n += 1;
                if *n > MAX_TAG_TOKENS {
                    return Some(u32::from(span.start_line));
                }
            }
            (_, None) => {}
        }
    }
    None
}

/// `f` on a thread with a [`TEMPLATE_STACK`] stack, waiting for it (the page has one thread:
/// there `f` runs on it, and a hostile template's recursion ends in a trap the page reports).
fn on_template_stack<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T, ChatError> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::thread::scope(|s| {
            let thread = std::thread::Builder::new()
                .name("chat-template".into())
                .stack_size(TEMPLATE_STACK)
                .spawn_scoped(s, f)
                .map_err(ChatError::Thread)?;
            Ok(thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
        })
    }
    #[cfg(target_arch = "wasm32")]
    Ok(f())
}

/// `raise_exception(message)`, which Hugging Face templates call to refuse a conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`, which transformers gives templates: the local time (or `clock`)
/// formatted as C's strftime does.
fn strftime_now(format: &str, clock: Option<jiff::civil::DateTime>) -> Result<String, Error> {
    let now = clock.unwrap_or_else(|| jiff::ZonedDateTime::now().datetime());
    jiff::fmt::strtime::format(format, now)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("strftime_now: {e}")))
}

/// The engine's message with its line, without the template's name (always "chat").
fn describe(e: &Error) -> String {
    let what = e
        .detail()
        .map_or_else(|| e.kind().to_string(), str::to_string);
    match e.line() {
        Some(line) => format!("{what} (line {line})"),
        None => what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitnet() -> ChatTemplate {
        let tokens = TemplateTokens {
            bos: "<|begin_of_text|>".into(),
            eos: "<|end_of_text|>".into(),
            strip_bos: true,
        };
        ChatTemplate::with_tokens(BITNET_TEMPLATE.into(), TemplateOrigin::BitNet, tokens, None)
            .expect("compiles")
    }

    #[test]
    fn a_file_without_a_template_chats_in_plain_text() {
        let t = ChatTemplate::with_tokens(
            PLAIN_TEXT_TEMPLATE.into(),
            TemplateOrigin::PlainText,
            TemplateTokens::default(),
            None,
        )
        .expect("compiles");
        let turns = [
            (Role::System, "In the beginning".into()),
            (Role::User, "Who is the LORD?".into()),
            (Role::Assistant, " I am the LORD.".into()),
            (Role::User, "And Moses said".into()),
        ];
        // Each message on a new line, each answer right after its message: what the context
        // holds before a message is a prefix of the rendering with it.
        assert_eq!(
            t.render(&turns, true).expect("renders"),
            "In the beginning\nWho is the LORD? I am the LORD.\nAnd Moses said"
        );
        assert_eq!(
            t.render(&turns[1..2], true).expect("renders"),
            "Who is the LORD?"
        );
    }

    #[test]
    fn bitnet_fallback_is_the_trained_format() {
        let t = bitnet();
        let p = t
            .render(
                &[(
                    Role::User,
                    "Hey, are you conscious? Can you talk to me?".into(),
                )],
                true,
            )
            .expect("renders");
        assert_eq!(
            p,
            "User: Hey, are you conscious? Can you talk to me?<|eot_id|>Assistant: "
        );
        let turns = [
            (Role::System, "Be brief.".into()),
            (Role::User, "Hi".into()),
            (Role::Assistant, "Hello!".into()),
            (Role::User, "Bye".into()),
        ];
        assert_eq!(
            t.render(&turns, true).expect("renders"),
            "System: Be brief.<|eot_id|>User: Hi<|eot_id|>Assistant: Hello!<|eot_id|>User: Bye<|eot_id|>Assistant: "
        );
        assert_eq!(
            t.render(&turns[..3], false).expect("renders"),
            "System: Be brief.<|eot_id|>User: Hi<|eot_id|>Assistant: Hello!<|eot_id|>"
        );
    }

    fn plain(src: &str) -> ChatTemplate {
        ChatTemplate::with_tokens(
            src.into(),
            TemplateOrigin::File,
            TemplateTokens::default(),
            None,
        )
        .expect("compiles")
    }

    #[test]
    fn a_leading_bos_is_dropped_only_when_the_tokenizer_adds_one() {
        let src = "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}";
        let turns = [(Role::User, "a".to_string())];
        for (strip, want) in [(true, "[a]"), (false, "<s>[a]")] {
            let tokens = TemplateTokens {
                bos: "<s>".into(),
                eos: "</s>".into(),
                strip_bos: strip,
            };
            let t = ChatTemplate::with_tokens(src.into(), TemplateOrigin::File, tokens, None)
                .expect("compiles");
            assert_eq!(t.render(&turns, true).expect("renders"), want);
        }
    }

    #[test]
    fn python_methods_and_loop_controls_work_as_in_transformers() {
        let src = "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}\
                   {{ m.content.strip().upper() }}{% if m['content'].startswith(' x') %}!{% endif %}\
                   {% endfor %}";
        let t = plain(src);
        let turns = [
            (Role::User, " x1 ".to_string()),
            (Role::Assistant, "y".to_string()),
            (Role::User, "z".to_string()),
        ];
        assert_eq!(t.render(&turns, false).expect("renders"), "X1!Y");
    }

    #[test]
    fn a_refusal_and_a_syntax_error_are_one_line_each() {
        let t = plain(
            "{% if messages[0].role == 'assistant' %}{{ raise_exception('Roles must alternate') }}{% endif %}ok",
        );
        let e = t
            .render(&[(Role::Assistant, "a".into())], true)
            .expect_err("raises")
            .to_string();
        assert!(
            e.contains("refused this conversation: Roles must alternate"),
            "{e}"
        );
        let e = ChatTemplate::with_tokens(
            "{% for m in messages %}".into(),
            TemplateOrigin::File,
            TemplateTokens::default(),
            None,
        )
        .expect_err("unclosed")
        .to_string();
        assert!(
            e.starts_with("the chat template (the file's tokenizer.chat_template) cannot be read:"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn strftime_now_formats_the_clock_as_c_does() {
        let clock = jiff::civil::date(2026, 1, 2).at(3, 4, 5, 0);
        let t = ChatTemplate::with_tokens(
            "{{ strftime_now('%d %b %Y %H:%M:%S') }}".into(),
            TemplateOrigin::File,
            TemplateTokens::default(),
            Some(clock),
        )
        .expect("compiles");
        assert_eq!(
            t.render(&[], false).expect("renders"),
            "02 Jan 2026 03:04:05"
        );
    }

    #[test]
    fn a_template_without_system_messages_gets_the_system_prompt_in_the_first_user_turn() {
        let src = "{% for m in messages %}{% if m.role == 'system' %}\
                   {{ raise_exception('System role not supported') }}{% endif %}\
                   <{{ m.role }}>{{ m.content }}{% endfor %}";
        let t = plain(src);
        let turns = [
            (Role::System, "Be brief.".to_string()),
            (Role::User, "Hi".to_string()),
        ];
        assert_eq!(
            t.render(&turns, true).expect("renders"),
            "<user>Be brief.\n\nHi"
        );
    }

    /// A hostile template's conversation: one user message.
    fn hostile(src: String) -> Result<String, ChatError> {
        ChatTemplate::with_tokens(src, TemplateOrigin::File, TemplateTokens::default(), None)
            .and_then(|t| t.render(&[(Role::User, "hi".into())], true))
    }

    #[test]
    fn endless_loops_and_growing_strings_run_out_of_fuel() {
        let loops = "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}\
                     {% endfor %}";
        let doubling = "{% set ns = namespace(s='xy') %}{% for i in range(40) %}\
                        {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}";
        let repeated = "{% for i in range(10) %}{{ 'x' * 99999999 }}{% endfor %}";
        for src in [loops, doubling, repeated] {
            match hostile(src.into()) {
                Err(e @ ChatError::Limit { .. }) => {
                    assert!(e.to_string().contains("ran out of its limit"), "{e}")
                }
                other => panic!("{src}: {other:?}"),
            }
        }
        // The same doubling ten times is within the limit: fuel grows with what a template does.
        let ten = doubling.replace("range(40)", "range(10)");
        assert_eq!(hostile(ten).expect("renders"), "2048");
    }

    #[test]
    fn the_deepest_tags_allowed_are_read_and_deeper_ones_refused() {
        // Chains that nest one node per link: each at the most links a tag may hold, then
        // past it. Rendering may fail (undefined names), but must end as a value: a stack
        // overflow aborts the test.
        let chains = [
            ("{{ x", ".a", 2, " }}"),
            ("{{ ", "-", 1, "1 }}"),
            ("{{ x", "|e", 2, " }}"),
            ("{{ 1", "~1", 2, " }}"),
            ("{{ x", "[0]", 3, " }}"),
            ("{{ ", "not ", 1, "x }}"),
        ];
        for (head, link, tokens, tail) in chains {
            let within = format!("{head}{}{tail}", link.repeat((MAX_TAG_TOKENS - 1) / tokens));
            let r = hostile(within);
            assert!(
                !matches!(r, Err(ChatError::TooDeep { .. })),
                "{head}{link}…: {r:?}"
            );
            let past = format!("{head}{}{tail}", link.repeat(60_000));
            let e = hostile(past).expect_err("too deep");
            assert!(matches!(e, ChatError::TooDeep { line: 1, .. }), "{e}");
        }
        let e = hostile(format!("{{# {} #}}", " ".repeat(MAX_TEMPLATE_BYTES))).expect_err("long");
        assert!(matches!(e, ChatError::TooLong { .. }), "{e}");
    }
}
