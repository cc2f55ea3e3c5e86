//! `--hot-swap` as a user runs it: ik_llama.cpp's perplexity sweep (a script moves one tensor
//! to another type before each pass; every printed PPL equals a fresh run on that file), a chat
//! whose model file changes between turns (the answer after the change equals a fresh chat's on
//! the new file), and one clear line where the flag cannot apply.

mod support;

use std::path::{Path, PathBuf};

use support::{assert_one_line_error, hesper, run, stderr, stdout};

/// A scratch directory, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("hesper-hot-swap-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&d).expect("temp dir");
        Self(d)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn kjv() -> String {
    format!("{}/../models/hesper-kjv.gguf", env!("CARGO_MANIFEST_DIR"))
}

fn quantize(args: &[&str]) {
    let mut all = vec!["quantize"];
    all.extend(args);
    let o = hesper(&all);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// The built-in model in Q8_0 (`s0.gguf`), then one more tensor in another type per step:
/// `s1.gguf` with `blk.0.ffn_up.weight` in F16, `s2.gguf` also with `blk.1.ffn_down.weight` in
/// Q6_K.
fn sweep_files(d: &Dir) -> [String; 3] {
    let s = [d.path("s0.gguf"), d.path("s1.gguf"), d.path("s2.gguf")];
    quantize(&[&kjv(), &s[0], "Q8_0"]);
    let up = "blk.0.ffn_up.weight=F16";
    quantize(&[&s[0], &s[1], "Q8_0", "--tensor-type", up]);
    let down = "blk.1.ffn_down.weight=Q6_K";
    quantize(&[
        &s[1],
        &s[2],
        "Q8_0",
        "--tensor-type",
        up,
        "--tensor-type",
        down,
    ]);
    s
}

fn final_ppls(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("Final estimate: PPL = "))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_perplexity_sweep_prints_what_fresh_runs_print() {
    let d = Dir::new("ppl");
    let steps = sweep_files(&d);
    let live = d.path("live.gguf");
    std::fs::copy(&steps[0], &live).expect("copy");
    // Before each check the script puts the next file in place (as a sweep's script would
    // run `hesper-rs quantize`); when there is none it changes nothing and the loop ends.
    let count = d.path("count");
    let script = d.path("next.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nn=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}\n\
             next={dir}/s$n.gguf\n[ -f $next ] && cp $next {dir}/tmp.gguf && mv {dir}/tmp.gguf {live}\nexit 0\n",
            dir = d.0.display()
        ),
    )
    .expect("script");
    make_executable(Path::new(&script));
    let text = format!("{}/../models/kjv-valid.txt", env!("CARGO_MANIFEST_DIR"));
    let common = ["-f", &text, "-c", "128", "--chunks", "3"];
    let mut args = vec![
        "perplexity",
        "-m",
        &live,
        "--hot-swap",
        "--pre-reload-script",
        &script,
    ];
    args.extend(common);
    let o = hesper(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let swept = final_ppls(&stdout(&o));
    let fresh: Vec<String> = steps
        .iter()
        .flat_map(|file| {
            let mut args = vec!["perplexity", "-m", file];
            args.extend(common);
            final_ppls(&stdout(&hesper(&args)))
        })
        .collect();
    assert_eq!(swept.len(), 3, "{}", stdout(&o));
    assert_eq!(swept, fresh);
    assert_ne!(fresh[0], fresh[1], "each step changes the model");
    let err = stderr(&o);
    for line in [
        "hot-swap pass 2: 1 tensor(s) swapped in",
        "blk.0.ffn_up.weight (Q8_0 -> F16)",
        "hot-swap pass 3: 1 tensor(s) swapped in",
        "blk.1.ffn_down.weight (Q8_0 -> Q6_K)",
        "hot-swap: no tensor changed; done",
    ] {
        assert!(err.contains(line), "{line:?} in {err}");
    }
}

#[cfg(unix)]
fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A script that fails ends the loop with an error line after the first pass; a file cut
/// short ends it too, naming the refusal.
#[test]
fn a_failing_script_or_a_torn_file_ends_the_loop() {
    let d = Dir::new("ppl-bad");
    let live = d.path("live.gguf");
    quantize(&[&kjv(), &live, "Q8_0"]);
    let text = format!("{}/../models/kjv-valid.txt", env!("CARGO_MANIFEST_DIR"));
    for (script, body, needle) in [
        (
            "fail.sh",
            "exit 3".to_string(),
            "exit status: 3; the hot-swap loop ends",
        ),
        (
            "cut.sh",
            format!("truncate -s 1000 {live}"),
            "the loop ends with the weights loaded before",
        ),
    ] {
        let script = d.path(script);
        std::fs::write(&script, format!("#!/bin/sh\n{body}\n")).expect("script");
        make_executable(Path::new(&script));
        let args = [
            "perplexity",
            "-m",
            &live,
            "-f",
            &text,
            "-c",
            "128",
            "--chunks",
            "1",
            "--hot-swap",
            "--pre-reload-script",
            &script,
        ];
        ends_with_error(&hesper(&args), needle);
    }
}

/// A run that printed its first pass and failed with one error line containing `needle`.
fn ends_with_error(o: &std::process::Output, needle: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "{err}");
    assert_eq!(final_ppls(&stdout(o)).len(), 1, "the first pass printed");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains(needle), "{needle:?} in {err}");
}

