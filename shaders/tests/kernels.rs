//! Every kernel of `hesper-shaders` run on a real WebGPU adapter (Mesa lavapipe in CI) against
//! the CPU backend's reference functions, on sizes that are not multiples of the workgroup.
//! Finding no adapter is a failure, not a skip: CI installs lavapipe.
//!
//! Each comparison states its tolerance and why; the measured maximum is printed (run with
//! `--nocapture`).

use std::ops::Range;

use hesper_cpu::attention::{self, KvCache};
use hesper_cpu::kernels::scalar::{bf16_dot, f16_dot, f32_dot, i2s_code_dot, q8_0_dot, tq2_0_dot};
use hesper_cpu::ops;
use hesper_cpu::quant::{
    quantize_i8_row, quantize_q8_0, quantize_q8_k, round_bf16, round_f16, I8Row, QK_K,
};
use hesper_cpu::Isa;
use hesper_engine::backend::{AttentionShape, RopeShape};
use hesper_engine::config::Activation;
use hesper_engine::formats::{i2s_code, q8_0_block, tq2_0_code, TQ2_0_BLOCK_BYTES};
use hesper_engine::weights::{decode_row, Format};
use hesper_gpu::{Gpu, GpuBuffer, KernelArgs};
use hesper_shaders as k;

/// Opens the adapter; no adapter is a test failure.
fn gpu() -> Gpu {
    let g = Gpu::new().unwrap_or_else(|e| panic!("a WebGPU adapter is required: {e}"));
    println!(
        "adapter: {} ({:?}, {:?})",
        g.info.name, g.info.backend, g.info.device_type
    );
    g
}

/// One launch in its own batch and submit.
fn launch<A: KernelArgs>(g: &mut Gpu, args: &A, grid: [u32; 3]) {
    let mut b = g.batch();
    b.run(g, args, grid)
        .unwrap_or_else(|e| panic!("{}: {e}", A::SOURCE.name));
    g.submit(b)
        .unwrap_or_else(|e| panic!("{}: {e}", A::SOURCE.name));
}

/// Reads a whole buffer back (a macro: the element bound is `bytemuck::Pod`, which this
/// crate does not name).
macro_rules! read {
    ($g:expr, $b:expr) => {{
        let b = $b;
        $g.read(b, b.len()).unwrap_or_else(|e| panic!("read: {e}"))
    }};
}

/// A small LCG: deterministic test data.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
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

/// Random normal f16 bit patterns with exponents `exp` (biased), either sign.
fn f16_bits(n: usize, seed: u64, exp: std::ops::RangeInclusive<u16>) -> Vec<u16> {
    let mut r = Lcg(seed);
    let span = u64::from(exp.end() - exp.start() + 1);
    (0..n)
        .map(|_| {
            let x = r.next();
            let sign = ((x & 1) as u16) << 15;
            let e = exp.start() + ((x >> 1) % span) as u16;
            sign | (e << 10) | ((x >> 8) & 0x3ff) as u16
        })
        .collect()
}

/// f16 bit patterns widened to f32 by the engine's row decoder.
fn f16_to_f32(bits: &[u16]) -> Vec<f32> {
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let mut out = vec![0.0; bits.len()];
    decode_row(Format::F16, &bytes, &mut out);
    out
}

/// f16 pairs in u32 words, the lower element in the low half.
fn pack_f16(bits: &[u16]) -> Vec<u32> {
    bits.chunks_exact(2)
        .map(|p| u32::from(p[0]) | (u32::from(p[1]) << 16))
        .collect()
}

/// Bytes as little-endian u32 words.
fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Max over `i` of `|a[i] − b[i]| / scale(i)`, after checking the lengths agree and every GPU
/// value (`a`) is finite.
fn max_diff(a: &[f32], b: &[f32], scale: impl Fn(usize) -> f32) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .enumerate()
        .map(|(i, (x, y))| {
            assert!(x.is_finite(), "non-finite GPU value {x}");
            (x - y).abs() / scale(i)
        })
        .fold(0.0, f32::max)
}

/// `|a − b| / max(|b|, 1)`: relative for large values, absolute below 1.
fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    max_diff(a, b, |i| b[i].abs().max(1.0))
}

/// Max `|a − b|`.
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    max_diff(a, b, |_| 1.0)
}

/// Distance in units in the last place between two finite f32 of the same sign.
fn ulps(a: f32, b: f32) -> u32 {
    assert_eq!(a.is_sign_negative(), b.is_sign_negative(), "{a} vs {b}");
    a.to_bits().abs_diff(b.to_bits())
}

/// Prints a test's measured error `e` (described by `what`) and asserts it is within `bound`.
fn assert_within(name: &str, what: &str, e: f32, bound: f32) {
    println!("{name}: max {what} {e:e}");
    assert!(e <= bound, "{name}: max {what} {e}");
}

/// Marks output the kernels must not touch.
const SENTINEL: f32 = -7.25;

/// An output of `n` tokens × `width` columns filled with [`SENTINEL`].
fn sentinel_out(g: &Gpu, n: usize, width: usize) -> GpuBuffer<f32> {
    g.upload("out", &vec![SENTINEL; n * width])
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The `[n][rows]` window at columns `row0..row0+rows` of a `[n][width]` output, after
/// checking every column outside it still holds [`SENTINEL`].
fn window(got: &[f32], n: usize, width: usize, row0: usize, rows: usize) -> Vec<f32> {
    assert_eq!(got.len(), n * width);
    let mut out = Vec::with_capacity(n * rows);
    for t in 0..n {
        for c in 0..width {
            let v = got[t * width + c];
            if (row0..row0 + rows).contains(&c) {
                out.push(v);
            } else {
                assert_eq!(
                    v.to_bits(),
                    SENTINEL.to_bits(),
                    "token {t} column {c} outside the window {row0}..{}",
                    row0 + rows
                );
            }
        }
    }
    out
}

/// Output widths and window offsets every matrix kernel is launched with: the whole output
/// (`row0 = 0`), then a window of the same rows at an offset inside a wider output.
const WINDOWS: [(usize, usize); 2] = [(0, 0), (9, 13)];

/// Threads per row the matrix kernels are launched with: one (64 rows a workgroup, the last
/// workgroup partly past the window), a few, and a full wave of 32 (two rows a workgroup).
const LANES: [u32; 3] = [1, 4, 32];

/// A matrix-kernel test: kernel `name` takes `n` tokens through `rows` rows of `cols` weights.
#[derive(Clone, Copy)]
struct Matrix {
    name: &'static str,
    rows: usize,
    cols: usize,
    n: usize,
}

impl Matrix {
    /// Kernel `name` on `n` tokens through `rows` rows of `cols` weights.
    fn new(name: &'static str, rows: usize, cols: usize, n: usize) -> Self {
        Matrix {
            name,
            rows,
            cols,
            n,
        }
    }
}

/// One launch of a [`Matrix`] test: its rows written at columns `row0..row0 + rows` of a
/// `[n][width]` output, `lanes` threads a row, by the kernel's decode instance or (`wide`) its
/// wide-step one.
#[derive(Clone, Copy)]
struct Placement {
    m: Matrix,
    row0: usize,
    width: usize,
    lanes: u32,
    wide: bool,
}

/// `launch_matrix!(g, out, placement, out_scale; kernel | kernel_wide { field: value, .. })`
/// launches matrix kernel `k::kernel` (or its wide-step instance `k::kernel_wide` where the
/// placement says `wide`) with its own buffers (the fields) at a [`Placement`], storing
/// (`k::STORE`) its sums times `out_scale` into `out`. A macro: every matrix kernel has its own
/// `Args` struct; they share the window, output and scale fields filled in here.
macro_rules! launch_matrix {
    ($g:expr, $out:expr, $p:expr, $out_scale:expr;
     $kernel:ident | $wide:ident { $($field:ident: $value:expr),* $(,)? }) => {{
        let p: Placement = $p;
        if p.wide {
            launch_matrix!(@one $g, $out, p, $out_scale; $wide { $($field: $value),* })
        } else {
            launch_matrix!(@one $g, $out, p, $out_scale; $kernel { $($field: $value),* })
        }
    }};
    (@one $g:expr, $out:expr, $p:expr, $out_scale:expr;
     $kernel:ident { $($field:ident: $value:expr),* }) => {{
        let p: Placement = $p;
        // Written only by joined Q/K/V matrices (`k::SPLIT_QKV`).
        let (mut unused_k, mut unused_v) = (
            $g.zeroed("unused", 1).expect("buffer"),
            $g.zeroed("unused", 1).expect("buffer"),
        );
        launch(
            $g,
            &k::$kernel::Args {
                $($field: $value,)*
                out: $out,
                out_k: &mut unused_k,
                out_v: &mut unused_v,
                cols: p.m.cols as u32,
                rows: p.width as u32,
                row0: p.row0 as u32,
                window_rows: p.m.rows as u32,
                n: p.m.n as u32,
                lanes: p.lanes,
                mode: k::STORE,
                out_scale: $out_scale,
                out_scale_odd: 0.0,
                split_k: p.width as u32,
                split_v: p.width as u32,
                out_scale_v: 0.0,
            },
            k::matrix_grid(
                p.m.rows as u32,
                p.lanes,
                p.m.n as u32,
                k::$kernel::TILE,
                k::$kernel::ROWS,
            ),
        )
    }};
}

/// `launch_tiled!(g, out, placement, out_scale; kernel { field: value, .. })` launches tiled
/// kernel `k::kernel` (`gemm.rs`) over its grid at a [`Placement`] (its `wide` unused), storing
/// its sums times `out_scale` into `out`, as [`launch_matrix!`] does for the matrix-vector
/// kernels.
macro_rules! launch_tiled {
    ($g:expr, $out:expr, $p:expr, $out_scale:expr;
     $kernel:ident { $($field:ident: $value:expr),* $(,)? }) => {
        launch_tiled!($g, $out, $p, $out_scale, 0.0, k::STORE;
            $kernel { $($field: $value),* })
    };
    // In output mode `$mode`, odd rows scaled by `$out_scale_odd` (gate/up pairs).
    ($g:expr, $out:expr, $p:expr, $out_scale:expr, $out_scale_odd:expr, $mode:expr;
     $kernel:ident { $($field:ident: $value:expr),* $(,)? }) => {
        launch_tiled!(@grid k::gemm_grid; $g, $out, $p, $out_scale, $out_scale_odd, $mode;
            $kernel { $($field: $value),* })
    };
    // In the grid `$grid` lays out (a kernel whose tile is not the tiled kernels').
    (@grid $grid:path; $g:expr, $out:expr, $p:expr, $out_scale:expr, $out_scale_odd:expr,
     $mode:expr; $kernel:ident { $($field:ident: $value:expr),* $(,)? }) => {{
        let p: Placement = $p;
        let (mut unused_k, mut unused_v) = (
            $g.zeroed("unused", 1).expect("buffer"),
            $g.zeroed("unused", 1).expect("buffer"),
        );
        launch(
            $g,
            &k::$kernel::Args {
                $($field: $value,)*
                out: $out,
                out_k: &mut unused_k,
                out_v: &mut unused_v,
                cols: p.m.cols as u32,
                rows: p.width as u32,
                row0: p.row0 as u32,
                window_rows: p.m.rows as u32,
                n: p.m.n as u32,
                mode: $mode,
                out_scale: $out_scale,
                out_scale_odd: $out_scale_odd,
                split_k: p.width as u32,
                split_v: p.width as u32,
                out_scale_v: 0.0,
            },
            $grid(p.m.rows as u32, p.m.n as u32),
        )
    }};
}

/// Runs a tiled kernel (`tiled`, with [`launch_tiled!`]) and the wide-step instance of its
/// matrix-vector kernel (`wide`) at every window of [`WINDOWS`] and every lane count of
/// [`LANES`] (the lanes' order a tiled kernel must follow): both within `bound` of the reference by
/// `error`, and the same bits.
fn sweep_tiled(
    g: &mut Gpu,
    m: Matrix,
    mut tiled: impl FnMut(&mut Gpu, &mut GpuBuffer<f32>, Placement),
    mut wide: impl FnMut(&mut Gpu, &mut GpuBuffer<f32>, Placement),
    error: impl Fn(&[f32]) -> f32,
    what: &str,
    bound: f32,
) {
    for ((row0, extra), lanes) in WINDOWS.into_iter().flat_map(|w| LANES.map(|l| (w, l))) {
        let width = row0 + m.rows + extra;
        let p = Placement {
            m,
            row0,
            width,
            lanes,
            wide: true,
        };
        let mut results = Vec::new();
        for is_tiled in [false, true] {
            let mut out = sentinel_out(g, m.n, width);
            if is_tiled {
                tiled(g, &mut out, p);
            } else {
                wide(g, &mut out, p);
            }
            let got = window(&read!(g, &out), m.n, width, row0, m.rows);
            let kernel = if is_tiled { "tiled" } else { "wide" };
            let name = format!(
                "{} {kernel} (row0 {row0}, width {width}, {lanes} lanes)",
                m.name
            );
            assert_within(&name, what, error(&got), bound);
            results.push(bits(&got));
        }
        assert!(
            results[0] == results[1],
            "{}: the tiled kernel differs from the wide-step instance (row0 {row0}, {lanes} lanes)",
            m.name
        );
    }
}

/// Runs a matrix kernel at every window of [`WINDOWS`] with every lane count of [`LANES`], its
/// decode and its wide-step instance: `run` launches it (with [`launch_matrix!`]) into a fresh
/// [`SENTINEL`]-filled output; then nothing outside the window may have been written, `error`
/// of the window's `[n][rows]` values (`what`, for the report) must be within `bound`, and the
/// two instances must agree bit for bit (the same sums in the same order: which one a step
/// runs may never change a row).
fn sweep_matrix(
    g: &mut Gpu,
    m: Matrix,
    mut run: impl FnMut(&mut Gpu, &mut GpuBuffer<f32>, Placement),
    error: impl Fn(&[f32]) -> f32,
    what: &str,
    bound: f32,
) {
    for ((row0, extra), lanes) in WINDOWS.into_iter().flat_map(|w| LANES.map(|l| (w, l))) {
        let width = row0 + m.rows + extra;
        let mut results = Vec::new();
        for wide in [false, true] {
            let mut out = sentinel_out(g, m.n, width);
            let p = Placement {
                m,
                row0,
                width,
                lanes,
                wide,
            };
            run(g, &mut out, p);
            let got = window(&read!(g, &out), m.n, width, row0, m.rows);
            let instance = if wide { "wide" } else { "decode" };
            let name = format!(
                "{} {instance} (row0 {row0}, width {width}, {lanes} lanes)",
                m.name
            );
            assert_within(&name, what, error(&got), bound);
            results.push(bits(&got));
        }
        assert!(
            results[0] == results[1],
            "{}: the wide-step instance differs from the decode one (row0 {row0}, {lanes} lanes)",
            m.name
        );
    }
}

#[test]
fn adapter_is_found() {
    let g = gpu();
    assert!(g.limits.max_compute_invocations_per_workgroup >= 256);
}

/// The arguments of `x += y` over the first `n` values.
fn add_assign_args<'a>(
    x: &'a mut GpuBuffer<f32>,
    y: &'a GpuBuffer<f32>,
    n: usize,
) -> k::add_assign::Args<'a> {
    k::add_assign::Args { x, y, n: n as u32 }
}

#[test]
fn add_assign_is_exact() {
    let mut g = gpu();
    let n = 1000; // not a multiple of 256
    let (x, y) = (data(n, 1), data(n, 2));
    let mut bx = g.upload("x", &x).unwrap();
    let by = g.upload("y", &y).unwrap();
    let grid = k::add_assign::grid_for(n as u32);
    launch(&mut g, &add_assign_args(&mut bx, &by, n), grid);
    let got = read!(g, &bx);
    let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    // One correctly rounded f32 addition on both sides: bit-exact.
    println!("add_assign: max abs diff {}", max_abs_diff(&got, &want));
    assert_eq!(got, want, "add_assign");
}

#[test]
fn views_bind_read_and_write_their_own_elements() {
    let mut g = gpu();
    // Views of the second and third of four parts, each a multiple of the alignment.
    let part = g.limits.min_storage_buffer_offset_alignment as usize / 4 * 3;
    let all = data(4 * part, 3);
    let whole = g.upload("parts", &all).unwrap();
    assert!(
        g.view(&whole, 1, part).is_none(),
        "a view off the alignment"
    );
    assert!(
        g.view(&whole, 3 * part, part + 1).is_none(),
        "a view past the end"
    );
    let (Some(second), Some(mut third)) =
        (g.view(&whole, part, part), g.view(&whole, 2 * part, part))
    else {
        panic!("aligned views refused");
    };
    // A kernel binds the view's elements alone (read-only: wgpu tracks a buffer's use whole, so
    // one launch cannot also write another part of it).
    let x = data(part, 4);
    let mut bx = g.upload("x", &x).unwrap();
    launch(
        &mut g,
        &add_assign_args(&mut bx, &second, part),
        k::add_assign::grid_for(part as u32),
    );
    let sums: Vec<f32> = (0..part).map(|i| x[i] + all[part + i]).collect();
    assert_eq!(read!(g, &bx), sums);
    // Writes and reads land in the view's own elements.
    g.write(&mut third, 1, &[0.5]).unwrap();
    assert_eq!(read!(g, &third)[..2], [all[2 * part], 0.5]);
    let mut want = all.clone();
    want[2 * part + 1] = 0.5;
    assert_eq!(read!(g, &whole), want, "the other parts are untouched");
}

#[test]
fn qkv_biases_are_added_in_one_launch() {
    let mut g = gpu();
    // Three rows of 72 query and 24 key/value values: 504 threads, the last workgroup partly
    // past the values' end.
    let (n, qw, kvw) = (3, 72, 24);
    let (q, kx, v) = (data(n * qw, 3), data(n * kvw, 4), data(n * kvw, 5));
    let (bq, bk, bv) = (data(qw, 6), data(kvw, 7), data(kvw, 8));
    let mut gq = g.upload("q", &q).unwrap();
    let mut gk = g.upload("k", &kx).unwrap();
    let mut gv = g.upload("v", &v).unwrap();
    let (gbq, gbk, gbv) = (
        g.upload("bq", &bq).unwrap(),
        g.upload("bk", &bk).unwrap(),
        g.upload("bv", &bv).unwrap(),
    );
    let args = k::add_qkv_bias::Args {
        q: &mut gq,
        k: &mut gk,
        v: &mut gv,
        bq: &gbq,
        bk: &gbk,
        bv: &gbv,
        q_width: qw as u32,
        kv_width: kvw as u32,
        n: n as u32,
    };
    launch(
        &mut g,
        &args,
        k::add_qkv_bias::grid_for((n * (qw + 2 * kvw)) as u32),
    );
    let biased = |x: &[f32], b: &[f32]| -> Vec<f32> {
        x.iter()
            .enumerate()
            .map(|(i, a)| a + b[i % b.len()])
            .collect()
    };
    // One correctly rounded addition each, as `add_bias` does: bit-exact.
    assert_eq!(read!(g, &gq), biased(&q, &bq), "queries");
    assert_eq!(read!(g, &gk), biased(&kx, &bk), "keys");
    assert_eq!(read!(g, &gv), biased(&v, &bv), "values");
}

