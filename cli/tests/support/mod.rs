//! Running the `hesper-rs` binary from tests: with a time limit, so a hang fails the test
//! instead of stalling the suite.

#![allow(dead_code)] // each test binary uses its own share of these helpers

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The longest any one run may take (the slowest is a GPU run on lavapipe compiling its
/// kernels, a few seconds).
pub const TIME_LIMIT: Duration = Duration::from_secs(120);

/// Runs `hesper-rs args` to completion.
pub fn hesper(args: &[&str]) -> Output {
    run(args, None)
}

/// Runs `hesper-rs args` with `stdin` as its standard input (`None`: empty); fails the test
/// if it runs past [`TIME_LIMIT`].
pub fn run(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hesper-rs");
    let input = stdin.unwrap_or_default().to_vec();
    let mut pipe = child.stdin.take().expect("stdin");
    // Written from a thread: a child that does not read its input must not block the test.
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > TIME_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("hesper-rs {args:?} ran past {TIME_LIMIT:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = writer.join();
    Output {
        status,
        stdout: out_reader.join().expect("stdout reader"),
        stderr: err_reader.join().expect("stderr reader"),
    }
}

/// `hesper-rs args`, with a valid `XDG_RUNTIME_DIR` (as `.ci/run` sets): without one, the
/// Vulkan loader prints warnings when `--backend gpu` opens a device, and these tests read
/// stderr line by line.
pub fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hesper-rs"));
    cmd.args(args);
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let dir = std::env::temp_dir().join(format!("hesper-xdg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("runtime dir");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        }
        cmd.env("XDG_RUNTIME_DIR", dir);
    }
    cmd
}

/// A file under golden-values/.
pub fn golden(name: &str) -> String {
    format!("{}/../golden-values/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts a run that went wrong said so as it should: a non-zero exit (not a signal), no
/// panic, and exactly one line on stderr, which contains `needle`.
pub fn assert_one_line_error(args: &[&str], o: &Output, needle: &str) {
    let err = stderr(o);
    assert_no_crash(args, o);
    assert!(!o.status.success(), "{args:?} succeeded; stderr: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: stderr lacks {needle:?}: {err}"
    );
    assert_eq!(
        err.trim().lines().count(),
        1,
        "{args:?}: more than one line: {err}"
    );
}

/// Asserts the process ended by itself: no panic message, no abort or other signal.
pub fn assert_no_crash(args: &[&str], o: &Output) {
    let err = stderr(o);
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert!(
        !err.contains("memory allocation of"),
        "{args:?} aborted: {err}"
    );
    assert!(
        o.status.code().is_some(),
        "{args:?} was killed by a signal ({:?}): {err}",
        o.status
    );
}
