//! `hesper-rs quantize` against llama.cpp's quantizer: the golden files `families.py models`
//! made with `llama_model_quantize` (what llama-quantize runs, no importance matrix) — Q6_K,
//! BF16, and the Q4_K_M and Q5_K_M mixes — are reproduced byte for byte; Q8_0 blocks equal gguf-py's reference quantizer's; overrides and
//! fallbacks choose as llama-quantize does; bad arguments are one line.

mod support;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hesper_engine::gguf::{GgmlType, Gguf};
use support::{assert_one_line_error, command, golden, hesper, stderr};

fn out(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("hesper-quantize-{}-{name}", std::process::id()))
}

fn quantize(input: &str, output: &PathBuf, args: &[&str]) -> Vec<u8> {
    let mut all = vec!["quantize", input, output.to_str().unwrap()];
    all.extend(args);
    let o = hesper(&all);
    assert!(o.status.success(), "{all:?}: {}", stderr(&o));
    let bytes = std::fs::read(output).expect("the output");
    std::fs::remove_file(output).unwrap();
    bytes
}

#[test]
fn llama_cpp_quantizer_files_are_reproduced_byte_for_byte() {
    let f16 = golden("models/tiny-llama-f16.gguf");
    let f32_mistral = golden("models/tiny-mistral-f32.gguf");
    for (input, ty, reference) in [
        (&f16, "q6_k", "tiny-llama-q6_k.gguf"),
        (&f16, "BF16", "tiny-llama-bf16.gguf"),
        (&f16, "Q4_K_M", "tiny-llama-q4_k_m.gguf"),
        (&f16, "q5_k_m", "tiny-llama-q5_k_m.gguf"),
        (&f32_mistral, "Q4_K", "tiny-mistral-q4_k_m.gguf"),
    ] {
        let ours = quantize(input, &out(ty), &[ty]);
        let theirs = std::fs::read(golden(&format!("models/{reference}"))).unwrap();
        assert!(ours == theirs, "{ty}: not llama.cpp's {reference}");
    }
}

#[test]
fn q8_0_blocks_are_the_reference_quantizer_s() {
    // tiny-llama-q8_0 holds the same values as tiny-llama-f16, quantized by gguf-py's
    // reference Q8_0 (ggml's quantize_row_q8_0_ref); its head is untied, so compare the layers.
    let ours = quantize(
        &golden("models/tiny-llama-f16.gguf"),
        &out("q8_0"),
        &["q8_0"],
    );
    let reference = std::fs::read(golden("models/tiny-llama-q8_0.gguf")).unwrap();
    let (a, b) = (
        Gguf::parse(&ours).unwrap(),
        Gguf::parse(&reference).unwrap(),
    );
    let mut compared = 0;
    for t in a.tensors().iter().filter(|t| t.name.starts_with("blk.")) {
        let r = b.tensor(&t.name).expect("the same tensor");
        assert_eq!(t.ty, r.ty, "{}", t.name);
        let (x, y) = (
            a.tensor_bytes(&ours, t).unwrap(),
            b.tensor_bytes(&reference, r).unwrap(),
        );
        assert!(x == y, "{}: other bytes", t.name);
        compared += usize::from(t.ty == GgmlType::Q8_0);
    }
    assert_eq!(compared, 14, "every layer matrix");
}

