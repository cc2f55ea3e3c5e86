//! The GPU's fused output stages against the unfused ops, in every weight layout the GPU runs:
//! gate and up joined into one pass with `act(g)·u` as it writes, and the residual add fused
//! into the down/output projection. Both do the same arithmetic in the same order as the
//! product followed by `glu`/`add`, so they must agree bit for bit; the unfused GPU path is
//! held to the CPU by the golden tests, and the fused pair is held to the CPU here too.

use half::f16;
use hesper_cpu::CpuBackend;
use hesper_engine::backend::{Backend, GateUp, MatrixUse};
use hesper_engine::config::Activation;
use hesper_engine::weights::{Format, MatrixDesc};
use hesper_gpu_backend::GpuBackend;
use hesper_tests::random::Rng;

/// Input width (a whole number of 256-blocks for TQ) and FFN width.
const D: usize = 512;
const FF: usize = 256;

/// Test data from the shared stream: 2-bit ternary codes and f16 scales.
trait Weights {
    /// A byte of four 2-bit ternary codes (0, 1, 2).
    fn codes(&mut self) -> u8;
    /// An f16 in `[-scale, scale)`, as little-endian bytes.
    fn f16(&mut self, scale: f32) -> [u8; 2];
}

impl Weights for Rng {
    fn codes(&mut self) -> u8 {
        (0..4).fold(0, |b, i| b | (((self.next_u64() % 3) as u8) << (2 * i)))
    }
    fn f16(&mut self, scale: f32) -> [u8; 2] {
        f16::from_f32(self.unit() * scale).to_le_bytes()
    }
}

/// `rows × cols` weights of `format` with plausible values.
fn weights(format: Format, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let n = rows * cols;
    match format {
        Format::F32 => (0..n)
            .flat_map(|_| (rng.unit() * 0.1).to_le_bytes())
            .collect(),
        Format::F16 => (0..n).flat_map(|_| rng.f16(0.1)).collect(),
        Format::Q8_0 => (0..n / 32)
            .flat_map(|_| {
                let mut b = rng.f16(0.01).to_vec();
                b.extend((0..32).map(|_| rng.next_u64() as u8));
                b
            })
            .collect(),
        Format::I2S { .. } => (0..n / 4).map(|_| rng.codes()).collect(),
        Format::TQ2_0 => (0..n / 256)
            .flat_map(|_| {
                let mut b: Vec<u8> = (0..64).map(|_| rng.codes()).collect();
                b.extend(rng.f16(0.05));
                b
            })
            .collect(),
        Format::TQ1_0 => (0..n / 256)
            .flat_map(|_| {
                // Base-3 packed bytes hold at most 3^5 = 243 values.
                let mut b: Vec<u8> = (0..52).map(|_| (rng.next_u64() % 243) as u8).collect();
                b.extend(rng.f16(0.05));
                b
            })
            .collect(),
        other => unreachable!("no GPU kernel for {other:?}"),
    }
}

fn load<B: Backend>(
    b: &B,
    name: &str,
    format: Format,
    rows: usize,
    cols: usize,
    seed: u64,
) -> B::Matrix {
    let data = weights(format, rows, cols, &mut Rng::new(seed));
    let desc = MatrixDesc {
        name: name.into(),
        rows,
        cols,
        format,
        range: 0..data.len(),
    };
    b.load_owned_matrix(desc, data, Some(0.75), MatrixUse::Product)
        .expect("matrix")
}

fn read<B: Backend>(b: &B, x: &B::Buffer, len: usize) -> Vec<f32> {
    let mut v = vec![0.0; len];
    pollster::block_on(b.read(x, &mut v)).expect("read");
    v
}

