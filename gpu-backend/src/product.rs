//! Matrix products on the GPU: the activation quantization a layout reads, then its matrix
//! kernel over each row window with the output stage the caller asks for — store, add to the
//! output (the residual, fused) or the gated activation of an interleaved gate/up pair (see
//! `hesper_shaders::store_rows`).

use hesper_engine::config::Activation;
use hesper_gpu::{GpuBuffer, GpuError};
use hesper_shaders as k;

use crate::activations::Activations;
use crate::matrix::{GpuMatrix, Kind};
use crate::matrix_cores::{self, MatrixCores};
use crate::State;

/// The output stage of a gate/up pair for `act`.
pub fn glu_mode(act: Activation) -> u32 {
    match act {
        Activation::Relu2 => k::GLU_RELU2,
        Activation::Silu => k::GLU_SILU,
        Activation::GeluTanh => k::GLU_GELU,
        Activation::SwigluClamped => k::GLU_CLAMPED,
    }
}

/// Bytes of `n` rows of `cols` activations as `kind`'s product reads them (codes and scales
/// of the quantized form, or the floats themselves), for the per-kernel bandwidth.
pub fn activation_bytes(kind: Kind, packed_dot: bool, n: usize, cols: usize) -> u64 {
    let (n, cols) = (n as u64, cols as u64);
    match kind {
        Kind::I2s { .. } if packed_dot => n * cols + 8 * n,
        Kind::I2s { .. } => 4 * n * cols + 4 * n,
        Kind::Tq | Kind::Kq { .. } => 4 * n * cols + 4 * n * cols / 256,
        Kind::Q8_0 => n * cols + 4 * n * cols / 32,
        Kind::F16 => 2 * n * cols,
        Kind::F32 | Kind::Bf16 => 4 * n * cols,
    }
}

/// The forms of activations a fused RMSNorm leaves for the product that comes next
/// (`GpuBackend::rms_norm_for`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Form {
    /// Per-token int8 codes four to a word, their scale and `Σq` (I2_S on `dot4I8Packed`).
    I8Packed,
    /// Halves two to a word (F16).
    Halves,
    /// ggml Q8_0 blocks (Q8_0, and Q4_0 and MXFP4 widened to it).
    Q8_0,
    /// ggml Q8_K blocks (the K-quants and TQ).
    Q8K,
}

/// The form in which a fused RMSNorm can leave the activations of a `kind` product, if any
/// (F32 and BF16 read the floats; I2_S without `dot4I8Packed` reads codes of its own layout).
pub fn fused_form(kind: Kind, packed_dot: bool) -> Option<Form> {
    match kind {
        Kind::I2s { .. } if packed_dot => Some(Form::I8Packed),
        Kind::F16 => Some(Form::Halves),
        Kind::Q8_0 => Some(Form::Q8_0),
        Kind::Tq | Kind::Kq { .. } => Some(Form::Q8K),
        Kind::I2s { .. } | Kind::F32 | Kind::Bf16 => None,
    }
}

/// Whether `a` and `b` read the same quantized activations (the same layout and width).
pub fn same_input(a: &GpuMatrix, b: &GpuMatrix) -> bool {
    std::mem::discriminant(&a.kind) == std::mem::discriminant(&b.kind) && a.desc.cols == b.desc.cols
}

