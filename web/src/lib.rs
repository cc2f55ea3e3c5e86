//! hesper-web: hesper-rs in a browser tab (see the crate README).
//!
//! One [`Engine`] per Web Worker: it opens the page's WebGPU adapter, streams a GGUF model
//! from a `Blob` onto it tensor by tensor, and generates text with the same forward pass,
//! sampler and chat framing as the native CLI (`hesper-runtime`). Every call that waits for
//! the GPU is async, so the worker's event loop keeps running (a stop message gets through).
#![cfg(target_arch = "wasm32")]

mod blob;
mod options;

use hesper_engine::backend::Backend;
use hesper_engine::chat::{ChatTemplate, KEY_CHAT_TEMPLATE};
use hesper_engine::model::{LoadOptions, Logits, Model, Session};
use hesper_engine::source::{read_header, TensorSource};
use hesper_engine::tokenizer::Tokenizer;
use hesper_gpu_backend::GpuBackend;
use hesper_runtime::chat::{ChatContext, Conversation, Turn};
use hesper_runtime::{complete, Event, Flow, Local, RuntimeError, Stats};
use js_sys::Function;
use wasm_bindgen::prelude::*;
use web_sys::Blob;

use crate::blob::BlobSource;

/// Largest context a page asks for by default (the 2B4T model's training context is 4096).
const DEFAULT_CTX_CAP: usize = 4096;

/// A model loaded in the page, with its conversation.
struct Loaded {
    model: Model<GpuBackend>,
    /// `None` for files that feed token ids directly (the golden test models).
    tok: Option<Tokenizer>,
    session: Session<GpuBackend>,
    conversation: Conversation,
    source: String,
}

