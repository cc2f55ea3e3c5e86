//! Bad input through the binary, on both backends (the GPU on lavapipe in CI): every row of
//! issue 12's table, and every numeric flag at its extremes. Each run ends by itself (a hang
//! fails the test) with either one clear error line and a non-zero exit, or a correct result —
//! never a panic, an abort, or exit 0 with a wrong answer.

mod support;

use std::process::Stdio;

use hesper_engine::config::Config;
use hesper_engine::gguf::{Gguf, GgufBuilder, Value};
use support::{
    assert_no_crash, assert_one_line_error, command, golden, hesper, run, stderr, stdout,
};

const BACKENDS: [&str; 2] = ["cpu", "gpu"];

/// 2^58: `n_ctx * kv_dim` wrapped to a zero-length GPU cache (exit 0, wrong logits).
const HUGE_CTX: &str = "288230376151711744";

/// `args` on `backend`.
fn on<'a>(backend: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    v.extend(["--backend", backend]);
    v
}

/// A scratch path unique to this test process.
fn scratch(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("hesper-bad-input-{}-{name}", std::process::id()))
}

/// The demo model's greedy continuation of "hi" with `extra` flags: the reference a run with
/// odd but valid flags must reproduce.
fn greedy(backend: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["generate", "-p", "hi", "-n", "6"];
    if !extra.iter().any(|a| a.starts_with("--temp")) {
        args.extend(["--temp", "0"]);
    }
    args.extend_from_slice(extra);
    let o = hesper(&on(backend, &args));
    assert_no_crash(&args, &o);
    o
}

/// Files and ids the model cannot use: one clear line each.
#[test]
fn inputs_the_model_cannot_use_give_one_clear_line() {
    let not_gguf = scratch("not-gguf.bin");
    std::fs::write(&not_gguf, b"this is not a model").expect("write");
    let long_prompt = "word ".repeat(600);
    let no_tokenizer = golden("models/tiny-i2s.gguf");
    let llama_vocab = golden("tokenizer/ggml-vocab-llama-spm.gguf");
    let rows: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["generate", "-m", "/nonexistent/model.gguf"],
            "cannot read /nonexistent/model.gguf",
        ),
        (
            vec!["info", "-m", not_gguf.to_str().unwrap()],
            "not a GGUF file",
        ),
        (
            vec!["generate", "-p", &long_prompt],
            "longer than the context",
        ),
        (vec!["generate", "-m", &no_tokenizer], "has no tokenizer"),
        (
            vec!["logits", "--tokens", "1,99999999", "--out", "/dev/null"],
            "outside the vocabulary",
        ),
        (
            vec!["logits", "--tokens", "1,x", "--out", "/dev/null"],
            "is not a token id",
        ),
        (
            vec!["generate", "-m", &llama_vocab],
            "the file holds no tensors: a vocabulary or metadata file, not a model",
        ),
        (
            vec!["bench", "-m", &no_tokenizer, "-r", "0"],
            "nothing to measure",
        ),
    ];
    for backend in BACKENDS {
        for (args, needle) in &rows {
            let args = on(backend, args);
            assert_one_line_error(&args, &hesper(&args), needle);
        }
    }
    // Q6_K needs whole 256-value rows (the random demo model is 128 wide).
    let tiny = format!("{}/../models/hesper-tiny.gguf", env!("CARGO_MANIFEST_DIR"));
    let args = [
        "generate",
        "-m",
        &tiny,
        "--lm-head",
        "q6_k",
        "--backend",
        "cpu",
    ];
    assert_one_line_error(
        &args,
        &hesper(&args),
        "not whole 256-value blocks, which Q6_K needs",
    );
    std::fs::remove_file(&not_gguf).ok();
}