#[test]
fn interleaved_rows_cover_a_pair_larger_than_their_grid() {
    let mut g = gpu();
    // 13 rows of 101 words each (2626 output words): a grid of 3 workgroups (768 threads)
    // walks them four times, the last time in part; and a grid covering every word once.
    let (rows, row_words) = (13usize, 101usize);
    let mut lcg = Lcg(5);
    let a: Vec<u32> = (0..rows * row_words).map(|_| lcg.next() as u32).collect();
    let b: Vec<u32> = (0..rows * row_words).map(|_| lcg.next() as u32).collect();
    let want: Vec<u32> = (0..2 * rows)
        .flat_map(|r| {
            let src = if r % 2 == 0 { &a } else { &b };
            src[r / 2 * row_words..][..row_words].to_vec()
        })
        .collect();
    let (ga, gb) = (g.upload("a", &a).unwrap(), g.upload("b", &b).unwrap());
    let words = (2 * rows * row_words) as u32;
    for groups in [3, k::interleave_rows::grid_for(words)[0]] {
        let mut out = g.zeroed::<u32>("out", want.len()).unwrap();
        let args = k::interleave_rows::Args {
            a: &ga,
            b: &gb,
            out: &mut out,
            row_words: row_words as u32,
            rows: rows as u32,
            stride: groups * k::interleave_rows::WORKGROUP_SIZE,
        };
        launch(&mut g, &args, [groups, 1, 1]);
        assert_eq!(read!(g, &out), want, "{groups} workgroups");
    }
}

#[test]
fn gated_activations_match_glu() {
    let mut g = gpu();
    let n = 1000; // not a multiple of 256
    let grid = k::relu2_mul::grid_for(n as u32);
    let acts = [
        Activation::Relu2,
        Activation::Silu,
        Activation::GeluTanh,
        Activation::SwigluClamped,
    ];
    for act in acts {
        // Values in ±2, in ±10 for the clamped SwiGLU (past its limit of 7 on both sides).
        let spread = if act == Activation::SwigluClamped {
            5.0
        } else {
            1.0
        };
        let (gate, up): (Vec<f32>, Vec<f32>) = (
            data(n, 3).iter().map(|v| v * spread).collect(),
            data(n, 4).iter().map(|v| v * spread).collect(),
        );
        let bg = g.upload("gate", &gate).unwrap();
        let bu = g.upload("up", &up).unwrap();
        let mut out = g.zeroed::<f32>("out", n).unwrap();
        /// Launches gated-activation kernel `k::$kernel` on `gate` and `up` into `out`.
        macro_rules! glu {
            ($kernel:ident) => {{
                let args = k::$kernel::Args {
                    gate: &bg,
                    up: &bu,
                    out: &mut out,
                    n: n as u32,
                };
                launch(&mut g, &args, grid)
            }};
        }
        match act {
            Activation::Relu2 => glu!(relu2_mul),
            Activation::Silu => glu!(silu_mul),
            Activation::GeluTanh => glu!(gelu_mul),
            Activation::SwigluClamped => glu!(swiglu_clamped_mul),
        }
        let got = read!(g, &out);
        let mut want = vec![0.0; n];
        ops::glu(&gate, &up, n, act, &mut want);
        let d = max_rel_diff(&got, &want);
        println!("{act:?}·up: max relative diff {d:e}");
        match act {
            // max, then two correctly rounded multiplications (no add to contract into an
            // FMA): bit-exact.
            Activation::Relu2 => assert_eq!(got, want, "relu2_mul"),
            // WGSL allows exp 3 + 2|x| ulp (|x| < 2 here: 7 ulp) and the division 2.5 ulp;
            // through 1 + e^(−g) and the final products that stays below ~1e-6 relative.
            Activation::Silu => assert!(d <= 1e-6, "silu_mul: max relative diff {d}"),
            // The same exp and division, of 2u = 2·√(2/π)·(g + 0.044715·g³) (|2u| < 5 here):
            // exp's allowance grows to 13 ulp.
            Activation::GeluTanh => assert!(d <= 2e-6, "gelu_mul: max relative diff {d}"),
            // SiLU's exp and division, of 1.702·g (|g| ≤ 7 after the cap: |x| < 12, exp's
            // allowance 27 ulp), times u + 1.
            Activation::SwigluClamped => {
                assert!(d <= 4e-6, "swiglu_clamped_mul: max relative diff {d}")
            }
        }
    }
}

/// The mixture's weighted sum: 5 rows of 300 (not a multiple of 256), 3 experts a row, each
/// row's outputs weighted and added in the order chosen, as the CPU backend's experts add them
/// (`o = y₀·w₀`, then `o += yᵣ·wᵣ`): within an ulp or two of a possibly fused multiply-add.
#[test]
fn moe_combine_weighs_each_rows_experts_in_order() {
    let mut g = gpu();
    let (n, width, n_used) = (5usize, 300usize, 3usize);
    let ys = data(n * n_used * width, 40);
    let w: Vec<f32> = data(n * n_used, 41).iter().map(|v| v.abs() + 0.1).collect();
    let (bys, bw) = (g.upload("ys", &ys).unwrap(), g.upload("w", &w).unwrap());
    // Each output's expert, for the biased sum below.
    let chosen: Vec<u32> = (0..n * n_used).map(|k| (k * 5 % 4) as u32).collect();
    let ids = g.upload("ids", &chosen).unwrap();
    let mut out = g.zeroed::<f32>("out", n * width).unwrap();
    let len = (n * width) as u32;
    launch(
        &mut g,
        &k::moe_combine::Args {
            ys: &bys,
            w: &bw,
            ids: &ids,
            bias: &bw,
            out: &mut out,
            width: width as u32,
            n_used: n_used as u32,
            biased: 0,
            add: 0,
            pos_at: 0,
            n: len,
        },
        k::moe_combine::grid_for(len),
    );
    let got = read!(g, &out);
    let mut want = vec![0.0f32; n * width];
    for (t, o) in want.chunks_exact_mut(width).enumerate() {
        for r in 0..n_used {
            let k = t * n_used + r;
            for (c, o) in o.iter_mut().enumerate() {
                *o += ys[k * width + c] * w[k];
            }
        }
    }
    let d = max_rel_diff(&got, &want);
    assert!(d <= 1e-6, "moe_combine: max relative diff {d}");
    // Added to a residual: the sum stored, then added (`add_assign`), bit for bit.
    let residual = data(n * width, 42);
    let mut added = g.upload("residual", &residual).unwrap();
    launch(
        &mut g,
        &k::moe_combine::Args {
            ys: &bys,
            w: &bw,
            ids: &ids,
            bias: &bw,
            out: &mut added,
            width: width as u32,
            n_used: n_used as u32,
            biased: 0,
            add: 1,
            pos_at: 0,
            n: len,
        },
        k::moe_combine::grid_for(len),
    );
    let mut stored = g.upload("residual", &residual).unwrap();
    launch(
        &mut g,
        &add_assign_args(&mut stored, &out, n * width),
        k::add_assign::grid_for(len),
    );
    assert!(bits(&read!(g, &added)) == bits(&read!(g, &stored)));
    // Each output plus its expert's bias (4 experts' stacked): the biases added first, bit
    // for bit.
    let bias = data(4 * width, 43);
    let biased: Vec<f32> = (0..n * n_used * width)
        .map(|i| ys[i] + bias[chosen[i / width] as usize * width + i % width])
        .collect();
    let (bbias, bbiased) = (
        g.upload("bias", &bias).unwrap(),
        g.upload("ys + bias", &biased).unwrap(),
    );
    let mut sums = [
        g.zeroed::<f32>("out", n * width).unwrap(),
        g.zeroed::<f32>("out", n * width).unwrap(),
    ];
    for (i, out) in sums.iter_mut().enumerate() {
        launch(
            &mut g,
            &k::moe_combine::Args {
                ys: [&bys, &bbiased][i],
                w: &bw,
                ids: &ids,
                bias: &bbias,
                out,
                width: width as u32,
                n_used: n_used as u32,
                biased: [1, 0][i],
                add: 0,
                pos_at: 0,
                n: len,
            },
            k::moe_combine::grid_for(len),
        );
    }
    assert!(bits(&read!(g, &sums[0])) == bits(&read!(g, &sums[1])));
}

/// `moe_route` chooses each row's experts as `Experts::route` does — the same ids in the same
/// order, ties to the lower id (rows 3 and 4 hold equal logits) — with weights within 1e-6
/// relative (the GPU's softmax sums in f32 where the CPU's sums in f64; `exp` within WGSL's
/// error), renormalized or not, scaled.
#[test]
fn moe_route_chooses_as_the_host_routes() {
    let mut g = gpu();
    let (n, n_expert) = (6usize, 11usize);
    let mut logits = data(n * n_expert, 42);
    logits[3 * n_expert..4 * n_expert].fill(0.5);
    for e in [2, 5, 9] {
        logits[4 * n_expert + e] = 1.25;
    }
    let bl = g.upload("logits", &logits).unwrap();
    for (n_used, normalize, scale) in [(3usize, true, 1.0f32), (4, false, 2.5), (1, true, 1.0)] {
        let routing = hesper_engine::config::Experts {
            n_expert,
            n_used,
            n_ff: 1,
            normalize,
            scale,
        };
        let mut ids = g.zeroed::<u32>("ids", n * n_used).unwrap();
        let mut w = g.zeroed::<f32>("w", n * n_used).unwrap();
        launch(
            &mut g,
            &k::moe_route::Args {
                logits: &bl,
                ids: &mut ids,
                w: &mut w,
                n_expert: n_expert as u32,
                n_used: n_used as u32,
                normalize: normalize.into(),
                scale,
                n: n as u32,
            },
            k::moe_route::grid_for(n as u32),
        );
        let (ids, w) = (read!(g, &ids), read!(g, &w));
        let want = routing.routes(&logits).chosen;
        let want_ids: Vec<u32> = want.iter().flatten().map(|&(e, _)| e as u32).collect();
        let want_w: Vec<f32> = want.iter().flatten().map(|&(_, w)| w).collect();
        assert_eq!(ids, want_ids, "top {n_used}");
        let d = max_rel_diff(&w, &want_w);
        assert!(
            d <= 1e-6,
            "moe_route top {n_used}: weights' max relative diff {d}"
        );
    }
}

/// `moe_group` writes the tables its doc states, checked against a host grouping: each
/// expert's pairs in order, its run padded to whole tiles with its last pair, the runs expert
/// by expert, the slots past them given no expert, and every pair's slot. Cases: experts no
/// pair chose, a run of exactly a tile, runs of two tiles and more, a layer of the most
/// experts (256, every thread one), and one pair.
#[test]
fn moe_group_sorts_the_pairs_by_expert_into_whole_tiles() {
    let mut g = gpu();
    let tile = 64usize;
    let mut cases: Vec<(usize, Vec<u32>)> = Vec::new();
    // 8 experts: expert 3 none, expert 1 exactly a tile, expert 6 three tiles and a bit.
    let mut ids: Vec<u32> = (0..300u32)
        .map(|p| [0, 2, 4, 5, 7][(p * 7 % 11) as usize % 5])
        .collect();
    ids.extend(std::iter::repeat_n(1, 64));
    ids.extend(std::iter::repeat_n(6, 200));
    let mixed: Vec<usize> = (0..ids.len()).map(|p| p * 131 % ids.len()).collect();
    cases.push((8, mixed.iter().map(|&p| ids[p]).collect()));
    cases.push((256, (0..1000u32).map(|p| p * 37 % 256 / 2 * 2).collect()));
    cases.push((4, vec![3]));
    for (n_expert, ids) in cases {
        let pairs = ids.len();
        let slots = tile * (pairs.div_ceil(tile) + pairs.min(n_expert));
        let mut words = ids.clone();
        words.resize(pairs + 2 * slots + pairs, u32::MAX);
        let mut buf = g.upload("ids", &words).unwrap();
        launch(
            &mut g,
            &k::moe_group::Args {
                ids: &mut buf,
                n_expert: n_expert as u32,
                pairs: pairs as u32,
                slots: slots as u32,
                tile: tile as u32,
            },
            [1, 1, 1],
        );
        let got = read!(g, &buf);
        let (mut order, mut gid, mut pos) = (Vec::new(), Vec::new(), vec![u32::MAX; pairs]);
        for e in 0..n_expert as u32 {
            let run: Vec<u32> = (0..pairs as u32)
                .filter(|&p| ids[p as usize] == e)
                .collect();
            for &p in &run {
                pos[p as usize] = order.len() as u32;
                order.push(p);
            }
            let padded = run.len().div_ceil(tile) * tile;
            order.extend(std::iter::repeat_n(
                *run.last().unwrap_or(&0),
                padded - run.len(),
            ));
            gid.resize(order.len(), e);
        }
        assert!(
            order.len() <= slots,
            "{n_expert} experts: the bound on slots"
        );
        order.resize(slots, 0);
        gid.resize(slots, n_expert as u32);
        assert_eq!(
            &got[..pairs],
            &ids[..],
            "{n_expert} experts: the router's ids kept"
        );
        assert_eq!(
            &got[pairs..pairs + slots],
            &order[..],
            "{n_expert} experts: order"
        );
        assert_eq!(
            &got[pairs + slots..pairs + 2 * slots],
            &gid[..],
            "{n_expert} experts: gid"
        );
        assert_eq!(
            &got[pairs + 2 * slots..],
            &pos[..],
            "{n_expert} experts: pos"
        );
    }
}

/// Launches behind a gate run where `gate_grids` finds their expert among the chosen ids and
/// not elsewhere: three "experts" each add their own value to a buffer behind a gate of two
/// slots (one launch used), ids [2, 0] choose experts 0 and 2; expert 1's add never runs.
#[test]
fn gated_launches_run_only_for_the_chosen_experts() {
    let mut g = gpu();
    let len = 300usize;
    let (slots, per_expert) = (2usize, 6u32);
    let ones = g.upload("ones", &vec![1.0f32; len]).unwrap();
    let ids = g.upload("ids", &[2u32, 0]).unwrap();
    let mut grids = g.zeroed::<u32>("grids", 3 * slots * 3).unwrap();
    let mut args = g.indirect_args("args", 3 * slots * 3).unwrap();
    let mut xs: Vec<GpuBuffer<f32>> = (0..3).map(|_| g.zeroed("x", len).unwrap()).collect();
    let mut b = g.batch();
    b.run(
        &mut g,
        &k::gate_grids::Args {
            grids: &grids,
            ids: &ids,
            args: &mut args,
            per_expert,
            n_ids: 2,
            n: (3 * slots * 3) as u32,
        },
        k::gate_grids::grid_for((3 * slots * 3) as u32),
    )
    .unwrap();
    let mut table = vec![0u32; 3 * slots * 3];
    for (e, x) in xs.iter_mut().enumerate() {
        b.open_gate(&args, e * slots, slots).unwrap();
        let grid = k::add_assign::grid_for(len as u32);
        b.run(
            &mut g,
            &k::add_assign::Args {
                x,
                y: &ones,
                n: len as u32,
            },
            grid,
        )
        .unwrap();
        assert!(b.copy(&ones, 0, x, 0, 1).is_err(), "a copy inside a gate");
        let launched = b.close_gate();
        assert_eq!(launched, vec![grid]);
        table[e * per_expert as usize..][..3].copy_from_slice(&grid);
    }
    // Written after the launches were recorded, before the batch is submitted.
    g.write(&mut grids, 0, &table).unwrap();
    g.submit(b).unwrap();
    let got: Vec<f32> = xs.iter().map(|x| read!(g, x).iter().sum()).collect();
    assert_eq!(got, [len as f32, 0.0, len as f32]);
    // A gate refuses more launches than its slots.
    let mut b = g.batch();
    b.open_gate(&args, 0, 1).unwrap();
    let grid = k::add_assign::grid_for(len as u32);
    let x = &mut xs[0];
    b.run(
        &mut g,
        &k::add_assign::Args {
            x,
            y: &ones,
            n: len as u32,
        },
        grid,
    )
    .unwrap();
    assert!(b
        .run(
            &mut g,
            &k::add_assign::Args {
                x,
                y: &ones,
                n: len as u32
            },
            grid
        )
        .is_err());
}

/// `moe_combine_routed` adds each row's chosen outputs, picked by id from every expert's rows,
/// in the order chosen: equal to `moe_combine` of the same outputs gathered by the host, bit
/// for bit (the same products and sums in the same order).
#[test]
fn moe_combine_routed_picks_each_rows_experts_by_id() {
    let mut g = gpu();
    let (n, width, n_used, n_expert) = (5usize, 300usize, 2usize, 4usize);
    let ys = data(n_expert * n * width, 43);
    let ids: Vec<u32> = (0..n * n_used)
        .map(|i| ((i * 3 + 1) % n_expert) as u32)
        .collect();
    let w: Vec<f32> = data(n * n_used, 44).iter().map(|v| v.abs() + 0.1).collect();
    let mut gathered = vec![0.0f32; n * n_used * width];
    for (k, row) in gathered.chunks_exact_mut(width).enumerate() {
        let (t, e) = (k / n_used, ids[k] as usize);
        row.copy_from_slice(&ys[(e * n + t) * width..][..width]);
    }
    let (bys, bids, bw) = (
        g.upload("ys", &ys).unwrap(),
        g.upload("ids", &ids).unwrap(),
        g.upload("w", &w).unwrap(),
    );
    let bg = g.upload("gathered", &gathered).unwrap();
    let mut out = g.zeroed::<f32>("out", n * width).unwrap();
    let mut want = g.zeroed::<f32>("want", n * width).unwrap();
    let len = (n * width) as u32;
    launch(
        &mut g,
        &k::moe_combine_routed::Args {
            ys: &bys,
            ids: &bids,
            w: &bw,
            out: &mut out,
            width: width as u32,
            n_used: n_used as u32,
            rows: n as u32,
            add: 0,
            n: len,
        },
        k::moe_combine_routed::grid_for(len),
    );
    launch(
        &mut g,
        &k::moe_combine::Args {
            ys: &bg,
            w: &bw,
            ids: &bids,
            bias: &bw,
            out: &mut want,
            width: width as u32,
            n_used: n_used as u32,
            biased: 0,
            add: 0,
            pos_at: 0,
            n: len,
        },
        k::moe_combine::grid_for(len),
    );
    assert!(read!(g, &out) == read!(g, &want));
}

