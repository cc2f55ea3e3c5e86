//! One file's transfer: resumed with an HTTP range from the partial file a stopped transfer
//! left, retried a few times within one run, and moved into the cache only when its size and
//! SHA-256 are the ones the Hub publishes.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::api::{check_status, get};
use crate::{HubError, Progress, Settings};

/// Tries per run before a stopped transfer is reported (each resumes where the last stopped).
const ATTEMPTS: usize = 3;
/// Bytes read and written at a time.
const CHUNK: usize = 1 << 20;

/// What one file's transfer needs to know.
pub(crate) struct Transfer<'a> {
    /// The repository.
    pub repo: &'a str,
    /// The commit to download from.
    pub commit: &'a str,
    /// The file's path in the repository.
    pub path: &'a str,
    /// Its size and SHA-256, as the Hub publishes them.
    pub size: u64,
    /// Its SHA-256 (lowercase hex).
    pub sha256: &'a str,
}

impl Transfer<'_> {
    /// Downloads into `partial` (resuming what is there), checks it, and renames it to `blob`.
    pub(crate) fn run(
        &self,
        agent: &ureq::Agent,
        settings: &Settings,
        partial: &Path,
        blob: &Path,
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<(), HubError> {
        if let Some(dir) = partial.parent() {
            fs::create_dir_all(dir).map_err(HubError::io(dir))?;
        }
        let start = fs::metadata(partial).map_or(0, |m| m.len());
        on_progress(Progress::Started {
            size: self.size,
            resumed_from: start,
        });
        let mut cause = String::new();
        for attempt in 0..ATTEMPTS {
            let mut have = fs::metadata(partial).map_or(0, |m| m.len());
            if have > self.size {
                // Not a prefix of this file: start over.
                fs::remove_file(partial).map_err(HubError::io(partial))?;
                have = 0;
            }
            if have == self.size {
                break;
            }
            if attempt > 0 {
                on_progress(Progress::Retrying {
                    done: have,
                    cause: cause.clone(),
                });
            }
            match self.fetch_from(agent, settings, partial, have, on_progress) {
                Ok(()) => {}
                Err(Step::Fatal(e)) => return Err(e),
                Err(Step::Stopped(why)) => cause = why,
            }
        }
        let have = fs::metadata(partial).map_or(0, |m| m.len());
        if have < self.size {
            return Err(HubError::Interrupted {
                file: self.path.to_string(),
                done: have,
                size: self.size,
                cause,
            });
        }
        on_progress(Progress::Checking);
        let got = sha256_of(partial)?;
        if got != self.sha256 {
            let _ = fs::remove_file(partial);
            return Err(HubError::Corrupt {
                file: self.path.to_string(),
                what: format!("have SHA-256 {got}, the Hub publishes {}", self.sha256),
            });
        }
        fs::rename(partial, blob).map_err(HubError::io(blob))?;
        on_progress(Progress::Done);
        Ok(())
    }

    /// One request for the bytes from `have` on, appended to `partial`.
    fn fetch_from(
        &self,
        agent: &ureq::Agent,
        settings: &Settings,
        partial: &Path,
        have: u64,
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<(), Step> {
        let url = format!(
            "{}/{}/resolve/{}/{}",
            settings.endpoint,
            self.repo,
            self.commit,
            encode_path(self.path)
        );
        let mut req = get(agent, settings, &url);
        if have > 0 {
            req = req.header("Range", format!("bytes={have}-"));
        }
        let mut resp = req.call().map_err(|e| Step::Stopped(e.to_string()))?;
        let status = resp.status().as_u16();
        // 206: the rest, as asked; 200: the whole file (a server that ignores ranges);
        // 416: the partial file is not a prefix the server knows, so start over.
        let mut done = match status {
            206 if content_range_start(&resp) == Some(have) => have,
            200 => 0,
            206 | 416 => {
                let _ = fs::remove_file(partial);
                return Err(Step::Stopped(format!(
                    "the server refused to resume at byte {have}"
                )));
            }
            _ => {
                check_status(status, self.repo, settings, &url).map_err(Step::Fatal)?;
                return Err(Step::Fatal(HubError::Status { url, status }));
            }
        };
        let mut out = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(done == 0)
            .append(done > 0)
            .open(partial)
            .map_err(|e| Step::Fatal(HubError::io(partial)(e)))?;
        let mut body = resp
            .body_mut()
            .with_config()
            .limit(u64::MAX)
            .reader()
            .take(self.size - done);
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => return Err(Step::Stopped(e.to_string())),
            };
            out.write_all(&buf[..n])
                .map_err(|e| Step::Fatal(HubError::io(partial)(e)))?;
            done += n as u64;
            on_progress(Progress::Bytes {
                done,
                size: self.size,
            });
        }
        out.flush()
            .map_err(|e| Step::Fatal(HubError::io(partial)(e)))?;
        if done < self.size {
            return Err(Step::Stopped("the connection closed early".into()));
        }
        Ok(())
    }
}

/// How one request ended, when not with the whole file.
enum Step {
    /// Worth another try from where it stopped.
    Stopped(String),
    /// Not worth another try.
    Fatal(HubError),
}

/// Where a 206 answer's `Content-Range: bytes START-END/SIZE` starts.
fn content_range_start(resp: &ureq::http::Response<ureq::Body>) -> Option<u64> {
    let v = resp.headers().get("content-range")?.to_str().ok()?;
    v.strip_prefix("bytes ")?
        .split('-')
        .next()?
        .trim()
        .parse()
        .ok()
}

/// A repository path with each segment percent-encoded for a URL.
fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The SHA-256 of a file's bytes, lowercase hex.
fn sha256_of(path: &Path) -> Result<String, HubError> {
    let mut file = File::open(path).map_err(HubError::io(path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = file.read(&mut buf).map_err(HubError::io(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_encoded_segment_by_segment() {
        assert_eq!(encode_path("sub dir/m+1.gguf"), "sub%20dir/m%2B1.gguf");
    }
}
