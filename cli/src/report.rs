//! How the binary talks to the user outside its results: notes on stderr that never fail the
//! run, one line per error with each cause said once, and a closed output pipe taken as the
//! reader having seen enough.

use std::io::ErrorKind;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

/// Whether notes are off (`--log-disable`); errors are printed all the same.
pub static QUIET: AtomicBool = AtomicBool::new(false);

/// Notes held back until the work has begun ([`later`]).
static LATER: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Holds a note until [`flush_later`]: one that is only worth saying once the run is under way
/// (a run that fails right after loading prints its error line alone).
pub fn later(line: String) {
    if let Ok(mut held) = LATER.lock() {
        held.push(line);
    }
}

/// Prints the notes [`later`] held (a banner calls it; `main` once a command succeeded).
pub fn flush_later() {
    let held = LATER
        .lock()
        .map(|mut h| std::mem::take(&mut *h))
        .unwrap_or_default();
    for line in held {
        note!("{line}");
    }
}

/// Exit code of a process whose output pipe was closed by its reader (128 + SIGPIPE), as
/// `yes | head -1` leaves it.
const BROKEN_PIPE_EXIT: u8 = 141;

/// Prints a line on stderr unless `--log-disable` turned notes off; a closed or failing
/// stderr is ignored (notes are not results).
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if !$crate::report::QUIET.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = writeln!(std::io::stderr(), $($arg)*);
        }
    }};
}
pub(crate) use note;

/// Like [`note!`] without the newline (a prompt).
macro_rules! note_inline {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if !$crate::report::QUIET.load(std::sync::atomic::Ordering::Relaxed) {
            let mut err = std::io::stderr();
            let _ = write!(err, $($arg)*);
            let _ = err.flush();
        }
    }};
}
pub(crate) use note_inline;

/// The exit code for a failed run, after printing its error: one line, each cause once.
/// A closed stdout ends the run quietly.
pub fn failure(e: &anyhow::Error) -> ExitCode {
    if is_broken_pipe(e) {
        return ExitCode::from(BROKEN_PIPE_EXIT);
    }
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "error: {}", one_line(e));
    ExitCode::FAILURE
}

/// Prints a command-line parsing error as one line (help and version print as clap does).
pub fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind as K;
    if matches!(e.kind(), K::DisplayHelp | K::DisplayVersion) {
        return match e.print() {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(BROKEN_PIPE_EXIT),
        };
    }
    if e.kind() == K::DisplayHelpOnMissingArgumentOrSubcommand {
        let _ = e.print();
        return ExitCode::from(2);
    }
    let text = e.render().to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("error: invalid arguments");
    // "…were not provided:" names the arguments on the lines that follow.
    let first = match first.strip_suffix(':') {
        Some(head) => {
            let named: Vec<&str> = lines
                .clone()
                .take_while(|l| l.starts_with("--") || l.starts_with('<') || l.starts_with('-'))
                .collect();
            if named.is_empty() {
                first.to_string()
            } else {
                format!("{head}: {}", named.join(", "))
            }
        }
        None => first.to_string(),
    };
    // clap's tip (e.g. how to pass a value starting with '-') is worth keeping on the line.
    match lines.find_map(|l| l.strip_prefix("tip: ")) {
        Some(tip) => note!("{first} ({tip}; see --help)"),
        None => note!("{first} (see --help)"),
    }
    ExitCode::from(2)
}

/// The error and its causes joined by ": ", skipping a cause whose text the line already
/// holds (an error type that prints its source, wrapped by one that adds it again).
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.replace('\n', " ")
}

/// True when the error comes from writing to a pipe whose reader has gone.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    let broken = |io: &std::io::Error| io.kind() == ErrorKind::BrokenPipe;
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(broken)
            || matches!(
                c.downcast_ref::<hesper_runtime::RuntimeError>(),
                Some(hesper_runtime::RuntimeError::Output(io)) if broken(io)
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_said_once() {
        let os = std::io::Error::new(
            ErrorKind::NotFound,
            "No such file or directory (os error 2)",
        );
        let inner = anyhow::Error::new(os)
            .context("cannot read /x.gguf: No such file or directory (os error 2)");
        let e = inner.context("loading");
        assert_eq!(
            one_line(&e),
            "loading: cannot read /x.gguf: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn a_closed_pipe_is_recognised_through_context() {
        let e = anyhow::Error::new(std::io::Error::from(ErrorKind::BrokenPipe)).context("writing");
        assert!(is_broken_pipe(&e));
        let streamed = hesper_runtime::RuntimeError::Output(ErrorKind::BrokenPipe.into());
        assert!(is_broken_pipe(&anyhow::Error::new(streamed)));
        assert!(!is_broken_pipe(&anyhow::anyhow!("other")));
    }
}
