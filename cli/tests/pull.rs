//! `hesper-rs pull` and `-hf` against a local server with the Hugging Face Hub's URL layout
//! (`HF_ENDPOINT`): a download checked and reused, a transfer cut mid-way and resumed, a wrong
//! checksum refused, offline use of a file downloaded before, and each failure in one line.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use support::{assert_one_line_error, command, stderr, stdout};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const REPO: &str = "hesper/kjv-gguf";
const MODEL: &str = "hesper-kjv.gguf";

/// A Hub with one repository holding the built-in model (and a README outside Git LFS).
struct Hub {
    port: u16,
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    model: Vec<u8>,
    /// The SHA-256 published for the model (its own unless a test changes it).
    published_sha: Mutex<String>,
    /// Responses to cut after half the bytes, still to come.
    cuts: AtomicUsize,
    /// The Range header of each file request (None: no range).
    ranges: Mutex<Vec<Option<String>>>,
    /// A token the repository asks for.
    token: Mutex<Option<String>>,
    /// Extra GGUF names listed (not downloadable), to make the choice ambiguous.
    extra: Mutex<Vec<String>>,
}

impl Hub {
    fn start() -> Self {
        let model = std::fs::read(format!("{}/../models/{MODEL}", env!("CARGO_MANIFEST_DIR")))
            .expect("the built-in model");
        let state = Arc::new(State {
            published_sha: Mutex::new(hex(&Sha256::digest(&model))),
            model,
            ..State::default()
        });
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().unwrap().port();
        let s = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let s = s.clone();
                std::thread::spawn(move || serve(&s, conn));
            }
        });
        Self { port, state }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn ranges(&self) -> Vec<Option<String>> {
        self.state.ranges.lock().unwrap().clone()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Answers one request (each connection is closed after its answer).
fn serve(s: &State, mut conn: TcpStream) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let send = |conn: &mut TcpStream, status: &str, extra: &str, body: &[u8]| {
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
            body.len()
        );
        let _ = conn.write_all(head.as_bytes());
        let _ = conn.write_all(body);
    };
    let allowed = match &*s.token.lock().unwrap() {
        Some(t) => headers.get("authorization") == Some(&format!("Bearer {t}")),
        None => true,
    };
    let listing = format!("/api/models/{REPO}/revision/main?blobs=true");
    let resolve = format!("/{REPO}/resolve/{COMMIT}/{MODEL}");
    if !allowed && (path == listing || path == resolve) {
        return send(&mut conn, "401 Unauthorized", "", b"{\"error\":\"gated\"}");
    }
    if path == listing {
        let sha = s.published_sha.lock().unwrap().clone();
        let mut siblings = vec![
            serde_json::json!({"rfilename": ".gitattributes", "size": 10}),
            serde_json::json!({"rfilename": "README.md", "size": 20}),
            serde_json::json!({"rfilename": MODEL, "size": s.model.len(),
                "lfs": {"sha256": sha, "size": s.model.len(), "pointerSize": 134}}),
        ];
        for name in s.extra.lock().unwrap().iter() {
            siblings.push(serde_json::json!({"rfilename": name,
                "lfs": {"sha256": "0".repeat(64), "size": 1, "pointerSize": 134}}));
        }
        let body = serde_json::json!({"id": REPO, "sha": COMMIT, "siblings": siblings});
        send(
            &mut conn,
            "200 OK",
            "Content-Type: application/json\r\n",
            body.to_string().as_bytes(),
        );
    } else if path == resolve {
        // The Hub sends LFS files to its CDN.
        send(&mut conn, "302 Found", "Location: /cdn/model\r\n", b"");
    } else if path == "/cdn/model" {
        let range = headers.get("range").cloned();
        s.ranges.lock().unwrap().push(range.clone());
        let from: usize = range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok())
            .unwrap_or(0);
        let n = s.model.len();
        let (status, extra) = if from > 0 {
            (
                "206 Partial Content",
                format!("Content-Range: bytes {from}-{}/{n}\r\n", n - 1),
            )
        } else {
            ("200 OK", String::new())
        };
        let body = &s.model[from..];
        let cut = s
            .cuts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1))
            .is_ok();
        if cut {
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&body[..body.len() / 2]);
            let _ = conn.shutdown(std::net::Shutdown::Both);
        } else {
            send(&mut conn, status, &extra, body);
        }
    } else {
        send(&mut conn, "404 Not Found", "", b"{\"error\":\"not found\"}");
    }
}