#[test]
fn overrides_and_fallbacks_choose_as_llama_quantize_does() {
    let f16 = golden("models/tiny-llama-f16.gguf");
    let bytes = quantize(
        &f16,
        &out("mix"),
        &[
            "q6_k",
            "--tensor-type",
            "attn_v=q8_0",
            "--tensor-type",
            "blk.1.*=f16",
        ],
    );
    let g = Gguf::parse(&bytes).unwrap();
    let ty = |name: &str| g.tensor(name).unwrap().ty;
    assert_eq!(ty("blk.0.attn_v.weight"), GgmlType::Q8_0);
    assert_eq!(ty("blk.0.attn_q.weight"), GgmlType::Q6K);
    assert_eq!(
        ty("blk.1.attn_v.weight"),
        GgmlType::F16,
        "the last match wins"
    );
    assert_eq!(ty("blk.1.attn_norm.weight"), GgmlType::F32, "vectors stay");
    assert_eq!(ty("token_embd.weight"), GgmlType::Q6K);
    // The Mistral-shaped F32 file in Q8_0 runs, and its logits stay those of the F32 model to
    // Q8_0's precision: measured, every position's cosine is 0.99945 or more on this model,
    // while the coarser Q6_K gives 0.9970 — so the bound 0.999 tells Q8_0's error from one
    // larger than it (a wrong scale or code order gives far less).
    let mistral = golden("models/tiny-mistral-f32.gguf");
    let q = out("mistral.gguf");
    let o = hesper(&["quantize", &mistral, q.to_str().unwrap(), "q8_0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let logits = |m: &str| {
        let f = out(&format!("logits-{}", m.len()));
        let o = hesper(&[
            "logits",
            "-m",
            m,
            "-p",
            "Hello world, this is",
            "-o",
            f.to_str().unwrap(),
            "--backend",
            "cpu",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let bytes = std::fs::read(&f).unwrap();
        std::fs::remove_file(&f).unwrap();
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect::<Vec<f32>>()
    };
    let (a, b) = (logits(&mistral), logits(q.to_str().unwrap()));
    assert_eq!(a.len(), b.len());
    let n_vocab = 512;
    for (x, y) in a.chunks(n_vocab).zip(b.chunks(n_vocab)) {
        let dot: f64 = x
            .iter()
            .zip(y)
            .map(|(p, q)| f64::from(*p) * f64::from(*q))
            .sum();
        let norm = |v: &[f32]| v.iter().map(|p| f64::from(*p).powi(2)).sum::<f64>().sqrt();
        let cos = dot / (norm(x) * norm(y));
        assert!(cos > 0.999, "cosine {cos}");
    }
    std::fs::remove_file(&q).unwrap();
}

#[test]
fn bad_arguments_are_one_line() {
    let f16 = golden("models/tiny-llama-f16.gguf");
    let o = out("bad.gguf");
    let o = o.to_str().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (
            &["quantize", &f16, o, "q3_k"],
            "expected one of Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q5_K, Q4_K, TQ2_0, TQ1_0, I2_S, F16, BF16, F32",
        ),
        (&["quantize", &f16, &f16, "q8_0"], "the output is the input"),
        (
            &["quantize", "/nonexistent.gguf", o, "q8_0"],
            "/nonexistent.gguf",
        ),
        (
            &["quantize", &f16, o, "q8_0", "--tensor-type", "attn_v"],
            "expected PATTERN=TYPE",
        ),
    ];
    for (args, needle) in cases {
        assert_one_line_error(args, &hesper(args), needle);
    }
    assert!(!std::path::Path::new(o).exists());

    // An output that is a directory: one line, and no part file left beside it.
    let dir = out("a-directory");
    std::fs::create_dir_all(&dir).unwrap();
    let args = ["quantize", &f16, dir.to_str().unwrap(), "q8_0"];
    assert_one_line_error(&args, &hesper(&args), "is a directory");
    let parent = dir.parent().unwrap();
    let stem = dir.file_name().unwrap().to_string_lossy().into_owned();
    let left: Vec<_> = std::fs::read_dir(parent)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&stem) && n != &stem)
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(left.is_empty(), "left beside the directory: {left:?}");
}

#[test]
fn a_tensor_type_pattern_that_matches_nothing_is_reported() {
    let f16 = golden("models/tiny-llama-f16.gguf");
    let o = out("unmatched.gguf");
    let args = [
        "quantize",
        &f16,
        o.to_str().unwrap(),
        "q8_0",
        "--tensor-type",
        "blk.99.ffn_up=f16",
    ];
    let run = hesper(&args);
    assert!(run.status.success(), "{}", stderr(&run));
    std::fs::remove_file(&o).unwrap();
    assert!(
        stderr(&run).contains("--tensor-type \"blk.99.ffn_up\" matches no tensor"),
        "{}",
        stderr(&run)
    );
}

/// The tensors of `bytes` whose type is `ty`, with their data.
fn tensors_of(bytes: &[u8], ty: GgmlType) -> Vec<(String, Vec<u8>)> {
    let g = Gguf::parse(bytes).unwrap();
    g.tensors()
        .iter()
        .filter(|t| t.ty == ty)
        .map(|t| (t.name.clone(), g.tensor_bytes(bytes, t).unwrap().to_vec()))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into_iter()
        .collect()
}