/// Runs RMS-norm kernel `k::$kernel` (one workgroup a row) on 3 rows of 1000 (not a multiple
/// of 256) with eps 1e-5, rows and weights from data seeds `$seed_x` and `$seed_w`; evaluates
/// to its max relative diff from the CPU's `ops::rms_norm`. Runs it once more with `add` set
/// on its own output, which must then hold each value doubled (an exact add). A macro: each
/// kernel has its own `Args` struct.
macro_rules! rms_norm_diff {
    ($g:expr, $kernel:ident, $seed_x:expr, $seed_w:expr) => {{
        let g: &mut Gpu = $g;
        let (rows, width, eps) = (3usize, 1000usize, 1e-5f32);
        let (x, w) = (data(rows * width, $seed_x), data(width, $seed_w));
        let (bx, bw) = (g.upload("x", &x).unwrap(), g.upload("w", &w).unwrap());
        let mut y = g.zeroed::<f32>("y", rows * width).unwrap();
        let mut runs = Vec::new();
        for add in 0..2 {
            let args = k::$kernel::Args {
                x: &bx,
                w: &bw,
                y: &mut y,
                width: width as u32,
                eps,
                add,
            };
            launch(g, &args, k::row_grid(rows as u32));
            runs.push(read!(g, &y));
        }
        let [once, twice] = &runs[..] else {
            unreachable!()
        };
        let mut want = vec![0.0; rows * width];
        ops::rms_norm(Isa::Scalar, &x, &w, rows, eps, &mut want);
        let halves: Vec<f32> = twice.iter().map(|v| v / 2.0).collect();
        assert_eq!(
            bits(&halves),
            bits(once),
            "{}: adding the norm to itself is not the norm doubled",
            stringify!($kernel)
        );
        max_rel_diff(once, &want)
    }};
}

#[test]
fn rms_norm_matches_the_cpu() {
    let mut g = gpu();
    let d = rms_norm_diff!(&mut g, rms_norm, 5, 6);
    // The CPU sums squares in f64, the GPU in f32 (4 terms a thread, then a 256-way tree:
    // ~12 roundings deep, ~1e-6 relative on the mean); sqrt and the division add 2.5 ulp
    // each under WGSL. The scale is then off by a few 1e-7 relative; 1e-5 leaves margin.
    assert_within("rms_norm", "relative diff", d, 1e-5);
}

#[test]
fn argmax_two_stages_find_the_first_maximum() {
    let mut g = gpu();
    let n = 128_256; // the 2B4T vocabulary; not a multiple of the 256 × per_thread stride
    let mut logits = data(n, 7);
    // Ties at 9.0: the first index must win.
    // 77_777 is thread 209 of its workgroup; 77_833 is in the same workgroup on thread 9
    // (a later index reduced first by the tree), 78_033 on the same thread (the per-thread
    // loop), 100_001 in a later workgroup (the second stage).
    for i in [77_777, 77_833, 78_033, 100_001] {
        logits[i] = 9.0;
    }
    // Same shape as the GPU backend: up to 64 logits a thread.
    let groups = n.div_ceil(256 * 64).clamp(1, 256) as u32;
    let per_thread = (n as u32).div_ceil(256 * groups);
    assert!(
        groups * 256 * per_thread > n as u32,
        "the last workgroup is partial"
    );
    let bl = g.upload("logits", &logits).unwrap();
    let mut best = g.zeroed::<f32>("best", groups as usize).unwrap();
    let mut best_index = g.zeroed::<u32>("best_index", groups as usize).unwrap();
    let mut index = g.zeroed::<u32>("index", 1).unwrap();
    let mut b = g.batch();
    b.run(
        &mut g,
        &k::argmax_partial::Args {
            logits: &bl,
            best: &mut best,
            best_index: &mut best_index,
            n: n as u32,
            per_thread,
        },
        [groups, 1, 1],
    )
    .unwrap();
    b.run(
        &mut g,
        &k::argmax_final::Args {
            best: &best,
            best_index: &best_index,
            index: &mut index,
            n: groups,
        },
        [1, 1, 1],
    )
    .unwrap();
    g.submit(b).unwrap();
    // The partials: each workgroup's maximum and the first index holding it (exact).
    let (vals, idxs) = (read!(g, &best), read!(g, &best_index));
    let span = 256 * per_thread as usize;
    for w in 0..groups as usize {
        let range = w * span..((w + 1) * span).min(n);
        let i =
            range.start + hesper_engine::sampler::argmax(logits[range].iter().copied()) as usize;
        assert_eq!((vals[w], idxs[w]), (logits[i], i as u32), "workgroup {w}");
    }
    let got = read!(g, &index)[0];
    let want = hesper_engine::sampler::argmax(logits.iter().copied());
    println!("argmax: gpu {got}, cpu {want}");
    assert_eq!(want, 77_777);
    assert_eq!(got, want, "argmax");
}

/// Tokens of the rope tests.
const ROPE_TOKENS: usize = 7;
/// Position of the rope tests' first token.
const ROPE_POS0: usize = 5;

/// A rope kernel run by [`rope_run!`]: the geometry, the input, the angle table and the
/// output.
struct RopeRun {
    shape: RopeShape<'static>,
    x: Vec<f32>,
    table: Vec<f32>,
    got: Vec<f32>,
}

/// Runs rope kernel `k::$kernel` in place on [`ROPE_TOKENS`] tokens from position
/// [`ROPE_POS0`], 3 heads of 64 with 48 rotated dims (a partial rotation): 7·3·24 = 504 pairs,
/// not a multiple of 64. The input comes from data seed `$seed`, the angles (frequency base
/// `$base`) from the backend's table, which covers positions `0..pos0 + n` and which the
/// kernel indexes by position. A macro: each kernel has its own `Args` struct.
macro_rules! rope_run {
    ($g:expr, $kernel:ident, $base:expr, $seed:expr) => {{
        let g: &mut Gpu = $g;
        let (n, pos0) = (ROPE_TOKENS, ROPE_POS0);
        let shape = RopeShape {
            n_head: 3,
            head_dim: 64,
            rope_dim: 48,
            base: $base,
            scale: 1.0,
            freq_factors: None,
            attn_factor: 1.0,
            yarn: None,
        };
        let x = data(n * shape.n_head * shape.head_dim, $seed);
        let table = shape.angles(0, pos0 + n);
        let mut bx = g.upload("x", &x).unwrap();
        let cs = g.upload("cs", &table).unwrap();
        let pairs = n * shape.n_head * shape.rope_dim / 2;
        let args = k::$kernel::Args {
            x: &mut bx,
            cs: &cs,
            n_tokens: n as u32,
            n_head: shape.n_head as u32,
            head_dim: shape.head_dim as u32,
            rope_dim: shape.rope_dim as u32,
            pos0: pos0 as u32,
        };
        launch(g, &args, k::$kernel::grid_for(pairs as u32));
        RopeRun {
            got: read!(g, &bx),
            shape,
            x,
            table,
        }
    }};
}

#[test]
fn rope_neox_matches_the_cpu() {
    let mut g = gpu();
    let RopeRun { shape, x, got, .. } = rope_run!(&mut g, rope_neox, 500000.0, 8);
    let mut want = x.clone();
    ops::rope(&mut want, ROPE_TOKENS, ROPE_POS0, &shape);
    // Same angles and the same two products and one sum per output; the GPU may contract
    // `a·c − b·s` into one FMA, which moves the result by at most an ulp of the larger
    // product (|a|, |b| < 2: ≤ 2.4e-7). The unrotated tail dims must be untouched.
    let d = max_rel_diff(&got, &want);
    assert_within("rope_neox", "relative diff", d, 1e-6);
    for (t, (gr, xr)) in got
        .chunks_exact(shape.head_dim)
        .zip(x.chunks_exact(shape.head_dim))
        .enumerate()
    {
        assert_eq!(
            gr[shape.rope_dim..],
            xr[shape.rope_dim..],
            "head row {t} tail"
        );
    }
}

#[test]
fn quantize_i8_matches_the_cpu() {
    let mut g = gpu();
    // 1000 columns: not a multiple of 256; the last row is all zeros (the 1e-5 floor).
    let (rows, cols) = (4usize, 1000usize);
    let mut x = data(rows * cols, 9);
    x[(rows - 1) * cols..].fill(0.0);
    let bx = g.upload("x", &x).unwrap();
    let mut q = g.zeroed::<i32>("q", rows * cols).unwrap();
    let mut scale = g.zeroed::<f32>("scale", rows).unwrap();
    launch(
        &mut g,
        &k::quantize_i8::Args {
            x: &bx,
            q: &mut q,
            scale: &mut scale,
            cols: cols as u32,
        },
        k::row_grid(rows as u32),
    );
    let (gq, gs) = (read!(g, &q), read!(g, &scale));
    let mut off_by_one = 0;
    let mut max_ulps = 0.0f64;
    for r in 0..rows {
        let xr = &x[r * cols..][..cols];
        let want = quantize_i8_row(xr);
        // The scale: the CPU divides in f64 and rounds once; WGSL allows the GPU's f32
        // division 2.5 ulp from the exact quotient.
        let max = xr.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
        let exact = 127.0 / f64::from(max).max(1e-5);
        let ulp = f64::from(f32::from_bits(want.scale.to_bits() + 1) - want.scale);
        let e = (f64::from(gs[r]) - exact).abs() / ulp;
        max_ulps = max_ulps.max(e);
        assert!(
            e <= 2.5,
            "row {r}: scale {} vs {} ({e} ulp)",
            gs[r],
            want.scale
        );
        // The codes: x·s is one correctly rounded product and WGSL `round` is
        // half-to-even like `nearest_int`, so with the same scale the codes are identical.
        // A scale an ulp or two apart moves x·s by ≤ 127·3·2^-24 ≈ 2e-5, which crosses a
        // rounding boundary (a .5) for about one value in 10^4: a handful of codes off by one.
        let codes = gq[r * cols..][..cols].iter().zip(&want.q);
        off_by_one += count_off_by_one(codes, gs[r] == want.scale, &format!("row {r} col"));
    }
    println!("quantize_i8: scale max {max_ulps:.2} ulp from exact, {off_by_one} codes off by one");
    assert!(off_by_one <= 5, "{off_by_one} codes off by one");
}

/// Compares GPU codes with the CPU's (`(gpu, cpu)` pairs, the `e`-th named `"{what} {e}"`):
/// identical when `same_scale`, otherwise each at most one apart. Returns how many are.
fn count_off_by_one<'a>(
    codes: impl Iterator<Item = (&'a i32, &'a i8)>,
    same_scale: bool,
    what: &str,
) -> usize {
    let mut off_by_one = 0;
    for (e, (&a, &b)) in codes.enumerate() {
        let b = i32::from(b);
        if same_scale {
            assert_eq!(a, b, "{what} {e} with an equal scale");
        } else if a != b {
            assert_eq!((a - b).abs(), 1, "{what} {e}");
            off_by_one += 1;
        }
    }
    off_by_one
}

#[test]
fn quantize_q8k_matches_the_cpu() {
    let mut g = gpu();
    let blocks = 3;
    let mut x = data(blocks * QK_K, 10);
    // Block 0: a magnitude tie between −2.5 (first) and +2.5: the negative one gives the
    // scale (positive d). Block 1: all zeros (d = 0). Block 2: largest magnitude positive
    // (negative d).
    x[50] = -2.5;
    x[200] = 2.5;
    x[QK_K..2 * QK_K].fill(0.0);
    x[2 * QK_K + 100] = 2.75;
    let bx = g.upload("x", &x).unwrap();
    let mut q = g.zeroed::<i32>("q", blocks * QK_K).unwrap();
    let mut d = g.zeroed::<f32>("d", blocks).unwrap();
    launch(
        &mut g,
        &k::quantize_q8k::Args {
            x: &bx,
            q: &mut q,
            d: &mut d,
        },
        k::row_grid(blocks as u32),
    );
    let (gq, gd) = (read!(g, &q), read!(g, &d));
    let want = quantize_q8_k(&x);
    assert!(want[0].d > 0.0 && want[1].d == 0.0 && want[2].d < 0.0);
    let (mut max_ulps, mut off_by_one) = (0, 0);
    for (b, wb) in want.iter().enumerate() {
        // d = 1/(−127/max): two divisions, each 2.5 ulp under WGSL and correctly rounded on
        // the CPU: within 6 ulp. Exact 0 for the zero block.
        let u = ulps(gd[b], wb.d);
        max_ulps = max_ulps.max(u);
        assert!(u <= 6, "block {b}: d {} vs {} ({u} ulp)", gd[b], wb.d);
        // Codes: identical when the GPU's iscale equals the CPU's (recognisable as d equal);
        // otherwise x·iscale moves by a few 1e-5 and a code may cross a rounding boundary.
        let codes = gq[b * QK_K..][..QK_K].iter().zip(&wb.qs);
        off_by_one += count_off_by_one(codes, u == 0, &format!("block {b} element"));
    }
    println!("quantize_q8k: d max {max_ulps} ulp, {off_by_one} codes off by one");
    assert!(off_by_one <= 3, "{off_by_one} codes off by one");
}

/// Random I2_S code bytes (codes 0..=2, four a byte).
fn i2s_codes(n_bytes: usize, seed: u64) -> Vec<u8> {
    let mut r = Lcg(seed);
    (0..n_bytes)
        .map(|_| (0..4).fold(0u8, |b, k| b | (((r.next() % 3) as u8) << (2 * k))))
        .collect()
}

/// The CPU's I2_S outputs, `[n][rows]`: each token's integer dot with every row of `codes`
/// (`cols / 4` bytes a row), less its Σq, divided by its scale, times `beta`.
fn i2s_reference(codes: &[u8], acts: &[I8Row], cols: usize, beta: f32) -> Vec<f32> {
    acts.iter()
        .flat_map(|a| {
            codes
                .chunks_exact(cols / 4)
                .map(|row| (i2s_code_dot(row, &a.q) - a.sum) as f32 / a.scale * beta)
        })
        .collect()
}

#[test]
fn bitlinear_i2s_matches_the_cpu() {
    let mut g = gpu();
    // 37 rows of 640 weights (5 groups of 128: 40 words a row for 64 threads), 21 tokens
    // (five decode tiles of 4 and one of 1; a wide tile of 16 and one of 5).
    let (rows, cols, n, beta) = (37usize, 640usize, 21usize, 0.0371f32);
    let codes = i2s_codes(rows * cols / 4, 11);
    let acts: Vec<_> = (0..n)
        .map(|t| quantize_i8_row(&data(cols, 12 + t as u64)))
        .collect();
    let q: Vec<i32> = acts
        .iter()
        .flat_map(|a| a.q.iter().map(|&v| i32::from(v)))
        .collect();
    let scales: Vec<f32> = acts.iter().map(|a| a.scale).collect();
    let bc = g.upload("codes", &words(&codes)).unwrap();
    let bq = g.upload("q", &q).unwrap();
    let bs = g.upload("scale", &scales).unwrap();
    let want = i2s_reference(&codes, &acts, cols, beta);
    // The integer sums are exact; then the same division (2.5 ulp under WGSL, correctly
    // rounded on the CPU) and one multiplication: a few ulp, < 1e-6 relative.
    sweep_matrix(
        &mut g,
        Matrix::new("bitlinear_i2s", rows, cols, n),
        |g, out, p| {
            launch_matrix!(g, out, p, beta;
                bitlinear_i2s | bitlinear_i2s_wide { codes: &bc, q: &bq, scale: &bs })
        },
        |got| max_rel_diff(got, &want),
        "relative diff",
        1e-6,
    );
}

/// Activations quantized in blocks (Q8_K or Q8_0) for the GPU: every token's codes as `i32`,
/// then every token's block scales.
fn block_activations<B>(
    acts: &[Vec<B>],
    qs: impl Fn(&B) -> &[i8],
    d: impl Fn(&B) -> f32,
) -> (Vec<i32>, Vec<f32>) {
    let blocks = || acts.iter().flatten();
    let q = blocks()
        .flat_map(|b| qs(b).iter().map(|&v| i32::from(v)))
        .collect();
    (q, blocks().map(d).collect())
}

/// A TQ2_0 matrix of `rows` × `cols` (random crumbs, small positive f16 block scales) in the
/// GPU's layout and `n` tokens of Q8_K activations, uploaded, with the CPU's `tq2_0_dot` of
/// every (token, row) times `out_scale` and the scale of its rounding error.
struct TqCase {
    codes: GpuBuffer<u32>,
    wscale: GpuBuffer<f32>,
    q: GpuBuffer<i32>,
    d: GpuBuffer<f32>,
    want: Vec<f32>,
    /// Σ over blocks of |sumi·d·ws| (times `out_scale`): what the f32 accumulation rounds.
    magnitude: Vec<f32>,
}

impl TqCase {
    fn new(g: &Gpu, rows: usize, cols: usize, n: usize, out_scale: f32) -> TqCase {
        let blocks = cols / QK_K;
        // TQ2_0 rows: per block 64 bytes of crumbs 0..=2 (element e at byte 32·(e/128) + e%32,
        // shift 2·((e%128)/32)), then the f16 scale (small positive normals, like real ones).
        let mut codes = i2s_codes(rows * blocks * 64, 13).into_iter();
        let scale_bits = f16_bits(rows * blocks, 14, 5..=10)
            .into_iter()
            .map(|b| b & 0x7fff)
            .collect::<Vec<_>>();
        let tq: Vec<u8> = (0..rows * blocks)
            .flat_map(|rb| {
                let mut blk: Vec<u8> = codes.by_ref().take(64).collect();
                blk.extend(scale_bits[rb].to_le_bytes());
                blk
            })
            .collect();
        let row_bytes = blocks * TQ2_0_BLOCK_BYTES;
        assert_eq!(tq.len(), rows * row_bytes);
        // Repacked into the I2_S layout (element k at byte 32·(k/128) + k%32, shift
        // 6 − 2·((k%128)/32)) with the block scales beside as f32.
        let mut repacked = vec![0u8; rows * cols / 4];
        for (r, row) in tq.chunks_exact(row_bytes).enumerate() {
            let out = &mut repacked[r * cols / 4..][..cols / 4];
            for kk in 0..cols {
                let blk = &row[(kk / QK_K) * TQ2_0_BLOCK_BYTES..][..TQ2_0_BLOCK_BYTES];
                let c = tq2_0_code(blk, kk % QK_K);
                out[32 * (kk / 128) + kk % 32] |= c << (6 - 2 * ((kk % 128) / 32));
            }
            for kk in 0..cols {
                let blk = &row[(kk / QK_K) * TQ2_0_BLOCK_BYTES..][..TQ2_0_BLOCK_BYTES];
                assert_eq!(i2s_code(out, kk), tq2_0_code(blk, kk % QK_K), "repack");
            }
        }
        let acts: Vec<_> = (0..n)
            .map(|t| quantize_q8_k(&data(cols, 15 + t as u64)))
            .collect();
        let (q, d) = block_activations(&acts, |b| &b.qs, |b| b.d);
        let want = acts
            .iter()
            .flat_map(|a| {
                tq.chunks_exact(row_bytes)
                    .map(|row| tq2_0_dot(row, a) * out_scale)
            })
            .collect();
        let magnitude = acts
            .iter()
            .flat_map(|a| {
                tq.chunks_exact(row_bytes).map(move |row| {
                    row.chunks_exact(TQ2_0_BLOCK_BYTES)
                        .zip(a)
                        .map(|(blk, ab)| tq2_0_dot(blk, std::slice::from_ref(ab)).abs())
                        .sum::<f32>()
                        * out_scale
                })
            })
            .collect();
        TqCase {
            codes: g.upload("codes", &words(&repacked)).unwrap(),
            wscale: g.upload("wscale", &f16_to_f32(&scale_bits)).unwrap(),
            q: g.upload("q", &q).unwrap(),
            d: g.upload("d", &d).unwrap(),
            want,
            magnitude,
        }
    }

