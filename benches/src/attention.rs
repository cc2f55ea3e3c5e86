//! `attention`: the CPU backend's attention, dense against sparse and f32 against f16 caches,
//! side by side with the seed's crate `ruvllm_sparse_attention` 0.1.1 on the same shapes, at
//! growing context lengths; and what the KV cache of a 30-layer model takes at each length.
//!
//! Usage: `cargo run --release -p hesper-benches --bin attention -- [THREADS] [ROUNDS]`
//! (defaults 2 and 3). Shapes: the seed's table (8 heads × 64, no GQA) and 2B4T's (20/5 heads ×
//! 128). Decode: one token at position T − 1 over a filled cache (median of 20 calls per round).
//! Prefill: attention of a T-token prompt from an empty cache (dense only up to 8192, where it
//! already takes seconds). The variants run interleaved within each round; the median round is
//! printed. The seed's crate runs with its `parallel` feature (rayon over heads).

use std::time::Instant;

use hesper_cpu::attention::{attention, KvCache};
use hesper_cpu::CpuBackend;
use hesper_engine::attention::{AttentionConfig, KvType, SparsePattern};
use hesper_engine::backend::AttentionShape;
use ruvllm_sparse_attention::{
    KvCache as SeedCache, SparseAttentionConfig, SubquadraticSparseAttention, Tensor3,
};

/// Context lengths decode is measured at.
const DECODE_LENGTHS: [usize; 8] = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768];
/// Context lengths prefill is measured at.
const PREFILL_LENGTHS: [usize; 4] = [512, 2048, 8192, 32768];
/// Longest prompt dense prefill is measured at.
const DENSE_PREFILL_MAX: usize = 8192;

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3).max(1);
    let backend = CpuBackend::new(threads).unwrap_or_else(|e| {
        eprintln!("attention: {e}");
        std::process::exit(1);
    });
    println!(
        "{} thread(s), {} kernels, {rounds} interleaved rounds (median shown), times in ms",
        backend.threads(),
        backend.isa().name()
    );
    let shapes = [
        ("8 heads × 64", shape(8, 8, 64)),
        ("2B4T 20/5 heads × 128", shape(20, 5, 128)),
    ];
    for (name, s) in shapes {
        println!("\n## {name}: decode, one token at position T − 1\n");
        println!("| T | dense f32 | dense f16 | sparse f32 | sparse f16 | seed sparse | seed / ours (sparse f32) |");
        println!("|---:|---:|---:|---:|---:|---:|---:|");
        for t in DECODE_LENGTHS {
            let row = decode_row(&backend, &s, t, rounds);
            println!(
                "| {t} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1}× |",
                row[0],
                row[1],
                row[2],
                row[3],
                row[4],
                row[4] / row[2]
            );
        }
        println!("\n## {name}: prefill of a T-token prompt\n");
        println!("| T | dense f32 | sparse f32 | seed sparse | seed / ours (sparse) |");
        println!("|---:|---:|---:|---:|---:|");
        for t in PREFILL_LENGTHS {
            let [dense, sparse, seed] = prefill_row(&backend, &s, t, rounds);
            let dense = dense.map_or("—".into(), |d| format!("{d:.1}"));
            let (sparse, seed) = (sparse.unwrap_or(f64::NAN), seed.unwrap_or(f64::NAN));
            println!(
                "| {t} | {dense} | {sparse:.1} | {seed:.1} | {:.1}× |",
                seed / sparse
            );
        }
    }
    println!("\n## KV cache of a 30-layer model with 2B4T's 5 × 128 kv heads\n");
    println!("| T | f32 | f16 | sparse landmarks (f32) |");
    println!("|---:|---:|---:|---:|");
    for t in DECODE_LENGTHS {
        let bytes = |config: &AttentionConfig| KvCache::with_config(&[t; 30], 640, config).bytes();
        let f32 = bytes(&AttentionConfig::default());
        let f16 = bytes(&config(KvType::F16, false));
        let marks = bytes(&config(KvType::F32, true)) - f32;
        println!("| {t} | {} | {} | {} |", mib(f32), mib(f16), mib(marks));
    }
}

fn shape(n_head: usize, n_head_kv: usize, head_dim: usize) -> AttentionShape<'static> {
    AttentionShape {
        n_head,
        n_head_kv,
        head_dim,
        window: None,
        softcap: None,
        sinks: None,
    }
}

fn config(kv_type: KvType, sparse: bool) -> AttentionConfig {
    AttentionConfig {
        swa_full: false,
        kv_type,
        sparse: sparse.then(SparsePattern::default),
    }
}

