//! The ring as users run it: `hesper-rs node` processes on 127.0.0.1, compared with
//! `hesper-rs generate` on the whole model.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hesper_engine::file::ModelFile;
use hesper_engine::gguf::{GgufBuilder, Value};
use support::{assert_no_crash, command, hesper, stderr, stdout, TIME_LIMIT};

/// The demo model with its two layers repeated (blocks 0, 1, 0, 1): four layers, so a ring
/// of three nodes has a range for each. `name` goes into its metadata, so two files with
/// different names are different models.
fn four_layer_model(name: &str) -> PathBuf {
    // Tests run in parallel: one writes each file, the others wait for it.
    static WRITING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ring-{name}.gguf"));
    if path.exists() {
        return path;
    }
    let demo = format!("{}/../models/hesper-tiny.gguf", env!("CARGO_MANIFEST_DIR"));
    let file = ModelFile::open(demo.as_ref()).expect("demo model");
    let g = file.header();
    let mut b = GgufBuilder::new();
    for (k, v) in g.metadata() {
        b = match k.as_str() {
            k if k.ends_with(".block_count") => b.kv(k, Value::U32(4)),
            "general.name" => b,
            _ => b.kv(k, v.clone()),
        };
    }
    b = b.kv("general.name", Value::String(name.into()));
    let copy = |b: GgufBuilder, name: &str, t: &hesper_engine::gguf::TensorInfo| {
        let data = file.tensor_bytes(t).expect("tensor").to_vec();
        b.tensor(name, t.dims(), t.ty.id(), data)
    };
    for t in g.tensors().iter().filter(|t| !t.name.starts_with("blk.")) {
        b = copy(b, &t.name, t);
    }
    for layer in 0..4 {
        for t in g.tensors() {
            if let Some(rest) = t.name.strip_prefix(&format!("blk.{}.", layer % 2)) {
                b = copy(b, &format!("blk.{layer}.{rest}"), t);
            }
        }
    }
    let tmp = path.with_extension(format!("{}.partial", std::process::id()));
    std::fs::write(&tmp, b.build()).expect("write model");
    std::fs::rename(&tmp, &path).expect("rename model");
    path
}

/// `n` ports free on 127.0.0.1 a moment ago.
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

/// A running `hesper-rs` whose output is collected as it comes.
struct Proc {
    args: Vec<String>,
    child: Child,
    out: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
    err: Arc<Mutex<Vec<u8>>>,
}

impl Proc {
    fn spawn(args: &[String]) -> Self {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut child = command(&refs)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hesper-rs");
        let (out, err) = (Arc::default(), Arc::default());
        let collect = |mut pipe: Box<dyn Read + Send>, into: &Arc<Mutex<Vec<u8>>>| {
            let into = Arc::clone(into);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut buf) {
                    into.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            })
        };
        let readers = vec![
            collect(Box::new(child.stdout.take().unwrap()), &out),
            collect(Box::new(child.stderr.take().unwrap()), &err),
        ];
        Self {
            args: args.to_vec(),
            child,
            out,
            readers,
            err,
        }
    }

    /// Standard output so far.
    fn stdout_len(&self) -> usize {
        self.out.lock().unwrap().len()
    }

    /// Waits for the process to end (failing the test past [`TIME_LIMIT`]).
    fn wait(mut self) -> Output {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            if start.elapsed() > TIME_LIMIT {
                let _ = self.child.kill();
                panic!("hesper-rs {:?} ran past {TIME_LIMIT:?}", self.args);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        for r in self.readers {
            r.join().expect("reader");
        }
        let take = |v: &Arc<Mutex<Vec<u8>>>| std::mem::take(&mut *v.lock().unwrap());
        Output {
            status,
            stdout: take(&self.out),
            stderr: take(&self.err),
        }
    }
}

/// One node's part: its role, layers and backend.
struct Part<'a> {
    role: &'a str,
    layers: &'a str,
    backend: &'a str,
    model: &'a std::path::Path,
}

/// A node of `role` holding `layers` of `model` on the CPU.
fn on_cpu<'a>(role: &'a str, layers: &'a str, model: &'a std::path::Path) -> Part<'a> {
    Part {
        role,
        layers,
        backend: "cpu",
        model,
    }
}

/// `hesper-rs node` arguments for `p`, listening on `listen` with `next` after it, then `more`.
fn node_args(p: &Part<'_>, listen: u16, next: u16, more: &[&str]) -> Vec<String> {
    let (listen, next) = (format!("127.0.0.1:{listen}"), format!("127.0.0.1:{next}"));
    let model = p.model.to_str().unwrap();
    let head = ["node", "--role", p.role, "-m", model, "--layers", p.layers];
    let tail = ["--backend", p.backend, "--listen", &listen, "--next", &next];
    head.iter()
        .chain(&tail)
        .chain(more)
        .map(|s| s.to_string())
        .collect()
}