    /// The largest |got − want| over the output's Σ|block terms|. Per block the integer sum is
    /// exact and `sumi · (d · ws)` the same two products on both sides; only the order of the
    /// block additions differs (the CPU in order, the GPU each lane's blocks `l, l + lanes, …`,
    /// then the lanes' sums in lane order): with `B` blocks, ≤ B − 1 roundings of partial sums
    /// bounded by Σ|terms|, so |Δ| ≤ (B − 1)·2^-24·Σ|terms| (< 2.4e-7 of it for 5 blocks,
    /// 5.4e-7 for 10).
    fn error(&self, got: &[f32]) -> f32 {
        dot_error(got, &self.want, &self.magnitude)
    }
}

#[test]
fn bitlinear_tq_matches_the_cpu_tq2_0_dot() {
    let mut g = gpu();
    // 37 rows of 1280 weights (5 Q8_K blocks: lane 0 sums all five at 1 lane, blocks 0 and 4
    // at 4, block 0 at 32), 21 tokens (five decode tiles of 4 and one of 1; two wide tiles of 8
    // and one of 5).
    let (rows, cols, n, out_scale) = (37usize, 1280usize, 21usize, 1.25f32);
    let c = TqCase::new(&g, rows, cols, n, out_scale);
    // 1e-6 leaves margin over the 2.4e-7 of `TqCase::error`.
    sweep_matrix(
        &mut g,
        Matrix::new("bitlinear_tq", rows, cols, n),
        |g, out, p| {
            launch_matrix!(g, out, p, out_scale;
            bitlinear_tq | bitlinear_tq_wide {
                codes: &c.codes, wscale: &c.wscale, q: &c.q, d: &c.d
            })
        },
        |got| c.error(got),
        "diff of Σ|block terms|",
        1e-6,
    );
}

#[test]
fn tiled_tq_kernel_gives_the_matrix_vector_kernels_bits() {
    let mut g = gpu();
    // 150 rows (two tiles of 64 and one of 22) of 2560 weights (20 K-steps of half a block;
    // 10 blocks walked in order at 1 lane, 0 4 8 1 5 9 2 6 3 7 at 4: two lanes of three blocks,
    // then two of two; one block a lane at 32), 70 tokens (a tile of 64 and one of 6), beside
    // the wide-step instance the backend runs for fewer. The bound: `TqCase::error`'s 5.4e-7
    // for 10 blocks, with margin.
    let (rows, cols, n, out_scale) = (150usize, 2560usize, 70usize, 0.75f32);
    let c = TqCase::new(&g, rows, cols, n, out_scale);
    sweep_tiled(
        &mut g,
        Matrix::new("bitlinear_tq_gemm", rows, cols, n),
        |g, out, p| {
            launch_tiled!(g, out, p, out_scale;
            bitlinear_tq_gemm {
                codes: &c.codes, wscale: &c.wscale, q: &c.q, d: &c.d, lanes: p.lanes
            })
        },
        |g, out, p| {
            launch_matrix!(g, out, p, out_scale;
            bitlinear_tq | bitlinear_tq_wide {
                codes: &c.codes, wscale: &c.wscale, q: &c.q, d: &c.d
            })
        },
        |got| c.error(got),
        "diff of Σ|block terms|",
        1e-6,
    );
}

/// A K-quant type in `matvec_kq`'s layout: high bits a code (Q4_K 0, Q5_K 1, Q6_K 2), the
/// sub-block length and the offset taken from every code (Q6_K's 32).
#[derive(Clone, Copy, Debug)]
struct KqType {
    high: u32,
    sub: u32,
    offset: u32,
}

const KQ_TYPES: [KqType; 3] = [
    KqType {
        high: 0,
        sub: 32,
        offset: 0,
    },
    KqType {
        high: 1,
        sub: 32,
        offset: 0,
    },
    KqType {
        high: 2,
        sub: 16,
        offset: 32,
    },
];

/// A `rows × cols` matrix of random codes in `matvec_kq`'s layout (nibble words, high-bit words,
/// a byte of scale and one of minimum a sub-block: Q4_K/Q5_K's 6-bit scales and minimums,
/// Q6_K's signed 8-bit scales without minimums; `d` and `dmin` of each block beside), and `n`
/// tokens of Q8_K activations, uploaded; with the layout's product computed here in f64 from
/// its definition
/// (`Σ_blocks (d·d_act)·Σ_s scale·Σ(code − offset)·q − (dmin·d_act)·Σ_s min·Σq`) and the scale
/// of its f32 rounding.
struct KqCase {
    ty: KqType,
    w: GpuBuffer<u32>,
    wd: GpuBuffer<f32>,
    q: GpuBuffer<i32>,
    d: GpuBuffer<f32>,
    want: Vec<f32>,
    /// Σ over blocks of |(d·d_act)·sumi| + |(dmin·d_act)·summ| (times `out_scale`).
    magnitude: Vec<f32>,
}

impl KqCase {
    fn new(g: &Gpu, ty: KqType, rows: usize, cols: usize, n: usize, out_scale: f32) -> KqCase {
        let (high, sub) = (ty.high as usize, ty.sub as usize);
        let blocks = cols / QK_K;
        let subs = QK_K / sub;
        let (nibble_words, high_words) = (cols / 8, cols * high / 32);
        let mut r = Lcg(41 + ty.high as u64);
        let mut layout = Vec::new();
        let mut scales = Vec::new();
        for _ in 0..rows {
            layout.extend((0..nibble_words + high_words).map(|_| r.next() as u32));
            // Two bytes a sub-block (scale, then minimum), two sub-blocks a word.
            let mut halves = Vec::new();
            for _ in 0..blocks * subs {
                let (scale, min) = if high == 2 {
                    ((r.next() % 256) as i32 - 128, 0)
                } else {
                    ((r.next() % 64) as i32, (r.next() % 64) as i32)
                };
                scales.push((scale, min));
                halves.push((scale as u32 & 0xff) | ((min as u32) << 8));
            }
            layout.extend(halves.chunks_exact(2).map(|p| p[0] | (p[1] << 16)));
        }
        let wd: Vec<f32> = (0..rows * blocks)
            .flat_map(|_| {
                let d = (1 + r.next() % 1000) as f32 * 1e-5;
                let dmin = if high == 2 {
                    0.0
                } else {
                    (1 + r.next() % 1000) as f32 * 1e-6
                };
                [d, dmin]
            })
            .collect();
        let stride = nibble_words + high_words + blocks * subs / 2;
        let code = |row: usize, e: usize| -> i32 {
            let w = &layout[row * stride..];
            let nibble = (w[e / 8] >> (4 * (e % 8))) & 15;
            // Q4_K has no high bits: no word, 0.
            let hi = (32usize).checked_div(high).map_or(0, |per| {
                (w[nibble_words + e / per] >> (high * (e % per))) & ((1 << high) - 1)
            });
            (nibble | (hi << 4)) as i32 - ty.offset as i32
        };
        let acts: Vec<_> = (0..n)
            .map(|t| quantize_q8_k(&data(cols, 43 + t as u64)))
            .collect();
        let (q, d) = block_activations(&acts, |b| &b.qs, |b| b.d);
        let (mut want, mut magnitude) = (Vec::new(), Vec::new());
        for t in 0..n {
            for row in 0..rows {
                let (mut sum, mut size) = (0f64, 0f64);
                for blk in 0..blocks {
                    let (mut sumi, mut summ) = (0i64, 0i64);
                    for s in 0..subs {
                        let (scale, min) = scales[(row * blocks + blk) * subs + s];
                        let e0 = blk * QK_K + s * sub;
                        let qv = |e: usize| i64::from(q[t * cols + e]);
                        let dot: i64 = (e0..e0 + sub)
                            .map(|e| i64::from(code(row, e)) * qv(e))
                            .sum();
                        let sq: i64 = (e0..e0 + sub).map(qv).sum();
                        sumi += i64::from(scale) * dot;
                        summ += i64::from(min) * sq;
                    }
                    let da = f64::from(d[t * blocks + blk]);
                    let a = f64::from(wd[2 * (row * blocks + blk)]) * da * sumi as f64;
                    let b = f64::from(wd[2 * (row * blocks + blk) + 1]) * da * summ as f64;
                    sum += a - b;
                    size += a.abs() + b.abs();
                }
                want.push((sum * f64::from(out_scale)) as f32);
                magnitude.push((size * f64::from(out_scale)) as f32);
            }
        }
        KqCase {
            ty,
            w: g.upload("w", &layout).unwrap(),
            wd: g.upload("wd", &wd).unwrap(),
            q: g.upload("q", &q).unwrap(),
            d: g.upload("d", &d).unwrap(),
            want,
            magnitude,
        }
    }

    /// The largest |got − want| over the output's Σ|block terms|. The integers are exact on
    /// both sides; the GPU rounds per block `d·d_act`, `dmin·d_act`, `sumi` and `summ` to f32
    /// (|sumi| can pass 2^24), each product and their difference (≤ 4 roundings of the terms'
    /// size), then adds `B` blocks' terms (≤ B − 1 roundings of Σ|terms|): ≤ (B + 3)·2^-24 of
    /// Σ|terms|: 4.8e-7 for 5 blocks, 7.7e-7 for 10.
    fn error(&self, got: &[f32]) -> f32 {
        dot_error(got, &self.want, &self.magnitude)
    }
}

#[test]
fn matvec_kq_matches_its_layouts_definition() {
    let mut g = gpu();
    // 37 rows of 1280 (5 blocks: lane 0 sums all five at 1 lane, blocks 0 and 4 at 4), 21
    // tokens (five decode tiles of 4 and one of 1; two wide tiles of 8 and one of 5).
    let (rows, cols, n, out_scale) = (37usize, 1280usize, 21usize, 1.25f32);
    for ty in KQ_TYPES {
        let c = KqCase::new(&g, ty, rows, cols, n, out_scale);
        // 1e-6 leaves margin over the 4.8e-7 of `KqCase::error`.
        sweep_matrix(
            &mut g,
            Matrix::new("matvec_kq", rows, cols, n),
            |g, out, p| {
                launch_matrix!(g, out, p, out_scale;
                matvec_kq | matvec_kq_wide {
                    w: &c.w, wd: &c.wd, q: &c.q, d: &c.d, d_at: 0, ids: &c.w, per_input: 1, expert0: 0, experts: 0,
                    high: c.ty.high, sub: c.ty.sub, offset: c.ty.offset
                })
            },
            |got| c.error(got),
            "diff of Σ|block terms|",
            1e-6,
        );
    }
}

#[test]
fn tiled_kq_kernel_gives_the_matrix_vector_kernels_bits() {
    let mut g = gpu();
    // 150 rows (two tiles of 64 and one of 22) of 2560 (40 K-steps of 64 columns; 10 blocks
    // walked 0 4 8 1 5 9 2 6 3 7 at 4 lanes), 70 tokens (a tile of 64 and one of 6), beside the
    // wide-step instance the backend runs for fewer; Q4_K, Q5_K and Q6_K. The bound:
    // `KqCase::error`'s 7.7e-7 for 10 blocks.
    let (rows, cols, n, out_scale) = (150usize, 2560usize, 70usize, 0.75f32);
    for ty in KQ_TYPES {
        let c = KqCase::new(&g, ty, rows, cols, n, out_scale);
        sweep_tiled(
            &mut g,
            Matrix::new("matvec_kq_gemm", rows, cols, n),
            |g, out, p| {
                launch_tiled!(g, out, p, out_scale;
                matvec_kq_gemm {
                    w: &c.w, wd: &c.wd, q: &c.q, d: &c.d,
                    high: c.ty.high, sub: c.ty.sub, offset: c.ty.offset, lanes: p.lanes,
                    ids: &c.w, per_input: 1, expert0: 0, experts: 0, gid_at: 0, order_at: 0,
                    gathered: 0
                })
            },
            |g, out, p| {
                launch_matrix!(g, out, p, out_scale;
                matvec_kq | matvec_kq_wide {
                    w: &c.w, wd: &c.wd, q: &c.q, d: &c.d, d_at: 0, ids: &c.w, per_input: 1, expert0: 0, experts: 0,
                    high: c.ty.high, sub: c.ty.sub, offset: c.ty.offset
                })
            },
            |got| c.error(got),
            "diff of Σ|block terms|",
            1e-6,
        );
    }
}

/// Max of `|got − want| / Σ|w·x|` over `[n][rows]`: the error of an f32 dot product in a
/// different summation order is bounded by a multiple of the sum of the magnitudes of its
/// terms (not of the result, which may cancel).
fn dot_error(got: &[f32], want: &[f32], magnitude: &[f32]) -> f32 {
    max_diff(got, want, |i| magnitude[i])
}

/// The CPU's outputs `[n][rows]` of a float matvec and their Σ|w·x|, both times `out_scale`:
/// `dot(r, xt)` is the CPU's dot of weight row `r` with token activations `xt`, `w` the
/// weights' f32 values (`[rows][cols]`), `x` the activations as both sides see them.
fn matvec_reference(
    w: &[f32],
    x: &[f32],
    cols: usize,
    out_scale: f32,
    dot: impl Fn(usize, &[f32]) -> f32,
) -> (Vec<f32>, Vec<f32>) {
    let mut want = Vec::new();
    let mut magnitude = Vec::new();
    for xt in x.chunks_exact(cols) {
        for (r, wr) in w.chunks_exact(cols).enumerate() {
            want.push(dot(r, xt) * out_scale);
            magnitude.push(wr.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum::<f32>() * out_scale);
        }
    }
    (want, magnitude)
}

/// A float product (F32, F16 or BF16 weights) on the GPU's buffers: the weight words the
/// kernels read, the activations as their kernel takes them (`X`: f32 values, or `pack_f16`'s
/// halves), and the CPU's outputs `[n][rows]` (times `out_scale`) with their Σ|w·x|.
struct FloatCase<X> {
    w: GpuBuffer<u32>,
    x: GpuBuffer<X>,
    want: Vec<f32>,
    magnitude: Vec<f32>,
}

impl<X> FloatCase<X> {
    /// The largest difference from the CPU's outputs, as a fraction of Σ|w·x|.
    fn error(&self, got: &[f32]) -> f32 {
        dot_error(got, &self.want, &self.magnitude)
    }
}

/// Each row of `bits` (16-bit weights, `cols` a row) as the CPU reads it.
fn row_bytes_of(bits: &[u16], cols: usize) -> Vec<Vec<u8>> {
    bits.chunks_exact(cols)
        .map(|r| r.iter().flat_map(|b| b.to_le_bytes()).collect())
        .collect()
}