/// `from` with layer 0's FFN up projection replaced by its gate projection's bytes (same
/// type and shape): a change that moves the model's answers.
fn edited_copy(from: &str, to: &str) {
    let mut bytes = std::fs::read(from).expect("model");
    let g = hesper_engine::gguf::Gguf::parse(&bytes).expect("parse");
    let (gate, up) = (
        g.tensor("blk.0.ffn_gate.weight").expect("gate"),
        g.tensor("blk.0.ffn_up.weight").expect("up"),
    );
    let len = gate.nbytes.expect("size") as usize;
    assert_eq!(up.nbytes, Some(len as u64));
    let (from_at, to_at) = (gate.start as usize, up.start as usize);
    bytes.copy_within(from_at..from_at + len, to_at);
    std::fs::write(to, bytes).expect("write");
}

/// The chat's file changes between two messages: the second answer is what a fresh load of
/// the new file continues the whole conversation's text with (the conversation is evaluated
/// again with the new weights, as if they had always been there), and not what the old
/// weights answer.
#[test]
fn a_chat_goes_on_with_the_new_weights_as_if_they_had_always_been_there() {
    let d = Dir::new("chat");
    let (old, new, live) = (d.path("old.gguf"), d.path("new.gguf"), d.path("live.gguf"));
    quantize(&[&kjv(), &old, "Q8_0"]);
    edited_copy(&old, &new);
    std::fs::copy(&old, &live).expect("copy");
    let flags = ["--temp", "0", "-n", "16", "--seed", "1"];
    let (m1, m2) = ("And God said", "Let there be light");
    // The test writes the first message, replaces the file once the first answer is out, then
    // writes the second.
    let mut child = support::command(&["chat", "-m", &live, "--hot-swap"])
        .args(flags)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    use std::io::{BufRead, Read, Write};
    writeln!(stdin, "{m1}").expect("write");
    let mut first = String::new();
    out.read_line(&mut first).expect("first answer");
    std::fs::copy(&new, d.path("tmp.gguf")).expect("copy");
    std::fs::rename(d.path("tmp.gguf"), &live).expect("rename");
    writeln!(stdin, "{m2}").expect("write");
    drop(stdin);
    let mut second = String::new();
    out.read_to_string(&mut second).expect("second answer");
    let o = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("hot-swap: blk.0.ffn_up.weight swapped in"),
        "{err}"
    );
    let first = first.trim_end_matches('\n');
    let second = second.trim_end_matches('\n');
    // A model without a chat template renders the conversation as plain text, each message
    // on a new line: what a fresh load of the new file continues it with.
    let text = format!("{m1}{first}\n{m2}");
    let mut args = vec!["generate", "-m", new.as_str(), "-p", &text];
    args.extend(flags);
    let fresh = stdout(&hesper(&args));
    let continued = fresh.strip_prefix(text.as_str()).expect("the prompt first");
    assert_eq!(
        second,
        continued.trim_end_matches('\n'),
        "the answer after the swap"
    );
    let mut args = vec!["generate", "-m", old.as_str(), "-p", &text];
    args.extend(flags);
    let stale = stdout(&hesper(&args));
    assert_ne!(stale, fresh, "the edit changes the answer");
    let mut args = vec!["chat", "-m", old.as_str()];
    args.extend(flags);
    let unswapped = stdout(&run(&args, Some(format!("{m1}\n").as_bytes())));
    assert_eq!(
        unswapped.trim_end_matches('\n'),
        first,
        "the answer before the swap"
    );
}

#[test]
fn hot_swap_where_it_cannot_apply_is_one_line() {
    for (args, needle) in [
        (
            &["generate", "--hot-swap", "-m", "x.gguf"][..],
            "--hot-swap applies to --chat",
        ),
        (
            &["chat", "--hot-swap"][..],
            "--hot-swap watches a model file",
        ),
        (
            &["perplexity", "-f", "x", "--pre-reload-script", "s"][..],
            "--hot-swap",
        ),
    ] {
        assert_one_line_error(args, &hesper(args), needle);
    }
}
