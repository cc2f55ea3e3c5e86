//! The `hesper-rs` binary as a user runs it.

mod support;

use support::{golden, hesper, stderr, stdout};

#[test]
fn generate_runs_the_builtin_model_and_the_seed_fixes_the_text() {
    let run = |seed: &str| {
        hesper(&[
            "generate",
            "-p",
            "Once upon a time",
            "-n",
            "12",
            "--seed",
            seed,
        ])
    };
    let (a, b, c) = (run("7"), run("7"), run("8"));
    assert!(a.status.success(), "{}", stderr(&a));
    let text = String::from_utf8_lossy(&a.stdout);
    assert!(text.starts_with("Once upon a time"), "{text}");
    assert!(
        text.len() > "Once upon a time".len() + 5,
        "nothing generated: {text}"
    );
    assert_eq!(a.stdout, b.stdout, "same seed, different text");
    assert_ne!(a.stdout, c.stdout, "different seeds, same text");
    let err = stderr(&a);
    assert!(
        err.contains("prompt eval time") && err.contains("tokens per second"),
        "{err}"
    );
}

#[test]
fn greedy_generation_is_deterministic_without_a_seed() {
    let run = || hesper(&["generate", "-p", "Hello", "-n", "8", "--temp", "0"]);
    assert_eq!(run().stdout, run().stdout);
}

/// `-c 24` with a prompt and 40 greedy tokens: without a shift the run stops at the full
/// context, with `--context-shift sinks` it goes on and says so; sparse attention over an f16
/// cache runs too, and `info` names the mode.
#[test]
fn generation_goes_past_a_shifting_context_and_the_attention_flags_apply() {
    let args = [
        "generate",
        "-p",
        "And it came to pass",
        "-n",
        "40",
        "--temp",
        "0",
        "-c",
        "24",
    ];
    let plain = hesper(&args);
    assert!(plain.status.success(), "{}", stderr(&plain));
    assert!(
        stderr(&plain).contains("context full (24 tokens)"),
        "{}",
        stderr(&plain)
    );
    let mut with_shift = args.to_vec();
    with_shift.extend(["--context-shift", "sinks"]);
    let shifted = hesper(&with_shift);
    let err = stderr(&shifted);
    assert!(shifted.status.success(), "{err}");
    assert!(
        err.contains("the context shifted") && !err.contains("context full"),
        "{err}"
    );
    assert!(shifted.stdout.len() > plain.stdout.len(), "{err}");
    // -n -2 (llama.cpp's "until the context is full") stops at the full context even where it
    // would shift: the same text as the run that does not shift.
    let mut until_full = with_shift.clone();
    until_full[4] = "-2";
    let full = hesper(&until_full);
    assert!(full.status.success(), "{}", stderr(&full));
    assert!(
        stderr(&full).contains("context full (24 tokens)"),
        "{}",
        stderr(&full)
    );
    assert_eq!(full.stdout, plain.stdout);
    let sparse = hesper(&[
        "generate",
        "-p",
        "And it came to pass",
        "-n",
        "24",
        "--temp",
        "0",
        "--attn",
        "sparse",
        "--attn-window",
        "8",
        "--kv-type",
        "f16",
    ]);
    assert!(sparse.status.success(), "{}", stderr(&sparse));
    let info = hesper(&["info", "--attn", "sparse", "--kv-type", "f16"]);
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(
        text.contains(
            "attention: sparse (window 128, globals [0], block 64, log-stride, landmarks), f16 KV"
        ),
        "{text}"
    );
}