/// `rows × cols` random F32 weights times `n` tokens of random activations.
fn f32_case(g: &Gpu, rows: usize, cols: usize, n: usize, scale: f32, seed: u64) -> FloatCase<f32> {
    let w = data(rows * cols, seed);
    let x = data(n * cols, seed + 1);
    let words: Vec<u32> = w.iter().map(|v| v.to_bits()).collect();
    let row_bytes: Vec<Vec<u8>> = w
        .chunks_exact(cols)
        .map(|r| r.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let (want, magnitude) =
        matvec_reference(&w, &x, cols, scale, |r, xt| f32_dot(&row_bytes[r], xt));
    FloatCase {
        w: g.upload("w", &words).unwrap(),
        x: g.upload("x", &x).unwrap(),
        want,
        magnitude,
    }
}

/// `rows × cols` random F16 weights times `n` tokens of activations rounded to halves as
/// `pack_f16` rounds them.
fn f16_case(g: &Gpu, rows: usize, cols: usize, n: usize, scale: f32, seed: u64) -> FloatCase<u32> {
    let bits = f16_bits(rows * cols, seed, 11..=16);
    let x = data(n * cols, seed + 1);
    let row_bytes = row_bytes_of(&bits, cols);
    let (want, magnitude) =
        matvec_reference(&f16_to_f32(&bits), &round_f16(&x), cols, scale, |r, xh| {
            f16_dot(&row_bytes[r], xh)
        });
    FloatCase {
        w: g.upload("w", &pack_f16(&bits)).unwrap(),
        x: g.upload("x", &halves_of(&x)).unwrap(),
        want,
        magnitude,
    }
}

/// `rows × cols` random BF16 weights times `n` tokens of random activations (the kernels round
/// them through bf16 as the CPU does).
fn bf16_case(g: &Gpu, rows: usize, cols: usize, n: usize, scale: f32, seed: u64) -> FloatCase<f32> {
    let bits: Vec<u16> = data(rows * cols, seed)
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    let x = data(n * cols, seed + 1);
    let values: Vec<f32> = bits
        .iter()
        .map(|&b| half::bf16::from_bits(b).to_f32())
        .collect();
    let row_bytes = row_bytes_of(&bits, cols);
    let (want, magnitude) = matvec_reference(&values, &round_bf16(&x), cols, scale, |r, xb| {
        bf16_dot(&row_bytes[r], xb)
    });
    FloatCase {
        w: g.upload("w", &pack_f16(&bits)).unwrap(),
        x: g.upload("x", &x).unwrap(),
        want,
        magnitude,
    }
}

/// 37 rows of 300 (not a multiple of 64; 150 words for F16 and BF16), 21 tokens (five decode
/// tiles of 4 and one of 1; a wide tile of 16 and one of 5).
const FLOAT_SHAPE: (usize, usize, usize) = (37, 300, 21);

/// The CPU sums 300 products in order, the GPU a few a lane then the lanes in order (with
/// possible FMA contraction); F16 and BF16 weights and activations widen exactly. Rounding
/// errors of either order behave like a random walk, ~sqrt(300)·2^-24 ≈ 1e-6 of Σ|w·x| at one
/// sigma; 5e-6 allows 5 sigma (the worst-case bound 300·2^-24 ≈ 1.8e-5 is never approached with
/// random signs).
const FLOAT_BOUND: f32 = 5e-6;

/// 150 rows (two tiles of 64 and one of 22) of 43 words (five K-steps of 8 and one of 3;
/// walked in order at 1 lane, in runs of 11, 11, 11 and 10 words at 4, ending inside K-steps;
/// runs of two and one word at 32), 70 tokens (a tile of 64 and one of 6): the tiled float
/// kernels beside the wide-step instances of their matrix-vector kernels.
const TILED_FLOAT: (usize, usize) = (150, 70);

#[test]
fn matvec_f32_matches_f32_dot() {
    let mut g = gpu();
    let (rows, cols, n) = FLOAT_SHAPE;
    let c = f32_case(&g, rows, cols, n, 0.75, 16);
    sweep_matrix(
        &mut g,
        Matrix::new("matvec_f32", rows, cols, n),
        |g, out, p| {
            launch_matrix!(g, out, p, 0.75;
                matvec_f32 | matvec_f32_wide { w: &c.w, x: &c.x })
        },
        |got| c.error(got),
        "diff of Σ|w·x|",
        FLOAT_BOUND,
    );
}

#[test]
fn tiled_f32_kernel_gives_the_matrix_vector_kernels_bits() {
    let mut g = gpu();
    let ((rows, n), cols) = (TILED_FLOAT, 43);
    let c = f32_case(&g, rows, cols, n, 0.75, 45);
    sweep_tiled(
        &mut g,
        Matrix::new("matvec_f32_gemm", rows, cols, n),
        |g, out, p| {
            launch_tiled!(g, out, p, 0.75;
                matvec_f32_gemm { w: &c.w, x: &c.x, lanes: p.lanes, ids: &c.w, per_input: 1, expert0: 0, experts: 0, gid_at: 0, order_at: 0, gathered: 0 })
        },
        |g, out, p| {
            launch_matrix!(g, out, p, 0.75;
                matvec_f32 | matvec_f32_wide { w: &c.w, x: &c.x })
        },
        |got| c.error(got),
        "diff of Σ|w·x|",
        FLOAT_BOUND,
    );
}

/// `x` rounded to halves as the CPU rounds them, packed as [`k::pack_f16`] packs them.
fn halves_of(x: &[f32]) -> Vec<u32> {
    let bits: Vec<u16> = x
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    pack_f16(&bits)
}

#[test]
fn pack_f16_rounds_to_the_nearest_half_as_the_cpu_does() {
    let mut g = gpu();
    // Random values over the halves' whole range (normal, subnormal, past the largest), and
    // the edges: ties between two halves (to even, both ways), a hair either side of a tie,
    // the subnormal ties, the largest half and the first value that rounds to infinity.
    let ulp = |x: f32| f32::from_bits(x.to_bits() + 1);
    let mut x: Vec<f32> = data(2000, 41)
        .iter()
        .enumerate()
        .map(|(i, v)| v * 2f32.powi((i % 48) as i32 - 30))
        .collect();
    let one = 1.0f32;
    let tie_even = one + 2f32.powi(-11); // between 1 and 1 + 2^-10: to 1
    let tie_odd = one + 3.0 * 2f32.powi(-11); // between 1 + 2^-10 and 1 + 2^-9: up
    let sub_tie = 2f32.powi(-25); // half of the smallest subnormal: to 0
    let sub_tie_odd = 3.0 * 2f32.powi(-25); // between 2^-24 and 2^-23: up
    for v in [
        tie_even,
        tie_odd,
        ulp(tie_even),
        f32::from_bits(tie_odd.to_bits() - 1),
        sub_tie,
        sub_tie_odd,
        ulp(sub_tie),
        65504.0,
        65519.99,
        65520.0,
        1e6,
        f32::INFINITY,
        0.0,
        -0.0,
        2f32.powi(-14),
        f32::from_bits(2f32.powi(-14).to_bits() - 1),
    ] {
        x.push(v);
        x.push(-v);
    }
    let bx = g.upload("x", &x).unwrap();
    let mut bh = g.zeroed::<u32>("h", x.len() / 2).unwrap();
    launch(
        &mut g,
        &k::pack_f16::Args {
            x: &bx,
            h: &mut bh,
            len: x.len() as u32,
        },
        k::pack_f16::grid_for((x.len() / 2) as u32),
    );
    // Bit for bit. WGSL's own quantizeToF16 may return either neighbour and flush subnormal
    // halves: lavapipe's flushes them (every value below 2^-14 here came back ±0).
    assert_eq!(read!(g, &bh), halves_of(&x));
}

#[test]
fn matvec_f16_matches_f16_dot() {
    let mut g = gpu();
    let (rows, cols, n) = FLOAT_SHAPE;
    let c = f16_case(&g, rows, cols, n, 0.75, 18);
    sweep_matrix(
        &mut g,
        Matrix::new("matvec_f16", rows, cols, n),
        |g, out, p| {
            launch_matrix!(g, out, p, 0.75;
                matvec_f16 | matvec_f16_wide { w: &c.w, xh: &c.x, ids: &c.w, per_input: 1, expert0: 0, experts: 0 })
        },
        |got| c.error(got),
        "diff of Σ|w·x|",
        FLOAT_BOUND,
    );
}

#[test]
fn tiled_f16_kernel_gives_the_matrix_vector_kernels_bits() {
    let mut g = gpu();
    let ((rows, n), cols) = (TILED_FLOAT, 86);
    let c = f16_case(&g, rows, cols, n, 0.75, 43);
    sweep_tiled(
        &mut g,
        Matrix::new("matvec_f16_gemm", rows, cols, n),
        |g, out, p| {
            launch_tiled!(g, out, p, 0.75;
                matvec_f16_gemm { w: &c.w, xh: &c.x, lanes: p.lanes, ids: &c.w, per_input: 1, expert0: 0, experts: 0, gid_at: 0, order_at: 0, gathered: 0 })
        },
        |g, out, p| {
            launch_matrix!(g, out, p, 0.75;
                matvec_f16 | matvec_f16_wide { w: &c.w, xh: &c.x, ids: &c.w, per_input: 1, expert0: 0, experts: 0 })
        },
        |got| c.error(got),
        "diff of Σ|w·x|",
        FLOAT_BOUND,
    );
}

#[test]
fn matvec_bf16_matches_bf16_dot() {
    let mut g = gpu();
    let (rows, cols, n) = FLOAT_SHAPE;
    let c = bf16_case(&g, rows, cols, n, 0.75, 47);
    sweep_matrix(
        &mut g,
        Matrix::new("matvec_bf16", rows, cols, n),
        |g, out, p| {
            launch_matrix!(g, out, p, 0.75;
                matvec_bf16 | matvec_bf16_wide { w: &c.w, x: &c.x, ids: &c.w, per_input: 1, expert0: 0, experts: 0 })
        },
        |got| c.error(got),
        "diff of Σ|w·x|",
        FLOAT_BOUND,
    );
}

#[test]
fn tiled_bf16_kernel_gives_the_matrix_vector_kernels_bits() {
    let mut g = gpu();
    let ((rows, n), cols) = (TILED_FLOAT, 86);
    let c = bf16_case(&g, rows, cols, n, 0.75, 49);
    sweep_tiled(
        &mut g,
        Matrix::new("matvec_bf16_gemm", rows, cols, n),
        |g, out, p| {
            launch_tiled!(g, out, p, 0.75;
                matvec_bf16_gemm { w: &c.w, x: &c.x, lanes: p.lanes, ids: &c.w, per_input: 1, expert0: 0, experts: 0, gid_at: 0, order_at: 0, gathered: 0 })
        },
        |g, out, p| {
            launch_matrix!(g, out, p, 0.75;
                matvec_bf16 | matvec_bf16_wide { w: &c.w, x: &c.x, ids: &c.w, per_input: 1, expert0: 0, experts: 0 })
        },
        |got| c.error(got),
        "diff of Σ|w·x|",
        FLOAT_BOUND,
    );
}

/// The ids and the two row windows (`row0`, `rows`) of the embedding tests: every id falls
/// in exactly one window; the second window is not at the start of the table.
const VOCAB: usize = 20;
const IDS: [u32; 6] = [5, 0, 17, 9, 19, 10];
const EMBED_WINDOWS: [(usize, usize); 2] = [(0, 10), (10, 10)];

/// Uploads each of the [`EMBED_WINDOWS`] of a table of `cols` columns: `words(elements)` is
/// the table's `elements` as the kernel reads them.
fn embed_tables(
    g: &Gpu,
    cols: usize,
    words: impl Fn(Range<usize>) -> Vec<u32>,
) -> Vec<GpuBuffer<u32>> {
    EMBED_WINDOWS
        .iter()
        .map(|&(row0, rows)| {
            g.upload("table", &words(row0 * cols..(row0 + rows) * cols))
                .unwrap()
        })
        .collect()
}

/// Asserts that every token of [`IDS`] outside the window `row0..row0 + rows` still has its
/// `cols` outputs in `got` at [`SENTINEL`].
fn assert_only_window_written(got: &[f32], cols: usize, row0: usize, rows: usize) {
    for (t, &id) in IDS.iter().enumerate() {
        if !(row0..row0 + rows).contains(&(id as usize)) {
            assert!(
                got[t * cols..][..cols].iter().all(|v| *v == SENTINEL),
                "token {t} (id {id}) written by the window {row0}..{}",
                row0 + rows
            );
        }
    }
}

/// Runs embedding kernel `k::$kernel` for [`IDS`] over both [`EMBED_WINDOWS`] (`$tables`, from
/// [`embed_tables`]) into one [`SENTINEL`]-filled output of `$cols` columns a token, with
/// `$per_token` invocations a token, checking after the first window that only its tokens
/// were written; evaluates to the final output. A macro: each kernel has its own `Args`
/// struct.
macro_rules! embed_windows {
    ($g:expr, $kernel:ident, $cols:expr, $per_token:expr, $tables:expr) => {{
        let (g, cols): (&mut Gpu, usize) = ($g, $cols);
        let n = IDS.len();
        let ids = g.upload("ids", &IDS).unwrap();
        let mut out = sentinel_out(g, n, cols);
        for (i, (&(row0, rows), table)) in EMBED_WINDOWS.iter().zip($tables).enumerate() {
            let args = k::$kernel::Args {
                table,
                ids: &ids,
                out: &mut out,
                cols: cols as u32,
                n: n as u32,
                row0: row0 as u32,
                rows: rows as u32,
            };
            launch(g, &args, k::$kernel::grid_for((n * $per_token) as u32));
            if i == 0 {
                assert_only_window_written(&read!(g, &out), cols, row0, rows);
            }
        }
        read!(g, &out)
    }};
}

/// The rows of `table` (`cols` columns) the ids of [`IDS`] select.
fn embed_reference(table: &[f32], cols: usize) -> Vec<f32> {
    IDS.iter()
        .flat_map(|&id| table[id as usize * cols..][..cols].iter().copied())
        .collect()
}

#[test]
fn embed_f32_fetches_rows_by_window() {
    let mut g = gpu();
    let cols = 300; // 6 tokens · 300 = 1800 invocations: not a multiple of 256
    let table = data(VOCAB * cols, 20);
    let tables = embed_tables(&g, cols, |e| bits(&table[e]));
    let got = embed_windows!(&mut g, embed_f32, cols, cols, &tables);
    let want = embed_reference(&table, cols);
    // A bit copy: exact.
    println!("embed_f32: max abs diff {}", max_abs_diff(&got, &want));
    assert_eq!(got, want, "embed_f32");
}

#[test]
fn embed_f16_fetches_rows_by_window() {
    let mut g = gpu();
    let cols = 300; // 6 tokens · 150 words = 900 invocations: not a multiple of 256
    let hbits = f16_bits(VOCAB * cols, 21, 1..=30);
    let table = f16_to_f32(&hbits);
    let tables = embed_tables(&g, cols, |e| pack_f16(&hbits[e]));
    let got = embed_windows!(&mut g, embed_f16, cols, cols / 2, &tables);
    let want = embed_reference(&table, cols);
    // Every normal f16 (exponents 1..=30, the whole normal range) widens exactly to f32.
    // Subnormal f16 are left out: whether `unpack2x16float` keeps them is the
    // implementation's floating-point behaviour (lavapipe keeps them exactly; a device that
    // flushes denormals would not).
    println!("embed_f16: max abs diff {}", max_abs_diff(&got, &want));
    assert_eq!(got, want, "embed_f16");
}

/// The bits of each value: the words of an f32 KV cache.
fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn attention_matches_the_cpu_across_a_tile_boundary() {
    attention_against_the_cpu(AttentionShape {
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        window: None,
        softcap: None,
        sinks: None,
    });
}

/// A sliding window (Gemma 3's) of 129 positions, across the tile boundary at 128: the keys
/// before it are left out as the CPU leaves them out (it reads them from the window's start).
#[test]
fn attention_over_a_sliding_window_matches_the_cpu() {
    attention_against_the_cpu(AttentionShape {
        n_head: 4,
        n_head_kv: 1,
        head_dim: 128,
        window: Some(129),
        softcap: None,
        sinks: None,
    });
}

/// Gemma 2's soft cap on the scores, tight enough (2, scores up to ~5) to bend most of them.
#[test]
fn attention_with_soft_capped_scores_matches_the_cpu() {
    attention_against_the_cpu(AttentionShape {
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        window: None,
        softcap: Some(2.0),
        sinks: None,
    });
}

/// gpt-oss's attention sinks and window: one logit per head in each softmax's denominator
/// (one larger than every score, one within them, one far below), over a window of 128.
#[test]
fn attention_with_sinks_matches_the_cpu() {
    attention_against_the_cpu(AttentionShape {
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        window: Some(128),
        softcap: None,
        sinks: Some(&[6.0, 0.5, -30.0, 2.0]),
    });
}

/// Heads of 256 (Falcon3's): each thread owns two output dimensions.
#[test]
fn attention_of_heads_of_256_matches_the_cpu() {
    attention_against_the_cpu(AttentionShape {
        n_head: 2,
        n_head_kv: 1,
        head_dim: 256,
        window: None,
        softcap: None,
        sinks: None,
    });
}

fn attention_against_the_cpu(s: AttentionShape) {
    let mut g = gpu();
    let (n, pos0, n_ctx) = (3usize, 130usize, 256usize);
    let (width, kv_dim) = (s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
    let len = pos0 + n;
    let k_all = data(len * kv_dim, 22);
    let v_all = data(len * kv_dim, 23);
    // Fill the CPU cache: the 130-token prefix, then the 3 tokens under test.
    let mut cache = KvCache::new(1, n_ctx, kv_dim);
    let mut scratch = vec![0.0; pos0 * width];
    let q_pre = data(pos0 * width, 24);
    attention::attention(
        Isa::Scalar,
        &mut cache,
        0,
        &q_pre,
        &k_all,
        &v_all,
        pos0,
        0,
        &s,
        &mut scratch,
    );
    let q = data(n * width, 25);
    let mut want = vec![0.0; n * width];
    attention::attention(
        Isa::Scalar,
        &mut cache,
        0,
        &q,
        &k_all[pos0 * kv_dim..],
        &v_all[pos0 * kv_dim..],
        n,
        pos0,
        &s,
        &mut want,
    );
    // The GPU caches `[pos][kv_dim]` for the whole context; positions past the last token
    // hold zero keys (score 0, in the middle of the real scores, so a non-negligible weight)
    // and values of 1e4: attending past the causal end cannot go unnoticed. A window is also
    // read from a ring of its window and the step's slots (position `p` in slot `p % slots`),
    // which the last positions have wrapped round.
    let ring = s.window.map(|w| w + n - 1);
    for slots in std::iter::once(n_ctx).chain(ring) {
        let mut kc = vec![0.0f32; slots * kv_dim];
        let mut vc = vec![1e4f32; slots * kv_dim];
        for p in len.saturating_sub(slots)..len {
            let (at, row) = (p % slots * kv_dim, p * kv_dim..(p + 1) * kv_dim);
            kc[at..at + kv_dim].copy_from_slice(&k_all[row.clone()]);
            vc[at..at + kv_dim].copy_from_slice(&v_all[row]);
        }
        let got = attention_on_the_gpu(&mut g, &s, &q, [&kc, &vc], (n, pos0, slots));
        // Scores (|q·k|/√head_dim up to ~5) differ by summation order, a few 1e-7; exp adds
        // WGSL's 3 + 2|x| ulp; the GPU's online softmax rescales per tile and sums in f32
        // where the CPU normalises once with an f64 sum. Each weight is then within ~1e-5
        // relative, and the output (a convex combination of values in [−2, 2)) within ~2e-5
        // absolute; 1e-4 leaves margin while any indexing, masking or GQA mistake gives O(0.1).
        let what = format!("attention over {slots} slots");
        assert_within(&what, "abs diff", max_abs_diff(&got, &want), 1e-4);
    }
}

/// The attention kernel's output for the `n` queries `q` at `pos0..` over the f32 caches `kv`
/// of `slots` positions.
fn attention_on_the_gpu(
    g: &mut Gpu,
    s: &AttentionShape,
    q: &[f32],
    [kc, vc]: [&[f32]; 2],
    (n, pos0, slots): (usize, usize, usize),
) -> Vec<f32> {
    let bq = g.upload("q", q).unwrap();
    let bk = g.upload("k_cache", &bits(kc)).unwrap();
    let bv = g.upload("v_cache", &bits(vc)).unwrap();
    let sink = g.upload("sink", s.sinks.unwrap_or(&[0.0])).unwrap();
    let mut out = g.zeroed::<f32>("out", q.len()).unwrap();
    launch(
        g,
        &k::attention::Args {
            q: &bq,
            k_cache: &bk,
            v_cache: &bv,
            lk: &bq,
            lv: &bq,
            globals: &bk,
            sink: &sink,
            out: &mut out,
            n_head: s.n_head as u32,
            n_head_kv: s.n_head_kv as u32,
            head_dim: s.head_dim as u32,
            pos0: pos0 as u32,
            scale: 1.0 / (s.head_dim as f32).sqrt(),
            f16: 0,
            slots: slots as u32,
            window: s.window.map_or(0, |w| w as u32),
            n_global: 0,
            log_stride: 0,
            landmarks: 0,
            block: 1,
            softcap: s.softcap.unwrap_or(0.0),
            sinks: u32::from(s.sinks.is_some()),
        },
        k::attention_grid(s.n_head as u32, n as u32),
    );
    read!(g, &out)
}

#[test]
fn a_batch_is_one_submit_and_pipelines_are_cached() {
    let mut g = gpu();
    let n = 300; // two workgroups, the second partial
    let (x, y) = (data(n, 26), data(n, 27));
    let mut bx = g.upload("x", &x).unwrap();
    let by = g.upload("y", &y).unwrap();
    let grid = k::add_assign::grid_for(n as u32);
    let mut b = g.batch();
    for _ in 0..5 {
        b.run(&mut g, &add_assign_args(&mut bx, &by, n), grid)
            .unwrap();
    }
    assert_eq!(b.dispatches(), 5);
    let before = g.submits();
    g.submit(b).unwrap();
    assert_eq!(g.submits(), before + 1, "one batch, one submit");
    let stats = g.cache_stats();
    assert_eq!((stats.misses, stats.hits), (1, 4), "pipeline cache");
    // The five adds ran in order, each seeing the one before (exact f32 additions).
    let want: Vec<f32> = x
        .iter()
        .zip(&y)
        .map(|(&a, &c)| (0..5).fold(a, |acc, _| acc + c))
        .collect();
    assert_eq!(read!(g, &bx), want);
    // An empty grid is refused before anything is recorded.
    let mut b = g.batch();
    let err = b
        .run(&mut g, &add_assign_args(&mut bx, &by, n), [0, 1, 1])
        .expect_err("grid of 0 workgroups");
    assert!(err.to_string().contains("grid"), "{err}");
    assert!(b.is_empty());
}

#[test]
fn quantize_q8_0_matches_the_cpu() {
    let mut g = gpu();
    // 2 tokens × 96 values = 6 blocks of 32 (not a multiple of the 8 blocks a workgroup
    // takes); block 1 is all zero, block 4 holds exact halves (x/d = ±k.5).
    let mut x = data(2 * 96, 30);
    x[32..64].fill(0.0);
    for (i, v) in x[128..160].iter_mut().enumerate() {
        *v = (i as f32 - 15.5) * (127.0 / 15.5) / 127.0 * 2.0;
    }
    let blocks = x.len() / 32;
    let bx = g.upload("x", &x).unwrap();
    let mut q = g.zeroed::<u32>("q", x.len() / 4).unwrap();
    let mut d = g.zeroed::<f32>("d", blocks).unwrap();
    launch(
        &mut g,
        &k::quantize_q8_0::Args {
            x: &bx,
            q: &mut q,
            d: &mut d,
            blocks: blocks as u32,
        },
        k::q8_0_grid(blocks as u32),
    );
    let (got_q, got_d) = (unpack_i8(&read!(g, &q)), read!(g, &d));
    let want = quantize_q8_0(&x);
    let mut off_by_one = 0;
    for (b, blk) in want.iter().enumerate() {
        // d = amax/127 goes through one division (2.5 ulp in WGSL) before rounding to f16,
        // so the stored f16 scale matches unless the quotient sits on an f16 rounding edge.
        assert_eq!(got_d[b], blk.d, "block {b} scale");
        for (e, &wq) in blk.qs.iter().enumerate() {
            let gq = got_q[b * 32 + e];
            // 1/d differs by a few ulp: a value within ulps of a .5 boundary may round the
            // other way (half away from zero on both sides of the boundary).
            match (gq - i32::from(wq)).abs() {
                0 => {}
                1 => off_by_one += 1,
                k => panic!("block {b} element {e}: code {gq} vs {wq} ({k} apart)"),
            }
        }
    }
    println!(
        "quantize_q8_0: {off_by_one} codes off by one of {}",
        x.len()
    );
    assert!(off_by_one <= 2, "{off_by_one} codes off by one");
}

/// RMSNorm fused with a block quantizer against `rms_norm_sg` and the quantizer run after it:
/// `y`, the codes and the scales, bit for bit. A macro: each kernel has its own `Args`.
macro_rules! fused_norm_vs_two_kernels {
    ($g:expr, $fused:ident, $rows:expr, $width:expr, $per_block:expr, $code:ty,
     $codes_per_word:expr, $quantize:expr) => {{
        let g: &mut Gpu = $g;
        let (rows, width, eps) = ($rows, $width, 1e-6f32);
        let mut x = data(rows * width, 40);
        // An all-zero block after the norm (d = 0, every code 0), in the middle row.
        x[width + $per_block..width + 2 * $per_block].fill(0.0);
        let w = data(width, 41);
        let (bx, bw) = (g.upload("x", &x).unwrap(), g.upload("w", &w).unwrap());
        let (blocks, len) = (rows * width / $per_block, rows * width);
        let mut y = [sentinel_out(g, rows, width), sentinel_out(g, rows, width)];
        let q_len = len / $codes_per_word;
        let mut q = [
            g.zeroed::<$code>("q", q_len).unwrap(),
            g.zeroed::<$code>("q", q_len).unwrap(),
        ];
        let mut d = [
            g.zeroed::<f32>("d", blocks).unwrap(),
            g.zeroed::<f32>("d", blocks).unwrap(),
        ];
        let [y0, y1] = &mut y;
        let [q0, q1] = &mut q;
        let [d0, d1] = &mut d;
        let norm = k::rms_norm_sg::Args {
            x: &bx,
            w: &bw,
            y: y0,
            width: width as u32,
            eps,
            add: 0,
        };
        launch(g, &norm, k::row_grid(rows as u32));
        $quantize(g, &*y0, q0, d0, blocks);
        let fused = k::$fused::Args {
            x: &bx,
            w: &bw,
            y: y1,
            q: q1,
            d: d1,
            width: width as u32,
            eps,
        };
        launch(g, &fused, k::span_grid(width as u32, rows as u32));
        assert_eq!(
            bits(&read!(g, &*y1)),
            bits(&read!(g, &*y0)),
            "{}: y",
            stringify!($fused)
        );
        assert_eq!(
            read!(g, &*q1),
            read!(g, &*q0),
            "{}: codes",
            stringify!($fused)
        );
        let (d_fused, d_apart) = (read!(g, &*d1), read!(g, &*d0));
        assert_eq!(
            bits(&d_fused),
            bits(&d_apart),
            "{}: scales",
            stringify!($fused)
        );
        assert!(
            d_fused.iter().filter(|&&s| s == 0.0).count() == 1,
            "one all-zero block"
        );
    }};
}

#[test]
fn norms_fused_with_block_quantizers_give_the_two_kernels_bits() {
    let mut g = gpu();
    // Q8_0: 864 wide (27 blocks of 32: three spans of 256 and a partial one), three rows.
    fused_norm_vs_two_kernels!(
        &mut g,
        rms_norm_quantize_q8_0_sg,
        3,
        864,
        32,
        u32,
        4,
        |g: &mut Gpu,
         y: &GpuBuffer<f32>,
         q: &mut GpuBuffer<u32>,
         d: &mut GpuBuffer<f32>,
         blocks: usize| {
            let args = k::quantize_q8_0::Args {
                x: y,
                q,
                d,
                blocks: blocks as u32,
            };
            launch(g, &args, k::q8_0_grid(blocks as u32));
        }
    );
    // Q8_K: three blocks of 256 a row, three rows.
    fused_norm_vs_two_kernels!(
        &mut g,
        rms_norm_quantize_q8k_sg,
        3,
        768,
        256,
        i32,
        1,
        |g: &mut Gpu,
         y: &GpuBuffer<f32>,
         q: &mut GpuBuffer<i32>,
         d: &mut GpuBuffer<f32>,
         blocks: usize| {
            launch(
                g,
                &k::quantize_q8k::Args { x: y, q, d },
                k::row_grid(blocks as u32),
            );
        }
    );
}

/// A Q8_0 product on the GPU's buffers: weights as ggml Q8_0 blocks repacked the way the
/// backend uploads them (int8 as words, f16 scales as f32), Q8_0 activations four codes to a
/// word, and the CPU's outputs `[n][rows]` (times `out_scale`) with their Σ|terms|.
struct Q8_0Case {
    wq: GpuBuffer<u32>,
    wd: GpuBuffer<f32>,
    q: GpuBuffer<u32>,
    d: GpuBuffer<f32>,
    /// The same scales from element [`SCALES_AT`] on, after stand-ins that would spoil every
    /// output (where `rope_attention` leaves them past its codes).
    d_past: GpuBuffer<f32>,
    want: Vec<f32>,
    magnitude: Vec<f32>,
}

impl Q8_0Case {
    fn new(g: &Gpu, rows: usize, cols: usize, n: usize, out_scale: f32, seed: u64) -> Self {
        let w = data(rows * cols, seed);
        let row_bytes: Vec<Vec<u8>> = w
            .chunks_exact(cols)
            .map(|r| {
                r.chunks_exact(32)
                    .flat_map(|b| {
                        let (d, qs) = q8_0_block(b);
                        let mut out = d.to_le_bytes().to_vec();
                        out.extend(qs.iter().map(|&v| v as u8));
                        out
                    })
                    .collect()
            })
            .collect();
        let (mut wq, mut wd) = (Vec::new(), Vec::new());
        for rb in &row_bytes {
            for blk in rb.chunks_exact(34) {
                wd.push(half::f16::from_le_bytes([blk[0], blk[1]]).to_f32());
                wq.extend(
                    blk[2..]
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
            }
        }
        let x = data(n * cols, seed + 1);
        let acts: Vec<_> = x.chunks_exact(cols).map(quantize_q8_0).collect();
        let (q, d) = block_activations(&acts, |b| &b.qs, |b| b.d);
        let mut want = Vec::new();
        let mut magnitude = Vec::new();
        for a in &acts {
            for rb in &row_bytes {
                want.push(q8_0_dot(rb, a) * out_scale);
                magnitude.push(
                    rb.chunks_exact(34)
                        .zip(a)
                        .map(|(blk, ab)| {
                            let wdv = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                            let s: i32 = blk[2..]
                                .iter()
                                .zip(&ab.qs)
                                .map(|(&wv, &qv)| (i32::from(wv as i8) * i32::from(qv)).abs())
                                .sum();
                            s as f32 * (wdv * ab.d).abs()
                        })
                        .sum::<f32>()
                        * out_scale,
                );
            }
        }
        Q8_0Case {
            wq: g.upload("wq", &wq).unwrap(),
            wd: g.upload("wd", &wd).unwrap(),
            q: g.upload("q", &pack_i8(&q)).unwrap(),
            d_past: g
                .upload(
                    "d past",
                    &[vec![-3.0; SCALES_AT as usize], d.clone()].concat(),
                )
                .unwrap(),
            d: g.upload("d", &d).unwrap(),
            want,
            magnitude,
        }
    }

    /// The largest difference from the CPU's outputs, as a fraction of Σ|terms|.
    fn error(&self, got: &[f32]) -> f32 {
        dot_error(got, &self.want, &self.magnitude)
    }
}

/// Where [`Q8_0Case::d_past`]'s scales start.
const SCALES_AT: u32 = 7;

#[test]
fn matvec_q8_0_matches_q8_0_dot() {
    let mut g = gpu();
    // 37 rows of 320 (10 blocks), 21 tokens (five decode tiles of 4 and one of 1; two wide
    // tiles of 8 and one of 5).
    let (rows, cols, n, out_scale) = (37usize, 320usize, 21usize, 0.75f32);
    let c = Q8_0Case::new(&g, rows, cols, n, out_scale, 31);
    let (bwq, bwd, bq, bd, bd_past) = (&c.wq, &c.wd, &c.q, &c.d, &c.d_past);
    // Block sums are exact integers; only the order of the 10 f32 block terms differs
    // (sequential on the CPU; each lane's blocks, then the lanes in order on the GPU): a few
    // ulp of Σ|terms|.
    // The plain and the dot4I8Packed instances add the same exact integer sums: the same bits
    // at every placement (the second reading its scales past `SCALES_AT` stand-ins).
    let mut outputs = [Vec::new(), Vec::new()];
    sweep_matrix(
        &mut g,
        Matrix::new("matvec_q8_0", rows, cols, n),
        |g, out, p| {
            launch_matrix!(g, out, p, out_scale;
            matvec_q8_0 | matvec_q8_0_wide {
                wq: bwq, wd: bwd, q: bq, d: bd, d_at: 0, ids: bwq, per_input: 1, expert0: 0, experts: 0
            });
            outputs[0].push(bits(&read!(g, &*out)));
        },
        |got| c.error(got),
        "diff of Σ|terms|",
        1e-6,
    );
    sweep_matrix(
        &mut g,
        Matrix::new("matvec_q8_0_dp4", rows, cols, n),
        |g, out, p| {
            launch_matrix!(g, out, p, out_scale;
            matvec_q8_0_dp4 | matvec_q8_0_dp4_wide {
                wq: bwq, wd: bwd, q: bq, d: bd_past, d_at: SCALES_AT, ids: bwq, per_input: 1, expert0: 0, experts: 0
            });
            outputs[1].push(bits(&read!(g, &*out)));
        },
        |got| c.error(got),
        "diff of Σ|terms|",
        1e-6,
    );
    assert!(!outputs[0].is_empty());
    assert!(outputs[0] == outputs[1], "dot4I8Packed changes the bits");
}

#[test]
fn tiled_q8_0_kernel_gives_the_matrix_vector_kernels_bits() {
    let mut g = gpu();
    // 150 rows (two tiles of 64 and one of 22) of 352 (11 blocks: five K-steps of 2 and one
    // of 1; walked in order at 1 lane, 0 4 8 1 5 9 2 6 10 3 7 at 4, lanes ending inside
    // K-steps; one block a lane at 32), 70 tokens (a tile of 64 and one of 6), beside the
    // wide-step instance of the dot4I8Packed kernel (the plain one gives the same bits:
    // `matvec_q8_0_matches_q8_0_dot`).
    let (rows, cols, n, out_scale) = (150usize, 352usize, 70usize, 0.75f32);
    let c = Q8_0Case::new(&g, rows, cols, n, out_scale, 41);
    let (bwq, bwd, bq, bd) = (&c.wq, &c.wd, &c.q, &c.d);
    // As `matvec_q8_0_matches_q8_0_dot`.
    sweep_tiled(
        &mut g,
        Matrix::new("matvec_q8_0_gemm", rows, cols, n),
        |g, out, p| {
            launch_tiled!(g, out, p, out_scale;
                matvec_q8_0_gemm { wq: bwq, wd: bwd, q: bq, d: bd, lanes: p.lanes, ids: bwq, per_input: 1, expert0: 0, experts: 0, gid_at: 0, order_at: 0, gathered: 0 })
        },
        |g, out, p| {
            launch_matrix!(g, out, p, out_scale;
            matvec_q8_0_dp4 | matvec_q8_0_dp4_wide {
                wq: bwq, wd: bwd, q: bq, d: bd, d_at: 0, ids: bwq, per_input: 1, expert0: 0, experts: 0
            })
        },
        |got| c.error(got),
        "diff of Σ|terms|",
        1e-6,
    );
}

/// The int8 codes of words packed as [`pack_i8`] packs them.
fn unpack_i8(words: &[u32]) -> Vec<i32> {
    words
        .iter()
        .flat_map(|w| (0..4).map(move |b| i32::from((w >> (8 * b)) as u8 as i8)))
        .collect()
}

/// int8 codes packed four to a word, the first in the low byte (the GPU's activation layout
/// for `dot4I8Packed`).
fn pack_i8(codes: &[i32]) -> Vec<u32> {
    codes
        .chunks_exact(4)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u32, |w, (b, &v)| w | (((v as u32) & 255) << (8 * b)))
        })
        .collect()
}

