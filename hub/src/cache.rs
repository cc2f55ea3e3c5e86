//! huggingface_hub's cache layout, so either tool finds what the other downloaded:
//! `models--OWNER--NAME/blobs/SHA256` holds the bytes, `snapshots/COMMIT/PATH` links to them,
//! `refs/REVISION` names the commit; a transfer in progress is `blobs/SHA256.incomplete`.

use std::fs;
use std::path::{Path, PathBuf};

use crate::HubError;

/// One repository's folder in the cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    root: PathBuf,
}

impl RepoCache {
    /// The folder of `repo` (`owner/name`) in `cache`.
    pub fn new(cache: &Path, repo: &str) -> Self {
        Self {
            root: cache.join(format!("models--{}", repo.replace('/', "--"))),
        }
    }

    /// The finished file with this SHA-256.
    pub fn blob(&self, sha256: &str) -> PathBuf {
        self.root.join("blobs").join(sha256)
    }

    /// The file a transfer of this SHA-256 writes into.
    pub fn partial(&self, sha256: &str) -> PathBuf {
        self.root.join("blobs").join(format!("{sha256}.incomplete"))
    }

    /// Where `path` of `commit` is seen.
    pub fn snapshot(&self, commit: &str, path: &str) -> PathBuf {
        self.root.join("snapshots").join(commit).join(path)
    }

    /// The commit `revision` named when last downloaded.
    pub fn commit(&self, revision: &str) -> Option<String> {
        let text = fs::read_to_string(self.root.join("refs").join(revision)).ok()?;
        let commit = text.trim();
        (!commit.is_empty() && !commit.contains(['/', '.'])).then(|| commit.to_string())
    }

    /// The paths under `commit`'s snapshot whose bytes are present.
    pub fn files(&self, commit: &str) -> Vec<String> {
        let base = self.root.join("snapshots").join(commit);
        let mut out = Vec::new();
        let mut dirs = vec![base.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.is_file() {
                    if let Ok(rel) = path.strip_prefix(&base) {
                        out.push(rel.to_string_lossy().replace('\\', "/"));
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// Makes `path` of `commit` show the blob `sha256`, and `revision` name `commit`.
    pub fn link(
        &self,
        revision: &str,
        commit: &str,
        path: &str,
        sha256: &str,
    ) -> Result<PathBuf, HubError> {
        let link = self.snapshot(commit, path);
        let dir = link.parent().unwrap_or(&self.root);
        fs::create_dir_all(dir).map_err(HubError::io(dir))?;
        if !link.is_file() {
            let _ = fs::remove_file(&link);
            place(&self.blob(sha256), &link).map_err(HubError::io(&link))?;
        }
        let refs = self.root.join("refs");
        fs::create_dir_all(&refs).map_err(HubError::io(&refs))?;
        let r = refs.join(revision);
        fs::write(&r, commit).map_err(HubError::io(&r))?;
        Ok(link)
    }
}

/// Links `link` to `blob` by a relative path, as huggingface_hub does.
#[cfg(unix)]
fn place(blob: &Path, link: &Path) -> std::io::Result<()> {
    // snapshots/COMMIT/a/b.gguf → ../../../blobs/SHA: one `..` per folder below the repo root.
    let depth = link
        .parent()
        .and_then(|p| p.strip_prefix(blob.parent()?.parent()?).ok())
        .map_or(2, |rel| rel.components().count());
    let mut target = PathBuf::new();
    for _ in 0..depth {
        target.push("..");
    }
    target.push("blobs");
    target.push(blob.file_name().unwrap_or_default());
    std::os::unix::fs::symlink(target, link)
}

/// Copies `blob` to `link` where links need privileges (huggingface_hub does the same on
/// Windows without developer mode).
#[cfg(not(unix))]
fn place(blob: &Path, link: &Path) -> std::io::Result<()> {
    fs::copy(blob, link).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linked_file_is_found_through_its_ref() {
        let dir = std::env::temp_dir().join(format!("hesper-hub-cache-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let c = RepoCache::new(&dir, "o/n");
        let sha = "ab".repeat(32);
        fs::create_dir_all(c.blob(&sha).parent().unwrap()).unwrap();
        fs::write(c.blob(&sha), b"GGUF").unwrap();
        let commit = "c".repeat(40);
        let p = c.link("main", &commit, "sub/m.gguf", &sha).unwrap();
        assert_eq!(
            p,
            dir.join(format!("models--o--n/snapshots/{commit}/sub/m.gguf"))
        );
        assert_eq!(fs::read(&p).unwrap(), b"GGUF");
        assert_eq!(c.commit("main").as_deref(), Some(commit.as_str()));
        assert_eq!(c.files(&commit), ["sub/m.gguf"]);
        // Linking again (a second pull) keeps the link.
        c.link("main", &commit, "sub/m.gguf", &sha).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"GGUF");
        fs::remove_dir_all(&dir).unwrap();
    }
}