/// A private `HF_HOME` for one test.
fn hf_home(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hesper-pull-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `hesper-rs args` with the Hub at `endpoint` and the cache under `home`.
fn run(endpoint: &str, home: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = command(args);
    for var in [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN_PATH",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("HF_ENDPOINT", endpoint).env("HF_HOME", home);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run hesper-rs");
    support::assert_no_crash(args, &out);
    out
}

fn repo_dir(home: &Path) -> PathBuf {
    home.join("hub/models--hesper--kjv-gguf")
}

#[test]
fn pull_downloads_checks_and_reuses_the_file_and_hf_runs_it() {
    let hub = Hub::start();
    let home = hf_home("reuse");
    let out = run(&hub.endpoint(), &home, &[], &["pull", REPO]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let path = PathBuf::from(stdout(&out).trim());
    let expected = repo_dir(&home).join(format!("snapshots/{COMMIT}/{MODEL}"));
    assert_eq!(path, expected);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        hub.state.model,
        "the bytes served"
    );
    // huggingface_hub's layout: the snapshot links to the blob named by its SHA-256.
    let sha = hub.state.published_sha.lock().unwrap().clone();
    let link = std::fs::read_link(&path).unwrap();
    assert_eq!(link, PathBuf::from(format!("../../blobs/{sha}")));
    assert_eq!(
        std::fs::read_to_string(repo_dir(&home).join("refs/main")).unwrap(),
        COMMIT
    );
    assert!(
        err.contains("downloading 3.0 MB from http://127.0.0.1"),
        "{err}"
    );
    assert!(err.contains("% ("), "a progress line: {err}");
    assert!(err.contains("3.0 MB downloaded and checked"), "{err}");

    // Again: nothing downloaded.
    let out = run(
        &hub.endpoint(),
        &home,
        &[],
        &["pull", &format!("{REPO}:{MODEL}")],
    );
    assert!(out.status.success());
    assert!(
        stderr(&out).contains("downloaded before"),
        "{}",
        stderr(&out)
    );
    assert_eq!(hub.ranges().len(), 1, "one transfer in all");

    // -hf runs the downloaded file: the same text as the built-in model gives.
    let gen = [
        "generate",
        "-p",
        "In the beginning",
        "-n",
        "6",
        "--seed",
        "3",
    ];
    let builtin = run(&hub.endpoint(), &home, &[], &gen);
    let from_hub = run(
        &hub.endpoint(),
        &home,
        &[],
        &[&gen[..], &["-hf", REPO]].concat(),
    );
    assert!(from_hub.status.success(), "{}", stderr(&from_hub));
    assert_eq!(stdout(&from_hub), stdout(&builtin));

    // Offline: a closed port, or HF_HUB_OFFLINE, still finds the downloaded file.
    let closed = closed_port();
    let out = run(&closed, &home, &[], &["pull", REPO]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot reach"), "{}", stderr(&out));
    let out = run(
        &closed,
        &home,
        &[("HF_HUB_OFFLINE", "1")],
        &["info", "-hf", REPO],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("HF_HUB_OFFLINE: using"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn a_cut_transfer_is_resumed_with_a_range() {
    let hub = Hub::start();
    let home = hf_home("resume");
    // Cut once: the same run resumes.
    hub.state.cuts.store(1, Ordering::SeqCst);
    let out = run(&hub.endpoint(), &home, &[], &["pull", REPO]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("the transfer stopped at"), "{err}");
    let ranges = hub.ranges();
    assert_eq!(ranges.len(), 2, "{ranges:?}");
    assert_eq!(ranges[0], None);
    let half = hub.state.model.len() / 2;
    assert_eq!(ranges[1], Some(format!("bytes={half}-")));
    assert_eq!(std::fs::read(stdout(&out).trim()).unwrap(), hub.state.model);

    // Cut every try: one line saying how to resume, the partial file kept; the next run
    // resumes it.
    let home = hf_home("resume-later");
    hub.state.cuts.store(100, Ordering::SeqCst);
    let args = ["pull", REPO];
    let quiet = ["--log-disable", "pull", REPO];
    let out = run(&hub.endpoint(), &home, &[], &quiet);
    assert_one_line_error(&quiet, &out, "run the command again to resume it");
    let sha = hub.state.published_sha.lock().unwrap().clone();
    let partial = repo_dir(&home).join(format!("blobs/{sha}.incomplete"));
    let kept = std::fs::metadata(&partial).expect("the partial file").len();
    assert!(kept > 0 && kept < hub.state.model.len() as u64);
    hub.state.cuts.store(0, Ordering::SeqCst);
    let before = hub.ranges().len();
    let out = run(&hub.endpoint(), &home, &[], &args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("resuming at"), "{}", stderr(&out));
    assert_eq!(hub.ranges()[before], Some(format!("bytes={kept}-")));
    assert_eq!(std::fs::read(stdout(&out).trim()).unwrap(), hub.state.model);
    assert!(!partial.exists());
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn a_wrong_checksum_is_refused_and_nothing_is_kept() {
    let hub = Hub::start();
    let home = hf_home("checksum");
    *hub.state.published_sha.lock().unwrap() = "f".repeat(64);
    let args = ["--log-disable", "pull", REPO];
    let out = run(&hub.endpoint(), &home, &[], &args);
    assert_one_line_error(
        &args,
        &out,
        &format!("the Hub publishes {}", "f".repeat(64)),
    );
    let blobs: Vec<_> = std::fs::read_dir(repo_dir(&home).join("blobs"))
        .unwrap()
        .collect();
    assert!(blobs.is_empty(), "{blobs:?}");
    assert!(!repo_dir(&home).join("snapshots").exists());
    std::fs::remove_dir_all(&home).unwrap();
}

/// An endpoint, the arguments, extra environment, and what the one error line says.
type Case<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);

#[test]
fn each_failure_is_one_line() {
    let hub = Hub::start();
    let home = hf_home("failures");
    let ep = hub.endpoint();
    let closed = closed_port();
    let q8 = format!("{REPO}:q8_0");
    let cases: Vec<Case> = vec![
        (
            &closed,
            vec!["pull", REPO],
            vec![],
            "cannot reach http://127.0.0.1",
        ),
        (
            &ep,
            vec!["pull", REPO],
            vec![("HF_HUB_OFFLINE", "1")],
            "HF_HUB_OFFLINE is set and hesper/kjv-gguf has no downloaded GGUF file",
        ),
        (
            &ep,
            vec!["pull", "hesper/nothing"],
            vec![],
            "has no model repository hesper/nothing",
        ),
        (
            &ep,
            vec!["pull", "hesper"],
            vec![],
            "no '/' between owner and name",
        ),
        (
            &ep,
            vec!["pull", &q8],
            vec![],
            "has no GGUF file matching \"q8_0\"; it has: hesper-kjv.gguf",
        ),
        (
            &ep,
            vec!["generate", "-hf", REPO, "-m", "x.gguf"],
            vec![],
            "cannot be used with",
        ),
    ];
    for (endpoint, args, env, needle) in &cases {
        let mut all = vec!["--log-disable"];
        all.extend(args);
        let out = run(endpoint, &home, env, &all);
        assert_one_line_error(&all, &out, needle);
    }
    // Several files: the user must choose.
    hub.state
        .extra
        .lock()
        .unwrap()
        .push("hesper-kjv-Q8_0.gguf".into());
    let args = ["--log-disable", "pull", REPO];
    let out = run(&ep, &home, &[], &args);
    assert_one_line_error(
        &args,
        &out,
        "has several GGUF files; name one as hesper/kjv-gguf:QUANT",
    );
    hub.state.extra.lock().unwrap().clear();
    // A gated repository: the token opens it.
    *hub.state.token.lock().unwrap() = Some("hf_secret".into());
    let out = run(&ep, &home, &[], &args);
    assert_one_line_error(&args, &out, "is gated or private: set HF_TOKEN");
    let out = run(&ep, &home, &[("HF_TOKEN", "hf_wrong")], &args);
    assert_one_line_error(&args, &out, "HF_TOKEN was sent and refused");
    let out = run(&ep, &home, &[("HF_TOKEN", "hf_secret")], &args);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::remove_dir_all(&home).unwrap();
}

/// An endpoint nothing listens on.
fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

/// File names in a hostile Hub's listing that would leave the cache once joined to it are
/// refused before anything is written, however the file is chosen (the default, a :QUANT).
#[test]
fn names_from_the_hub_that_leave_the_cache_are_refused() {
    let hub = Hub::start();
    let home = hf_home("escape");
    // Inside HF_HOME, so that whatever a name reaches is found and removed with it.
    let outside = home.join("outside");
    let hostile = [
        format!("{}/evil-Q8_0.gguf", outside.display()),
        "../../../outside/evil-Q8_0.gguf".to_string(),
        "sub/../../evil-Q8_0.gguf".to_string(),
        "a//evil-Q8_0.gguf".to_string(),
        "./evil-Q8_0.gguf".to_string(),
        "sub\\..\\evil-Q8_0.gguf".to_string(),
    ];
    let q8 = format!("{REPO}:Q8_0");
    for name in &hostile {
        *hub.state.extra.lock().unwrap() = vec![name.clone()];
        for spec in [REPO, q8.as_str()] {
            let args = ["--log-disable", "pull", spec];
            let out = run(&hub.endpoint(), &home, &[], &args);
            assert_one_line_error(&args, &out, "is not a relative path inside the repository");
        }
    }
    assert!(!outside.exists(), "written outside the cache");
    let repo = repo_dir(&home);
    assert!(
        !repo.join("snapshots").exists() && !repo.join("refs").exists(),
        "nothing is linked for a refused listing"
    );
    std::fs::remove_dir_all(&home).unwrap();
}
