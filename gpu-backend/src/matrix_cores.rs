//! I2_S prompts on matrix cores (`hesper_shaders::bitlinear_i2s_coop`): which tiled kernel a
//! step of many tokens runs, and the check a device's matrix cores pass before they run a
//! model — the kernel and the portable tiled one (`bitlinear_i2s_gemm`) on one product, every
//! output bit for bit. wgpu marks cooperative matrices experimental, and a driver that sums
//! or lays out a tile otherwise than the kernel expects fails the check instead of a model.

use hesper_gpu::Gpu;
use hesper_shaders as k;

/// Which kernel runs the I2_S products of a step of at least [`k::GEMM_STEP`] tokens (all
/// three give every output the matrix-vector kernels' bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatrixCores {
    /// The portable tiled kernel: every product on the shader cores.
    Off,
    /// `bitlinear_i2s_coop`, on the device's matrix cores.
    On,
    /// `bitlinear_i2s_coop_stand_in`: the same tile walk with each matrix operation written
    /// out, where matrix cores are not (tests; lavapipe).
    StandIn,
}

impl MatrixCores {
    /// Whether `gpu` runs this variant's kernel.
    pub(crate) fn runs_on(self, gpu: &Gpu) -> bool {
        use hesper_gpu::KernelArgs;
        let source = match self {
            MatrixCores::Off => return true,
            MatrixCores::On => <k::bitlinear_i2s_coop::Args as KernelArgs>::SOURCE,
            MatrixCores::StandIn => <k::bitlinear_i2s_coop_stand_in::Args as KernelArgs>::SOURCE,
        };
        gpu.device.features().contains(source.device_features())
    }
}

/// Rows whose sums the matrix cores add exactly: a row's `Σcode·q` stays below 2²⁴ (codes up to
/// 2, activations of magnitude up to 128), so no partial sum rounds in f32 in any order.
pub(crate) const MAX_COLS: usize = 32_768;

/// Runs `variant`'s kernel and the portable tiled kernel on one product (150 rows of 384
/// weights, 70 tokens: tiles cut by both edges) and says whether every output has the same
/// bits.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn agrees(gpu: &mut Gpu, variant: MatrixCores) -> Result<bool, hesper_gpu::GpuError> {
    let (rows, cols, n) = (150usize, 384usize, 70usize);
    // A fixed generator: codes 0–2 in every crumb, int8 activations over their whole range.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let codes: Vec<u32> = (0..rows * cols / 16)
        .map(|_| (0..16).fold(0u32, |w, i| w | (((next() % 3) as u32) << (2 * i))))
        .collect();
    let acts: Vec<i8> = (0..n * cols).map(|_| next() as i8).collect();
    let q: Vec<u32> = acts
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0] as u8, c[1] as u8, c[2] as u8, c[3] as u8]))
        .collect();
    let sum: Vec<i32> = acts
        .chunks(cols)
        .map(|t| t.iter().map(|&v| i32::from(v)).sum())
        .collect();
    let scale: Vec<f32> = (0..n).map(|t| 97.0 + t as f32 * 0.37).collect();
    let codes = gpu.upload("check codes", &codes)?;
    let q = gpu.upload("check activations", &q)?;
    let sum = gpu.upload("check sums", &sum)?;
    let scale = gpu.upload("check scales", &scale)?;
    let mut results = Vec::new();
    for kernel in [MatrixCores::Off, variant] {
        let mut out: hesper_gpu::GpuBuffer<f32> = gpu.zeroed("check output", n * rows)?;
        let (mut out_k, mut out_v) = (gpu.zeroed("unused", 1)?, gpu.zeroed("unused", 1)?);
        let mut batch = gpu.batch();
        macro_rules! run {
            ($kernel:ident) => {
                batch.run(
                    gpu,
                    &k::$kernel::Args {
                        codes: &codes,
                        q: &q,
                        scale: &scale,
                        sum: &sum,
                        out: &mut out,
                        out_k: &mut out_k,
                        out_v: &mut out_v,
                        cols: cols as u32,
                        rows: rows as u32,
                        row0: 0,
                        window_rows: rows as u32,
                        n: n as u32,
                        mode: k::STORE,
                        out_scale: 0.0371,
                        out_scale_odd: 0.0,
                        split_k: rows as u32,
                        split_v: rows as u32,
                        out_scale_v: 0.0,
                    },
                    k::gemm_grid(rows as u32, n as u32),
                )?
            };
        }
        match kernel {
            MatrixCores::Off => run!(bitlinear_i2s_gemm),
            MatrixCores::On => run!(bitlinear_i2s_coop),
            MatrixCores::StandIn => run!(bitlinear_i2s_coop_stand_in),
        }
        let got = gpu.submit_and_read(batch, &out, n * rows)?;
        results.push(got.iter().map(|v| v.to_bits()).collect::<Vec<u32>>());
    }
    Ok(results[0] == results[1])
}