#[test]
fn packed_i2s_path_equals_the_cpu_exactly() {
    let mut g = gpu();
    // The dot4I8Packed path: quantize_i8_packed, then bitlinear_i2s_dp4, on the shape of the
    // plain test (37 × 640, 21 tokens) — the integer sums are the same, so the outputs match
    // the CPU to the plain path's bound.
    let (rows, cols, n, beta) = (37usize, 640usize, 21usize, 0.0371f32);
    let codes = i2s_codes(rows * cols / 4, 11);
    let x: Vec<f32> = (0..n).flat_map(|t| data(cols, 12 + t as u64)).collect();
    let acts: Vec<_> = x.chunks_exact(cols).map(quantize_i8_row).collect();
    let bx = g.upload("x", &x).unwrap();
    let mut q = g.zeroed::<u32>("q", n * cols / 4).unwrap();
    let mut scale = g.zeroed::<f32>("scale", n).unwrap();
    let mut sum = g.zeroed::<i32>("sum", n).unwrap();
    launch(
        &mut g,
        &k::quantize_i8_packed::Args {
            x: &bx,
            q: &mut q,
            scale: &mut scale,
            sum: &mut sum,
            cols: cols as u32,
        },
        k::row_grid(n as u32),
    );
    let (got_q, got_s, got_sum) = (read!(g, &q), read!(g, &scale), read!(g, &sum));
    for (t, a) in acts.iter().enumerate() {
        // Same rule as quantize_i8 (whose test bounds the scale to 2.5 ulp); with the scale
        // equal, codes and their sum are equal too.
        assert_eq!(got_s[t], a.scale, "token {t} scale");
        assert_eq!(got_sum[t], a.sum, "token {t} Σq");
        let bytes: Vec<i8> = got_q[t * cols / 4..(t + 1) * cols / 4]
            .iter()
            .flat_map(|w| w.to_le_bytes().map(|b| b as i8))
            .collect();
        assert_eq!(bytes, a.q, "token {t} packed codes");
    }
    let bc = g.upload("codes", &words(&codes)).unwrap();
    let want = i2s_reference(&codes, &acts, cols, beta);
    // Exact integer sums, then the plain path's division and multiplication.
    sweep_matrix(
        &mut g,
        Matrix::new("bitlinear_i2s_dp4", rows, cols, n),
        |g, out, p| {
            launch_matrix!(g, out, p, beta;
                bitlinear_i2s_dp4 | bitlinear_i2s_dp4_wide { codes: &bc, q: &q, scale: &scale, sum: &sum })
        },
        |got| max_rel_diff(got, &want),
        "relative diff",
        1e-6,
    );
}

/// Packs each token's int8 codes four to a word, with its scale and Σq: what
/// `quantize_i8_packed` leaves for the `dot4I8Packed` I2_S kernels.
fn packed_i8_activations(
    g: &Gpu,
    acts: &[I8Row],
) -> (GpuBuffer<u32>, GpuBuffer<f32>, GpuBuffer<i32>) {
    let codes: Vec<i32> = acts
        .iter()
        .flat_map(|a| a.q.iter().map(|&v| i32::from(v)))
        .collect();
    let scale: Vec<f32> = acts.iter().map(|a| a.scale).collect();
    let sum: Vec<i32> = acts.iter().map(|a| a.sum).collect();
    (
        g.upload("q", &pack_i8(&codes)).unwrap(),
        g.upload("scale", &scale).unwrap(),
        g.upload("sum", &sum).unwrap(),
    )
}

#[test]
fn tiled_i2s_kernel_gives_the_matrix_vector_kernels_bits() {
    let mut g = gpu();
    // 150 rows (two tiles of 64 and one of 22) of 384 weights (three 128-weight groups: three
    // K-steps), 70 tokens (a tile of 64 and one of 6), beside the wide-step instance of the
    // dp4 kernel the backend runs for fewer tokens.
    let (rows, cols, n, beta) = (150usize, 384usize, 70usize, 0.0371f32);
    let codes = i2s_codes(rows * cols / 4, 21);
    let acts: Vec<_> = (0..n)
        .map(|t| quantize_i8_row(&data(cols, 22 + t as u64)))
        .collect();
    let (q, scale, sum) = packed_i8_activations(&g, &acts);
    let bc = g.upload("codes", &words(&codes)).unwrap();
    let want = i2s_reference(&codes, &acts, cols, beta);
    // Exact integer sums, then the matrix-vector kernel's division and multiplication.
    sweep_tiled(
        &mut g,
        Matrix::new("bitlinear_i2s_gemm", rows, cols, n),
        |g, out, p| {
            launch_tiled!(g, out, p, beta;
                bitlinear_i2s_gemm { codes: &bc, q: &q, scale: &scale, sum: &sum })
        },
        |g, out, p| {
            launch_matrix!(g, out, p, beta;
                bitlinear_i2s_dp4 | bitlinear_i2s_dp4_wide { codes: &bc, q: &q, scale: &scale, sum: &sum })
        },
        |got| max_rel_diff(got, &want),
        "relative diff",
        1e-6,
    );
}