/// Starts a ring of `parts` (the master first) on fresh ports, with `every` flags for each
/// node and `extra` flags for the master; returns the processes in the same order.
fn start_ring(parts: &[Part<'_>], every: &[&str], extra: &[&str]) -> Vec<Proc> {
    let ports = free_ports(parts.len());
    // Workers first, in reverse, so the master starts last (the order does not matter, but
    // this makes the master's wait short).
    let mut procs: Vec<(usize, Proc)> = Vec::new();
    for (i, p) in parts.iter().enumerate().rev() {
        let mut args = node_args(p, ports[i], ports[(i + 1) % parts.len()], every);
        if i == 0 {
            args.extend(extra.iter().map(|s| s.to_string()));
        }
        procs.push((i, Proc::spawn(&args)));
    }
    procs.sort_by_key(|(i, _)| *i);
    procs.into_iter().map(|(_, p)| p).collect()
}

/// [`start_ring`], then waits for every node: each must exit cleanly.
fn run_ring(parts: &[Part<'_>], every: &[&str], extra: &[&str]) -> Vec<Output> {
    let outs: Vec<Output> = start_ring(parts, every, extra)
        .into_iter()
        .map(Proc::wait)
        .collect();
    for o in &outs {
        assert_no_crash(&[], o);
        assert!(o.status.success(), "{}", stderr(o));
    }
    outs
}

/// `generate` on the whole model with `flags`, on the CPU.
fn generate(model: &std::path::Path, flags: &[&str]) -> Output {
    let mut args = vec![
        "generate",
        "-m",
        model.to_str().unwrap(),
        "--backend",
        "cpu",
    ];
    args.extend_from_slice(flags);
    let o = hesper(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    o
}

/// The ring's runs compared with `generate`: (flags for both, the master's backend, the
/// ring's transport flags).
#[test]
fn a_ring_of_three_processes_prints_what_generate_prints() {
    let model = four_layer_model("same");
    let greedy = ["-p", "Once upon a time", "-n", "32", "--temp", "0"];
    let sampled = [
        "-p",
        "Once upon a time",
        "-n",
        "32",
        "--seed",
        "7",
        "--temp",
        "0.9",
    ];
    // Greedy with the master on the GPU (lavapipe) over each transport; sampled with every
    // node on the CPU, so the sampler sees the very logits `generate` does; and UDP with
    // datagrams dropped, duplicated and reordered on every node.
    let chaos = ["--transport", "udp", "--udp-chaos", "0.1,0.05,0.1"];
    let runs: [(&[&str], &str, &[&str]); 5] = [
        (&greedy, "gpu", &["--transport", "tcp"]),
        (&greedy, "gpu", &["--transport", "udp"]),
        (&greedy, "gpu", &["--transport", "uring"]),
        (&sampled, "cpu", &["--transport", "tcp"]),
        (&greedy, "cpu", &chaos),
    ];
    for (flags, master_backend, transport) in runs {
        let expected = generate(&model, flags);
        let parts = [
            Part {
                role: "master",
                layers: "0..1",
                backend: master_backend,
                model: &model,
            },
            Part {
                role: "worker",
                layers: "1..3",
                backend: "cpu",
                model: &model,
            },
            Part {
                role: "worker",
                layers: "3..4",
                backend: "cpu",
                model: &model,
            },
        ];
        let outs = run_ring(&parts, transport, flags);
        let what = format!("{flags:?} {master_backend} {transport:?}");
        assert_eq!(
            stdout(&outs[0]),
            stdout(&expected),
            "{what}: the ring printed other text than generate; master stderr: {}",
            stderr(&outs[0])
        );
        assert!(stdout(&expected).len() > "Once upon a time".len() + 32);
        for o in &outs[1..] {
            assert!(
                stdout(o).is_empty(),
                "a worker wrote to stdout: {}",
                stdout(o)
            );
        }
        // The uring run really ran on io_uring (a host without it would fall back to TCP,
        // saying so; this machine kind has it).
        assert!(
            !stderr(&outs[0]).contains("io_uring is unavailable"),
            "{what}: {}",
            stderr(&outs[0])
        );
        // Only UDP counts datagrams sent again.
        assert_eq!(
            stderr(&outs[0]).contains("datagrams sent again"),
            transport.contains(&"udp"),
            "{what}: {}",
            stderr(&outs[0])
        );
        if transport.contains(&"--udp-chaos") {
            assert!(
                resent(&stderr(&outs[0])) > 0,
                "{what}: nothing was sent again: {}",
                stderr(&outs[0])
            );
        }
    }
}

/// A `llama` model (Mistral's proportions, F32, a SentencePiece vocabulary: the golden model of
/// golden-values/families.py) split across a GPU node and a CPU node prints what `generate`
/// prints on the whole model.
/// Over links that hold every frame back 150 ms, the ring still ends cleanly on every node:
/// the master waits for its Shutdown to come back round before it exits, so the last worker
/// never finds the master gone before the Shutdown reaches it.
#[test]
fn a_ring_on_slow_links_ends_cleanly_on_every_node() {
    let model = four_layer_model("same");
    let flags = ["-p", "Once upon a time", "-n", "2", "--temp", "0"];
    let expected = generate(&model, &flags);
    let parts = [
        on_cpu("master", "0..1", &model),
        on_cpu("worker", "1..3", &model),
        on_cpu("worker", "3..4", &model),
    ];
    let slow = ["--transport", "tcp", "--link-delay", "150"];
    let outs = run_ring(&parts, &slow, &flags);
    assert_eq!(stdout(&outs[0]), stdout(&expected));
    for o in &outs[1..] {
        assert!(
            stderr(o).contains("the master ended the ring"),
            "{}",
            stderr(o)
        );
    }
}

#[test]
fn a_llama_model_splits_across_a_gpu_node_and_a_cpu_node() {
    let model = PathBuf::from(support::golden("models/tiny-mistral-f32.gguf"));
    let flags = ["-p", "And it came to pass", "-n", "24", "--temp", "0"];
    let expected = generate(&model, &flags);
    let parts = [
        Part {
            role: "master",
            layers: "0..1",
            backend: "gpu",
            model: &model,
        },
        on_cpu("worker", "1..2", &model),
    ];
    let outs = run_ring(&parts, &["--transport", "tcp"], &flags);
    assert_eq!(
        stdout(&outs[0]),
        stdout(&expected),
        "the ring printed other text than generate; master stderr: {}",
        stderr(&outs[0])
    );
    assert!(stdout(&expected).starts_with("And it came to pass"));
}

/// The datagrams the master's report says were sent again.
fn resent(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter(|l| l.starts_with("hesper: ring link"))
        .filter_map(|l| l.split(", ").last()?.split(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// [`four_layer_model`]`("same")` with other bytes in `tensor` (its first 64 reversed): the
/// same header, other weights.
fn same_header_other_data(tensor: &str) -> PathBuf {
    let mut bytes = std::fs::read(four_layer_model("same")).expect("model");
    let g = hesper_engine::gguf::Gguf::parse(&bytes).expect("parse");
    let at = g.tensor(tensor).expect("tensor").start as usize;
    bytes[at..at + 64].reverse();
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ring-other-{tensor}-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).expect("write");
    path
}

#[test]
fn misconfigured_rings_are_refused_with_the_reason() {
    let model = four_layer_model("same");
    let other = four_layer_model("other");
    // The last node holds the embedding table as the tied LM head.
    let other_rows = same_header_other_data("token_embd.weight");
    let cases = [
        (
            ("0..1", &model),
            ("2..4", &model),
            "layers 1..2 are held by no node",
        ),
        (
            ("0..2", &model),
            ("1..4", &model),
            "layers 1..2 are held twice",
        ),
        (
            ("0..2", &model),
            ("2..3", &model),
            "layers 3..4 are held by no node",
        ),
        (
            ("0..2", &model),
            ("2..4", &other),
            "holds a different model",
        ),
        (
            ("0..2", &model),
            ("2..4", &other_rows),
            "holds other data than the master in tensor token_embd.weight",
        ),
    ];
    for ((ml, mm), (wl, wm), reason) in cases {
        let parts = [
            Part {
                role: "master",
                layers: ml,
                backend: "cpu",
                model: mm,
            },
            Part {
                role: "worker",
                layers: wl,
                backend: "cpu",
                model: wm,
            },
        ];
        let outs: Vec<Output> = start_ring(&parts, &[], &["-p", "hi", "-n", "4"])
            .into_iter()
            .map(Proc::wait)
            .collect();
        for o in &outs {
            assert_no_crash(&[], o);
            assert!(
                !o.status.success(),
                "{reason}: a node succeeded: {}",
                stderr(o)
            );
            assert!(stderr(o).contains(reason), "{reason}: {}", stderr(o));
        }
        assert_eq!(stdout(&outs[0]), "", "{reason}: the master printed text");
    }
    std::fs::remove_file(&other_rows).expect("remove");
}

#[test]
fn a_lost_worker_ends_the_ring_within_5_s_naming_it() {
    let model = four_layer_model("same");
    // Killed (its sockets close) over each transport, and stalled (SIGSTOP: its sockets stay
    // open, its heartbeats stop).
    for (transport, signal) in [
        ("tcp", "KILL"),
        ("udp", "KILL"),
        ("uring", "KILL"),
        ("tcp", "STOP"),
    ] {
        let parts = [
            Part {
                role: "master",
                layers: "0..2",
                backend: "cpu",
                model: &model,
            },
            Part {
                role: "worker",
                layers: "2..4",
                backend: "cpu",
                model: &model,
            },
        ];
        let long = ["-p", "hi", "-n", "-1", "-c", "200000", "--temp", "0"];
        let mut procs = start_ring(&parts, &["--transport", transport], &long);
        let start = Instant::now();
        while procs[0].stdout_len() < 64 {
            assert!(start.elapsed() < TIME_LIMIT, "the ring never generated");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut worker = procs.pop().unwrap();
        let pid = worker.child.id().to_string();
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("kill");
        assert!(sent.success());
        let lost = Instant::now();
        let master = procs.pop().unwrap().wait();
        let took = lost.elapsed();
        let _ = worker.child.kill();
        let _ = worker.child.wait();
        let what = format!("{transport}, SIG{signal}");
        assert_no_crash(&[], &master);
        assert!(
            !master.status.success(),
            "{what}: the master went on: {}",
            stderr(&master)
        );
        assert!(
            took < Duration::from_secs(5),
            "{what}: the master took {took:?} to stop"
        );
        let err = stderr(&master);
        assert!(
            err.contains("ring node") && err.contains("(layers 2..4") && err.contains("lost"),
            "{what}: {err}"
        );
    }
}

#[test]
fn garbage_sent_to_a_listening_node_is_refused_and_the_ring_still_forms() {
    let model = four_layer_model("same");
    let expected = generate(&model, &["-p", "hi", "-n", "8", "--temp", "0"]);
    let ports = free_ports(2);
    let part = |role, layers| on_cpu(role, layers, &model);
    let worker = Proc::spawn(&node_args(&part("worker", "2..4"), ports[1], ports[0], &[]));
    let mut header = [0u8; 40];
    header[..4].copy_from_slice(b"HSRG");
    header[4..6].copy_from_slice(&hesper_ring::frame::VERSION.to_le_bytes());
    header[6] = 2;
    header[36..40].copy_from_slice(&u32::MAX.to_le_bytes());
    let attempts: [&[u8]; 3] = [
        b"GET / HTTP/1.1\r\n\r\n and more than forty bytes of it",
        &header,
        &[],
    ];
    for bytes in attempts {
        let start = Instant::now();
        let mut s = loop {
            match TcpStream::connect(("127.0.0.1", ports[1])) {
                Ok(s) => break s,
                Err(_) if start.elapsed() < TIME_LIMIT => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("the worker never listened: {e}"),
            }
        };
        let _ = s.write_all(bytes);
    }
    let flags = ["-p", "hi", "-n", "8", "--temp", "0"];
    let master = Proc::spawn(&node_args(
        &part("master", "0..2"),
        ports[0],
        ports[1],
        &flags,
    ))
    .wait();
    let worker = worker.wait();
    assert!(master.status.success(), "{}", stderr(&master));
    assert_eq!(stdout(&master), stdout(&expected));
    let err = stderr(&worker);
    assert!(worker.status.success(), "{err}");
    for reason in [
        "bad magic",
        "payload of 4294967295 bytes",
        "refused a connection",
    ] {
        assert!(err.contains(reason), "{reason}: {err}");
    }
}

#[test]
fn with_a_standby_a_lost_worker_changes_nothing_in_the_output() {
    let model = four_layer_model("same");
    let flags = ["-p", "hi", "-n", "400", "-c", "1024", "--temp", "0"];
    let expected = generate(&model, &flags);
    for transport in ["tcp", "udp", "uring"] {
        let ports = free_ports(3);
        let part = |role, layers| on_cpu(role, layers, &model);
        let t = ["--transport", transport];
        let standby = Proc::spawn(&node_args(&part("standby", "2..4"), ports[2], ports[0], &t));
        let mut worker = Proc::spawn(&node_args(&part("worker", "2..4"), ports[1], ports[0], &t));
        let spare = format!("127.0.0.1:{}", ports[2]);
        let mut more = vec!["--transport", transport, "--standby", &spare];
        more.extend(flags);
        let args = node_args(&part("master", "0..2"), ports[0], ports[1], &more);
        let master = Proc::spawn(&args);
        let start = Instant::now();
        while master.stdout_len() < 64 {
            assert!(start.elapsed() < TIME_LIMIT, "the ring never generated");
            std::thread::sleep(Duration::from_millis(20));
        }
        worker.child.kill().expect("kill the worker");
        let master = master.wait();
        let standby = standby.wait();
        worker.wait();
        assert_no_crash(&[], &master);
        let err = stderr(&master);
        assert!(master.status.success(), "{transport}: {err}");
        assert!(
            err.contains("re-forming the ring through the standby"),
            "{transport}: {err}"
        );
        assert_eq!(stdout(&master), stdout(&expected), "{transport}: {err}");
        assert!(
            standby.status.success(),
            "{transport}: {}",
            stderr(&standby)
        );
    }
}

#[test]
fn a_ring_key_lets_the_ring_form_and_keeps_others_out() {
    let model = four_layer_model("same");
    let flags = ["-p", "hi", "-n", "8", "--temp", "0"];
    let expected = generate(&model, &flags);
    for transport in ["tcp", "udp", "uring"] {
        // A refused ring ends when formation times out: the refusals wait 2 s, not 5.
        let ring = |master_key: Option<&str>, worker_key: Option<&str>, timeout: &str| {
            let ports = free_ports(2);
            let part = |role, layers| on_cpu(role, layers, &model);
            let mut w = vec!["--transport", transport, "--form-timeout", timeout];
            w.extend(worker_key.map(|k| ["--ring-key", k]).iter().flatten());
            let worker = Proc::spawn(&node_args(&part("worker", "2..4"), ports[1], ports[0], &w));
            let mut m = vec!["--transport", transport, "--form-timeout", timeout];
            m.extend(master_key.map(|k| ["--ring-key", k]).iter().flatten());
            m.extend(flags);
            let m = node_args(&part("master", "0..2"), ports[0], ports[1], &m);
            (Proc::spawn(&m).wait(), worker.wait())
        };
        let (master, worker) = ring(Some("s3cret"), Some("s3cret"), "5");
        assert!(master.status.success(), "{transport}: {}", stderr(&master));
        assert!(worker.status.success(), "{transport}: {}", stderr(&worker));
        assert_eq!(stdout(&master), stdout(&expected), "{transport}");
        for (master_key, worker_key, reason) in [
            (Some("s3cret"), Some("other"), "holds another --ring-key"),
            (Some("s3cret"), None, "did not answer the key handshake"),
            (
                None,
                Some("s3cret"),
                "does every node have the same --ring-key, or none?",
            ),
        ] {
            let (master, worker) = ring(master_key, worker_key, "2");
            for o in [&master, &worker] {
                assert_no_crash(&[], o);
                assert!(
                    !o.status.success(),
                    "{transport} {worker_key:?}: {}",
                    stderr(o)
                );
            }
            assert!(
                stderr(&master).contains(reason),
                "{transport} {worker_key:?}: {}",
                stderr(&master)
            );
            assert_eq!(stdout(&master), "");
        }
    }
}

/// Connects to `port` on 127.0.0.1 as a stranger (waiting for it to listen) and writes
/// `bytes`; the connection stays open while the stream lives.
fn stranger(port: u16, bytes: &[u8]) -> TcpStream {
    let start = Instant::now();
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if start.elapsed() < TIME_LIMIT => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("nothing listened on {port}: {e}"),
        }
    };
    s.write_all(bytes).expect("write");
    s
}

/// A well-formed frame of `kind` whose payload is `payload`.
fn frame(kind: hesper_ring::Kind, payload: Vec<u8>) -> Vec<u8> {
    hesper_ring::Frame::new(hesper_ring::Header::new(kind), payload).encode()
}

#[test]
fn well_formed_frames_from_strangers_never_reach_a_keyless_ring() {
    use hesper_ring::Kind;
    let model = four_layer_model("same");
    let flags = ["-p", "hi", "-n", "200", "--temp", "0"];
    let expected = generate(&model, &flags);
    let part = |role, layers| on_cpu(role, layers, &model);
    // Before the master: a Hello with bytes past its records and a Forward frame reach the
    // waiting worker first; it closes both and takes the master's link. Mid-run, more
    // strangers (a malformed Hello, an empty one) are refused and never read.
    let ports = free_ports(2);
    let worker = Proc::spawn(&node_args(&part("worker", "2..4"), ports[1], ports[0], &[]));
    let early = [
        stranger(ports[1], &frame(Kind::Hello, vec![7; 90])),
        stranger(ports[1], &frame(Kind::Forward, vec![0; 16])),
    ];
    std::thread::sleep(Duration::from_millis(300));
    let master = Proc::spawn(&node_args(
        &part("master", "0..2"),
        ports[0],
        ports[1],
        &flags,
    ));
    let start = Instant::now();
    while master.stdout_len() < 16 {
        assert!(start.elapsed() < TIME_LIMIT, "the ring never generated");
        std::thread::sleep(Duration::from_millis(5));
    }
    let late = [
        stranger(ports[1], &frame(Kind::Hello, vec![7; 90])),
        stranger(ports[1], &frame(Kind::Hello, 0u16.to_le_bytes().to_vec())),
        stranger(ports[0], &frame(Kind::Prediction, vec![0; 8])),
    ];
    let (master, worker) = (master.wait(), worker.wait());
    drop((early, late));
    assert!(master.status.success(), "{}", stderr(&master));
    assert_eq!(stdout(&master), stdout(&expected), "{}", stderr(&worker));
    let err = stderr(&worker);
    assert!(worker.status.success(), "{err}");
    let listening = format!("listening on 127.0.0.1:{}", ports[1]);
    for reason in [
        listening.as_str(),
        "a malformed Hello",
        "it opened with a Forward frame, not a Hello",
        "this node already has a predecessor",
    ] {
        assert!(err.contains(reason), "{reason}: {err}");
    }
    // A master whose listening port gets a bare 40-byte header before its last node: the
    // stranger does not take the last node's slot.
    let ports = free_ports(2);
    let flags = ["-p", "hi", "-n", "8", "--temp", "0"];
    let expected = generate(&model, &flags);
    let more = ["--form-timeout", "20"];
    let mut args = node_args(&part("master", "0..2"), ports[0], ports[1], &flags);
    args.extend(more.iter().map(|s| s.to_string()));
    let master = Proc::spawn(&args);
    let header = stranger(ports[0], &frame(Kind::Hello, Vec::new())[..40]);
    std::thread::sleep(Duration::from_millis(300));
    let worker = Proc::spawn(&node_args(&part("worker", "2..4"), ports[1], ports[0], &[]));
    let (master, worker) = (master.wait(), worker.wait());
    drop(header);
    let err = stderr(&master);
    assert!(master.status.success(), "{err}");
    assert!(worker.status.success(), "{}", stderr(&worker));
    assert_eq!(stdout(&master), stdout(&expected));
    assert!(err.contains("closed a connection from"), "{err}");
}

/// `bytes` (a GGUF file) with tensor `to`'s data replaced by tensor `from`'s (same type and
/// size).
fn with_tensor_copied(bytes: &mut [u8], from: &str, to: &str) {
    let g = hesper_engine::gguf::Gguf::parse(bytes).expect("parse");
    let (a, b) = (g.tensor(from).expect("from"), g.tensor(to).expect("to"));
    let len = a.nbytes.expect("size") as usize;
    assert_eq!(b.nbytes, Some(len as u64));
    let (a, b) = (a.start as usize, b.start as usize);
    bytes.copy_within(a..a + len, b);
}

/// `--hot-swap` over a ring: the file of a chat's master and worker is replaced between two
/// messages (a tensor of each node's layers changed); both swap in their own layers' tensors
/// between the steps, and the second answer is what `generate` on the new file continues the
/// conversation's text with. A worker started without `--hot-swap` stops the ring from
/// running on mixed files, and so does a worker whose own copy alone was rewritten (the same
/// header, other bytes in a tensor of its layers).
#[test]
fn a_ring_swaps_in_changed_tensors_between_chat_turns() {
    use std::io::BufRead;
    let base = std::fs::read(four_layer_model("same")).expect("model");
    let mut edited = base.clone();
    with_tensor_copied(&mut edited, "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight");
    with_tensor_copied(&mut edited, "blk.3.ffn_gate.weight", "blk.3.ffn_up.weight");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ring-swap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (live, new) = (dir.join("live.gguf"), dir.join("new.gguf"));
    let workers_own = dir.join("worker.gguf");
    std::fs::write(&new, &edited).expect("write");
    let flags = ["--temp", "0", "-n", "12", "--seed", "1"];
    let (m1, m2) = ("hi", "once upon a time");
    // (whether the worker swaps, whether it reads a copy of its own that alone is rewritten)
    for (worker_swaps, own_copy) in [(true, false), (false, false), (true, true)] {
        std::fs::write(&live, &base).expect("write");
        std::fs::write(&workers_own, &base).expect("write");
        let worker_file = if own_copy { &workers_own } else { &live };
        let ports = free_ports(2);
        let mut worker_flags = vec![];
        if worker_swaps {
            worker_flags.push("--hot-swap");
        }
        let worker = Proc::spawn(&node_args(
            &on_cpu("worker", "2..4", worker_file),
            ports[1],
            ports[0],
            &worker_flags,
        ));
        let mut more = vec!["--chat", "--hot-swap"];
        more.extend(flags);
        let args = node_args(&on_cpu("master", "0..2", &live), ports[0], ports[1], &more);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut master = command(&refs)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the master");
        let mut stdin = master.stdin.take().expect("stdin");
        let mut out = std::io::BufReader::new(master.stdout.take().expect("stdout"));
        writeln!(stdin, "{m1}").expect("write");
        let mut first = String::new();
        out.read_line(&mut first).expect("the first answer");
        let tmp = dir.join("tmp.gguf");
        std::fs::copy(&new, &tmp).expect("copy");
        std::fs::rename(&tmp, worker_file).expect("rename");
        let _ = writeln!(stdin, "{m2}");
        drop(stdin);
        let mut second = String::new();
        out.read_to_string(&mut second).expect("the second answer");
        let o = master.wait_with_output().expect("the master");
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        let w = worker.wait();
        if own_copy {
            assert!(!o.status.success(), "{err}");
            assert!(
                err.contains("holds other data than the master in tensor blk.3.ffn_up.weight"),
                "{err}"
            );
            assert!(
                second.trim().is_empty(),
                "no answer from mixed files: {second}"
            );
        } else if worker_swaps {
            assert!(o.status.success(), "{err}");
            assert!(
                err.contains("hot-swap: blk.0.ffn_up.weight, blk.3.ffn_up.weight swapped in"),
                "{err}"
            );
            assert!(
                stderr(&w).contains("hot-swap: blk.3.ffn_up.weight swapped in"),
                "{}",
                stderr(&w)
            );
            let text = format!("{m1}{}\n{m2}", first.trim_end_matches('\n'));
            let mut g = vec!["-p", text.as_str()];
            g.extend(flags);
            let fresh = stdout(&generate(&new, &g));
            let continued = fresh.strip_prefix(text.as_str()).expect("the prompt first");
            let stale = stdout(&generate(&four_layer_model("same"), &g));
            assert_ne!(stale, fresh, "the edit changes the answer");
            assert_eq!(
                second.trim_end_matches('\n'),
                continued.trim_end_matches('\n'),
                "{err}"
            );
        } else {
            assert!(!o.status.success(), "{err}");
            assert!(err.contains("hold different files"), "{err}");
            assert!(err.contains("it was not started with --hot-swap"), "{err}");
            assert!(
                second.trim().is_empty(),
                "no answer from mixed files: {second}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--layers auto` on three nodes: each offers what it measured and the memory it may hold
/// (capped here by `--ring-memory`), the master prints its plan and assigns each node its
/// layers: the master and the first worker at most the one layer their caps allow, the last
/// worker (two threads) the rest and the head; the ring then prints what `generate` prints.
/// Caps too small for the model end the forming ring in one line naming what is missing, and
/// every node is told.
#[test]
fn layers_are_assigned_by_measurement_within_each_nodes_memory() {
    use hesper_runtime::ring::plan::ModelBytes;
    let model = four_layer_model("same");
    let file = ModelFile::open(&model).expect("model");
    let g = file.header();
    let n_vocab = g.tensor("token_embd.weight").map(|t| t.ne[1] as usize);
    let config = hesper_engine::config::Config::from_gguf(g, n_vocab).expect("config");
    let bytes = ModelBytes::of(g, config.n_layer, config.kv_dim(), 256);
    let layer = bytes.layers[0] + bytes.kv_per_layer;
    // Room for one layer and a half: the second does not fit.
    let cap = |base: u64| (base + layer * 3 / 2).to_string();
    let flags = [
        "-p",
        "Once upon a time",
        "-n",
        "24",
        "--temp",
        "0",
        "-c",
        "256",
    ];
    let expected = generate(&model, &flags);
    let run = |caps: [String; 3]| {
        let ports = free_ports(3);
        let on = |i: usize, role: &str, threads: &str, more: &[&str]| {
            let part = on_cpu(role, "auto", &model);
            let mut extra = vec!["-t", threads, "--ring-memory", &caps[i]];
            extra.extend_from_slice(more);
            Proc::spawn(&node_args(&part, ports[i], ports[(i + 1) % 3], &extra))
        };
        let workers = [on(2, "worker", "2", &[]), on(1, "worker", "1", &[])];
        let master = on(0, "master", "1", &flags).wait();
        let workers = workers.map(Proc::wait);
        (master, workers)
    };
    let (master, workers) = run([cap(bytes.embedding), cap(0), u64::MAX.to_string()]);
    let err = stderr(&master);
    assert!(master.status.success(), "{err}");
    assert!(err.contains("layers assigned by measurement"), "{err}");
    // Each node within its cap (the master and the first worker one layer at most: which of
    // them takes the first layer follows their measured speeds), the last worker the rest.
    let held: Vec<(usize, usize)> = (0..3)
        .map(|node| {
            let line = err
                .lines()
                .find(|l| l.starts_with(&format!("hesper: ring node {node}: ")))
                .unwrap_or_else(|| panic!("node {node} is not in the plan: {err}"));
            let range = line
                .split("(layers ")
                .nth(1)
                .and_then(|r| r.split(',').next());
            let (a, b) = range
                .and_then(|r| r.split_once(".."))
                .unwrap_or_else(|| panic!("no layers in {line:?}"));
            (a.parse().expect("start"), b.parse().expect("end"))
        })
        .collect();
    assert!(
        held[0].1 - held[0].0 <= 1 && held[1].1 - held[1].0 <= 1,
        "the capped nodes hold one layer at most: {err}"
    );
    assert!(
        held[0].0 == 0 && held[0].1 == held[1].0 && held[1].1 == held[2].0 && held[2].1 == 4,
        "the layers in order, every one held: {err}"
    );
    assert_eq!(stdout(&master), stdout(&expected), "{err}");
    for w in &workers {
        assert!(w.status.success(), "{}", stderr(w));
    }
    let small = (bytes.embedding / 2).to_string();
    let (master, workers) = run([small.clone(), small.clone(), small]);
    let err = stderr(&master);
    assert!(!master.status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(
        line.contains("does not fit in the ring's memory") && line.contains("MiB missing"),
        "{err}"
    );
    for w in &workers {
        assert!(
            !w.status.success() && stderr(w).contains("does not fit in the ring's memory"),
            "{}",
            stderr(w)
        );
    }
}

/// `--private`: the master holds the LM head and samples, the last node hands back hidden
/// states. The ring prints what `generate` prints, greedy and sampled, with layers given and
/// assigned. Under `--layers auto` the last worker is not given the head at all: its copy of
/// the file, with other bytes in the (tied) embedding table, forms a ring with the master and
/// changes nothing in the output — the head's bytes on that node were never read — while the
/// same copy, without `--private`, is refused for holding other head bytes than the master.
#[test]
fn a_private_ring_keeps_the_output_on_the_master() {
    let model = four_layer_model("same");
    let other_head = same_header_other_data("token_embd.weight");
    let greedy = ["-p", "Once upon a time", "-n", "24", "--temp", "0"];
    let sampled = [
        "-p",
        "Once upon a time",
        "-n",
        "24",
        "--seed",
        "3",
        "--temp",
        "0.9",
    ];
    let runs: [(&[&str], [&str; 3], &std::path::Path, bool); 4] = [
        (&greedy, ["0..1", "1..3", "3..4"], &model, true),
        (&sampled, ["0..2", "2..3", "3..4"], &model, true),
        (&sampled, ["auto", "auto", "auto"], &other_head, true),
        (&greedy, ["auto", "auto", "auto"], &other_head, false),
    ];
    for (flags, layers, last_file, private) in runs {
        let expected = generate(&model, flags);
        let ports = free_ports(3);
        let part = |i: usize, role, file| on_cpu(role, layers[i], file);
        let last = Proc::spawn(&node_args(
            &part(2, "worker", last_file),
            ports[2],
            ports[0],
            &[],
        ));
        let mid = Proc::spawn(&node_args(
            &part(1, "worker", &model),
            ports[1],
            ports[2],
            &[],
        ));
        let mut more: Vec<&str> = flags.to_vec();
        if private {
            more.push("--private");
        }
        let master = Proc::spawn(&node_args(
            &part(0, "master", &model),
            ports[0],
            ports[1],
            &more,
        ));
        let master = master.wait();
        let (mid, last) = (mid.wait(), last.wait());
        let what = format!("{flags:?} {layers:?} private {private}");
        if !private {
            assert!(!master.status.success(), "{what}");
            let err = stderr(&master);
            assert!(
                err.contains("holds other data than the master in tensor token_embd.weight"),
                "{what}: {err}"
            );
            continue;
        }
        assert!(master.status.success(), "{what}: {}", stderr(&master));
        assert_eq!(
            stdout(&master),
            stdout(&expected),
            "{what}: {}",
            stderr(&master)
        );
        for w in [&mid, &last] {
            assert!(w.status.success(), "{what}: {}", stderr(w));
        }
    }
}
