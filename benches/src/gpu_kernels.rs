//! `gpu_kernels [REPS]`: times each DSL kernel at the BitNet b1.58 2B4T shapes (F16 decode at
//! the golden files' 512 × 256 too) on whatever WebGPU adapter wgpu finds (`WGPU_BACKEND`
//! restricts it). Each kernel is recorded `REPS` times into one batch, submitted once and
//! waited for; the best of three batches is printed as µs per launch and the weight bytes it
//! streams per second. On a software adapter (lavapipe) the figures describe the emulation, not
//! a GPU.

use std::time::Instant;

use hesper_gpu::{Batch, Gpu, GpuBuffer, GpuError};
use hesper_shaders::{self as k, lanes_per_row};

const D: usize = 2560;
const FF: usize = 6912;
const N_HEAD: usize = 20;
const N_HEAD_KV: usize = 5;
const HEAD_DIM: usize = 128;
const CTX: usize = 512;
/// LM-head rows timed at most (one window of the 128 256-row head).
const HEAD_ROWS: usize = 65_535;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), GpuError> {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20)
        .max(1);
    let mut g = Gpu::new()?;
    println!(
        "adapter: {} ({:?}, {:?}); {reps} launches per batch, best of 3",
        g.info.name, g.info.backend, g.info.device_type
    );
    println!("| kernel | shape | µs/launch | weight GB/s |");
    println!("| --- | --- | ---: | ---: |");
    let x = g.upload("x", &pattern_f32(FF))?;
    let mut out = g.zeroed::<f32>("out", FF.max(HEAD_ROWS))?;
    // The outputs only a joined Q/K/V matrix writes.
    let mut unused = (g.zeroed::<f32>("unused", 1)?, g.zeroed::<f32>("unused", 1)?);
    let mut q = g.upload("q", &vec![3i32; FF])?;
    let mut scale = g.upload("scale", &[40.0f32])?;
    // One token through matrix kernel `k::$kernel` (its decode instance) over a `rows × cols`
    // matrix whose rows hold `units` lane units (`lanes_per_row`), stored into `out`.
    macro_rules! one_token {
        ($b:expr, $g:expr, $kernel:ident, $rows:expr, $cols:expr, $units:expr;
         $($field:ident: $value:expr),* $(,)?) => {{
            let (rows, cols, lanes) = ($rows as u32, $cols as u32, lanes_per_row($units));
            $b.run(
                $g,
                &k::$kernel::Args {
                    $($field: $value,)*
                    out: &mut out,
                    out_k: &mut unused.0,
                    out_v: &mut unused.1,
                    cols,
                    rows,
                    row0: 0,
                    window_rows: rows,
                    n: 1,
                    lanes,
                    mode: k::STORE,
                    out_scale: 1.0,
                    out_scale_odd: 0.0,
                    split_k: rows,
                    split_v: rows,
                    out_scale_v: 0.0,
                },
                k::matrix_grid(rows, lanes, 1, k::$kernel::TILE, k::$kernel::ROWS),
            )
        }};
    }

    let gains = g.upload("gains", &vec![1.0f32; D])?;
    time(&mut g, reps, "rms_norm", "1 × 2560", 0, |b, g| {
        b.run(
            g,
            &k::rms_norm::Args {
                x: &x,
                w: &gains,
                y: &mut out,
                width: D as u32,
                eps: 1e-5,
                add: 0,
            },
            k::row_grid(1),
        )
    })?;
    time(&mut g, reps, "quantize_i8", "1 × 2560", 0, |b, g| {
        b.run(
            g,
            &k::quantize_i8::Args {
                x: &x,
                q: &mut q,
                scale: &mut scale,
                cols: D as u32,
            },
            k::row_grid(1),
        )
    })?;
    for (name, rows, cols) in [
        ("attn_q/o", D, D),
        ("ffn_gate/up", FF, D),
        ("ffn_down", D, FF),
    ] {
        let codes = g.upload("codes", &pattern_u32(rows * cols / 16))?;
        time(
            &mut g,
            reps,
            "bitlinear_i2s",
            &format!("{name} {rows} × {cols}"),
            rows * cols / 4,
            |b, g| {
                one_token!(b, g, bitlinear_i2s, rows, cols, cols / 16;
                    codes: &codes, q: &q, scale: &scale)
            },
        )?;
        // The same matrix as TQ2_0 (repacked into I2_S's codes, a scale per block) times Q8_K
        // codes: the matrix-vector kernel a decoded token of a TQ file runs.
        let blocks = cols / 256;
        let wscale = g.upload("tq scales", &vec![0.01f32; rows * blocks])?;
        let d = g.upload("q8k scales", &vec![0.02f32; blocks])?;
        time(
            &mut g,
            reps,
            "bitlinear_tq",
            &format!("{name} {rows} × {cols}"),
            rows * cols / 4 + rows * blocks * 2,
            |b, g| {
                one_token!(b, g, bitlinear_tq, rows, cols, blocks;
                    codes: &codes, wscale: &wscale, q: &q, d: &d)
            },
        )?;
        // The same shape as Q8_0 (int8 codes as words, a scale a 32-block) times Q8_0 codes
        // four to a word, with `dot4I8Packed` (what a decoded token runs where it exists).
        let q8_blocks = cols / 32;
        let wq = g.upload("q8_0", &pattern_u32(rows * cols / 4))?;
        let wd = g.upload("q8_0 scales", &vec![0.01f32; rows * q8_blocks])?;
        let xq = g.upload("q8_0 activations", &pattern_u32(cols / 4))?;
        let xd = g.upload("q8_0 activation scales", &vec![0.02f32; q8_blocks])?;
        time(
            &mut g,
            reps,
            "matvec_q8_0_dp4",
            &format!("{name} {rows} × {cols}"),
            rows * cols + rows * q8_blocks * 4,
            |b, g| {
                one_token!(b, g, matvec_q8_0_dp4, rows, cols, q8_blocks;
                    wq: &wq, wd: &wd, q: &xq, d: &xd, d_at: 0, ids: &wq, per_input: 1, expert0: 0, experts: 0)
            },
        )?;
        // The same shape as Q4_K and Q6_K in `matvec_kq`'s layout (nibbles, high bits, two
        // bytes of scale and minimum a sub-block; `d`, `dmin` a block) times Q8_K codes.
        for (kind, high, sub, offset) in [("Q4_K", 0, 32, 0), ("Q6_K", 2, 16, 32)] {
            let words = rows * (cols / 8 + cols * high / 32 + cols / sub / 2);
            let w = g.upload("k-quant", &pattern_u32(words))?;
            let wd = g.upload("k-quant d", &vec![0.01f32; 2 * rows * blocks])?;
            time(
                &mut g,
                reps,
                "matvec_kq",
                &format!("{kind} {name} {rows} × {cols}"),
                4 * words + rows * blocks * 8,
                |b, g| {
                    one_token!(b, g, matvec_kq, rows, cols, blocks;
                        w: &w, wd: &wd, q: &q, d: &d, d_at: 0, ids: &w, per_input: 1, expert0: 0, experts: 0,
                        high: high as u32, sub: sub as u32, offset: offset)
                },
            )?;
        }
    }
    // One window, as large as the adapter binds (the backend splits the head the same way).
    let head_rows = HEAD_ROWS.min(g.max_binding() as usize / (D * 2));
    let head = g.upload("lm head", &pattern_u32(head_rows * D / 2))?;
    // The token's activations as `pack_f16` leaves them: halves, two to a word.
    let xh = g.upload("x as halves", &pattern_u32(D / 2))?;
    time(
        &mut g,
        reps,
        "matvec_f16",
        &format!("LM head window {head_rows} × {D}"),
        head_rows * D * 2,
        |b, g| one_token!(b, g, matvec_f16, head_rows, D, D / 2; w: &head, xh: &xh, ids: &head, per_input: 1, expert0: 0, experts: 0),
    )?;
    // The golden Llama files' LM head (512 × 256): a short row, where the lanes' fold is a
    // large part of a launch.
    time(
        &mut g,
        reps,
        "matvec_f16",
        "512 × 256",
        512 * 256 * 2,
        |b, g| one_token!(b, g, matvec_f16, 512, 256, 128; w: &head, xh: &xh, ids: &head, per_input: 1, expert0: 0, experts: 0),
    )?;
    time(
        &mut g,
        reps,
        "matvec_f16_wide",
        "512 × 256",
        512 * 256 * 2,
        |b, g| one_token!(b, g, matvec_f16_wide, 512, 256, 128; w: &head, xh: &xh, ids: &head, per_input: 1, expert0: 0, experts: 0),
    )?;
    let kv = N_HEAD_KV * HEAD_DIM;
    let words = |x: Vec<f32>| -> Vec<u32> { x.iter().map(|v| v.to_bits()).collect() };
    let kc = g.upload("k cache", &words(pattern_f32(CTX * kv)))?;
    let vc = g.upload("v cache", &words(pattern_f32(CTX * kv)))?;
    time(
        &mut g,
        reps,
        "attention",
        &format!("decode at position {}", CTX - 1),
        2 * CTX * kv * 4,
        |b, g| {
            b.run(
                g,
                &k::attention::Args {
                    q: &x,
                    k_cache: &kc,
                    v_cache: &vc,
                    lk: &x,
                    lv: &x,
                    globals: &kc,
                    sink: &x,
                    out: &mut out,
                    n_head: N_HEAD as u32,
                    n_head_kv: N_HEAD_KV as u32,
                    head_dim: HEAD_DIM as u32,
                    pos0: (CTX - 1) as u32,
                    scale: 1.0 / (HEAD_DIM as f32).sqrt(),
                    f16: 0,
                    slots: CTX as u32,
                    window: 0,
                    n_global: 0,
                    log_stride: 0,
                    landmarks: 0,
                    block: 1,
                    softcap: 0.0,
                    sinks: 0,
                },
                k::attention_grid(N_HEAD as u32, 1),
            )
        },
    )?;
    let up = g.upload("up", &pattern_f32(FF))?;
    time(&mut g, reps, "relu2_mul", "6912", 0, |b, g| {
        b.run(
            g,
            &k::relu2_mul::Args {
                gate: &x,
                up: &up,
                out: &mut out,
                n: FF as u32,
            },
            k::relu2_mul::grid_for(FF as u32),
        )
    })?;
    Ok(())
}