/// Quantizes `n` rows of `x` as `w`'s layout reads them, into the state's activation scratch:
/// int8 codes (four to a word for packed I2_S and Q8_0) and scales, or halves for F16 (nothing
/// for F32 and BF16, which read `x` itself).
pub fn quantize(
    st: &mut State,
    w: &GpuMatrix,
    x: &GpuBuffer<f32>,
    n: usize,
) -> Result<(), GpuError> {
    let cols = w.desc.cols;
    // Rows a fused RMSNorm already quantized for this product.
    if let Some(done) = st.quantized.take() {
        let layout = fused_form(w.kind, st.packed_dot) == Some(done.form);
        if layout && done.buffer == *x.raw() && done.cols == cols && done.n == n {
            return Ok(());
        }
    }
    let (blocks, per_block) = match w.kind {
        Kind::I2s { .. } => (n, cols),
        Kind::Tq | Kind::Kq { .. } => (n * cols / 256, 256),
        Kind::Q8_0 => (n * cols / 32, 32),
        Kind::F16 => return pack_halves(st, x, n * cols),
        Kind::F32 | Kind::Bf16 => return Ok(()),
    };
    st.reserve(blocks * per_block, blocks)?;
    let State {
        gpu,
        batch,
        act:
            Activations {
                q,
                packed,
                act_scale,
                ..
            },
        packed_dot,
        ..
    } = st;
    let traffic = 4 * (n * cols) as u64 + activation_bytes(w.kind, *packed_dot, n, cols);
    let cols = cols as u32;
    match w.kind {
        Kind::I2s { .. } if *packed_dot => batch.run_moving(
            gpu,
            &k::quantize_i8_packed::Args {
                x,
                q: &mut packed.0,
                scale: act_scale,
                sum: &mut packed.1,
                cols,
            },
            k::row_grid(n as u32),
            traffic,
        ),
        Kind::I2s { .. } => batch.run_moving(
            gpu,
            &k::quantize_i8::Args {
                x,
                q,
                scale: act_scale,
                cols,
            },
            k::row_grid(n as u32),
            traffic,
        ),
        Kind::Tq | Kind::Kq { .. } => batch.run_moving(
            gpu,
            &k::quantize_q8k::Args { x, q, d: act_scale },
            k::row_grid(blocks as u32),
            traffic,
        ),
        _ => batch.run_moving(
            gpu,
            &k::quantize_q8_0::Args {
                x,
                q: &mut packed.0,
                d: act_scale,
                blocks: blocks as u32,
            },
            k::q8_0_grid(blocks as u32),
            traffic,
        ),
    }
}

/// Rounds the `len` values of `x` to halves in the state's f16 scratch, once for every F16
/// product that reads them (the kernel would otherwise round each value once per weight row).
fn pack_halves(st: &mut State, x: &GpuBuffer<f32>, len: usize) -> Result<(), GpuError> {
    let words = len / 2;
    st.reserve_halves(words)?;
    let State {
        gpu,
        batch,
        act: Activations { halves, .. },
        ..
    } = st;
    batch.run_moving(
        gpu,
        &k::pack_f16::Args {
            x,
            h: halves,
            len: len as u32,
        },
        k::pack_f16::grid_for(words as u32),
        6 * len as u64,
    )
}