/// The FFN of one layer on `b`: `act(gate·x)·(up·x)` through `gate_up` (joined where the
/// backend joins), then `y += down·a` through `matmul_add`.
fn ffn<B: Backend>(
    b: &B,
    format: Format,
    join: bool,
    act: Activation,
    n: usize,
) -> (Vec<f32>, Vec<f32>) {
    let (gate, up) = (
        load(b, "gate", format, FF, D, 1),
        load(b, "up", format, FF, D, 2),
    );
    let down = load(b, "down", format, D, FF, 3);
    let pair = if join {
        b.join_gate_up(gate, up).expect("join")
    } else {
        GateUp::Apart { gate, up }
    };
    let mut rng = Rng::new(4);
    let mut x = b.alloc(n * D).expect("alloc");
    let mut y = b.alloc(n * D).expect("alloc");
    let input: Vec<f32> = (0..n * D).map(|_| rng.unit()).collect();
    let residual: Vec<f32> = (0..n * D).map(|_| rng.unit()).collect();
    b.write(&mut x, &input).expect("write");
    b.write(&mut y, &residual).expect("write");
    let (mut g, mut u, mut a) = (
        b.alloc(n * FF).unwrap(),
        b.alloc(n * FF).unwrap(),
        b.alloc(n * FF).unwrap(),
    );
    let mut scratch = b.alloc(n * D).expect("alloc");
    b.gate_up(&pair, &x, n, FF, act, [&mut g, &mut u], &mut a);
    let hidden = read(b, &a, n * FF);
    if join {
        b.matmul_add(&down, &a, n, D, &mut y, &mut scratch);
    } else {
        b.matmul(&down, &a, n, &mut scratch);
        b.add(&mut y, &scratch, n * D);
    }
    (hidden, read(b, &y, n * D))
}

const FORMATS: [Format; 6] = [
    Format::F32,
    Format::F16,
    Format::Q8_0,
    Format::I2S { beta: 0.5 },
    Format::TQ1_0,
    Format::TQ2_0,
];

#[test]
fn fused_gate_up_and_residual_equal_the_unfused_ops_bit_for_bit() {
    let gpu = GpuBackend::new().expect("a GPU adapter (lavapipe in CI)");
    let cpu = CpuBackend::new(2).expect("cpu");
    for packed in [false, true] {
        let packed = gpu.set_packed_dot(packed);
        for format in FORMATS {
            for act in [Activation::Relu2, Activation::Silu] {
                for n in [1, 5] {
                    let what = format!("{format:?} {act:?} n={n} packed_dot={packed}");
                    let d0 = gpu.stats().dispatches;
                    let (h_fused, y_fused) = ffn(&gpu, format, true, act, n);
                    let d1 = gpu.stats().dispatches;
                    let (h_apart, y_apart) = ffn(&gpu, format, false, act, n);
                    let d2 = gpu.stats().dispatches;
                    // Fused: quantize + joined product, quantize + product-and-add (float
                    // layouts skip the quantizers; the join at load is not in the counters, which
                    // count the backend's recorded work). Apart: the input quantized once for
                    // gate and up, two products, glu; then quantize, product and add.
                    let quantizers = u64::from(!matches!(format, Format::F32 | Format::F16));
                    assert_eq!(d1 - d0, 2 + 2 * quantizers, "{what}: fused dispatches");
                    assert_eq!(d2 - d1, 5 + 2 * quantizers, "{what}: unfused dispatches");
                    let same = |a: &[f32], b: &[f32]| {
                        a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
                    };
                    assert!(
                        same(&h_fused, &h_apart),
                        "{what}: fused gate/up differs from gate, up, glu"
                    );
                    assert!(
                        same(&y_fused, &y_apart),
                        "{what}: fused residual differs from product + add"
                    );
                    // The CPU's result, at the bound the unfused GPU path is held to elsewhere:
                    // the same integer sums, with f32 rounding of the scales and of the
                    // activation in another order; relative to the largest value.
                    let (h_cpu, y_cpu) = ffn(&cpu, format, false, act, n);
                    for (ours, cpu, name) in
                        [(&h_fused, &h_cpu, "hidden"), (&y_fused, &y_cpu, "output")]
                    {
                        let scale = cpu.iter().fold(0f32, |m, v| m.max(v.abs()));
                        let worst = ours
                            .iter()
                            .zip(cpu.iter())
                            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                        println!("{what} {name}: worst |Δ|/max = {:.2e}", worst / scale);
                        assert!(
                            worst <= 1e-5 * scale,
                            "{what} {name}: GPU vs CPU {worst} of {scale}"
                        );
                    }
                }
            }
        }
    }
}