#[test]
fn sizes_that_cannot_be_held_are_refused_naming_the_flag_and_what_fits() {
    let out = scratch("huge-ctx.f32");
    let out = out.to_str().unwrap();
    for backend in BACKENDS {
        let rows: [(&[&str], &str); 4] = [
            (
                &[
                    "logits",
                    "-c",
                    HUGE_CTX,
                    "--tokens",
                    "1,15043,3186",
                    "-o",
                    out,
                ],
                "-c/--ctx-size 288230376151711744",
            ),
            (
                &["generate", "-c", HUGE_CTX, "-n", "2"],
                "-c/--ctx-size 288230376151711744",
            ),
            (
                &["generate", "-c", "10000000000", "-n", "2"],
                "the largest context that fits is",
            ),
            (
                &["bench", "-p", "9223372036854775808", "-n", "0", "-r", "1"],
                "the largest context that fits is",
            ),
        ];
        for (args, needle) in rows {
            let args = on(backend, args);
            assert_one_line_error(&args, &hesper(&args), needle);
        }
    }
    std::fs::remove_file(out).ok();
}

#[test]
fn batches_larger_than_the_context_are_clamped_and_change_nothing() {
    for backend in BACKENDS {
        let reference = greedy(backend, &[]);
        assert!(reference.status.success(), "{}", stderr(&reference));
        for b in ["9223372036854775808", "10000000", "100000"] {
            let o = greedy(backend, &["-b", b]);
            assert!(o.status.success(), "-b {b} on {backend}: {}", stderr(&o));
            assert_eq!(stdout(&o), stdout(&reference), "-b {b} on {backend}");
        }
    }
}