/// The engine a worker drives.
#[wasm_bindgen]
pub struct Engine {
    loaded: Option<Loaded>,
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

fn js_error(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

/// Calls the page's text callback; it returns `false` to stop generating.
fn text_event(on_text: &Function, stopped: &mut bool, e: Event<'_>) -> Flow {
    let text = match e {
        Event::Text(t) => t.to_string(),
        Event::ContextFull { n_ctx } => format!("\n[context full: {n_ctx} tokens]"),
        Event::Trimmed { kept, n_ctx } => {
            format!("[the conversation outgrew the context ({n_ctx} tokens); {kept} latest turn(s) kept]\n")
        }
        Event::Refused { tokens, n_ctx } => format!(
            "[this message is {tokens} tokens, too long for the context ({n_ctx} tokens); not sent]"
        ),
    };
    let go_on = on_text.call1(&JsValue::NULL, &JsValue::from_str(&text));
    if matches!(go_on, Ok(v) if v == JsValue::FALSE) {
        *stopped = true;
        Flow::Stop
    } else {
        Flow::Continue
    }
}

#[wasm_bindgen]
impl Engine {
    /// An engine with no model.
    #[wasm_bindgen(constructor)]
    pub fn new() -> Engine {
        Engine { loaded: None }
    }

    /// Opens the WebGPU adapter and loads the GGUF model in `blob` onto it, tensor by
    /// tensor. `options`: `{ctx}` (0 or missing: the model's training context, at most
    /// 4096). `progress(bytes_read, bytes_total)` is called as the file is read. Resolves to
    /// [`Engine::info`].
    pub async fn load(
        &mut self,
        blob: Blob,
        name: String,
        options: JsValue,
        progress: Function,
    ) -> Result<JsValue, JsError> {
        // The old model's buffers go before the new ones are made.
        self.loaded = None;
        let mut source = BlobSource::new(blob, name.clone(), progress);
        let file = read_header(&mut source).await.map_err(js_error)?;
        let tok = Tokenizer::from_gguf(file.header()).map_err(js_error)?;
        let gpu = GpuBackend::open()
            .await
            .map_err(|e| JsError::new(&format!("cannot open a WebGPU device: {e}")))?;
        let model = Model::load_streamed(gpu, file, &mut source, LoadOptions::default())
            .await
            .map_err(|e| JsError::new(&format!("{name}: cannot load the model: {e}")))?;
        source.report(source.len());
        let n_ctx = options::ctx(&options, model.config.n_ctx_train, DEFAULT_CTX_CAP)?;
        let batch = 64;
        let session = model.new_session(n_ctx, batch).map_err(js_error)?;
        self.loaded = Some(Loaded {
            model,
            tok,
            session,
            conversation: Conversation::new(None),
            source: name,
        });
        Ok(self.info())
    }

    /// What is loaded and where it runs: `{model, name, adapter, backend, kernels, n_ctx,
    /// n_vocab, n_layer, n_embd, bytes_per_token, wasm_memory, chat_template}` (`null` before a
    /// load); `chat_template` is whether the file names a chat format (without one, the page
    /// starts in completion mode and chat turns are plain text).
    pub fn info(&self) -> JsValue {
        let Some(l) = &self.loaded else {
            return JsValue::NULL;
        };
        let c = &l.model.config;
        let header = l.model.file.header();
        let name = header.get_str("general.name").unwrap_or("").to_string();
        options::object(&[
            ("model", l.source.clone().into()),
            ("name", name.into()),
            ("adapter", l.model.backend.describe().into()),
            ("backend", l.model.backend.name().into()),
            ("kernels", kernel_variants(&l.model.backend).into()),
            ("n_ctx", (l.session.n_ctx() as f64).into()),
            ("n_vocab", (c.n_vocab as f64).into()),
            ("n_layer", (c.n_layer as f64).into()),
            ("n_embd", (c.n_embd as f64).into()),
            ("bytes_per_token", (l.model.bytes_per_token() as f64).into()),
            ("wasm_memory", wasm_memory().into()),
            (
                "chat_template",
                header.get_str(KEY_CHAT_TEMPLATE).is_some().into(),
            ),
        ])
    }

    /// Starts a new conversation (with an optional system prompt) in an empty context.
    pub fn reset(&mut self, system: Option<String>) {
        if let Some(l) = &mut self.loaded {
            l.conversation = Conversation::new(system);
            l.session.truncate(0);
        }
    }

    /// Sends `message` in the conversation (the model's chat template frames it) and streams
    /// the answer through `on_text(text)`, which returns `false` to stop. `settings`:
    /// `{temperature, top_k, top_p, min_p, repeat_penalty, seed, n_predict}`. Resolves to
    /// `{text, stopped, prompt_tokens, prompt_ms, gen_tokens, gen_ms}`.
    pub async fn chat(
        &mut self,
        message: String,
        settings: JsValue,
        on_text: Function,
    ) -> Result<JsValue, JsError> {
        let l = self.loaded_mut()?;
        let tok = l.tok.as_ref().ok_or_else(no_tokenizer)?;
        // Compiled per message (microseconds): a template that does not parse fails the chat
        // with its message, not the load.
        let template = ChatTemplate::from_gguf(l.model.file.header(), tok).map_err(js_error)?;
        let mut sampler = hesper_engine::sampler::Sampler::new(options::sampler(&settings)?);
        let mut stats = Stats::default();
        let mut stopped = false;
        let mut on_event = |e: Event<'_>| -> Result<Flow, RuntimeError> {
            Ok(text_event(&on_text, &mut stopped, e))
        };
        let mut local = Local {
            model: &l.model,
            session: &mut l.session,
        };
        let mut cx = ChatContext {
            eval: &mut local,
            tok,
            template: &template,
            sampler: &mut sampler,
            n_predict: options::n_predict(&settings)?,
            stats: &mut stats,
        };
        let text = match l.conversation.send(&mut cx, &message, &mut on_event).await {
            Ok(Turn::Answered(text)) => text,
            Ok(Turn::Refused) => String::new(),
            Err(e) => return Err(js_error(e)),
        };
        Ok(options::completion(&text, stopped, &stats))
    }

    /// Completes `prompt` as plain text (no chat template) in a fresh context, like
    /// `hesper-rs generate -p PROMPT`; streams and resolves as [`Engine::chat`] does.
    pub async fn complete(
        &mut self,
        prompt: String,
        settings: JsValue,
        on_text: Function,
    ) -> Result<JsValue, JsError> {
        let l = self.loaded_mut()?;
        let tok = l.tok.as_ref().ok_or_else(no_tokenizer)?;
        let mut sampler = hesper_engine::sampler::Sampler::new(options::sampler(&settings)?);
        let input = tok.encode(&prompt, tok.add_bos(), true).map_err(js_error)?;
        if input.is_empty() || input.len() >= l.session.n_ctx() {
            return Err(JsError::new(&format!(
                "the prompt is {} tokens; it must be between 1 and {} (the context holds {})",
                input.len(),
                l.session.n_ctx() - 1,
                l.session.n_ctx()
            )));
        }
        l.session.truncate(0);
        l.conversation = Conversation::new(None);
        let mut stats = Stats::default();
        let mut stopped = false;
        let mut on_event = |e: Event<'_>| -> Result<Flow, RuntimeError> {
            Ok(text_event(&on_text, &mut stopped, e))
        };
        let done = complete(
            &mut Local {
                model: &l.model,
                session: &mut l.session,
            },
            tok,
            &mut sampler,
            &input,
            options::n_predict(&settings)?,
            &mut stats,
            &mut on_event,
        )
        .await
        .map_err(js_error)?;
        // The next chat message starts afresh.
        l.session.truncate(0);
        Ok(options::completion(&done.text, stopped, &stats))
    }

