//! Every DSL kernel run on a real WebGPU adapter (Mesa lavapipe in CI) against the CPU
//! backend's kernels, on sizes that are not multiples of the workgroup. Finding no adapter is
//! a failure, not a skip: CI installs lavapipe.

use hesper_cpu::ops;
use hesper_engine::config::Activation;
use hesper_gpu::{kernel_source, Gpu, KernelSource};

fn gpu() -> Gpu {
    Gpu::new().unwrap_or_else(|e| panic!("{e}"))
}

/// Deterministic test data in [-2, 2).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

fn run(gpu: &mut Gpu, k: &KernelSource, buffers: &[&wgpu::Buffer], groups: u32) {
    let mut batch = gpu.batch();
    batch
        .dispatch(gpu, k, buffers, [groups, 1, 1])
        .unwrap_or_else(|e| panic!("{e}"));
    gpu.submit(batch);
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f32::max)
}

#[test]
fn adapter_is_found_and_described() {
    let g = gpu();
    println!(
        "adapter: {} ({:?}, {:?})",
        g.info.name, g.info.backend, g.info.device_type
    );
    assert!(g.limits.max_compute_invocations_per_workgroup >= 256);
}

#[test]
fn add_and_gates_match_the_cpu() {
    let mut g = gpu();
    let n = 1000; // not a multiple of 256
    let (x, y) = (data(n, 1), data(n, 2));
    let (bx, by) = (g.storage("x", &x), g.storage("y", &y));
    let out = g.storage_zeroed::<f32>("out", n);
    let params = g.uniform("params", &[(n as u32).to_le_bytes()]);
    let groups = n.div_ceil(256) as u32;

    run(
        &mut g,
        &kernel_source!(hesper_shaders::add),
        &[&bx, &by, &out, &params],
        groups,
    );
    let got: Vec<f32> = g.read(&out, n).expect("read");
    let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    assert_eq!(got, want, "add is exact");

    for (k, act) in [
        (kernel_source!(hesper_shaders::relu2_mul), Activation::Relu2),
        (kernel_source!(hesper_shaders::silu_mul), Activation::Silu),
    ] {
        run(&mut g, &k, &[&bx, &by, &out, &params], groups);
        let got: Vec<f32> = g.read(&out, n).expect("read");
        let mut want = vec![0.0; n];
        ops::glu(&x, &y, n, act, &mut want);
        // ReLU² is the same three multiplications; SiLU's exp may differ by an ulp or two
        // between the GPU's and libm's implementations.
        let d = max_rel_diff(&got, &want);
        assert!(d <= 1e-6, "{}: max relative difference {d}", k.name);
    }
}

#[test]
fn rms_norm_matches_the_cpu() {
    let mut g = gpu();
    let (rows, width, eps) = (3usize, 1000usize, 1e-5f32);
    let (x, w) = (data(rows * width, 3), data(width, 4));
    let (bx, bw) = (g.storage("x", &x), g.storage("w", &w));
    let y = g.storage_zeroed::<f32>("y", rows * width);
    let params = g.uniform("params", &[(width as u32).to_le_bytes(), eps.to_le_bytes()]);
    run(
        &mut g,
        &kernel_source!(hesper_shaders::rms_norm),
        &[&bx, &bw, &y, &params],
        rows as u32,
    );
    let got: Vec<f32> = g.read(&y, rows * width).expect("read");
    let mut want = vec![0.0; rows * width];
    ops::rms_norm(&x, &w, rows, eps, &mut want);
    // The CPU sums squares in f64 in order; the GPU in f32 over a 256-way tree: the scale
    // differs by a few ulps (~1e-6 relative for 1000 terms).
    let d = max_rel_diff(&got, &want);
    assert!(d <= 1e-5, "rms_norm: max relative difference {d}");
}

#[test]
fn argmax_partial_finds_the_first_maximum() {
    let mut g = gpu();
    let n = 128_256; // the 2B4T vocabulary
    let mut logits = data(n, 5);
    logits[77_777] = 9.0;
    logits[100_001] = 9.0; // a tie: the first index wins
    let groups = 16u32;
    let per_thread = (n as u32).div_ceil(256 * groups);
    let bl = g.storage("logits", &logits);
    let (best, best_index) = (
        g.storage_zeroed::<f32>("best", groups as usize),
        g.storage_zeroed::<u32>("best_index", groups as usize),
    );
    let params = g.uniform(
        "params",
        &[(n as u32).to_le_bytes(), per_thread.to_le_bytes()],
    );
    run(
        &mut g,
        &kernel_source!(hesper_shaders::argmax_partial),
        &[&bl, &best, &best_index, &params],
        groups,
    );
    let vals: Vec<f32> = g.read(&best, groups as usize).expect("read");
    let idxs: Vec<u32> = g.read(&best_index, groups as usize).expect("read");
    // Second stage on the host: the first partial holding the maximum.
    let (mut bv, mut bi) = (f32::NEG_INFINITY, 0u32);
    for (&v, &i) in vals.iter().zip(&idxs) {
        if v > bv || (v == bv && i < bi) {
            (bv, bi) = (v, i);
        }
    }
    assert_eq!(bi, hesper_engine::sampler::argmax(logits.iter().copied()));
    assert_eq!(bi, 77_777);
}