/// Where a product's rows go.
pub enum Outputs<'a> {
    /// One buffer, written as the mode says ([`k::STORE`], [`k::ADD`], a gated pair's).
    One(&'a mut GpuBuffer<f32>, u32),
    /// The Q, K and V outputs of a joined matrix ([`GpuMatrix::join_qkv`]).
    Qkv([&'a mut GpuBuffer<f32>; 3]),
    /// One buffer, written as the mode says, by a matrix of stacked experts
    /// ([`GpuMatrix::experts`]): `n` rows, row `z` the product of expert `ids[z]`'s rows with
    /// activation row `z / per_input` (`per_input`: the rows each input row is multiplied by),
    /// or of the slots `picks.grouped` says.
    ById {
        /// The outputs, `n` rows of one expert's width.
        out: &'a mut GpuBuffer<f32>,
        /// The output stage ([`k::STORE`], a gated pair's).
        mode: u32,
        /// Which expert and activation row each output row takes.
        picks: Picks<'a>,
    },
}

/// How the rows of a product of stacked experts pick their expert and activation row.
#[derive(Clone, Copy)]
pub struct Picks<'a> {
    /// The router's ids (row `z`'s expert `ids[z]`), and `moe_group`'s tables past them.
    pub ids: &'a GpuBuffer<u32>,
    /// Output rows an activation row feeds (a row's choices, or 1).
    pub per_input: u32,
    /// Where the rows are slots grouped by expert ([`k::moe_group`]): its tables.
    pub grouped: Option<Grouped>,
}

/// Where [`k::moe_group`]'s tables lie in the ids buffer, for a product whose output rows are
/// slots grouped by expert (run by the tiled kernels' `_id` instances, [`groups`]).
#[derive(Clone, Copy)]
pub struct Grouped {
    /// The first word of `gid`, each slot's expert.
    pub gid_at: u32,
    /// The first word of `order`, each slot's (row, choice) pair.
    pub order_at: u32,
    /// Whether slot `z` reads activation row `order[z] / per_input` (a gate or up product);
    /// else row `z` (a down product reading its input in slot order).
    pub gathered: bool,
}

/// Whether a product of `w`'s stacked experts has a tiled `_id` instance to multiply slots
/// grouped by expert: the K-quants and Q8_0 (with Q4_0 and MXFP4) on `dot4I8Packed`, F16 and
/// BF16 on any adapter.
pub fn groups(w: &GpuMatrix, packed_dot: bool) -> bool {
    match w.kind {
        Kind::Kq { .. } | Kind::Q8_0 => packed_dot,
        Kind::F16 | Kind::Bf16 => true,
        Kind::F32 | Kind::I2s { .. } | Kind::Tq => false,
    }
}

/// Each `ws[i]` times `x`'s `inputs` rows into `outs[i]`, written as `mode` says; `x`
/// quantized once for every run of matrices that read it the same way. With `by_id` (how the
/// rows pick their expert, and the output rows: `inputs · per_input`, or the slots where they
/// are grouped) the matrices are stacked experts ([`Outputs::ById`]); without, output row `z`
/// is input row `z`'s product.
pub fn multiply_each(
    st: &mut State,
    ws: &[&GpuMatrix],
    x: &GpuBuffer<f32>,
    inputs: usize,
    outs: &mut [&mut GpuBuffer<f32>],
    mode: u32,
    by_id: Option<(Picks, usize)>,
) -> Result<(), GpuError> {
    for (i, (w, out)) in ws.iter().zip(outs.iter_mut()).enumerate() {
        if i == 0 || !same_input(ws[i - 1], w) {
            quantize(st, w, x, inputs)?;
        }
        match by_id {
            Some((picks, rows)) => {
                let outputs = Outputs::ById { out, mode, picks };
                multiply_into(st, w, x, rows, outputs)?;
            }
            None => multiply(st, w, x, inputs, out, mode)?,
        }
    }
    Ok(())
}

/// Runs `w`'s kernel over each of its windows on the activations [`quantize`] left (or `x`
/// for float layouts), writing `out` as `mode` says.
pub fn multiply(
    st: &mut State,
    w: &GpuMatrix,
    x: &GpuBuffer<f32>,
    n: usize,
    out: &mut GpuBuffer<f32>,
    mode: u32,
) -> Result<(), GpuError> {
    multiply_into(st, w, x, n, Outputs::One(out, mode))
}

/// [`multiply`] into any [`Outputs`].
pub fn multiply_into(
    st: &mut State,
    w: &GpuMatrix,
    x: &GpuBuffer<f32>,
    n: usize,
    outputs: Outputs,
) -> Result<(), GpuError> {
    let State {
        gpu,
        batch,
        act:
            Activations {
                q,
                packed,
                act_scale,
                halves,
                scales_in_codes,
            },
        packed_dot,
        matrix_cores,
        unused,
        products,
        ..
    } = st;
    let (out, out_k, out_v, mode, by_id) = match outputs {
        Outputs::One(out, mode) => (out, &mut unused.0, &mut unused.1, mode, None),
        Outputs::Qkv([out_q, out_k, out_v]) => (out_q, out_k, out_v, k::SPLIT_QKV, None),
        Outputs::ById { out, mode, picks } => {
            (out, &mut unused.0, &mut unused.1, mode, Some(picks))
        }
    };
    let grouped = by_id.and_then(|p| p.grouped);
    let (cols, rows, n32) = (w.desc.cols as u32, w.desc.rows as u32, n as u32);
    let (out_scale, out_scale_odd, out_scale_v) = w.out_scales();
    let (split_k, split_v) = w
        .qkv
        .map_or((rows, rows), |p| (p.k_row as u32, p.v_row as u32));
    let lanes = k::lanes_per_row(match w.kind {
        Kind::I2s { .. } => w.desc.cols / 16,
        Kind::Tq | Kind::Kq { .. } => w.desc.cols / 256,
        Kind::Q8_0 => w.desc.cols / 32,
        Kind::F16 | Kind::Bf16 => w.desc.cols / 2,
        Kind::F32 => w.desc.cols,
    });
    // Rows picking their expert run the `_id` instances (one row of activations a workgroup
    // row) on the activation rows they share, each reading one expert's share of the weights.
    // Slots grouped by expert read each chosen expert's weights once per tile of its slots.
    let (inputs, share) = match by_id {
        Some(p) if p.grouped.is_some() => (n.div_ceil(p.per_input as usize), (1, 1)),
        Some(p) => (n.div_ceil(p.per_input as usize), (n, w.experts)),
        None => (n, (1, 1)),
    };
    let activations = activation_bytes(w.kind, *packed_dot, inputs, w.desc.cols);
    // A step of more rows than one decode tile runs the wide-step instances: the same sums in
    // the same order, each weight read once per tile of their larger tiles.
    let wide = n >= k::WIDE_STEP as usize && by_id.is_none();
    // A step of at least a tile of tokens runs a layout's tiled kernel where it has one
    // (`hesper_shaders::bitlinear_i2s_gemm`, `bitlinear_tq_gemm`, `matvec_kq_gemm`,
    // `matvec_q8_0_gemm`, `matvec_f16_gemm`, `matvec_f32_gemm`, `matvec_bf16_gemm`): the same
    // bits again, each weight read once per 64 tokens and each activation once per 64 rows
    // (I2_S, TQ, Q8_0 and the K-quants on matrix cores where the backend uses them:
    // `matrix_cores.rs`).
    let tiled = n >= k::GEMM_STEP as usize && by_id.is_none();
    for win in &w.windows {
        // The window's weights and scales, the activations, and the outputs it writes (read
        // too where it adds into them; half as many where gate/up pairs make one value).
        let outputs = 4 * (n * win.rows) as u64;
        let weights = win.data.bytes() + win.scales.as_ref().map_or(0, |s| s.bytes());
        let traffic = weights * share.0 as u64 / share.1 as u64
            + activations
            + match mode {
                k::STORE | k::SPLIT_QKV => outputs,
                k::ADD => 2 * outputs,
                _ => outputs / 2,
            };
        let (row0, window_rows) = (win.row0 as u32, win.rows as u32);
        // A window of stacked experts holds whole experts of `desc.rows` rows each, from
        // expert `expert0` on; its rows by id are of one expert, written from row 0.
        let expert_rows = w.desc.rows as u32;
        let (expert0, experts) = (row0 / expert_rows.max(1), window_rows / expert_rows.max(1));
        let (row0, window_rows) = match by_id {
            Some(_) => (0, expert_rows),
            None => (row0, window_rows),
        };
        // How the rows pick their expert (the `_id` instances' fields; where the rows do not
        // pick, unread: the weights as the ids), and where `moe_group`'s tables lie.
        let (ids, per_input) = by_id.map_or((&win.data, 1), |p| (p.ids, p.per_input));
        let (gid_at, order_at, gathered) =
            grouped.map_or((0, 0, 0), |g| (g.gid_at, g.order_at, g.gathered.into()));
        // Every matrix kernel's launch, its decode or its wide-step instance: its own buffers,
        // then the shared shape and output stage.
        macro_rules! launch {
            // A layout whose tiled kernel multiplies integer codes (`dot4I8Packed`): as below
            // where the adapter has it.
            (packed: $decode:ident | $wide:ident | $tiled:ident {
                $($field:ident: $value:expr),* $(,)?
            }) => {
                if *packed_dot {
                    launch!($decode | $wide | $tiled { $($field: $value),* })
                } else {
                    launch!($decode | $wide { $($field: $value),* })
                }
            };
            // A layout with a tiled kernel: it takes the buffers of the matrix-vector kernel
            // and the lanes whose order it follows.
            ($decode:ident | $wide:ident | $tiled:ident {
                $($field:ident: $value:expr),* $(,)?
            }) => {
                if tiled {
                    launch!(@tiled $tiled { $($field: $value,)* lanes: lanes })
                } else {
                    launch!($decode | $wide { $($field: $value),* })
                }
            };
            // A layout with a tiled kernel (and its grouped `_id` instance) and an `_id`
            // instance of its matrix-vector kernel: as below where the step is neither tiled
            // nor grouped.
            (ids: $decode:ident | $wide:ident | $id:ident | $tiled:ident | $grouped:ident {
                $($field:ident: $value:expr),* $(,)?
            }) => {
                if tiled || grouped.is_some() {
                    launch!(@picked $tiled | $grouped { $($field: $value),* })
                } else {
                    launch!(ids: $decode | $wide | $id { $($field: $value),* })
                }
            };
            // A layout whose matrix-vector kernel has an `_id` instance: that where the rows
            // pick their expert, else as below (binding the weights as the unread ids).
            (ids: $decode:ident | $wide:ident | $id:ident {
                $($field:ident: $value:expr),* $(,)?
            }) => {
                match by_id {
                    Some(_) => launch!(@one $id {
                        $($field: $value,)*
                        ids: ids,
                        per_input: per_input,
                        expert0: expert0,
                        experts: experts
                    }),
                    None => launch!($decode | $wide {
                        $($field: $value,)* ids: ids, per_input: per_input, expert0: 0, experts: 0
                    }),
                }
            };
            ($decode:ident | $wide:ident { $($field:ident: $value:expr),* $(,)? }) => {
                if wide {
                    launch!(@one $wide { $($field: $value),* })
                } else {
                    launch!(@one $decode { $($field: $value),* })
                }
            };
            (@one $kernel:ident { $($field:ident: $value:expr),* }) => {
                launch!(@run $kernel { $($field: $value,)* lanes: lanes }
                    k::matrix_grid(window_rows, lanes, n32, k::$kernel::TILE, k::$kernel::ROWS))
            };
            // A tiled kernel: no lanes, its own grid.
            (@tiled $kernel:ident { $($field:ident: $value:expr),* $(,)? }) => {
                launch!(@run $kernel { $($field: $value),* } k::gemm_grid(window_rows, n32))
            };
            // A tiled kernel, or its `_id` instance where the rows are slots grouped by expert.
            (@picked $kernel:ident | $grouped:ident { $($field:ident: $value:expr),* $(,)? }) => {
                if grouped.is_some() {
                    launch!(@picked $grouped { $($field: $value),* })
                } else {
                    launch!(@picked $kernel { $($field: $value),* })
                }
            };
            // A tiled kernel with an `_id` instance (or that instance): the lanes whose order
            // it follows and how its rows pick their expert (unread where they do not).
            (@picked $kernel:ident { $($field:ident: $value:expr),* $(,)? }) => {
                launch!(@tiled $kernel {
                    $($field: $value,)*
                    lanes: lanes,
                    ids: ids,
                    per_input: per_input,
                    expert0: expert0,
                    experts: experts,
                    gid_at: gid_at,
                    order_at: order_at,
                    gathered: gathered,
                })
            };
            // A matrix-core kernel (`@tiled` or `@narrow`) where the backend uses matrix
            // cores, else its stand-in (same buffers, same grid).
            (@cores $grid:ident $kernel:ident | $stand_in:ident {
                $($field:ident: $value:expr),* $(,)?
            }) => {
                if *matrix_cores == MatrixCores::On {
                    launch!(@$grid $kernel { $($field: $value),* })
                } else {
                    launch!(@$grid $stand_in { $($field: $value),* })
                }
            };
            // A tiled kernel of half the tokens (`matvec_q8_0_coop`, `matvec_kq_coop`,
            // `bitlinear_tq_coop`), with the lanes whose order it follows.
            (@narrow $kernel:ident { $($field:ident: $value:expr),* $(,)? }) => {
                launch!(@run $kernel { $($field: $value,)* lanes: lanes }
                    k::narrow_gemm_grid(window_rows, n32))
            };
            (@run $kernel:ident { $($field:ident: $value:expr),* $(,)? } $grid:expr) => {{
                *products.entry(stringify!($kernel)).or_default() += 1;
                batch.run_moving(
                    gpu,
                    &k::$kernel::Args {
                        $($field: $value,)*
                        out: &mut *out,
                        out_k: &mut *out_k,
                        out_v: &mut *out_v,
                        cols,
                        rows,
                        row0,
                        window_rows,
                        n: n32,
                        mode,
                        out_scale,
                        out_scale_odd,
                        split_k,
                        split_v,
                        out_scale_v,
                    },
                    $grid,
                    traffic,
                )?
            }};
        }
        // Matrix cores (or their stand-in) for a step of the tiled kernels' size.
        let cores = *packed_dot && tiled && *matrix_cores != MatrixCores::Off;
        match w.kind {
            // On matrix cores where the row's sums stay exact there.
            Kind::I2s { .. } if cores && w.desc.cols <= matrix_cores::MAX_COLS => launch!(
                @cores tiled bitlinear_i2s_coop | bitlinear_i2s_coop_stand_in {
                    codes: &win.data,
                    q: &packed.0,
                    scale: act_scale,
                    sum: &packed.1,
                }
            ),
            Kind::I2s { .. } if *packed_dot && tiled => launch!(
                @tiled bitlinear_i2s_gemm {
                    codes: &win.data,
                    q: &packed.0,
                    scale: act_scale,
                    sum: &packed.1,
                }
            ),
            Kind::I2s { .. } if *packed_dot => launch!(
                bitlinear_i2s_dp4
                    | bitlinear_i2s_dp4_wide {
                        codes: &win.data,
                        q: &packed.0,
                        scale: act_scale,
                        sum: &packed.1,
                    }
            ),
            Kind::I2s { .. } => launch!(
                bitlinear_i2s
                    | bitlinear_i2s_wide {
                        codes: &win.data,
                        q: q,
                        scale: act_scale,
                    }
            ),
            // Q8_0 blocks' sums are exact on matrix cores at any width.
            Kind::Q8_0 if cores && scales_in_codes.is_none() => launch!(
                @cores narrow matvec_q8_0_coop | matvec_q8_0_coop_stand_in {
                    wq: &win.data,
                    wd: win.scales(&w.desc.name)?,
                    q: &packed.0,
                    d: act_scale,
                }
            ),
            // Tiled, or slots grouped by expert (never on matrix cores: `tiled` is false there;
            // the activations' scales lie apart, as the step's quantizer wrote them).
            Kind::Q8_0
                if grouped.is_some() || (*packed_dot && tiled && scales_in_codes.is_none()) =>
            {
                launch!(
                    @picked matvec_q8_0_gemm | matvec_q8_0_gemm_id {
                        wq: &win.data,
                        wd: win.scales(&w.desc.name)?,
                        q: &packed.0,
                        d: act_scale,
                    }
                )
            }
            // The scales are `act_scale`'s, or `packed.0`'s past the codes where one kernel
            // wrote both there (bound twice: as the codes and as the scales; only a
            // decode-sized step's attention does, and the matrix-vector kernels read either).
            Kind::Q8_0 => {
                let wd = win.scales(&w.desc.name)?;
                let mut run = |d: &GpuBuffer<f32>, d_at: u32| -> Result<(), GpuError> {
                    if *packed_dot {
                        launch!(
                            ids: matvec_q8_0_dp4
                                | matvec_q8_0_dp4_wide
                                | matvec_q8_0_dp4_id {
                                    wq: &win.data,
                                    wd: wd,
                                    q: &packed.0,
                                    d: d,
                                    d_at: d_at
                                }
                        )
                    } else {
                        launch!(
                            ids: matvec_q8_0
                                | matvec_q8_0_wide
                                | matvec_q8_0_id {
                                    wq: &win.data,
                                    wd: wd,
                                    q: &packed.0,
                                    d: d,
                                    d_at: d_at
                                }
                        )
                    }
                    Ok(())
                };
                match *scales_in_codes {
                    Some(at) => packed.0.as_elements(|d| run(d, at))?,
                    None => run(act_scale, 0)?,
                }
            }
            // So is a TQ block's.
            Kind::Tq if cores => launch!(
                @cores narrow bitlinear_tq_coop | bitlinear_tq_coop_stand_in {
                    codes: &win.data,
                    wscale: win.scales(&w.desc.name)?,
                    q: q,
                    d: act_scale,
                }
            ),
            Kind::Tq => launch!(
                packed: bitlinear_tq
                    | bitlinear_tq_wide
                    | bitlinear_tq_gemm {
                        codes: &win.data,
                        wscale: win.scales(&w.desc.name)?,
                        q: q,
                        d: act_scale,
                    }
            ),
            // A K-quant sub-block's sums are exact on matrix cores at any width too.
            Kind::Kq { sub, high, offset } if cores => launch!(
                @cores narrow matvec_kq_coop | matvec_kq_coop_stand_in {
                    w: &win.data,
                    wd: win.scales(&w.desc.name)?,
                    q: q,
                    d: act_scale,
                    sub: sub,
                    high: high,
                    offset: offset,
                }
            ),
            Kind::Kq { sub, high, offset }
                if grouped.is_some() || (tiled && *packed_dot && scales_in_codes.is_none()) =>
            {
                launch!(@picked matvec_kq_gemm | matvec_kq_gemm_id {
                    w: &win.data,
                    wd: win.scales(&w.desc.name)?,
                    q: q,
                    d: act_scale,
                    sub: sub,
                    high: high,
                    offset: offset,
                })
            }
            // The scales are `act_scale`'s, or `q`'s past the codes where a decoded token's
            // attention wrote both there (bound twice, as for Q8_0 above).
            Kind::Kq { sub, high, offset } => {
                let wd = win.scales(&w.desc.name)?;
                let mut run = |d: &GpuBuffer<f32>, d_at: u32| -> Result<(), GpuError> {
                    launch!(
                        ids: matvec_kq | matvec_kq_wide | matvec_kq_id {
                            w: &win.data,
                            wd: wd,
                            q: &*q,
                            d: d,
                            d_at: d_at,
                            sub: sub,
                            high: high,
                            offset: offset,
                        }
                    );
                    Ok(())
                };
                match *scales_in_codes {
                    Some(at) => q.as_elements(|d| run(d, at))?,
                    None => run(act_scale, 0)?,
                }
            }
            // The float layouts' tiled kernels multiply floats, on any adapter.
            Kind::F32 if tiled => launch!(@picked matvec_f32_gemm { w: &win.data, x: x }),
            Kind::F32 => launch!(matvec_f32 | matvec_f32_wide { w: &win.data, x: x }),
            Kind::F16 => launch!(
                ids: matvec_f16
                    | matvec_f16_wide
                    | matvec_f16_id
                    | matvec_f16_gemm
                    | matvec_f16_gemm_id {
                        w: &win.data,
                        xh: &*halves,
                    }
            ),
            Kind::Bf16 => launch!(
                ids: matvec_bf16
                    | matvec_bf16_wide
                    | matvec_bf16_id
                    | matvec_bf16_gemm
                    | matvec_bf16_gemm_id {
                        w: &win.data,
                        x: x,
                    }
            ),
        }
    }
    Ok(())
}
