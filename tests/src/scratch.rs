//! A scratch copy of a model file that tests edit under a running model (hot-swap).

use std::path::{Path, PathBuf};

/// A copy of a model in a folder of its own, removed with the value.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// Copies `from` to `<temp>/hesper-<tag>-<pid>/model.gguf`.
    pub fn new(tag: &str, from: &Path) -> Self {
        let dir = std::env::temp_dir().join(format!("hesper-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("model.gguf");
        std::fs::copy(from, &path).expect("copy");
        Self(path)
    }

    /// Rewrites the file in place (truncated, then written), after the clock has moved on so
    /// that the file's times change.
    pub fn write(&self, bytes: &[u8]) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&self.0, bytes).expect("write");
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