/// How a matrix-core stand-in test places its product: output mode (plain or gate/up pairs),
/// the window's first row and the output's width, and the lanes whose order the float steps
/// follow.
const STAND_IN_PLACEMENTS: [(u32, usize, usize, u32); 2] =
    [(k::STORE, 0, 0, 1), (k::GLU_SILU, 10, 22, 4)];

/// Runs a matrix-core kernel's stand-in (`stand_in`) and the portable tiled kernel (`tiled`),
/// each launched as `(gpu, output, placement, out_scale, odd rows' scale, mode)`, on `m` at
/// each of [`STAND_IN_PLACEMENTS`] and at `lanes` (plain stores) — a window of `m.rows` rows
/// `width − m.rows` wider than it, its first row `row0` — and asserts the tiled kernel wrote
/// every output of the window and the stand-in the same bits.
fn assert_stand_in_gives_tiled_bits(
    g: &mut Gpu,
    m: Matrix,
    lanes: &[u32],
    mut stand_in: impl FnMut(&mut Gpu, &mut GpuBuffer<f32>, Placement, f32, f32, u32),
    mut tiled: impl FnMut(&mut Gpu, &mut GpuBuffer<f32>, Placement, f32, f32, u32),
) {
    assert!(
        g.device
            .features()
            .contains(wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP),
        "the stand-ins need halves and subgroups"
    );
    let placements = STAND_IN_PLACEMENTS
        .into_iter()
        .chain(lanes.iter().map(|&l| (k::STORE, 0, 0, l)));
    for (mode, row0, wider, lanes) in placements {
        let width = m.rows + wider;
        let out_width = if mode == k::STORE { width } else { width / 2 };
        let mut results = Vec::new();
        for run_stand_in in [false, true] {
            let mut out = sentinel_out(g, m.n, out_width);
            let p = Placement {
                m,
                row0,
                width,
                lanes,
                wide: true,
            };
            let (scale, odd) = (0.0371, 0.0173);
            if run_stand_in {
                stand_in(g, &mut out, p, scale, odd, mode);
            } else {
                tiled(g, &mut out, p, scale, odd, mode);
            }
            results.push(bits(&read!(g, &out)));
        }
        let written = results[0]
            .iter()
            .filter(|&&b| b != SENTINEL.to_bits())
            .count();
        let expected = if mode == k::STORE {
            m.n * m.rows
        } else {
            m.n * m.rows / 2
        };
        assert_eq!(
            written, expected,
            "{}, mode {mode}: outputs written by the tiled kernel",
            m.name
        );
        assert!(
            results[0] == results[1],
            "{}, mode {mode}, {lanes} lanes: the matrix-core stand-in differs from the tiled kernel",
            m.name
        );
    }
}

#[test]
fn matrix_core_i2s_kernel_stand_in_gives_the_tiled_kernels_bits() {
    let mut g = gpu();
    // 150 rows (two tiles of 64 and one of 22) of 384 weights (three groups: twelve K-steps of
    // 32), 70 tokens (a tile of 64 and one of 6): the matrix-core kernel's tile walk, written
    // out by its stand-in, against the portable tiled kernel (whose bits are the
    // matrix-vector kernels', tested above). Stored plainly, and as gate/up pairs, whose odd
    // row the output stage reads beside the even one, into a window of a wider output.
    let (rows, cols, n) = (150usize, 384usize, 70usize);
    let codes = i2s_codes(rows * cols / 4, 31);
    let acts: Vec<_> = (0..n)
        .map(|t| quantize_i8_row(&data(cols, 32 + t as u64)))
        .collect();
    let (q, act_scale, sum) = packed_i8_activations(&g, &acts);
    let bc = g.upload("codes", &words(&codes)).unwrap();
    assert_stand_in_gives_tiled_bits(
        &mut g,
        Matrix::new("bitlinear_i2s_coop_stand_in", rows, cols, n),
        &[],
        |g, out, p, scale, odd, mode| {
            launch_tiled!(g, out, p, scale, odd, mode;
                bitlinear_i2s_coop_stand_in { codes: &bc, q: &q, scale: &act_scale, sum: &sum })
        },
        |g, out, p, scale, odd, mode| {
            launch_tiled!(g, out, p, scale, odd, mode;
                bitlinear_i2s_gemm { codes: &bc, q: &q, scale: &act_scale, sum: &sum })
        },
    );
}

#[test]
fn matrix_core_q8_0_kernel_stand_in_gives_the_tiled_kernels_bits() {
    let mut g = gpu();
    // 150 rows (two tiles of 64 and one of 22) of 352 weights (11 blocks: eleven K-steps), 70
    // tokens (two tiles of 32 and one of 6), as above; the lanes set the order of the float
    // steps: blocks in order at 1 lane, lanes ending mid-row at 4, lanes without a block at 32.
    let (rows, cols, n) = (150usize, 352usize, 70usize);
    let c = Q8_0Case::new(&g, rows, cols, n, 1.0, 51);
    let (bwq, bwd, bq, bd) = (&c.wq, &c.wd, &c.q, &c.d);
    assert_stand_in_gives_tiled_bits(
        &mut g,
        Matrix::new("matvec_q8_0_coop_stand_in", rows, cols, n),
        &[32],
        |g, out, p, scale, odd, mode| {
            launch_tiled!(@grid k::narrow_gemm_grid; g, out, p, scale, odd, mode;
                matvec_q8_0_coop_stand_in { wq: bwq, wd: bwd, q: bq, d: bd, lanes: p.lanes })
        },
        |g, out, p, scale, odd, mode| {
            launch_tiled!(g, out, p, scale, odd, mode;
                matvec_q8_0_gemm { wq: bwq, wd: bwd, q: bq, d: bd, lanes: p.lanes, ids: bwq, per_input: 1, expert0: 0, experts: 0, gid_at: 0, order_at: 0, gathered: 0 })
        },
    );
}

#[test]
fn matrix_core_kq_kernel_stand_in_gives_the_tiled_kernels_bits() {
    let mut g = gpu();
    // Q4_K, Q5_K and Q6_K: 150 rows of 1280 weights (5 blocks, walked 0 4 1 2 3 at 4 lanes:
    // 40 or 80 sub-blocks), 70 tokens, as above; lanes without a block at 8.
    let (rows, cols, n) = (150usize, 1280usize, 70usize);
    for ty in KQ_TYPES {
        let c = KqCase::new(&g, ty, rows, cols, n, 1.0);
        assert_stand_in_gives_tiled_bits(
            &mut g,
            Matrix::new("matvec_kq_coop_stand_in", rows, cols, n),
            &[8],
            |g, out, p, scale, odd, mode| {
                launch_tiled!(@grid k::narrow_gemm_grid; g, out, p, scale, odd, mode;
                matvec_kq_coop_stand_in {
                    w: &c.w, wd: &c.wd, q: &c.q, d: &c.d,
                    high: c.ty.high, sub: c.ty.sub, offset: c.ty.offset, lanes: p.lanes
                })
            },
            |g, out, p, scale, odd, mode| {
                launch_tiled!(g, out, p, scale, odd, mode;
                matvec_kq_gemm {
                    w: &c.w, wd: &c.wd, q: &c.q, d: &c.d,
                    high: c.ty.high, sub: c.ty.sub, offset: c.ty.offset, lanes: p.lanes,
                    ids: &c.w, per_input: 1, expert0: 0, experts: 0, gid_at: 0, order_at: 0,
                    gathered: 0
                })
            },
        );
    }
}

#[test]
fn matrix_core_tq_kernel_stand_in_gives_the_tiled_kernels_bits() {
    let mut g = gpu();
    // 150 rows of 1280 weights (5 blocks of eight K-steps, walked 0 4 1 2 3 at 4 lanes), 70
    // tokens, as above; lanes without a block at 8.
    let (rows, cols, n) = (150usize, 1280usize, 70usize);
    let c = TqCase::new(&g, rows, cols, n, 1.0);
    assert_stand_in_gives_tiled_bits(
        &mut g,
        Matrix::new("bitlinear_tq_coop_stand_in", rows, cols, n),
        &[8],
        |g, out, p, scale, odd, mode| {
            launch_tiled!(@grid k::narrow_gemm_grid; g, out, p, scale, odd, mode;
            bitlinear_tq_coop_stand_in {
                codes: &c.codes, wscale: &c.wscale, q: &c.q, d: &c.d, lanes: p.lanes
            })
        },
        |g, out, p, scale, odd, mode| {
            launch_tiled!(g, out, p, scale, odd, mode;
            bitlinear_tq_gemm {
                codes: &c.codes, wscale: &c.wscale, q: &c.q, d: &c.d, lanes: p.lanes
            })
        },
    );
}

#[test]
fn rms_norm_sg_matches_the_cpu() {
    let mut g = gpu();
    // lavapipe (CI) has subgroups (of 8); the kernel is written for any size from 4 to 128.
    assert!(
        g.device.features().contains(wgpu::Features::SUBGROUP),
        "no subgroups on this adapter"
    );
    let d = rms_norm_diff!(&mut g, rms_norm_sg, 33, 34);
    // f64 in order on the CPU, subgroup sums then partials in f32 on the GPU: a few ulps of
    // the scale, as for the tree version.
    assert_within("rms_norm_sg", "relative diff", d, 1e-5);
}

#[test]
fn head_norms_in_one_launch_match_the_cpu() {
    let mut g = gpu();
    // Query and key heads of 96 (fewer values than threads), 128 and 256 (two values a
    // thread), distinct gains and sides.
    for (width, rows) in [(96, [5, 3]), (128, [4, 2]), (256, [3, 1])] {
        let eps = 1e-6;
        let x = [data(rows[0] * width, 11), data(rows[1] * width, 12)];
        let w = [data(width, 13), data(width, 14)];
        let up = |g: &Gpu, v: &[f32]| g.upload("x", v).unwrap();
        let (bx, bw) = (
            [up(&g, &x[0]), up(&g, &x[1])],
            [up(&g, &w[0]), up(&g, &w[1])],
        );
        let mut yq = g.zeroed::<f32>("yq", rows[0] * width).unwrap();
        let mut yk = g.zeroed::<f32>("yk", rows[1] * width).unwrap();
        let args = k::rms_norm_heads::Args {
            xq: &bx[0],
            wq: &bw[0],
            yq: &mut yq,
            xk: &bx[1],
            wk: &bw[1],
            yk: &mut yk,
            q_rows: rows[0] as u32,
            width: width as u32,
            eps,
        };
        launch(&mut g, &args, k::row_grid((rows[0] + rows[1]) as u32));
        for (side, y) in [read!(g, &yq), read!(g, &yk)].iter().enumerate() {
            let mut want = vec![0.0; rows[side] * width];
            ops::rms_norm(Isa::Scalar, &x[side], &w[side], rows[side], eps, &mut want);
            // As `rms_norm_matches_the_cpu`: f64 sums on the CPU, a 128-way f32 tree here.
            let d = max_rel_diff(y, &want);
            assert_within(
                &format!("rms_norm_heads {width} side {side}"),
                "relative diff",
                d,
                1e-5,
            );
        }
    }
}

#[test]
fn rope_norm_rotates_adjacent_pairs() {
    let mut g = gpu();
    // The same geometry as the NeoX test; the reference is written here (the CPU backend only
    // has NeoX): pair i of a head is (x[2i], x[2i+1]), angle from the shared table.
    let RopeRun {
        shape,
        x,
        table,
        got,
    } = rope_run!(&mut g, rope_norm, 10000.0, 35);
    let (half, pos0) = (shape.rope_dim / 2, ROPE_POS0);
    let mut want = x.clone();
    for (r, head) in want.chunks_exact_mut(shape.head_dim).enumerate() {
        let t = r / shape.n_head;
        for i in 0..half {
            let at = 2 * ((pos0 + t) * half + i);
            let (c, s) = (table[at], table[at + 1]);
            let (a, b) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = a * c - b * s;
            head[2 * i + 1] = a * s + b * c;
        }
    }
    // Same products and sums; a GPU may contract one into an FMA (≤ an ulp of |a|,|b| < 2).
    let d = max_rel_diff(&got, &want);
    assert_within("rope_norm", "relative diff", d, 1e-6);
}

#[test]
fn kv_write_places_keys_and_values_at_their_positions() {
    let mut g = gpu();
    // 3 tokens of 320 at positions 5..8 of a 10-position cache that already holds data, as
    // f32 words and as pairs of f16; and in a ring of 7 slots, the last one wrapped round to
    // slot 0.
    let (kv, n, pos0, ctx) = (320usize, 3usize, 5usize, 10usize);
    let (mut k_new, v_new) = (data(n * kv, 36), data(n * kv, 37));
    // Rounding edges of f16: ties to even (down, then up), the largest half and the first value
    // past it (∞), the subnormal range, a tie at half the smallest subnormal (→ 0), −0, NaN-free.
    let edges = [
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        65504.0,
        65520.0,
        1e-6,
        2f32.powi(-25),
        3.0 * 2f32.powi(-26),
        -0.0,
        -70000.0,
        6.1e-5,
    ];
    k_new[..edges.len()].copy_from_slice(&edges);
    for (f16, slots) in [(false, ctx), (true, ctx), (false, 7), (true, 7)] {
        let word = |x: &[f32]| -> Vec<u32> {
            if f16 {
                let h = |v: f32| u32::from(half::f16::from_f32(v).to_bits());
                x.chunks_exact(2).map(|p| h(p[0]) | h(p[1]) << 16).collect()
            } else {
                bits(x)
            }
        };
        let (old_k, old_v) = (word(&data(ctx * kv, 38)), word(&data(ctx * kv, 39)));
        let (bk, bv) = (
            g.upload("k", &k_new).unwrap(),
            g.upload("v", &v_new).unwrap(),
        );
        let mut kc = g.upload("k cache", &old_k).unwrap();
        let mut vc = g.upload("v cache", &old_v).unwrap();
        launch(
            &mut g,
            &k::kv_write::Args {
                k: &bk,
                v: &bv,
                k_cache: &mut kc,
                v_cache: &mut vc,
                len: (n * kv) as u32,
                at: (pos0 * kv) as u32,
                ring: (slots * kv) as u32,
                f16: u32::from(f16),
            },
            k::kv_write::grid_for((n * kv) as u32),
        );
        // f16: each value rounded to the nearest half, as the CPU cache stores it.
        let per = if f16 { 2 } else { 1 };
        let (mut want_k, mut want_v) = (old_k, old_v);
        let (new_k, new_v) = (word(&k_new), word(&v_new));
        for t in 0..n {
            let (at, row) = (
                (pos0 + t) % slots * kv / per,
                t * kv / per..(t + 1) * kv / per,
            );
            want_k[at..at + kv / per].copy_from_slice(&new_k[row.clone()]);
            want_v[at..at + kv / per].copy_from_slice(&new_v[row]);
        }
        assert_eq!(read!(g, &kc), want_k, "K cache (f16: {f16}, {slots} slots)");
        assert_eq!(read!(g, &vc), want_v, "V cache (f16: {f16}, {slots} slots)");
    }
}

/// Experts stacked in the `_id` tests: 3 of 37 rows each; 3 rows of activations, each feeding 2
/// output rows whose experts `BY_ID` names (every expert, one twice for one input).
const EXPERTS: usize = 3;
const EXPERT_ROWS: usize = 37;
const INPUTS: usize = 3;
const BY_ID: [u32; 6] = [2, 0, 1, 1, 0, 2];

/// An `_id` instance's outputs (`run_id`: `BY_ID.len()` rows of [`EXPERT_ROWS`]) equal, bit for
/// bit, the decode instance's over the whole stack (`run_whole`: [`INPUTS`] rows of all the
/// experts' rows), row `z` its expert's rows for input `z / 2`, at every lane count.
fn assert_rows_by_id(
    g: &mut Gpu,
    name: &str,
    cols: usize,
    mut run_whole: impl FnMut(&mut Gpu, &mut GpuBuffer<f32>, Placement),
    mut run_id: impl FnMut(&mut Gpu, &mut GpuBuffer<f32>, Placement),
) {
    let (all, pairs) = (EXPERTS * EXPERT_ROWS, BY_ID.len());
    for lanes in LANES {
        let whole = Placement {
            m: Matrix::new("whole", all, cols, INPUTS),
            row0: 0,
            width: all,
            lanes,
            wide: false,
        };
        let mut out = sentinel_out(g, INPUTS, all);
        run_whole(g, &mut out, whole);
        let full = read!(g, &out);
        let by_id = Placement {
            m: Matrix::new("by id", EXPERT_ROWS, cols, pairs),
            width: EXPERT_ROWS,
            ..whole
        };
        let mut out = sentinel_out(g, pairs, EXPERT_ROWS);
        run_id(g, &mut out, by_id);
        let got = read!(g, &out);
        let want: Vec<f32> = (0..pairs)
            .flat_map(|z| {
                let first = (z / 2) * all + BY_ID[z] as usize * EXPERT_ROWS;
                full[first..first + EXPERT_ROWS].to_vec()
            })
            .collect();
        assert!(
            bits(&got) == bits(&want),
            "{name} at {lanes} lanes: rows by id differ from their experts' rows"
        );
    }
}