#[test]
fn a_closed_output_pipe_ends_the_run_quietly() {
    let rows: [&[&str]; 3] = [
        &["info"],
        &["bench", "--json", "-p", "8", "-n", "4", "-r", "1"],
        &["generate", "-n", "8"],
    ];
    for backend in BACKENDS {
        for args in rows {
            let args = on(backend, args);
            // The reader is gone before the first byte is written.
            let child = command(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn");
            let mut child = child;
            drop(child.stdout.take());
            let o = child.wait_with_output().expect("wait");
            assert_no_crash(&args, &o);
            assert!(
                matches!(o.status.code(), Some(0 | 141)),
                "{args:?}: {:?}",
                o.status
            );
            assert!(!stderr(&o).contains("error"), "{args:?}: {}", stderr(&o));
        }
    }
}

#[test]
fn files_that_are_not_models_get_one_line_each_cause_said_once() {
    let o = hesper(&["info", "-m", "/nonexistent.gguf"]);
    assert_one_line_error(&["info"], &o, "cannot read /nonexistent.gguf");
    assert_eq!(
        stderr(&o).matches("os error 2").count(),
        1,
        "{}",
        stderr(&o)
    );
    let dir = std::env::temp_dir();
    let dir = dir.to_str().unwrap();
    let rows = [
        (dir, "is a directory, not a GGUF file"),
        ("/dev/null", "is a device, not a GGUF file"),
    ];
    for backend in BACKENDS {
        for (path, needle) in rows {
            for cmd in ["info", "generate"] {
                let args = on(backend, &[cmd, "-m", path]);
                assert_one_line_error(&args, &hesper(&args), needle);
            }
        }
    }
}

#[test]
fn chat_survives_every_bad_turn() {
    let mut input = b"Hello there\n".to_vec();
    input.extend("word ".repeat(600).as_bytes());
    input.extend(b"\n\xff\xfe not UTF-8\nHow are you?\nAgain\nMore\n");
    for backend in BACKENDS {
        // A context of 80 fills within two answers of up to 50 tokens.
        let args = on(
            backend,
            &["generate", "--chat", "-c", "80", "-n", "50", "--seed", "3"],
        );
        let o = run(&args, Some(&input));
        let err = stderr(&o);
        assert_no_crash(&args, &o);
        assert!(o.status.success(), "{args:?}: {err}");
        for needle in [
            "too long for the context",
            "not valid UTF-8; not sent",
            "the conversation outgrew the context",
            "prompt eval time",
        ] {
            assert!(err.contains(needle), "{args:?}: no {needle:?} in {err}");
        }
        // A prompt for each of the six lines, and one that meets end of input.
        assert_eq!(err.matches("\n> ").count(), 7, "{err}");
    }
}

/// Templates come in downloaded files: one that loops for ever or grows a string without end
/// costs a message one line (the chat goes on), and one too deep to compile is refused in one
/// line before the model runs.
#[test]
fn hostile_chat_templates_cost_one_line() {
    let loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let grows = "{% set ns = namespace(s='xy') %}{% for i in range(40) %}\
                 {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}";
    for (name, source) in [("loop", loops), ("growth", grows)] {
        let path = scratch(&format!("{name}.jinja"));
        std::fs::write(&path, source).expect("write");
        let args = [
            "chat",
            "--chat-template-file",
            path.to_str().expect("utf-8"),
            "-n",
            "4",
        ];
        let o = run(&args, Some(b"hi\nthere\n"));
        let err = stderr(&o);
        assert_no_crash(&args, &o);
        assert!(o.status.success(), "{args:?}: {err}");
        assert_eq!(
            err.matches("ran out of its limit").count(),
            2,
            "{args:?}: {err}"
        );
        std::fs::remove_file(&path).expect("remove");
    }
    let path = scratch("deep.jinja");
    std::fs::write(&path, format!("{{{{ x{} }}}}", ".a".repeat(60_000))).expect("write");
    let args = [
        "chat",
        "--chat-template-file",
        path.to_str().expect("utf-8"),
    ];
    let o = run(&args, Some(b"hi\n"));
    assert_one_line_error(&args, &o, "has a tag of more than 1024 tokens (line 1)");
    std::fs::remove_file(&path).expect("remove");
}

#[test]
fn odd_but_valid_flags_give_the_same_answer() {
    for backend in BACKENDS {
        let reference = stdout(&greedy(backend, &[]));
        // `--no-repack` computes from the file's layout: the same integer sums.
        // A sparse window wider than the text is dense attention; a shift that never happens
        // changes nothing.
        let rows: [&[&str]; 6] = [
            &["--temp", "-1"],
            &["--temp=-1"],
            &["-t", "100000"],
            &["--no-repack"],
            &["--attn", "sparse"],
            &["--context-shift", "sinks"],
        ];
        for extra in rows {
            let o = greedy(backend, extra);
            assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
            assert_eq!(stdout(&o), reference, "{extra:?} on {backend}");
        }
    }
    let o = greedy("cpu", &["-t", "100000"]);
    assert!(
        stderr(&o).contains("threads per core; using"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn meaningless_values_are_refused() {
    let rows: [(&[&str], &str); 18] = [
        (&["generate", "--attn-window", "8"], "add --attn sparse"),
        (
            &["generate", "--attn", "sparse", "--attn-block", "0"],
            "--attn-block 0",
        ),
        (
            &["generate", "--keep", "2"],
            "--keep applies to --context-shift sinks",
        ),
        (
            &["generate", "--chat", "--context-shift", "sinks"],
            "--context-shift applies to a plain prompt",
        ),
        (
            &[
                "generate",
                "-c",
                "8",
                "--context-shift",
                "sinks",
                "--keep",
                "7",
            ],
            "keeping 7 positions leaves no room",
        ),
        (
            &[
                "generate",
                "--context-shift",
                "sinks",
                "--keep",
                "18446744073709551615",
            ],
            "keeping 18446744073709551615 positions leaves no room",
        ),
        (
            &["generate", "--repeat-penalty", "nan"],
            "--repeat-penalty NaN",
        ),
        (
            &["generate", "--repeat-penalty", "inf"],
            "--repeat-penalty inf",
        ),
        (&["generate", "--temp", "nan"], "--temp NaN"),
        (&["generate", "--top-p", "2"], "--top-p 2"),
        (&["generate", "-n", "-3"], "-n/--n-predict -3"),
        (&["generate", "-sys", "Be brief"], "applies to --chat"),
        (&["generate", "-s", "Be brief"], "--seed"),
        (
            &["generate", "-ctk", "f16", "-ctv", "f32"],
            "share one cache type",
        ),
        (
            &["logits", "--tokens", "1,,2", "-o", "/dev/null"],
            "item 2 is empty",
        ),
        (
            &["logits", "--tokens", "1,2,", "-o", "/dev/null"],
            "item 3 is empty",
        ),
        (
            &["generate", "--seed", "-2"],
            "invalid value '-2' for '--seed",
        ),
        (
            &["generate", "--cpu-kernels", "sse9"],
            "invalid value 'sse9' for '--cpu-kernels <NAME>': expected one of scalar",
        ),
    ];
    for backend in BACKENDS {
        for (args, needle) in rows {
            let args = on(backend, args);
            assert_one_line_error(&args, &hesper(&args), needle);
        }
    }
}

#[test]
fn logits_are_streamed_to_a_file_opened_first() {
    // An unwritable output fails at once, before the (missing) model is even looked at.
    let args = [
        "logits",
        "-m",
        "/nonexistent.gguf",
        "--tokens",
        "1",
        "-o",
        "/nonexistent-dir/x.f32",
    ];
    assert_one_line_error(
        &args,
        &hesper(&args),
        "cannot create /nonexistent-dir/x.f32",
    );
    // Many batches: every row is written, and equals the row computed on its own.
    let ids: Vec<String> = (0..300).map(|i| (1 + i * 7 % 500).to_string()).collect();
    let ids = ids.join(",");
    let (all, one) = (scratch("all.f32"), scratch("one.f32"));
    for backend in BACKENDS {
        let o = hesper(&on(
            backend,
            &[
                "logits",
                "--tokens",
                &ids,
                "-b",
                "64",
                "-o",
                all.to_str().unwrap(),
            ],
        ));
        assert!(o.status.success(), "{}", stderr(&o));
        let o = hesper(&on(
            backend,
            &["logits", "--tokens", "1", "-o", one.to_str().unwrap()],
        ));
        assert!(o.status.success(), "{}", stderr(&o));
        let all = std::fs::read(&all).expect("output");
        let one = std::fs::read(&one).expect("output");
        assert_eq!(all.len(), 300 * one.len(), "[n_tokens][n_vocab] float32");
        let max_diff = all
            .chunks_exact(4)
            .zip(one.chunks_exact(4))
            .map(|(a, b)| {
                let f = |x: &[u8]| f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
                (f(a) - f(b)).abs()
            })
            .fold(0.0f32, f32::max);
        // Same arithmetic for a row whether it is alone or in a batch (up to the GPU's
        // summation order across tiles).
        assert!(
            max_diff <= 1e-4,
            "{backend}: first row differs by {max_diff}"
        );
    }
    std::fs::remove_file(&all).ok();
    std::fs::remove_file(&one).ok();
}

#[test]
fn no_run_destroys_a_file_it_reads_or_one_it_fails_to_replace() {
    let model = format!("{}/../models/hesper-kjv.gguf", env!("CARGO_MANIFEST_DIR"));
    let text = format!("{}/../models/kjv-valid.txt", env!("CARGO_MANIFEST_DIR"));
    let copy = scratch("model.gguf");
    std::fs::copy(&model, &copy).expect("copy the model");
    let link = scratch("link.gguf");
    std::fs::remove_file(&link).ok();
    std::os::unix::fs::symlink(&copy, &link).expect("link");
    let (c, l) = (copy.to_str().unwrap(), link.to_str().unwrap());
    let model_bytes = std::fs::read(&copy).expect("model");
    let text_bytes = std::fs::read(&text).expect("text");
    // An output naming the model, directly or through a link, or the scored text: refused
    // before anything is written (the perplexity base file used to truncate the model it was
    // reading, which then died of SIGBUS).
    let logits = |out: &str| -> Vec<String> {
        ["logits", "-m", c, "--tokens", "1,2", "--out", out]
            .map(String::from)
            .to_vec()
    };
    let base = |out: &str| -> Vec<String> {
        let flags = ["-c", "64", "--chunks", "1", "--kl-divergence-base", out];
        let mut args = vec!["perplexity", "-m", c, "-f", &text];
        args.extend(flags);
        args.into_iter().map(String::from).collect()
    };
    for args in [logits(c), logits(l), base(c), base(l), base(&text)] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_one_line_error(&args, &hesper(&args), "refusing to write");
        assert!(
            std::fs::read(&copy).expect("model") == model_bytes,
            "{args:?}: model changed"
        );
        assert!(
            std::fs::read(&text).expect("text") == text_bytes,
            "{args:?}: text changed"
        );
    }
    // A run that fails (an id past the vocabulary) leaves an existing output as it was; one
    // that succeeds replaces it whole, and neither leaves a temporary file behind.
    let out = scratch("existing.f32");
    std::fs::write(&out, b"precious").expect("write");
    let o = out.to_str().unwrap();
    let args = ["logits", "-m", c, "--tokens", "1,2,999999", "--out", o];
    assert_one_line_error(&args, &hesper(&args), "999999");
    assert_eq!(std::fs::read(&out).expect("output"), b"precious");
    let args = ["logits", "-m", c, "--tokens", "1,2", "--out", o];
    let done = hesper(&args);
    assert!(done.status.success(), "{}", stderr(&done));
    let written = std::fs::read(&out).expect("output");
    assert!(
        written.len() > 8 && written.len().is_multiple_of(8),
        "{} bytes",
        written.len()
    );
    let temporary = format!(".{}.", out.file_name().unwrap().to_string_lossy());
    let leftovers: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .expect("temp dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&temporary))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    // A destination that is a device is written, not replaced.
    let args = ["logits", "-m", c, "--tokens", "1,2", "--out", "/dev/null"];
    let done = hesper(&args);
    assert!(done.status.success(), "{}", stderr(&done));
    let null = std::fs::metadata("/dev/null").expect("/dev/null");
    assert!(!null.is_file(), "/dev/null was replaced by a file");
    for p in [&copy, &link, &out] {
        std::fs::remove_file(p).ok();
    }
}

#[test]
fn tokenizer_warnings_are_shown() {
    // The SentencePiece vocabulary with a BOS id past its end.
    let bytes = std::fs::read(golden("tokenizer/ggml-vocab-llama-spm.gguf")).expect("vocab");
    let g = Gguf::parse(&bytes).expect("parse");
    let mut b = GgufBuilder::new();
    for (k, v) in g.metadata() {
        if k != "tokenizer.ggml.bos_token_id" {
            b = b.kv(k, v.clone());
        }
    }
    let b = b.kv("tokenizer.ggml.bos_token_id", Value::U32(99_999_999));
    let path = scratch("bad-bos.gguf");
    std::fs::write(&path, b.build()).expect("write");
    let o = hesper(&["info", "-m", path.to_str().unwrap(), "--backend", "cpu"]);
    std::fs::remove_file(&path).ok();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("1 metadata warning(s)")
            && text.contains("warning:")
            && text.contains("99999999"),
        "{text}"
    );
}

#[test]
fn the_first_run_is_quiet_and_the_small_flags_behave() {
    // `auto` on a machine without a GPU device does not ask the Vulkan loader, which would
    // print its own warnings: every stderr line is ours.
    let o = hesper(&[
        "generate",
        "-p",
        "Once upon a time",
        "-n",
        "4",
        "--seed",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    if !hesper_gpu_backend::hardware_gpu_possible() {
        for line in stderr(&o).lines() {
            assert!(
                line.is_empty() || line.starts_with("hesper"),
                "noise: {line:?}"
            );
        }
    }
    // `chat` is a command, and `-p` is its first message.
    let o = run(&["chat", "-p", "Hi", "-n", "4", "--seed", "1"], None);
    assert!(o.status.success() && !o.stdout.is_empty(), "{}", stderr(&o));
    // `-c 0` means the model's training context.
    let bytes = std::fs::read(format!(
        "{}/../models/hesper-kjv.gguf",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("built-in model");
    let g = Gguf::parse(&bytes).expect("parse");
    let n_ctx_train = Config::from_gguf(&g, None).expect("config").n_ctx_train;
    let o = hesper(&["generate", "-c", "0", "-n", "2", "--backend", "cpu"]);
    assert!(
        stderr(&o).contains(&format!("| ctx {n_ctx_train}\n")),
        "{}",
        stderr(&o)
    );
    // Parameters in millions for a small model, not "0.00 B".
    let o = hesper(&["bench", "-p", "4", "-n", "2", "-r", "1", "--backend", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(" M |"), "{}", stdout(&o));
}

/// Every numeric flag at its extremes: a clean error line or a run that produced text.
#[test]
fn every_numeric_flag_at_its_extremes() {
    const EXTREMES: [&str; 9] = [
        "0",
        "-1",
        "2147483648",
        "9223372036854775808",
        "18446744073709551616",
        "nan",
        "inf",
        "-inf",
        "",
    ];
    let cpu_flags = [
        "-c",
        "-b",
        "-n",
        "-t",
        "--top-k",
        "--top-p",
        "--min-p",
        "--temp",
        "--repeat-penalty",
        "--repeat-last-n",
        "--seed",
    ];
    // The GPU gets the flags that size its buffers.
    let gpu_flags = ["-c", "-b"];
    for (backend, flags) in [("cpu", &cpu_flags[..]), ("gpu", &gpu_flags[..])] {
        for flag in flags {
            for value in EXTREMES {
                let mut args = vec!["generate", "-p", "hi"];
                if *flag != "-n" {
                    args.extend(["-n", "2"]);
                }
                if *flag != "--seed" {
                    args.extend(["--seed", "1"]);
                }
                let with_value = format!("{flag}={value}");
                args.push(&with_value);
                let args = on(backend, &args);
                let o = hesper(&args);
                assert_no_crash(&args, &o);
                if o.status.success() {
                    assert!(stdout(&o).starts_with("hi"), "{args:?}: {}", stdout(&o));
                } else {
                    let err = stderr(&o);
                    assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
                    assert!(err.starts_with("error:"), "{args:?}: {err}");
                }
            }
        }
    }
}

/// A copy of the demo model whose embedding row of `token` (tied: its LM-head row too) holds
/// `bits` (an f16 NaN or infinity) in every column.
fn with_poisoned_row(name: &str, token: usize, bits: u16) -> std::path::PathBuf {
    let model = format!("{}/../models/hesper-kjv.gguf", env!("CARGO_MANIFEST_DIR"));
    let mut bytes = std::fs::read(&model).expect("model");
    let g = Gguf::parse(&bytes).expect("gguf");
    let t = g.tensor("token_embd.weight").expect("embedding");
    assert_eq!(t.ty.id(), 1, "the demo model's embedding is F16");
    let cols = t.ne[0] as usize;
    let start = t.start as usize + token * cols * 2;
    for c in 0..cols {
        bytes[start + 2 * c..start + 2 * c + 2].copy_from_slice(&bits.to_le_bytes());
    }
    let path = scratch(name);
    std::fs::write(&path, bytes).expect("write the copy");
    path
}

/// A run that failed with one error line containing `needle` after its banner or progress
/// lines (`hesper: …`, `perplexity: …`).
fn one_error_after_progress(args: &[&str], o: &std::process::Output, needle: &str) {
    assert_no_crash(args, o);
    let err = stderr(o);
    assert!(!o.status.success(), "{args:?} succeeded: {err}");
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| !l.starts_with("hesper: ") && !l.starts_with("perplexity: "))
        .collect();
    assert_eq!(errors.len(), 1, "{args:?}: {err}");
    assert!(errors[0].contains(needle), "{args:?}: {err}");
}

#[test]
fn non_finite_logits_are_refused_never_sampled() {
    // Token 1000's logit is NaN (or ±inf) at every position: every way of choosing a token —
    // greedy (the argmax), default sampling (top-k on the backend), sampling from the whole
    // row — must stop with the position and the token instead of picking one; `logits` and
    // `perplexity` too, writing nothing.
    for (name, bits) in [("nan.gguf", 0x7e00u16), ("inf.gguf", 0x7c00)] {
        let file = with_poisoned_row(name, 1000, bits);
        let m = file.to_str().unwrap();
        let out = scratch("nan-logits.f32");
        std::fs::remove_file(&out).ok();
        for backend in BACKENDS {
            let generate = ["generate", "-m", m, "-p", "And it came to pass", "-n", "8"];
            for sampling in [
                &["--temp", "0"][..],
                &["--seed", "1"][..],
                &["--seed", "1", "--top-k", "0"][..],
            ] {
                let mut args = on(backend, &generate);
                args.extend_from_slice(sampling);
                let o = hesper(&args);
                one_error_after_progress(&args, &o, "are not finite (NaN for token 1000)");
                // The prompt is echoed; no token follows it.
                assert_eq!(stdout(&o).trim_end(), "And it came to pass", "{args:?}");
            }
            let o_str = out.to_str().unwrap();
            let args = on(
                backend,
                &["logits", "-m", m, "--tokens", "1,2,3", "--out", o_str],
            );
            assert_one_line_error(&args, &hesper(&args), "logits at position 0 are not finite");
            assert!(!out.exists(), "{args:?} wrote {o_str}");
        }
        let text = format!("{}/../models/kjv-valid.txt", env!("CARGO_MANIFEST_DIR"));
        let args = [
            "perplexity",
            "-m",
            m,
            "-f",
            &text,
            "-c",
            "64",
            "--chunks",
            "1",
        ];
        one_error_after_progress(&args, &hesper(&args), "logits at position 0 are not finite");
        std::fs::remove_file(&file).ok();
    }
}

#[test]
fn a_layer_count_the_tensors_disagree_with_is_named_by_info_and_refused_by_a_run() {
    // The demo model with block_count one short: its last layer would be silently left out.
    let model = format!("{}/../models/hesper-kjv.gguf", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&model).expect("model");
    let g = Gguf::parse(&bytes).expect("gguf");
    let mut b = GgufBuilder::new();
    for (k, v) in g.metadata() {
        b = match (k.as_str(), v) {
            (k, Value::U32(n)) if k.ends_with(".block_count") => b.kv(k, Value::U32(n - 1)),
            _ => b.kv(k, v.clone()),
        };
    }
    for t in g.tensors() {
        let data = g.tensor_bytes(&bytes, t).expect("tensor").to_vec();
        b = b.tensor(&t.name, t.dims(), t.ty.id(), data);
    }
    let path = scratch("short-count.gguf");
    std::fs::write(&path, b.build()).expect("write");
    let p = path.to_str().unwrap();
    let needle = "belongs to a layer past the file's block_count (3)";
    let o = hesper(&["info", "-m", p]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(needle), "{}", stdout(&o));
    for backend in BACKENDS {
        let args = on(backend, &["generate", "-m", p, "-p", "hi", "-n", "4"]);
        assert_one_line_error(&args, &hesper(&args), needle);
    }
    std::fs::remove_file(&path).ok();
}