    /// The logits of every position of `tokens`, evaluated in a fresh context (as
    /// `hesper-rs logits`): `[n_tokens][n_vocab]` floats.
    pub async fn logits(&mut self, tokens: Vec<u32>) -> Result<Vec<f32>, JsError> {
        let l = self.loaded_mut()?;
        l.session.truncate(0);
        l.conversation = Conversation::new(None);
        let out = l
            .model
            .eval_async(&mut l.session, &tokens, Logits::All)
            .await
            .map_err(js_error);
        l.session.truncate(0);
        out
    }

    /// Token ids of `text` as the model's tokenizer splits it (with BOS where the model adds
    /// one).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, JsError> {
        let l = self.loaded.as_ref().ok_or_else(no_model)?;
        let tok = l.tok.as_ref().ok_or_else(no_tokenizer)?;
        tok.encode(text, tok.add_bos(), true).map_err(js_error)
    }

    fn loaded_mut(&mut self) -> Result<&mut Loaded, JsError> {
        self.loaded.as_mut().ok_or_else(no_model)
    }
}

/// The kernel variants the adapter lets the backend use (the portable ones where it lacks a
/// feature), as `info --backend gpu` names them natively.
fn kernel_variants(gpu: &GpuBackend) -> String {
    format!(
        "I2_S products: {}; RMSNorm sums: {}",
        if gpu.packed_dot() {
            "dot4I8Packed"
        } else {
            "plain int8"
        },
        if gpu.uses_subgroups() {
            "subgroup operations"
        } else {
            "workgroup tree"
        }
    )
}

fn no_model() -> JsError {
    JsError::new("no model is loaded")
}

fn no_tokenizer() -> JsError {
    JsError::new("this model has no tokenizer: it takes token ids (logits) only")
}

/// Bytes of wasm linear memory now (it only grows, so after a load this is the peak).
#[wasm_bindgen]
pub fn wasm_memory() -> f64 {
    wasm_bindgen::memory()
        .dyn_into::<js_sys::WebAssembly::Memory>()
        .map_or(0.0, |m| {
            m.buffer()
                .dyn_into::<js_sys::ArrayBuffer>()
                .map_or(0.0, |b| b.byte_length() as f64)
        })
}