#[test]
fn id_instances_multiply_each_row_by_its_experts_rows() {
    let mut g = gpu();
    let ids = g.upload("ids", &BY_ID).unwrap();
    let rows = EXPERTS * EXPERT_ROWS;
    // Q8_0, its dot4I8Packed instance, the three K-quant layouts, F16 and BF16.
    let cols = 320;
    let c = Q8_0Case::new(&g, rows, cols, INPUTS, 0.75, 53);
    let (bwq, bwd, bq, bd) = (&c.wq, &c.wd, &c.q, &c.d);
    assert_rows_by_id(
        &mut g,
        "matvec_q8_0_id",
        cols,
        |g, out, p| {
            launch_matrix!(@one g, out, p, 0.75;
                matvec_q8_0 { wq: bwq, wd: bwd, q: bq, d: bd, d_at: 0, ids: bwq, per_input: 1, expert0: 0, experts: 0 })
        },
        |g, out, p| {
            launch_matrix!(@one g, out, p, 0.75;
                matvec_q8_0_id { wq: bwq, wd: bwd, q: bq, d: bd, d_at: 0, ids: &ids, per_input: 2, expert0: 0, experts: EXPERTS as u32 })
        },
    );
    assert_rows_by_id(
        &mut g,
        "matvec_q8_0_dp4_id",
        cols,
        |g, out, p| {
            launch_matrix!(@one g, out, p, 0.75;
                matvec_q8_0 { wq: bwq, wd: bwd, q: bq, d: bd, d_at: 0, ids: bwq, per_input: 1, expert0: 0, experts: 0 })
        },
        |g, out, p| {
            launch_matrix!(@one g, out, p, 0.75; matvec_q8_0_dp4_id {
                wq: bwq, wd: bwd, q: bq, d: bd, d_at: 0, ids: &ids, per_input: 2, expert0: 0, experts: EXPERTS as u32
            })
        },
    );
    let cols = 512;
    for ty in KQ_TYPES {
        let c = KqCase::new(&g, ty, rows, cols, INPUTS, 1.25);
        let (high, sub, offset) = (ty.high, ty.sub, ty.offset);
        assert_rows_by_id(
            &mut g,
            &format!("matvec_kq_id ({ty:?})"),
            cols,
            |g, out, p| {
                launch_matrix!(@one g, out, p, 1.25; matvec_kq {
                    w: &c.w, wd: &c.wd, q: &c.q, d: &c.d, d_at: 0, ids: &c.w, per_input: 1, expert0: 0, experts: 0,
                    high: high, sub: sub, offset: offset
                })
            },
            |g, out, p| {
                launch_matrix!(@one g, out, p, 1.25; matvec_kq_id {
                    w: &c.w, wd: &c.wd, q: &c.q, d: &c.d, d_at: 0, ids: &ids, per_input: 2, expert0: 0, experts: EXPERTS as u32,
                    high: high, sub: sub, offset: offset
                })
            },
        );
    }
    let cols = 96;
    let c = f16_case(&g, rows, cols, INPUTS, 0.75, 59);
    assert_rows_by_id(
        &mut g,
        "matvec_f16_id",
        cols,
        |g, out, p| {
            launch_matrix!(@one g, out, p, 0.75;
                matvec_f16 { w: &c.w, xh: &c.x, ids: &c.w, per_input: 1, expert0: 0, experts: 0 })
        },
        |g, out, p| {
            launch_matrix!(@one g, out, p, 0.75;
                matvec_f16_id { w: &c.w, xh: &c.x, ids: &ids, per_input: 2, expert0: 0, experts: EXPERTS as u32 })
        },
    );
    let c = bf16_case(&g, rows, cols, INPUTS, 0.75, 61);
    assert_rows_by_id(
        &mut g,
        "matvec_bf16_id",
        cols,
        |g, out, p| {
            launch_matrix!(@one g, out, p, 0.75;
                matvec_bf16 { w: &c.w, x: &c.x, ids: &c.w, per_input: 1, expert0: 0, experts: 0 })
        },
        |g, out, p| {
            launch_matrix!(@one g, out, p, 0.75;
                matvec_bf16_id { w: &c.w, x: &c.x, ids: &ids, per_input: 2, expert0: 0, experts: EXPERTS as u32 })
        },
    );
}

/// Rows of activations in the grouped tests, each choosing two of the [`EXPERTS`]: first expert
/// 1 (70 pairs: a run of two tiles, the second partial), then expert 0 or 2 by parity (35 each).
const GROUPED_INPUTS: usize = 70;

/// The router's ids of the grouped tests and, past them, `moe_group`'s tables over its slots
/// (grouped on the GPU: `moe_group_sorts_the_pairs_by_expert_into_whole_tiles` checks them);
/// with the slots, `pos` (each pair's slot, read back) and the tables' offsets.
fn grouped_tables(g: &mut Gpu) -> (GpuBuffer<u32>, usize, Vec<u32>, u32, u32) {
    let ids: Vec<u32> = (0..GROUPED_INPUTS)
        .flat_map(|t| [1, 2 * (t as u32 % 2)])
        .collect();
    let pairs = ids.len();
    let tile = k::GEMM_TOKENS as usize;
    let slots = tile * (pairs.div_ceil(tile) + pairs.min(EXPERTS));
    let mut words = ids;
    words.resize(pairs + 2 * slots + pairs, 0);
    let mut tables = g.upload("tables", &words).unwrap();
    launch(
        g,
        &k::moe_group::Args {
            ids: &mut tables,
            n_expert: EXPERTS as u32,
            pairs: pairs as u32,
            slots: slots as u32,
            tile: tile as u32,
        },
        [1, 1, 1],
    );
    let pos = read!(g, &tables)[pairs + 2 * slots..].to_vec();
    let (order_at, gid_at) = (pairs as u32, (pairs + slots) as u32);
    (tables, slots, pos, order_at, gid_at)
}

/// A grouped `_id` instance of a tiled kernel (`run_grouped`: one row of [`EXPERT_ROWS`] a slot)
/// gives each pair, at its slot, the bits of the tiled kernel over the whole stack (`run_whole`:
/// [`GROUPED_INPUTS`] rows of all the experts' rows): its expert's rows for its input row, at
/// two lane counts.
fn assert_slots_by_id(
    g: &mut Gpu,
    name: &str,
    cols: usize,
    mut run_whole: impl FnMut(&mut Gpu, &mut GpuBuffer<f32>, Placement),
    mut run_grouped: impl FnMut(&mut Gpu, &mut GpuBuffer<f32>, Placement),
    (slots, pos): (usize, &[u32]),
) {
    let all = EXPERTS * EXPERT_ROWS;
    for lanes in [1, 4] {
        let whole = Placement {
            m: Matrix::new("whole", all, cols, GROUPED_INPUTS),
            row0: 0,
            width: all,
            lanes,
            wide: false,
        };
        let mut out = sentinel_out(g, GROUPED_INPUTS, all);
        run_whole(g, &mut out, whole);
        let full = read!(g, &out);
        let grouped = Placement {
            m: Matrix::new("grouped", EXPERT_ROWS, cols, slots),
            width: EXPERT_ROWS,
            ..whole
        };
        let mut out = sentinel_out(g, slots, EXPERT_ROWS);
        run_grouped(g, &mut out, grouped);
        let got = read!(g, &out);
        for (p, &slot) in pos.iter().enumerate() {
            let (t, e) = (p / 2, [1, 2 * (p / 2 % 2)][p % 2]);
            let want = &full[t * all + e * EXPERT_ROWS..][..EXPERT_ROWS];
            let at = slot as usize * EXPERT_ROWS;
            assert!(
                bits(&got[at..at + EXPERT_ROWS]) == bits(want),
                "{name} at {lanes} lanes: pair {p} (row {t}, expert {e}) at slot {slot}"
            );
        }
    }
}

#[test]
fn grouped_tiled_instances_multiply_each_slot_by_its_experts_rows() {
    let mut g = gpu();
    let (tables, slots, pos, order_at, gid_at) = grouped_tables(&mut g);
    let layout = (slots, &pos[..]);
    let rows = EXPERTS * EXPERT_ROWS;
    let n = GROUPED_INPUTS;
    let c = Q8_0Case::new(&g, rows, 320, n, 0.75, 83);
    let (bwq, bwd, bq, bd) = (&c.wq, &c.wd, &c.q, &c.d);
    assert_slots_by_id(
        &mut g,
        "matvec_q8_0_gemm_id",
        320,
        |g, out, p| {
            launch_tiled!(g, out, p, 0.75; matvec_q8_0_gemm {
                wq: bwq, wd: bwd, q: bq, d: bd, lanes: p.lanes, ids: bwq, per_input: 1,
                expert0: 0, experts: 0, gid_at: 0, order_at: 0, gathered: 0
            })
        },
        |g, out, p| {
            launch_tiled!(g, out, p, 0.75; matvec_q8_0_gemm_id {
                wq: bwq, wd: bwd, q: bq, d: bd, lanes: p.lanes, ids: &tables, per_input: 2,
                expert0: 0, experts: EXPERTS as u32, gid_at: gid_at, order_at: order_at,
                gathered: 1
            })
        },
        layout,
    );
    for ty in KQ_TYPES {
        let c = KqCase::new(&g, ty, rows, 512, n, 1.25);
        let (high, sub, offset) = (ty.high, ty.sub, ty.offset);
        assert_slots_by_id(
            &mut g,
            &format!("matvec_kq_gemm_id ({ty:?})"),
            512,
            |g, out, p| {
                launch_tiled!(g, out, p, 1.25; matvec_kq_gemm {
                    w: &c.w, wd: &c.wd, q: &c.q, d: &c.d, high: high, sub: sub,
                    offset: offset, lanes: p.lanes, ids: &c.w, per_input: 1, expert0: 0,
                    experts: 0, gid_at: 0, order_at: 0, gathered: 0
                })
            },
            |g, out, p| {
                launch_tiled!(g, out, p, 1.25; matvec_kq_gemm_id {
                    w: &c.w, wd: &c.wd, q: &c.q, d: &c.d, high: high, sub: sub,
                    offset: offset, lanes: p.lanes, ids: &tables, per_input: 2, expert0: 0,
                    experts: EXPERTS as u32, gid_at: gid_at, order_at: order_at, gathered: 1
                })
            },
            layout,
        );
    }
    let c = f16_case(&g, rows, 96, n, 0.75, 89);
    assert_slots_by_id(
        &mut g,
        "matvec_f16_gemm_id",
        96,
        |g, out, p| {
            launch_tiled!(g, out, p, 0.75; matvec_f16_gemm {
                w: &c.w, xh: &c.x, lanes: p.lanes, ids: &c.w, per_input: 1, expert0: 0,
                experts: 0, gid_at: 0, order_at: 0, gathered: 0
            })
        },
        |g, out, p| {
            launch_tiled!(g, out, p, 0.75; matvec_f16_gemm_id {
                w: &c.w, xh: &c.x, lanes: p.lanes, ids: &tables, per_input: 2, expert0: 0,
                experts: EXPERTS as u32, gid_at: gid_at, order_at: order_at, gathered: 1
            })
        },
        layout,
    );
    let c = bf16_case(&g, rows, 96, n, 0.75, 97);
    assert_slots_by_id(
        &mut g,
        "matvec_bf16_gemm_id",
        96,
        |g, out, p| {
            launch_tiled!(g, out, p, 0.75; matvec_bf16_gemm {
                w: &c.w, x: &c.x, lanes: p.lanes, ids: &c.w, per_input: 1, expert0: 0,
                experts: 0, gid_at: 0, order_at: 0, gathered: 0
            })
        },
        |g, out, p| {
            launch_tiled!(g, out, p, 0.75; matvec_bf16_gemm_id {
                w: &c.w, x: &c.x, lanes: p.lanes, ids: &tables, per_input: 2, expert0: 0,
                experts: EXPERTS as u32, gid_at: gid_at, order_at: order_at, gathered: 1
            })
        },
        layout,
    );
}

#[test]
fn id_instances_multiply_the_experts_of_their_window_only() {
    let mut g = gpu();
    let ids = g.upload("ids", &BY_ID).unwrap();
    let (rows, cols, pairs) = (EXPERTS * EXPERT_ROWS, 320usize, BY_ID.len());
    let c = Q8_0Case::new(&g, rows, cols, INPUTS, 0.75, 67);
    // The stack in two windows: experts 0 and 1 in the case's buffers, expert 2 in its own.
    let (words, blocks) = (EXPERT_ROWS * cols / 4, EXPERT_ROWS * cols / 32);
    let (wq, wd) = (read!(g, &c.wq), read!(g, &c.wd));
    let last_wq = g.upload("wq 2", &wq[2 * words..]).unwrap();
    let last_wd = g.upload("wd 2", &wd[2 * blocks..]).unwrap();
    let p = Placement {
        m: Matrix::new("by id", EXPERT_ROWS, cols, pairs),
        row0: 0,
        width: EXPERT_ROWS,
        lanes: 4,
        wide: false,
    };
    let run = |g: &mut Gpu, out: &mut GpuBuffer<f32>, window: usize| {
        let (wq, wd, expert0, experts) = match window {
            0 => (&c.wq, &c.wd, 0, 2),
            _ => (&last_wq, &last_wd, 2, 1),
        };
        launch_matrix!(@one g, out, p, 0.75; matvec_q8_0_dp4_id {
            wq: wq, wd: wd, q: &c.q, d: &c.d, d_at: 0, ids: &ids, per_input: 2,
            expert0: expert0, experts: experts
        })
    };
    let mut whole = sentinel_out(&g, pairs, EXPERT_ROWS);
    launch_matrix!(@one &mut g, &mut whole, p, 0.75; matvec_q8_0_dp4_id {
        wq: &c.wq, wd: &c.wd, q: &c.q, d: &c.d, d_at: 0, ids: &ids, per_input: 2,
        expert0: 0, experts: EXPERTS as u32
    });
    let want = read!(g, &whole);
    let mut out = sentinel_out(&g, pairs, EXPERT_ROWS);
    run(&mut g, &mut out, 0);
    // The first window writes the rows of its experts and leaves expert 2's to the other.
    let first = read!(g, &out);
    for (z, rows) in first.chunks_exact(EXPERT_ROWS).enumerate() {
        let left = rows.iter().all(|v| v.to_bits() == SENTINEL.to_bits());
        assert_eq!(left, BY_ID[z] == 2, "row {z} (expert {})", BY_ID[z]);
    }
    run(&mut g, &mut out, 1);
    assert!(
        bits(&read!(g, &out)) == bits(&want),
        "two windows differ from one"
    );
}

/// A grouped `_id` instance over a stack in two windows (experts 0 and 1, then expert 2, as
/// `id_instances_multiply_the_experts_of_their_window_only` splits it): the first launch writes
/// the slots of its experts' tiles and leaves expert 2's and those past the runs; the second
/// completes the one launch's output, bit for bit.
#[test]
fn grouped_instances_multiply_the_experts_of_their_window_only() {
    let mut g = gpu();
    let (tables, slots, pos, order_at, gid_at) = grouped_tables(&mut g);
    let (rows, cols) = (EXPERTS * EXPERT_ROWS, 320usize);
    let c = Q8_0Case::new(&g, rows, cols, GROUPED_INPUTS, 0.75, 101);
    let (words, blocks) = (EXPERT_ROWS * cols / 4, EXPERT_ROWS * cols / 32);
    let (wq, wd) = (read!(g, &c.wq), read!(g, &c.wd));
    let last_wq = g.upload("wq 2", &wq[2 * words..]).unwrap();
    let last_wd = g.upload("wd 2", &wd[2 * blocks..]).unwrap();
    let p = Placement {
        m: Matrix::new("grouped", EXPERT_ROWS, cols, slots),
        row0: 0,
        width: EXPERT_ROWS,
        lanes: 4,
        wide: false,
    };
    let run = |g: &mut Gpu, out: &mut GpuBuffer<f32>, window: Option<usize>| {
        let (wq, wd, expert0, experts) = match window {
            None => (&c.wq, &c.wd, 0, EXPERTS as u32),
            Some(0) => (&c.wq, &c.wd, 0, 2),
            Some(_) => (&last_wq, &last_wd, 2, 1),
        };
        launch_tiled!(g, out, p, 0.75; matvec_q8_0_gemm_id {
            wq: wq, wd: wd, q: &c.q, d: &c.d, lanes: p.lanes, ids: &tables, per_input: 2,
            expert0: expert0, experts: experts, gid_at: gid_at, order_at: order_at, gathered: 1
        })
    };
    let mut whole = sentinel_out(&g, slots, EXPERT_ROWS);
    run(&mut g, &mut whole, None);
    let want = read!(g, &whole);
    let mut out = sentinel_out(&g, slots, EXPERT_ROWS);
    run(&mut g, &mut out, Some(0));
    let first = read!(g, &out);
    let gid = read!(g, &tables)[gid_at as usize..][..slots].to_vec();
    for (z, rows) in first.chunks_exact(EXPERT_ROWS).enumerate() {
        let left = rows.iter().all(|v| v.to_bits() == SENTINEL.to_bits());
        assert_eq!(left, gid[z] >= 2, "slot {z} (expert {})", gid[z]);
    }
    assert!(
        pos.iter().all(|&z| gid[z as usize] < EXPERTS as u32),
        "every pair in a run"
    );
    run(&mut g, &mut out, Some(1));
    assert!(
        bits(&read!(g, &out)) == bits(&want),
        "two windows differ from one"
    );
}

/// `biased_glu_by_id` adds each row's expert's gate and up biases, then the gated activation:
/// the biases added on the host, then each activation's own kernel, bit for bit.
#[test]
fn biased_gated_activations_by_id_match_the_biases_then_the_activation() {
    let mut g = gpu();
    let (width, rows) = (300usize, BY_ID.len());
    let len = (rows * width) as u32;
    let (gate, up) = (data(rows * width, 71), data(rows * width, 72));
    let (bg, bu) = (data(EXPERTS * width, 73), data(EXPERTS * width, 74));
    let plus = |x: &[f32], b: &[f32]| -> Vec<f32> {
        (0..rows * width)
            .map(|i| x[i] + b[BY_ID[i / width] as usize * width + i % width])
            .collect::<Vec<f32>>()
    };
    let (gate_b, up_b) = (plus(&gate, &bg), plus(&up, &bu));
    let up_of = |g: &mut Gpu, x: &[f32]| g.upload("x", x).unwrap();
    let (bgate, bup, bbg, bbu) = (
        up_of(&mut g, &gate),
        up_of(&mut g, &up),
        up_of(&mut g, &bg),
        up_of(&mut g, &bu),
    );
    let (gate_b, up_b) = (up_of(&mut g, &gate_b), up_of(&mut g, &up_b));
    let ids = g.upload("ids", &BY_ID).unwrap();
    for mode in [k::GLU_RELU2, k::GLU_SILU, k::GLU_GELU, k::GLU_CLAMPED] {
        let mut got = g.zeroed::<f32>("got", rows * width).unwrap();
        launch(
            &mut g,
            &k::biased_glu_by_id::Args {
                gate: &bgate,
                up: &bup,
                bg: &bbg,
                bu: &bbu,
                ids: &ids,
                out: &mut got,
                width: width as u32,
                mode,
                ids_at: 0,
                n: len,
            },
            k::biased_glu_by_id::grid_for(len),
        );
        let mut want = g.zeroed::<f32>("want", rows * width).unwrap();
        let (gate, up, out, n) = (&gate_b, &up_b, &mut want, len);
        let grid = k::silu_mul::grid_for(len);
        match mode {
            k::GLU_RELU2 => launch(&mut g, &k::relu2_mul::Args { gate, up, out, n }, grid),
            k::GLU_SILU => launch(&mut g, &k::silu_mul::Args { gate, up, out, n }, grid),
            k::GLU_GELU => launch(&mut g, &k::gelu_mul::Args { gate, up, out, n }, grid),
            _ => launch(
                &mut g,
                &k::swiglu_clamped_mul::Args { gate, up, out, n },
                grid,
            ),
        }
        let (got, want) = (read!(g, &got), read!(g, &want));
        assert!(bits(&got) == bits(&want), "mode {mode}");
    }
}