/// TQ1_0 and TQ2_0 of F16 weights are gguf-py's reference quantizer's bytes (ggml's
/// `quantize_row_tq*_ref`: `golden-values/ternary_reference.py`), tensor by tensor; the
/// embedding and the head stay as they are.
#[test]
fn ternary_encodings_are_the_reference_quantizer_s() {
    use sha2::{Digest, Sha256};
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(golden("out/tiny-llama-f16-ternary.json")).unwrap(),
    )
    .unwrap();
    for (name, ty) in [("TQ1_0", GgmlType::TQ1_0), ("TQ2_0", GgmlType::TQ2_0)] {
        let ours = quantize(&golden("models/tiny-llama-f16.gguf"), &out(name), &[name]);
        let converted = tensors_of(&ours, ty);
        assert_eq!(
            converted.len(),
            14,
            "{name}: every layer matrix, nothing else"
        );
        for (tensor, data) in converted {
            let hash: String = Sha256::digest(&data)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(
                reference[name][&tensor].as_str(),
                Some(hash.as_str()),
                "{name} {tensor}"
            );
        }
        let g = Gguf::parse(&ours).unwrap();
        assert_eq!(g.tensor("token_embd.weight").unwrap().ty, GgmlType::F16);
    }
}

/// The ternary types convert among themselves without loss: TQ1_0 → TQ2_0 → TQ1_0 and
/// TQ2_0 → I2_S → TQ2_0 give back the same bytes, and a TQ2_0 model and its TQ1_0 copy
/// compute the same logits bit for bit. I2_S (one scale per tensor) refuses values that
/// are not ternary with one scale, with one error line, writing nothing.
#[test]
fn ternary_types_convert_among_themselves_without_loss() {
    for (start, via, back) in [
        ("tiny-tq1_0.gguf", "TQ2_0", GgmlType::TQ1_0),
        ("tiny-tq2_0.gguf", "I2_S", GgmlType::TQ2_0),
    ] {
        let original = std::fs::read(golden(&format!("models/{start}"))).unwrap();
        let mid = out(&format!("{start}.{via}"));
        let mid_bytes = quantize(&golden(&format!("models/{start}")), &mid, &[via]);
        std::fs::write(&mid, &mid_bytes).unwrap();
        let round = quantize(mid.to_str().unwrap(), &out("back"), &[&back.to_string()]);
        std::fs::remove_file(&mid).unwrap();
        let (a, b) = (tensors_of(&original, back), tensors_of(&round, back));
        assert_eq!(a.len(), 14, "{start}");
        assert!(a == b, "{start} -> {via} -> {back}: other bytes");
    }
    let tq2 = golden("models/tiny-tq2_0.gguf");
    let tq1 = out("tq1_0");
    std::fs::write(&tq1, quantize(&tq2, &out("tq1"), &["TQ1_0"])).unwrap();
    let logits = |m: &str| {
        let o = hesper(&["logits", "-m", m, "--tokens", "1,5,9,200,7", "-o", "-"]);
        assert!(o.status.success(), "{}", stderr(&o));
        o.stdout
    };
    assert!(logits(&tq2) == logits(tq1.to_str().unwrap()), "TQ1_0 copy");
    std::fs::remove_file(&tq1).unwrap();
    let i2s = out("i2s");
    let args = [
        "quantize",
        &golden("models/tiny-llama-f16.gguf"),
        i2s.to_str().unwrap(),
        "I2_S",
    ];
    let o = hesper(&args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains("I2_S holds ternary values with one scale"),
        "{err}"
    );
    assert!(!i2s.exists(), "nothing written");
}

/// Interrupted while writing (SIGINT, SIGTERM), `quantize` leaves no part file. Its stderr is
/// a pipe filled to the brim beforehand, so it stops at its first progress line, with the part
/// file open, until the signal comes.
#[test]
fn an_interrupted_quantize_leaves_no_part_file() {
    let f16 = golden("models/tiny-llama-f16.gguf");
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let dir = out(&format!("interrupted-{signal}"));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("out.gguf");
        let (reader, mut writer) = std::io::pipe().unwrap();
        // SAFETY: F_GETPIPE_SZ reads the capacity of a pipe this test holds open.
        let capacity = unsafe { libc::fcntl(writer.as_raw_fd(), libc::F_GETPIPE_SZ) };
        writer.write_all(&vec![b'.'; capacity as usize]).unwrap();
        let mut child = command(&["quantize", &f16, target.to_str().unwrap(), "q8_0"])
            .stdout(Stdio::null())
            .stderr(writer)
            .spawn()
            .unwrap();
        let files = || -> Vec<String> {
            std::fs::read_dir(&dir)
                .unwrap()
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !files().iter().any(|n| n.contains(".part-")) {
            assert!(Instant::now() < deadline, "no part file appeared");
            std::thread::sleep(Duration::from_millis(5));
        }
        let pid = i32::try_from(child.id()).unwrap();
        // SAFETY: kill(2) to the child this test started and has not yet waited for.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let status = child.wait().unwrap();
        drop(reader);
        let left = files();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(status.code(), Some(130), "signal {signal}: {status:?}");
        assert!(left.is_empty(), "signal {signal}: left {left:?}");
    }
}
