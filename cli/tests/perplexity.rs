//! `hesper-rs perplexity` as a user runs it: llama-perplexity's flags and figures on the
//! built-in trained model, and one clear line for each input it cannot use.

mod support;

use support::{assert_one_line_error, hesper, stderr, stdout};

fn models(name: &str) -> String {
    format!("{}/../models/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn scratch(name: &str) -> String {
    std::env::temp_dir()
        .join(format!("hesper-ppl-{}-{name}", std::process::id()))
        .display()
        .to_string()
}

/// The number after `label` on a line of `text`.
fn figure(text: &str, label: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} in {text}"));
    line[label.len()..]
        .trim_start_matches([' ', ':', '='])
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number in {line:?}"))
}

/// The trained model on text it never saw: a perplexity a random model (thousands, its
/// vocabulary being 4 096) could not reach, and llama-perplexity's output shape.
#[test]
fn perplexity_of_the_trained_model_on_held_out_text() {
    let valid = models("kjv-valid.txt");
    let o = hesper(&["perplexity", "-f", &valid, "--chunks", "3", "-b", "100"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.starts_with("[1]") && out.contains(",[3]") && !out.contains("[4]"),
        "{out}"
    );
    let ppl = figure(&out, "Final estimate: PPL");
    assert!((10.0..60.0).contains(&ppl), "PPL {ppl}");
    assert!(out.contains(" +/- "), "{out}");
    assert!(
        stderr(&o).contains("over 3 chunks, n_ctx=256"),
        "{}",
        stderr(&o)
    );
}

/// `--kl-divergence-base` saves, `--kl-divergence` compares: zero against itself, small and
/// positive for a re-quantized LM head.
#[test]
fn kl_divergence_against_a_saved_base() {
    let valid = models("kjv-valid.txt");
    let base = scratch("base.kld");
    let o = hesper(&[
        "perplexity",
        "-f",
        &valid,
        "--chunks",
        "2",
        "--kl-divergence-base",
        &base,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ppl = figure(&stdout(&o), "Final estimate: PPL");
    let kl = |extra: &[&str]| {
        let mut args = vec![
            "perplexity",
            "--kl-divergence",
            "--kl-divergence-base",
            &base,
        ];
        args.extend_from_slice(extra);
        let o = hesper(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let same = kl(&[]);
    assert_eq!(figure(&same, "Mean    KLD"), 0.0, "{same}");
    assert_eq!(figure(&same, "Same top p"), 100.0, "{same}");
    assert!(
        (figure(&same, "Mean PPL(base)") - ppl).abs() < 1e-3,
        "{same}"
    );
    let q8 = kl(&["--lm-head", "q8_0"]);
    let kld = figure(&q8, "Mean    KLD");
    assert!(kld > 0.0 && kld < 1e-3, "{q8}");
    assert!(figure(&q8, "Same top p") > 95.0, "{q8}");
    // A base whose values are not log-probabilities (the last scored token's second-to-last
    // value made NaN, then +5) is refused naming the token, never averaged into a NaN.
    let mut bytes = std::fs::read(&base).expect("base");
    let at = bytes.len() - 8;
    for value in [f32::NAN, 5.0] {
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        std::fs::write(&base, &bytes).expect("write");
        let args = [
            "perplexity",
            "--kl-divergence",
            "--kl-divergence-base",
            &base,
        ];
        let o = hesper(&args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{err}");
        assert!(err.contains("holds no log-probabilities"), "{err}");
        assert!(!stdout(&o).contains("NaN"), "{}", stdout(&o));
    }
    std::fs::remove_file(&base).ok();
}

#[test]
fn perplexity_inputs_it_cannot_use() {
    let short = scratch("short.txt");
    std::fs::write(
        &short,
        "In the beginning God created the heaven and the earth.",
    )
    .unwrap();
    let args = ["perplexity", "-f", short.as_str()];
    assert_one_line_error(&args, &hesper(&args), "needs at least 256");
    let args = ["perplexity", "-f", short.as_str(), "-c", "2"];
    assert_one_line_error(&args, &hesper(&args), "at least 4 tokens");
    let missing = scratch("missing.txt");
    let args = ["perplexity", "-f", missing.as_str()];
    assert_one_line_error(&args, &hesper(&args), "cannot read");
    let args = ["perplexity", "--kl-divergence"];
    assert_one_line_error(&args, &hesper(&args), "--kl-divergence-base");
    let args = ["perplexity", "-f", short.as_str(), "--chunks", "0"];
    assert_one_line_error(&args, &hesper(&args), "--chunks");

    // A base file that is not one, one cut short, one from another context or vocabulary.
    let gguf = models("hesper-kjv.gguf");
    let args = [
        "perplexity",
        "--kl-divergence",
        "--kl-divergence-base",
        gguf.as_str(),
    ];
    assert_one_line_error(&args, &hesper(&args), "not a hesper-rs KL base file");
    let base = scratch("cut.kld");
    let valid = models("kjv-valid.txt");
    let o = hesper(&[
        "perplexity",
        "-f",
        &valid,
        "--chunks",
        "1",
        "-c",
        "64",
        "--kl-divergence-base",
        &base,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let tiny = models("hesper-tiny.gguf");
    let args = [
        "perplexity",
        "--kl-divergence",
        "--kl-divergence-base",
        base.as_str(),
        "-m",
        tiny.as_str(),
    ];
    assert_one_line_error(
        &args,
        &hesper(&args),
        "vocabulary of 4096 tokens, this model 32000",
    );
    let args = [
        "perplexity",
        "--kl-divergence",
        "--kl-divergence-base",
        base.as_str(),
        "-c",
        "128",
    ];
    assert_one_line_error(&args, &hesper(&args), "was made with -c 64");
    let bytes = std::fs::read(&base).unwrap();
    std::fs::write(&base, &bytes[..bytes.len() - 4]).unwrap();
    let args = [
        "perplexity",
        "--kl-divergence",
        "--kl-divergence-base",
        base.as_str(),
    ];
    assert_one_line_error(&args, &hesper(&args), "truncated?");
    for f in [short, base] {
        std::fs::remove_file(f).ok();
    }
}