/// The seed's configuration equal to our default pattern's parts (its window counts one more).
fn seed() -> SubquadraticSparseAttention {
    let p = SparsePattern::default();
    SubquadraticSparseAttention::new(SparseAttentionConfig {
        window: p.window - 1,
        block_size: p.block,
        global_tokens: p.globals,
        causal: true,
        use_log_stride: true,
        use_landmarks: true,
        sort_candidates: false,
    })
    .expect("a valid configuration")
}

/// Milliseconds of dense f32, dense f16, sparse f32, sparse f16 and the seed's sparse decode.
fn decode_row(backend: &CpuBackend, s: &AttentionShape, t: usize, rounds: usize) -> [f64; 5] {
    let (w, kv) = (s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
    let (k, v) = (values(t * kv, 1), values(t * kv, 2));
    let q = values(w, 3);
    let configs = [
        config(KvType::F32, false),
        config(KvType::F16, false),
        config(KvType::F32, true),
        config(KvType::F16, true),
    ];
    let mut caches: Vec<KvCache> = configs
        .iter()
        .map(|c| {
            let mut cache = KvCache::with_config(&[t], kv, c);
            cache.append(0, &k, &v, t, 0);
            cache
        })
        .collect();
    let seed = seed();
    let mut seed_cache = SeedCache::new(t, s.n_head_kv, s.head_dim, SparsePattern::default().block);
    seed_cache
        .append_all(
            &tensor(&k, t, s.n_head_kv, s.head_dim),
            &tensor(&v, t, s.n_head_kv, s.head_dim),
        )
        .expect("the cache holds T positions");
    let q_seed = tensor(&q, 1, s.n_head, s.head_dim);
    let mut out = vec![0.0; w];
    let last = (t - 1) * kv;
    let mut samples = vec![Vec::new(); 5];
    for _ in 0..rounds {
        for (i, cache) in caches.iter_mut().enumerate() {
            samples[i].push(median_ms(20, || {
                backend.install(|| {
                    attention(
                        backend.isa(),
                        cache,
                        0,
                        &q,
                        &k[last..],
                        &v[last..],
                        1,
                        t - 1,
                        s,
                        &mut out,
                    )
                })
            }));
        }
        samples[4].push(median_ms(20, || {
            backend.install(|| {
                std::hint::black_box(seed.decode_step(&q_seed, &seed_cache).expect("decode"));
            })
        }));
    }
    std::array::from_fn(|i| median(&mut samples[i]))
}

/// Milliseconds of dense f32 (up to [`DENSE_PREFILL_MAX`]), sparse f32 and the seed's sparse
/// prefill.
fn prefill_row(
    backend: &CpuBackend,
    s: &AttentionShape,
    t: usize,
    rounds: usize,
) -> [Option<f64>; 3] {
    let (w, kv) = (s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
    let (q, k, v) = (values(t * w, 4), values(t * kv, 5), values(t * kv, 6));
    let seed = seed();
    let (qs, ks, vs) = (
        tensor(&q, t, s.n_head, s.head_dim),
        tensor(&k, t, s.n_head_kv, s.head_dim),
        tensor(&v, t, s.n_head_kv, s.head_dim),
    );
    let mut out = vec![0.0; t * w];
    let mut ours = |c: &AttentionConfig| -> f64 {
        let mut cache = KvCache::with_config(&[t], kv, c);
        let t0 = Instant::now();
        backend.install(|| attention(backend.isa(), &mut cache, 0, &q, &k, &v, t, 0, s, &mut out));
        t0.elapsed().as_secs_f64() * 1e3
    };
    let mut samples = vec![Vec::new(); 3];
    for _ in 0..rounds {
        if t <= DENSE_PREFILL_MAX {
            samples[0].push(ours(&config(KvType::F32, false)));
        }
        samples[1].push(ours(&config(KvType::F32, true)));
        let t0 = Instant::now();
        backend.install(|| std::hint::black_box(seed.forward_gqa(&qs, &ks, &vs).expect("prefill")));
        samples[2].push(t0.elapsed().as_secs_f64() * 1e3);
    }
    std::array::from_fn(|i| (!samples[i].is_empty()).then(|| median(&mut samples[i])))
}

fn tensor(x: &[f32], seq: usize, heads: usize, dim: usize) -> Tensor3 {
    Tensor3::from_vec(x.to_vec(), seq, heads, dim).expect("shape")
}

/// The median of `n` timings of `f`, in milliseconds.
fn median_ms(n: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..n)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    median(&mut v)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// `n` values in [−1, 1) (xorshift).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}
