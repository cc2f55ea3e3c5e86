//! The settings huggingface_hub reads from the environment, read the same way.

use std::path::PathBuf;

use crate::HubError;

/// The Hub used when `HF_ENDPOINT` is unset.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where and how to download.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The server (`HF_ENDPOINT`, else the Hugging Face Hub), without a trailing `/`.
    pub endpoint: String,
    /// A token for gated and private repositories (`HF_TOKEN`, `HUGGING_FACE_HUB_TOKEN`, or
    /// the file `huggingface-cli login` writes).
    pub token: Option<String>,
    /// The cache (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`,
    /// else `~/.cache/huggingface/hub`).
    pub cache: PathBuf,
    /// Use only downloaded files (`HF_HUB_OFFLINE=1`).
    pub offline: bool,
    /// The branch, tag or commit to download from.
    pub revision: String,
}

impl Settings {
    /// The settings the environment gives.
    pub fn from_env() -> Result<Self, HubError> {
        Self::from_vars(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// The settings `var` gives (the environment, or a test's table).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, HubError> {
        let endpoint = var("HF_ENDPOINT")
            .unwrap_or_else(|| DEFAULT_ENDPOINT.into())
            .trim_end_matches('/')
            .to_string();
        let home = var("HF_HOME").map(PathBuf::from).or_else(|| {
            var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|c| c.join("huggingface"))
        });
        let cache = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join("hub")))
            .ok_or(HubError::NoCacheDir)?;
        let token_file = var("HF_TOKEN_PATH")
            .map(PathBuf::from)
            .or_else(|| home.map(|h| h.join("token")));
        let token = var("HF_TOKEN")
            .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| token_file.and_then(|f| std::fs::read_to_string(f).ok()))
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(v.to_ascii_lowercase().as_str(), "1" | "on" | "yes" | "true")
        });
        Ok(Self {
            endpoint,
            token,
            cache,
            offline,
            revision: "main".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Settings, HubError> {
        Settings::from_vars(|k| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn the_cache_follows_huggingface_hub() {
        let s = settings(&[("HOME", "/h")]).unwrap();
        assert_eq!(s.cache, PathBuf::from("/h/.cache/huggingface/hub"));
        assert_eq!(s.endpoint, DEFAULT_ENDPOINT);
        assert!(!s.offline && s.token.is_none());
        let s = settings(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")]).unwrap();
        assert_eq!(s.cache, PathBuf::from("/x/huggingface/hub"));
        let s = settings(&[("HOME", "/h"), ("HF_HOME", "/hf")]).unwrap();
        assert_eq!(s.cache, PathBuf::from("/hf/hub"));
        let s = settings(&[("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/c")]).unwrap();
        assert_eq!(s.cache, PathBuf::from("/c"));
        assert!(matches!(settings(&[]), Err(HubError::NoCacheDir)));
    }

    #[test]
    fn endpoint_token_and_offline_come_from_their_variables() {
        let s = settings(&[
            ("HOME", "/h"),
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_TOKEN", " hf_x \n"),
            ("HF_HUB_OFFLINE", "True"),
        ])
        .unwrap();
        assert_eq!(s.endpoint, "http://127.0.0.1:9");
        assert_eq!(s.token.as_deref(), Some("hf_x"));
        assert!(s.offline);
        let s = settings(&[("HOME", "/h"), ("HF_HUB_OFFLINE", "0")]).unwrap();
        assert!(!s.offline);
    }
}
