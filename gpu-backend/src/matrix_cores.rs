//! I2_S, TQ, Q8_0 and K-quant prompts on matrix cores (`hesper_shaders::bitlinear_i2s_coop`,
//! `bitlinear_tq_coop`, `matvec_q8_0_coop`, `matvec_kq_coop`; Q4_0 and MXFP4 run as Q8_0):
//! which tiled kernels a step of many tokens runs, and the check a device's matrix cores pass
//! before they run a model — each kernel and its portable tiled one (`bitlinear_i2s_gemm`,
//! `bitlinear_tq_gemm`, `matvec_q8_0_gemm`, `matvec_kq_gemm`) on one product, every output bit
//! for bit. wgpu marks cooperative matrices experimental, and a driver that sums or lays out a
//! tile otherwise than the kernels expect fails the check instead of a model.

use hesper_gpu::Gpu;
use hesper_shaders as k;

/// Which kernels run the I2_S, TQ, Q8_0 and K-quant products of a step of at least
/// [`k::GEMM_STEP`] tokens (all three give every output the matrix-vector kernels' bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatrixCores {
    /// The portable tiled kernels: every product on the shader cores.
    Off,
    /// `bitlinear_i2s_coop`, `bitlinear_tq_coop`, `matvec_q8_0_coop` and `matvec_kq_coop`, on
    /// the device's matrix cores.
    On,
    /// Their stand-ins (`*_coop_stand_in`): the same tile walks with each matrix operation
    /// written out, where matrix cores are not (tests; lavapipe).
    StandIn,
}

