//! The chat template a command uses: `--chat-template-file`, else the model file's.

use std::path::Path;

use anyhow::{Context, Result};
use hesper_engine::chat::ChatTemplate;
use hesper_engine::gguf::Gguf;
use hesper_engine::tokenizer::Tokenizer;

/// The template in `file` (`--chat-template-file`), else the one [`ChatTemplate::from_gguf`]
/// picks for the model whose header is `header`.
pub fn chat_template(file: Option<&Path>, header: &Gguf, tok: &Tokenizer) -> Result<ChatTemplate> {
    Ok(match file {
        None => ChatTemplate::from_gguf(header, tok)?,
        Some(path) => {
            let source = std::fs::read_to_string(path).with_context(|| {
                format!("--chat-template-file {}: cannot read it", path.display())
            })?;
            ChatTemplate::from_source(source, path.display().to_string(), tok)?
        }
    })
}