#[test]
fn logits_writes_every_position() {
    let out = std::env::temp_dir().join(format!("hesper-logits-{}.f32", std::process::id()));
    let o = hesper(&[
        "logits",
        "-m",
        &golden("models/tiny-f32.gguf"),
        "--tokens",
        "1,483,320",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&out).expect("output file");
    std::fs::remove_file(&out).ok();
    assert_eq!(bytes.len(), 3 * 512 * 4, "[n_tokens][n_vocab] float32");
    // The first position's logits equal llama.cpp's for the same ids (s0 starts 1, 483, 320).
    let reference = std::fs::read(golden("out/tiny-f32.s0.logits.f32")).expect("golden");
    let ours: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let theirs: Vec<f32> = reference
        .chunks_exact(4)
        .take(3 * 512)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let diff = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(diff <= 1e-3, "max |Δlogit| {diff}");
}

#[test]
fn info_names_what_each_family_computes() {
    for (model, needles) in [
        (
            "models/tiny-llama-f16.gguf",
            &[
                "llama, 2 layers",
                "SiLU FFN, RMSNorm",
                "adjacent-pair RoPE",
                "rope_freqs",
            ][..],
        ),
        (
            "models/tiny-qwen2-f16.gguf",
            &["qwen2, 2 layers", "NeoX RoPE", "Q/K/V biases"][..],
        ),
        (
            "models/tiny-falcon3-i2s.gguf",
            &["heads 2/1 (head dim 256)"][..],
        ),
        (
            "models/tiny-mistral-f32.gguf",
            &[
                "heads 4/1",
                "RoPE base 1000000",
                "llama SentencePiece (space prefix on), 512 tokens, BOS 1 added",
            ][..],
        ),
        (
            "models/tiny-gemma3-f16.gguf",
            &[
                "GELU (tanh) FFN",
                "post-attention and post-FFN norms, embeddings times √n_embd",
                "a sliding window of 5 on 5 of 6 layers (RoPE base 10000 there)",
            ][..],
        ),
        (
            "models/tiny-qwen3moe-f16.gguf",
            &["8 experts of n_ff 256 (2 used a token, softmax routing renormalized: 1.71M of 4.07M parameters active)"][..],
        ),
        (
            "models/tiny-gpt-oss-f16.gguf",
            &[
                "SwiGLU (clamped) FFN",
                "biases on the attention's output, the router and every expert, attention sinks",
                "8 experts of n_ff 256 (4 used a token",
                "a sliding window of 5 on 1 of 2 layers",
            ][..],
        ),
    ] {
        let o = hesper(&["info", "-m", &golden(model)]);
        assert!(o.status.success(), "{}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout);
        for needle in needles {
            assert!(
                text.contains(needle),
                "{model}: info lacks {needle:?}:\n{text}"
            );
        }
    }
}

#[test]
fn info_describes_model_and_tokenizer() {
    let o = hesper(&["info", "--gguf", &golden("models/tiny-i2s.gguf")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "bitnet-b1.58",
        "I2_S",
        "ReLU² FFN, BitNet sub-norms",
        "blk.0.attn_q.weight",
        "tokenizer: none",
    ] {
        assert!(text.contains(needle), "info lacks {needle:?}:\n{text}");
    }
    let o = hesper(&["info"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("SentencePiece") || text.contains("llama"),
        "{text}"
    );
    // The CPU kernels it would run, and the layout they read.
    let o = hesper(&["info", "--backend", "cpu", "--cpu-kernels", "scalar"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("backend:   cpu: scalar kernels, weights as in the file"),
        "{text}"
    );
    // An F32 file is read as it is.
    let model = golden("models/tiny-f32.gguf");
    let o = hesper(&["info", "-m", &model, "--backend", "cpu"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(" kernels, weights as in the file"), "{text}");
    // AVX2's kernels read F16, Q4_0 and K-quant matrices from a copy interleaved sixteen rows
    // deep, and TQ1_0 ones rewritten as TQ2_0 (the TQ1_0 file's tied F16 embedding, its LM
    // head, is repacked); --no-repack keeps every layout.
    #[cfg(target_arch = "x86_64")]
    for (model, flags, layout) in [
        ("f16", &[][..], "F16 repacked sixteen rows deep at load"),
        ("f16", &["--no-repack"][..], "weights as in the file"),
        (
            "q4_k_m",
            &[][..],
            "Q4_K, Q6_K repacked sixteen rows deep at load",
        ),
        ("q4_k_m", &["--no-repack"][..], "weights as in the file"),
        (
            "tq1_0",
            &[][..],
            "F16 repacked sixteen rows deep at load, TQ1_0 rewritten as TQ2_0 at load",
        ),
        ("tq1_0", &["--no-repack"][..], "weights as in the file"),
    ] {
        let model = golden(&format!("models/tiny-llama-{model}.gguf"));
        let args = [
            &[
                "info",
                "-m",
                &model,
                "--backend",
                "cpu",
                "--cpu-kernels",
                "avx2",
            ][..],
            flags,
        ];
        let o = hesper(&args.concat());
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains(&format!("cpu: avx2 kernels, {layout}")),
            "{args:?}: {text}"
        );
    }
}

/// `--chat` reads turns from stdin, answers each, keeps the conversation in one context and
/// ends cleanly at end of input.
#[test]
fn chat_answers_each_turn_until_eof() {
    let o = support::run(
        &["generate", "--chat", "-n", "6", "--seed", "3"],
        Some(b"Hello there\n\nHow are you?\n"),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    // A prompt for each of the three input lines (the empty one is skipped without an
    // answer), and a last one that meets end of input.
    assert_eq!(err.matches("\n> ").count(), 4, "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.lines().count(), 2, "one answer line per turn: {out:?}");
    assert!(err.contains("prompt eval time"), "{err}");
}

/// A model that names no chat format (the built-in one) is not forced into one: `chat` says so,
/// each reply goes on from the message as `generate` would (in whole words, not the middle of
/// a word after a `User: …Assistant: ` frame it never saw), and without -n a reply ends within
/// a quarter of the context.
#[test]
fn the_built_in_model_chats_in_plain_text() {
    let message = "Who is the LORD?";
    let chat = support::run(
        &["chat", "--temp", "0"],
        Some(format!("{message}\n").as_bytes()),
    );
    let err = stderr(&chat);
    assert!(chat.status.success(), "{err}");
    assert!(err.contains("names no chat format"), "{err}");
    assert!(!err.contains("outgrew"), "{err}");
    // The built-in model's context is 256 tokens: a reply of 64 at most.
    let gen = hesper(&["generate", "--temp", "0", "-n", "64", "-p", message]);
    let continued = String::from_utf8_lossy(&gen.stdout);
    let reply = String::from_utf8_lossy(&chat.stdout);
    assert_eq!(reply.as_ref(), continued.strip_prefix(message).unwrap());
    let first = reply.chars().next().expect("a reply");
    assert!(
        !first.is_alphanumeric(),
        "the reply glues onto the message: {reply:?}"
    );
}

/// `--chat-template-file` replaces the file's template: `chat` names it, a message the template
/// refuses is not sent and the chat goes on, a template that does not parse is one line.
#[test]
fn chat_template_file_frames_the_turns() {
    let dir = std::env::temp_dir().join(format!("hesper-chat-template-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let good = dir.join("good.jinja");
    std::fs::write(
        &good,
        "{% for m in messages %}{% if 'forbidden' in m.content %}\
         {{ raise_exception('no forbidden words') }}{% endif %}\
         {{ m.role | capitalize }}: {{ m.content }}<|eot_id|>{% endfor %}\
         {% if add_generation_prompt %}Assistant: {% endif %}",
    )
    .expect("write");
    let bad = dir.join("bad.jinja");
    std::fs::write(&bad, "{% for m in messages %}").expect("write");
    let args = [
        "generate",
        "--chat",
        "-n",
        "4",
        "--seed",
        "3",
        "--chat-template-file",
        good.to_str().expect("UTF-8 path"),
    ];
    let o = support::run(
        &args,
        Some(b"Hello there\na forbidden word\nHow are you?\n"),
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!("chat template: {}", good.display())),
        "{err}"
    );
    assert!(
        err.contains("refused this conversation: no forbidden words (line 1); not sent"),
        "{err}"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.lines().count(), 2, "two answered turns: {out:?}");
    let args = [
        "generate",
        "--chat",
        "--chat-template-file",
        bad.to_str().expect("UTF-8"),
    ];
    support::assert_one_line_error(&args, &hesper(&args), "cannot be read: ");
    let args = [
        "generate",
        "--chat-template-file",
        bad.to_str().expect("UTF-8"),
    ];
    support::assert_one_line_error(&args, &hesper(&args), "applies to --chat");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--tokenizer-pre` switches the split; `info` says which one is in use.
#[test]
fn tokenizer_pre_override_is_reported() {
    let vocab = golden("tokenizer/ggml-vocab-llama-bpe.gguf");
    let info = |extra: &[&str]| {
        let mut args = vec!["info", "-m", vocab.as_str()];
        args.extend_from_slice(extra);
        let o = hesper(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with("tokenizer:"))
            .collect::<String>()
    };
    assert!(info(&[]).contains("Llama-3 split"), "{}", info(&[]));
    assert!(info(&["--tokenizer-pre", "default"]).contains("'default' split (forced"));
    let o = hesper(&["generate", "-m", &vocab, "--tokenizer-pre", "bogus"]);
    assert!(
        !o.status.success() && stderr(&o).contains("--tokenizer-pre \"bogus\""),
        "{}",
        stderr(&o)
    );
}

/// `bench --backend gpu --roofline --json`: the device's copy bandwidth, the roofline derived
/// from it, a per-kernel profile whose launches add up to the dispatches counted during tg
/// and whose bytes cover the weights read per token, and which instance of the matrix kernels
/// each test's products launched.
#[test]
fn gpu_bench_reports_its_roofline_and_kernels() {
    let o = hesper(&[
        "bench",
        "--backend",
        "gpu",
        "--roofline",
        "--json",
        "-p",
        "8",
        "-n",
        "3",
        "-r",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let tg = rows
        .as_array()
        .and_then(|r| r.iter().find(|r| r["test"] == "tg3"))
        .expect("a tg3 row");
    let num = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    // The built-in model's 4 layers each run 4 products (Q/K/V, output, gate/up, down) and the
    // LM head one. An 8-token prompt step runs the layers' products on the wide instances and
    // the head, on the last row alone, on the decode one; a generated token runs decode alone.
    let launches = |test: &str, wide: bool| -> f64 {
        let row = rows
            .as_array()
            .and_then(|r| r.iter().find(|r| r["test"] == test));
        let kernels = row.and_then(|r| r["matrix_kernels"].as_object());
        let kernels = kernels.unwrap_or_else(|| panic!("{test}'s matrix kernels: {row:?}"));
        kernels
            .iter()
            .filter(|(name, _)| name.ends_with("_wide") == wide)
            .map(|(_, n)| num(n))
            .sum()
    };
    assert_eq!((launches("pp8", true), launches("pp8", false)), (16.0, 1.0));
    assert_eq!(
        (launches("tg3", true), launches("tg3", false)),
        (0.0, 3.0 * 17.0)
    );
    let copy = num(&tg["gpu_copy_gb_per_s"]);
    assert!(copy > 0.0 && copy.is_finite(), "copy bandwidth {copy}");
    assert!(tg["read_gb_per_s"].is_null(), "host bandwidth on the GPU");
    let roof = num(&tg["roofline_ts"]);
    let expect = copy * 1e9 / num(&tg["bytes_per_token"]);
    assert!((roof - expect).abs() <= 1e-9 * expect, "{roof} vs {expect}");
    let share = num(&tg["roofline_share"]);
    assert!(
        (share - num(&tg["avg_ts"]) / roof).abs() <= 1e-12,
        "{share}"
    );
    let dispatches: f64 = tg["gpu"]
        .as_str()
        .and_then(|l| l.strip_prefix("gpu per generated token: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("dispatches per token");
    let kernels = tg["kernels"].as_array().expect("timestamp queries");
    let launches: f64 = kernels.iter().map(|k| num(&k["launches_per_token"])).sum();
    assert_eq!(launches, dispatches, "{kernels:?}");
    assert!(kernels
        .iter()
        .all(|k| num(&k["us_per_token"]) > 0.0 && k["kernel"].is_string()));
    // Every kernel of a token counts its traffic: the weights (the bytes per token) and the
    // activations, caches and outputs around them, which in this small model add a few %.
    let mb: f64 = kernels.iter().map(|k| num(&k["mb_per_token"])).sum();
    let weights = num(&tg["bytes_per_token"]) / 1e6;
    assert!(
        mb >= weights && mb <= 1.25 * weights,
        "{mb} MB moved per token, {weights} MB of weights: {kernels:?}"
    );
    for k in kernels {
        let share = num(&k["bandwidth_share"]);
        let expect = num(&k["gb_per_s"]) / copy;
        assert!((share - expect).abs() <= 1e-12, "{k:?}");
    }
}

/// `bench` as llama-bench: lists, ranges and -pg give a row per test, batch and thread count;
/// `-o json`, `jsonl` and `csv` hold nothing but their format whatever else is asked; the
/// model column names the file and its weight type, with `info`'s size; the defaults fit the
/// model's context.
#[test]
fn bench_speaks_llama_bench() {
    let info = hesper(&["info"]);
    let size_mib = stdout(&info)
        .lines()
        .find_map(|l| {
            l.strip_prefix("tensors (")?
                .split(", ")
                .nth(1)?
                .strip_suffix(" MiB):")
        })
        .expect("info's tensor size")
        .to_string();
    let grid = [
        "bench",
        "--backend",
        "cpu",
        "-r",
        "1",
        "-p",
        "8,16",
        "-n",
        "4",
        "-pg",
        "8,4",
        "-b",
        "4-8*2",
        "-t",
        "1-2",
    ];
    let names = ["pp8", "pp8", "pp16", "pp16", "tg4", "pp8+tg4", "pp8+tg4"];
    for format in ["json", "jsonl", "csv"] {
        for extra in [&[][..], &["--profile"]] {
            let args = [&grid[..], &["-o", format], extra].concat();
            let o = hesper(&args);
            assert!(o.status.success(), "{args:?}: {}", stderr(&o));
            let text = stdout(&o);
            let rows: Vec<serde_json::Value> = match format {
                "json" => serde_json::from_str::<Vec<_>>(&text).expect("one JSON array"),
                "jsonl" => text
                    .lines()
                    .map(|l| serde_json::from_str(l).expect("a JSON line"))
                    .collect(),
                _ => {
                    let lines: Vec<&str> = text.lines().collect();
                    let header: Vec<&str> = lines[0].split(',').collect();
                    lines[1..]
                        .iter()
                        .map(|l| {
                            let cells: Vec<&str> =
                                l.split("\",\"").map(|c| c.trim_matches('"')).collect();
                            assert_eq!(cells.len(), header.len(), "{l}");
                            header
                                .iter()
                                .zip(cells)
                                .map(|(h, c)| (h.to_string(), serde_json::Value::from(c)))
                                .collect()
                        })
                        .collect()
                }
            };
            assert_eq!(rows.len(), 2 * names.len(), "{args:?}: {text}");
            for (i, row) in rows.iter().enumerate() {
                let field = |k: &str| match &row[k] {
                    serde_json::Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                assert_eq!(field("test"), names[i % names.len()], "{row}");
                assert_eq!(field("n_threads"), if i < names.len() { "1" } else { "2" });
                assert_eq!(field("model_filename"), "hesper-kjv.gguf (built-in)");
                assert_eq!(field("model_type"), "I2_S");
                let size: f64 = field("model_size").parse().unwrap();
                assert_eq!(format!("{:.2}", size / (1 << 20) as f64), size_mib);
                let ts: f64 = field("avg_ts").parse().unwrap();
                assert!(ts > 0.0 && ts.is_finite(), "{row}");
                if format != "csv" {
                    assert_eq!(row["profile"].is_array(), !extra.is_empty(), "{row}");
                    let layout = row["cpu_layout"].as_str().unwrap_or_default();
                    assert!(layout.contains(" kernels, "), "{row}");
                }
            }
        }
    }
    // The defaults shrink to the built-in model's 256-token context.
    let o = hesper(&["bench", "--backend", "cpu", "-r", "1", "-o", "jsonl"]);
    let tests: Vec<String> = stdout(&o)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["test"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(tests, ["pp256", "tg128"], "{}", stderr(&o));
    // A list of thread counts is for bench alone.
    let args = ["generate", "-t", "1,2"];
    support::assert_one_line_error(&args, &hesper(&args), "lists and ranges are for bench");
}

/// llama.cpp's spellings mean what they mean there: `-s` the seed (`-S` too), `-sys` the system
/// prompt, `-f` a prompt file, `-ctk`/`-ctv` the KV type, `-ngl` and `-fa` accepted with a
/// note, `--log-disable` silences notes, `logits -o -` writes to standard output.
#[test]
fn llama_cpp_spellings_mean_what_they_mean_there() {
    let gen = |extra: &[&str]| {
        let mut args = vec!["generate", "--backend", "cpu", "-n", "8"];
        args.extend(extra);
        hesper(&args)
    };
    let seeded = gen(&["-p", "Once upon a time", "--seed", "7"]);
    assert!(seeded.status.success(), "{}", stderr(&seeded));
    assert_eq!(
        gen(&["-p", "Once upon a time", "-s", "7"]).stdout,
        seeded.stdout
    );
    assert_eq!(
        gen(&["-p", "Once upon a time", "-S", "7"]).stdout,
        seeded.stdout
    );
    let prompt = std::env::temp_dir().join(format!("hesper-prompt-{}.txt", std::process::id()));
    std::fs::write(&prompt, "Once upon a time").unwrap();
    let from_file = gen(&["-f", prompt.to_str().unwrap(), "-s", "7"]);
    std::fs::remove_file(&prompt).unwrap();
    assert_eq!(from_file.stdout, seeded.stdout, "{}", stderr(&from_file));

    let greedy = |extra: &[&str]| {
        let mut args = vec!["-p", "And it came to pass", "--temp", "0"];
        args.extend(extra);
        gen(&args)
    };
    let f16 = greedy(&["--kv-type", "f16"]);
    assert_eq!(greedy(&["-ctk", "f16", "-ctv", "f16"]).stdout, f16.stdout);
    let noted = greedy(&["-ngl", "99", "-fa"]);
    assert_eq!(noted.stdout, greedy(&[]).stdout, "{}", stderr(&noted));
    let err = stderr(&noted);
    assert!(
        err.contains("-ngl 99: every layer runs on the backend") && err.contains("-fa on"),
        "{err}"
    );
    let quiet = greedy(&["--log-disable"]);
    assert_eq!(quiet.stdout, greedy(&[]).stdout);
    assert_eq!(stderr(&quiet), "", "--log-disable prints no notes");

    let chat = hesper(&[
        "chat",
        "--backend",
        "cpu",
        "-sys",
        "Be brief",
        "-p",
        "Hi",
        "-n",
        "2",
    ]);
    assert!(chat.status.success(), "{}", stderr(&chat));

    let file = std::env::temp_dir().join(format!("hesper-logits-o-{}.f32", std::process::id()));
    let logits = |out: &str| hesper(&["logits", "--backend", "cpu", "-p", "Hello", "-o", out]);
    let to_file = logits(file.to_str().unwrap());
    assert!(to_file.status.success(), "{}", stderr(&to_file));
    let to_stdout = logits("-");
    assert!(to_stdout.status.success(), "{}", stderr(&to_stdout));
    assert_eq!(to_stdout.stdout, std::fs::read(&file).unwrap());
    std::fs::remove_file(&file).unwrap();
}

/// `tokenize` prints llama-tokenize's `ID -> 'piece'` lines (or `--ids`), `detokenize` turns
/// the ids back into the text, and an id past the vocabulary is one line.
#[test]
fn tokenize_and_detokenize_round_trip() {
    let text = "In the beginning God created the heaven";
    let lines = hesper(&["tokenize", "-p", text]);
    assert!(lines.status.success(), "{}", stderr(&lines));
    let out = stdout(&lines);
    assert!(out.lines().next().unwrap().ends_with("-> '<s>'"), "{out}");
    assert!(out.contains(" -> ' beginning'"), "{out}");
    let ids = hesper(&["tokenize", "-p", text, "--ids", "--no-bos"]);
    let list = stdout(&ids);
    assert!(
        list.starts_with('[') && list.trim_end().ends_with(']'),
        "{list}"
    );
    assert_eq!(
        list.matches(',').count() + 1,
        out.lines().count() - 1,
        "{list} vs {out}"
    );
    let back = hesper(&["detokenize", list.trim()]);
    assert!(back.status.success(), "{}", stderr(&back));
    assert_eq!(stdout(&back), format!("{text}\n"));
    let args = ["detokenize", "1,4096"];
    support::assert_one_line_error(&args, &hesper(&args), "past the vocabulary (4096 tokens)");
    // The text as an argument, or on stdin, as -p gives it.
    assert_eq!(hesper(&["tokenize", text]).stdout, lines.stdout);
    let piped = support::run(&["tokenize"], Some(text.as_bytes()));
    assert!(piped.status.success(), "{}", stderr(&piped));
    assert_eq!(piped.stdout, lines.stdout);
}

/// A prompt may be given as an argument, as llama-cli and Ollama take it; the root help names
/// every command.
#[test]
fn a_positional_prompt_is_the_prompt_and_the_help_names_every_command() {
    let flag = hesper(&[
        "generate",
        "-p",
        "In the beginning",
        "-n",
        "6",
        "--temp",
        "0",
    ]);
    let positional = hesper(&["generate", "In the beginning", "-n", "6", "--temp", "0"]);
    assert!(positional.status.success(), "{}", stderr(&positional));
    assert_eq!(positional.stdout, flag.stdout);
    let both = ["generate", "-p", "a", "b"];
    assert!(!hesper(&both).status.success(), "two prompts accepted");
    let help = stdout(&hesper(&["--help"]));
    let about = help.lines().next().unwrap_or_default();
    for command in [
        "generate",
        "chat",
        "info",
        "logits",
        "perplexity",
        "bench",
        "node",
        "quantize",
        "tokenize",
        "detokenize",
        "completions",
        "pull",
        "serve",
    ] {
        assert!(
            help.contains(&format!("  {command} ")),
            "{command} not in --help"
        );
        assert!(
            about.contains(command),
            "{command} not in the first line: {about}"
        );
    }
}

/// `completions` writes a script for bash, zsh and fish naming every command; `--version`
/// names the commit and the CPU kernels.
#[test]
fn completions_and_version() {
    for shell in ["bash", "zsh", "fish"] {
        let o = hesper(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        for command in ["generate", "chat", "serve", "pull", "bench", "tokenize"] {
            assert!(script.contains(command), "{shell} lacks {command}");
        }
    }
    let bash = hesper(&["completions", "bash"]);
    let check = std::process::Command::new("bash")
        .args(["-n", "-c", &stdout(&bash)])
        .status()
        .expect("bash");
    assert!(check.success(), "the bash script does not parse");
    let v = stdout(&hesper(&["--version"]));
    assert!(v.starts_with("hesper-rs 0.1.0 (commit "), "{v}");
    assert!(
        v.contains("CPU kernels: ") && v.contains("this CPU runs scalar"),
        "{v}"
    );
}

/// On a GPU run: no Mesa noise about XDG_RUNTIME_DIR when it is unset, a software adapter is
/// called one, and `info` describes the adapter in words (not Rust's debug dump).
#[test]
fn gpu_runs_speak_plainly() {
    let run = |args: &[&str]| {
        support::command(args)
            .env_remove("XDG_RUNTIME_DIR")
            .output()
            .expect("run hesper-rs")
    };
    let info = run(&["info", "--backend", "gpu"]);
    let text = stdout(&info);
    assert!(info.status.success(), "{}", stderr(&info));
    assert!(
        !stderr(&info).contains("XDG_RUNTIME_DIR"),
        "{}",
        stderr(&info)
    );
    assert!(text.contains("features: shader-f16 "), "{text}");
    assert!(
        !text.contains("Features {") && !text.contains("WgslLanguageFeatures"),
        "{text}"
    );
    // lavapipe (CI's adapter) is a software one; a hardware GPU is not called one.
    let software = text.contains("a software adapter running on the CPU");
    let o = run(&["generate", "--backend", "gpu", "-n", "2", "--seed", "1"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("XDG_RUNTIME_DIR"), "{err}");
    assert_eq!(
        err.contains("is a software adapter, running on the CPU"),
        software,
        "{text}\n{err}"
    );
}

/// Every command's `--help` shows only flags it reads: the flags that choose how a model runs
/// (backend, kernels, threads, LM head, llama.cpp's -ngl and -fa) only on commands that run
/// one (`info` shows the backend and kernels it describes), sampling and prompts only on the
/// commands that generate, the server's and the ring's flags only on theirs. `help --help`
/// and `help COMMAND` behave as `--help` and `COMMAND --help`.
#[test]
fn each_commands_help_shows_only_flags_it_uses() {
    let runs = ["--lm-head", "--threads", "--n-gpu-layers", "--flash-attn"];
    let kernels = ["--backend", "--no-repack", "--cpu-kernels"];
    let sampling = ["--temp", "--top-k", "--seed", "--n-predict", "--chat"];
    let serving = ["--api-key", "--parallel", "--embeddings", "--no-webui"];
    let ring = ["--listen", "--next", "--ring-key", "--standby"];
    let root = stdout(&hesper(&["--help"]));
    let commands: Vec<&str> = root
        .split("Commands:")
        .nth(1)
        .expect("a command list")
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|&c| c != "help")
        .collect();
    assert!(commands.len() >= 13, "{commands:?}");
    for command in commands {
        let o = hesper(&[command, "--help"]);
        assert!(o.status.success(), "{command}: {}", stderr(&o));
        let help = stdout(&o);
        let shown = |flag: &str| {
            help.lines()
                .any(|l| l.trim_start().split([' ', ',']).any(|w| w == flag))
        };
        let mut forbidden: Vec<&str> = Vec::new();
        match command {
            "tokenize" | "detokenize" | "quantize" | "pull" | "completions" => {
                forbidden.extend(runs.iter().chain(&kernels).chain(&sampling))
            }
            "info" => forbidden.extend(runs.iter().chain(&sampling)),
            "logits" | "perplexity" | "bench" => forbidden.extend(&sampling),
            _ => {}
        }
        if command != "serve" {
            forbidden.extend(&serving);
        }
        if command != "serve" && command != "node" {
            forbidden.extend(&ring);
        }
        for flag in forbidden {
            assert!(
                !shown(flag),
                "{command} --help shows {flag}, which it ignores:\n{help}"
            );
        }
        let via_help = hesper(&["help", command]);
        assert_eq!(stdout(&via_help), help, "help {command}");
    }
    // A flag a command ignores is refused, not accepted silently.
    let o = hesper(&["tokenize", "--backend", "cpu", "x"]);
    assert!(
        !o.status.success() && stderr(&o).contains("--backend"),
        "{}",
        stderr(&o)
    );
    let o = hesper(&["help", "--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), root);
}