impl MatrixCores {
    /// Whether `gpu` runs this variant's kernels (all need the same features).
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

/// I2_S rows whose sums the matrix cores add exactly: a row's `Σcode·q` stays below 2²⁴ (codes
/// up to 2, activations of magnitude up to 128), so no partial sum rounds in f32 in any order.
/// (A Q8_0 block's or K-quant sub-block's sum is exact at any width: its scale follows it.)
pub(crate) const MAX_COLS: usize = 32_768;

/// Runs `variant`'s kernels and the portable tiled ones on one product each (150 rows, 70
/// tokens: tiles cut by both edges; I2_S rows of 384 weights; Q8_0 rows of 11 blocks walked by
/// 4 lanes; Q6_K-shaped and TQ rows of 2 blocks walked by 2 lanes: sub-blocks of 16, two high
/// bits, an offset) and says whether every output has the same bits.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn agrees(gpu: &mut Gpu, variant: MatrixCores) -> Result<bool, hesper_gpu::GpuError> {
    use hesper_gpu::GpuBuffer;
    let (rows, n) = (150usize, 70usize);
    // A fixed generator: codes over their whole range, scales of a few magnitudes.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut words = |len: usize| -> Vec<u32> { (0..len).map(|_| next() as u32).collect() };
    let scales = |len: usize, base: f32| -> Vec<f32> {
        (0..len).map(|i| base + (i % 13) as f32 * 1e-3).collect()
    };
    // I2_S: codes 0–2 in every crumb (a crumb of 3 read as 2), int8 activations.
    let i2s_cols = 384;
    let codes: Vec<u32> = words(rows * i2s_cols / 16)
        .into_iter()
        .map(|w| (0..16).fold(0u32, |c, i| c | (((w >> (2 * i)) & 3).min(2) << (2 * i))))
        .collect();
    let q = words(n * i2s_cols / 4);
    let sum: Vec<i32> = q
        .chunks(i2s_cols / 4)
        .map(|t| {
            t.iter()
                .flat_map(|w| w.to_le_bytes())
                .map(|b| i32::from(b as i8))
                .sum()
        })
        .collect();
    let scale: Vec<f32> = (0..n).map(|t| 97.0 + t as f32 * 0.37).collect();
    // Q8_0: any int8 codes, block scales by row and by token.
    let (q8_cols, q8_lanes) = (352usize, 4u32);
    let q8_blocks = q8_cols / 32;
    let wq = words(rows * q8_cols / 4);
    let xq = words(n * q8_cols / 4);
    // Q6_K-shaped rows in `matvec_kq`'s layout: any nibbles and two high bits a code, then a
    // byte of signed scale and one of minimum for each sub-block of 16, two sub-blocks a word;
    // `d` and `dmin` per block; Q8_K codes as i32.
    let (kq_cols, kq_lanes) = (512usize, 2u32);
    let kq_blocks = kq_cols / 256;
    let kq6: Vec<u32> = (0..rows)
        .flat_map(|_| {
            let mut row = words(kq_cols / 8 + kq_cols * 2 / 32);
            row.extend(words(kq_blocks * 16 / 2));
            row
        })
        .collect();
    // TQ (in I2_S's layout): codes 0–2 in every crumb.
    let tq: Vec<u32> = words(rows * kq_cols / 16)
        .into_iter()
        .map(|w| (0..16).fold(0u32, |c, i| c | (((w >> (2 * i)) & 3).min(2) << (2 * i))))
        .collect();
    let xk: Vec<i32> = words(n * kq_cols)
        .into_iter()
        .map(|w| i32::from(w as i8).max(-127))
        .collect();
    let codes = gpu.upload("check codes", &codes)?;
    let q = gpu.upload("check activations", &q)?;
    let sum = gpu.upload("check sums", &sum)?;
    let scale = gpu.upload("check scales", &scale)?;
    let wq = gpu.upload("check Q8_0 codes", &wq)?;
    let wd = gpu.upload("check Q8_0 scales", &scales(rows * q8_blocks, 0.01))?;
    let xq = gpu.upload("check Q8_0 activations", &xq)?;
    let xd = gpu.upload("check Q8_0 activation scales", &scales(n * q8_blocks, 0.02))?;
    let kq6 = gpu.upload("check Q6_K codes", &kq6)?;
    let kd = gpu.upload("check K-quant scales", &scales(2 * rows * kq_blocks, 0.003))?;
    let tq = gpu.upload("check TQ codes", &tq)?;
    let tqd = gpu.upload("check TQ scales", &scales(rows * kq_blocks, 0.004))?;
    let xk = gpu.upload("check Q8_K activations", &xk)?;
    let xkd = gpu.upload("check Q8_K scales", &scales(n * kq_blocks, 0.05))?;
    let mut results = Vec::new();
    for kernel in [MatrixCores::Off, variant] {
        let mut outs: Vec<GpuBuffer<f32>> = (0..4)
            .map(|_| gpu.zeroed("check output", n * rows))
            .collect::<Result<_, _>>()?;
        let (mut out_k, mut out_v) = (gpu.zeroed("unused", 1)?, gpu.zeroed("unused", 1)?);
        let mut batch = gpu.batch();
        // One launch of `$kernel` into `$out` with its buffers, the product's shape and a
        // plain store.
        macro_rules! run {
            ($kernel:ident, $out:expr, $cols:expr, $grid:ident { $($field:ident: $value:expr),* }) => {
                batch.run(
                    gpu,
                    &k::$kernel::Args {
                        $($field: $value,)*
                        out: $out,
                        out_k: &mut out_k,
                        out_v: &mut out_v,
                        cols: $cols as u32,
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
                    k::$grid(rows as u32, n as u32),
                )?
            };
        }
        // The four products through `$i2s`, `$q8_0`, `$kq` and `$tq` on their grids (`$ids`:
        // the fields of the tiled kernels' rows that do not pick experts, where they have them).
        macro_rules! products {
            (
                $i2s:ident,
                $q8_0:ident,
                $kq:ident,
                $tq:ident,
                $tiles:ident,
                $narrow:ident
                $(, ids: $ids_q8:expr, $ids_kq:expr)?
            ) => {{
                let [i2s_out, q8_out, kq_out, tq_out] = &mut outs[..] else {
                    unreachable!("four outputs")
                };
                run!(
                    $i2s,
                    i2s_out,
                    i2s_cols,
                    $tiles {
                        codes: &codes,
                        q: &q,
                        scale: &scale,
                        sum: &sum
                    }
                );
                run!(
                    $q8_0,
                    q8_out,
                    q8_cols,
                    $narrow {
                        wq: &wq,
                        wd: &wd,
                        q: &xq,
                        d: &xd,
                        lanes: q8_lanes
                        $(, ids: $ids_q8, per_input: 1, expert0: 0, experts: 0,
                        gid_at: 0, order_at: 0, gathered: 0)?
                    }
                );
                run!(
                    $kq,
                    kq_out,
                    kq_cols,
                    $narrow {
                        w: &kq6,
                        wd: &kd,
                        q: &xk,
                        d: &xkd,
                        lanes: kq_lanes,
                        high: 2,
                        sub: 16,
                        offset: 32
                        $(, ids: $ids_kq, per_input: 1, expert0: 0, experts: 0,
                        gid_at: 0, order_at: 0, gathered: 0)?
                    }
                );
                run!(
                    $tq,
                    tq_out,
                    kq_cols,
                    $narrow {
                        codes: &tq,
                        wscale: &tqd,
                        q: &xk,
                        d: &xkd,
                        lanes: kq_lanes
                    }
                );
            }};
        }
        match kernel {
            MatrixCores::Off => products!(
                bitlinear_i2s_gemm,
                matvec_q8_0_gemm,
                matvec_kq_gemm,
                bitlinear_tq_gemm,
                gemm_grid,
                gemm_grid,
                ids: &wq, &kq6
            ),
            MatrixCores::On => products!(
                bitlinear_i2s_coop,
                matvec_q8_0_coop,
                matvec_kq_coop,
                bitlinear_tq_coop,
                gemm_grid,
                narrow_gemm_grid
            ),
            MatrixCores::StandIn => products!(
                bitlinear_i2s_coop_stand_in,
                matvec_q8_0_coop_stand_in,
                matvec_kq_coop_stand_in,
                bitlinear_tq_coop_stand_in,
                gemm_grid,
                narrow_gemm_grid
            ),
        }
        gpu.submit(batch)?;
        for out in &outs {
            let got = gpu.read(out, n * rows)?;
            results.push(got.iter().map(|v| v.to_bits()).collect::<Vec<u32>>());
        }
    }
    let (reference, candidate) = results.split_at(results.len() / 2);
    Ok(reference == candidate)
}
