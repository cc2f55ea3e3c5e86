//! The repository's file list with the size and SHA-256 the Hub publishes for each file
//! (`GET /api/models/REPO/revision/REV?blobs=true`), and the agent every request goes through.

use std::time::Duration;

use serde::Deserialize;

use crate::{HubError, Settings};

/// A connection attempt's limit.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// The longest wait for any single read (a stalled transfer fails, and is resumed).
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest file list read.
const LISTING_LIMIT: u64 = 64 << 20;

/// The HTTP agent: rustls, statuses handled by the caller, redirects followed (the Hub sends
/// file downloads to its CDN).
pub(crate) fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_per_read(Some(READ_TIMEOUT))
        .user_agent(concat!("hesper-rs/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// A request with the token, when there is one.
pub(crate) fn get(
    agent: &ureq::Agent,
    settings: &Settings,
    url: &str,
) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
    let req = agent.get(url);
    match &settings.token {
        Some(t) => req.header("Authorization", format!("Bearer {t}")),
        None => req,
    }
}

/// A repository at one commit.
#[derive(Debug, Clone)]
pub struct Listing {
    /// The commit the revision names.
    pub commit: String,
    /// Its files.
    pub files: Vec<RemoteFile>,
}

/// One file as the Hub publishes it.
#[derive(Debug, Clone)]
pub struct RemoteFile {
    /// Its path in the repository.
    pub path: String,
    /// Its size in bytes and SHA-256 (lowercase hex), for files stored with Git LFS (every
    /// GGUF on the Hub).
    pub lfs: Option<(u64, String)>,
}

#[derive(Deserialize)]
struct Info {
    sha: String,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
    lfs: Option<Lfs>,
}

#[derive(Deserialize)]
struct Lfs {
    size: u64,
    sha256: String,
}

/// The file list of `repo` at `settings.revision`.
pub(crate) fn listing(
    agent: &ureq::Agent,
    settings: &Settings,
    repo: &str,
) -> Result<Listing, HubError> {
    let url = format!(
        "{}/api/models/{repo}/revision/{}?blobs=true",
        settings.endpoint, settings.revision
    );
    let mut resp = get(agent, settings, &url)
        .call()
        .map_err(|e| HubError::Unreachable {
            endpoint: settings.endpoint.clone(),
            cause: e.to_string(),
        })?;
    check_status(resp.status().as_u16(), repo, settings, &url)?;
    let bad = |detail: String| HubError::BadListing {
        repo: repo.to_string(),
        detail,
    };
    let body = resp
        .body_mut()
        .with_config()
        .limit(LISTING_LIMIT)
        .read_to_string()
        .map_err(|e| bad(e.to_string()))?;
    let info: Info = serde_json::from_str(&body).map_err(|e| bad(e.to_string()))?;
    let hex = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    if info.sha.len() != 40 || !info.sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad(format!("{:?} is not a commit", info.sha)));
    }
    if let Some(s) = info
        .siblings
        .iter()
        .find(|s| !crate::spec::is_repo_path(&s.rfilename))
    {
        return Err(bad(format!(
            "{:?} is not a relative path inside the repository",
            s.rfilename
        )));
    }
    let files = info
        .siblings
        .into_iter()
        .map(|s| {
            let lfs = s
                .lfs
                .filter(|l| hex(&l.sha256))
                .map(|l| (l.size, l.sha256.to_ascii_lowercase()));
            RemoteFile {
                path: s.rfilename,
                lfs,
            }
        })
        .collect();
    Ok(Listing {
        commit: info.sha,
        files,
    })
}

/// The error a status other than success means for `repo`.
pub(crate) fn check_status(
    status: u16,
    repo: &str,
    settings: &Settings,
    url: &str,
) -> Result<(), HubError> {
    match status {
        200..=299 => Ok(()),
        401 | 403 => Err(HubError::Gated {
            repo: repo.to_string(),
            hint: if settings.token.is_some() {
                "HF_TOKEN was sent and refused; accept the repository's terms on its page, or use a token that may read it"
            } else {
                "set HF_TOKEN to a token of an account that accepted its terms"
            },
        }),
        404 => Err(HubError::NoRepo {
            repo: repo.to_string(),
            endpoint: settings.endpoint.clone(),
        }),
        status => Err(HubError::Status {
            url: url.to_string(),
            status,
        }),
    }
}