/// Records `launch` `reps` times per batch, three batches; prints the best.
fn time(
    g: &mut Gpu,
    reps: usize,
    kernel: &str,
    shape: &str,
    weight_bytes: usize,
    mut launch: impl FnMut(&mut Batch, &mut Gpu) -> Result<(), GpuError>,
) -> Result<(), GpuError> {
    let probe: GpuBuffer<f32> = g.zeroed("probe", 1)?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let mut batch = g.batch();
        for _ in 0..reps {
            launch(&mut batch, g)?;
        }
        let t0 = Instant::now();
        g.submit_and_read(batch, &probe, 1)?;
        best = best.min(t0.elapsed().as_secs_f64() / reps as f64);
    }
    let gbs = if weight_bytes > 0 {
        format!("{:.2}", weight_bytes as f64 / best / 1e9)
    } else {
        "-".into()
    };
    println!("| {kernel} | {shape} | {:.1} | {gbs} |", best * 1e6);
    Ok(())
}

fn pattern_f32(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect()
}

fn pattern_u32(n: usize) -> Vec<u32> {
    // Every 2-bit code in 0..=2 and plausible f16 pairs alike.
    (0..n)
        .map(|i| 0x2618_6186u32.rotate_left((i % 7) as u32 * 2))
        .collect()
}