#[test]
fn pipelines_are_cached_and_a_batch_is_one_submit() {
    let mut g = gpu();
    let n = 300;
    let x = g.storage("x", &data(n, 6));
    let out = g.storage_zeroed::<f32>("out", n);
    let params = g.uniform("params", &[(n as u32).to_le_bytes()]);
    let k = kernel_source!(hesper_shaders::add);
    let mut batch = g.batch();
    for _ in 0..5 {
        batch
            .dispatch(&mut g, &k, &[&x, &x, &out, &params], [2, 1, 1])
            .expect("dispatch");
    }
    assert_eq!(batch.dispatches(), 5);
    let before = g.submits();
    g.submit(batch);
    assert_eq!(g.submits(), before + 1);
    let stats = g.cache_stats();
    assert_eq!((stats.misses, stats.hits), (1, 4));
    let bad = batch_error(&mut g, &k, &[&x]);
    assert!(bad.contains("1 buffers given for 4 bindings"), "{bad}");
}

fn batch_error(g: &mut Gpu, k: &KernelSource, buffers: &[&wgpu::Buffer]) -> String {
    let mut batch = g.batch();
    batch
        .dispatch(g, k, buffers, [1, 1, 1])
        .expect_err("mismatched buffers")
        .to_string()
}

#[test]
fn rope_matches_the_cpu() {
    use hesper_engine::backend::RopeShape;
    let mut g = gpu();
    // 7 tokens from position 5, 3 heads of 64 with 48 rotated dims (a partial rotation).
    let (n, pos0) = (7usize, 5usize);
    let shape = RopeShape {
        n_head: 3,
        head_dim: 64,
        rope_dim: 48,
        base: 500000.0,
    };
    let x = data(n * shape.n_head * shape.head_dim, 7);
    let bx = g.storage("x", &x);
    let cs = g.storage("cs", &shape.angles(pos0, n));
    let params = g.uniform("params", &[n as u32, 3, 64, 48].map(u32::to_le_bytes));
    let pairs = (n * shape.n_head * shape.rope_dim / 2) as u32;
    run(
        &mut g,
        &kernel_source!(hesper_shaders::rope_neox),
        &[&bx, &cs, &params],
        pairs.div_ceil(64),
    );
    let got: Vec<f32> = g.read(&bx, x.len()).expect("read");
    let mut want = x.clone();
    ops::rope(&mut want, n, pos0, &shape);
    // Same angles and the same two products per output; a GPU may fuse them into one FMA.
    let d = max_rel_diff(&got, &want);
    assert!(d <= 1e-6, "rope: max relative difference {d}");
}

#[test]
fn bitlinear_i2s_matches_the_cpu() {
    use hesper_cpu::{kernels::Isa, quant::quantize_i8_row};
    let mut g = gpu();
    // 37 rows of 640 weights (5 groups of 128): odd against the workgroup of 256.
    let (rows, cols, beta) = (37usize, 640usize, 0.0371f32);
    let mut s = 11u64;
    let codes: Vec<u8> = (0..rows * cols / 4)
        .map(|_| {
            (0..4).fold(0u8, |b, k| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                b | ((((s >> 33) % 3) as u8) << (2 * k))
            })
        })
        .collect();
    let act = quantize_i8_row(&data(cols, 12));
    let q: Vec<i32> = act.q.iter().map(|&v| i32::from(v)).collect();
    let words: Vec<u32> = codes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let (bc, bq) = (g.storage("codes", &words), g.storage("q", &q));
    let out = g.storage_zeroed::<f32>("out", rows);
    let params = g.uniform(
        "params",
        &[
            (cols as u32).to_le_bytes(),
            beta.to_le_bytes(),
            act.scale.to_le_bytes(),
            act.sum.to_le_bytes(),
        ],
    );
    run(
        &mut g,
        &kernel_source!(hesper_shaders::bitlinear_i2s),
        &[&bc, &bq, &out, &params],
        rows as u32,
    );
    let got: Vec<f32> = g.read(&out, rows).expect("read");
    let want: Vec<f32> = codes
        .chunks_exact(cols / 4)
        .map(|row| (Isa::Scalar.i2s_code_dot(row, &act.q) - act.sum) as f32 / act.scale * beta)
        .collect();
    // The integer sums are exact; only the f32 division may differ (WGSL allows 2.5 ulp).
    let d = max_rel_diff(&got, &want);
    assert!(d <= 1e-6, "bitlinear_i2s: max relative difference {d}");
}
