//! The mixture-of-experts FFN on the GPU, as the CPU backend computes it: each chosen expert's
//! gate and up products (its biases added, where the family has them, before the activation),
//! its down product (and bias), then every row's outputs weighted and added in the order of
//! its choice. `moe_route` chooses each row's experts and weights on the GPU from the router's
//! logits (the definition of [`hesper_engine::config::Experts::route`], its softmax summed in
//! f32); then one of four ways, the same bits for every row (the products of a row do not
//! depend on the others, the weights are the same, and the combines add in the same order):
//!
//! - **By id** (a decoded token, or a step whose rows make no more choices than the layer has
//!   experts: [`by_id_pays`]; where the experts' matrices stack: [`stack`], at load): each
//!   product reads the stack of all the experts' matrices, each of its rows picking the rows
//!   of its expert from the router's ids on the GPU (the `_id` instances of the matrix-vector
//!   kernels, llama.cpp's `mul_mat_vec_id`): one launch a matrix whatever the count of
//!   experts, only the chosen experts' weights read, nothing waited for; `moe_combine` adds
//!   them up.
//! - **Grouped on the GPU** (a longer step whose experts stacked in a layout with a tiled `_id`
//!   instance, [`product::groups`]: the K-quants, Q8_0, Q4_0 and MXFP4 on `dot4I8Packed`, F16
//!   and BF16): `moe_group` sorts the
//!   step's (row, choice) pairs by expert into slots, each expert's run padded to whole tiles
//!   of the tiled kernels, and each product runs once over the slots, every tile reading its
//!   expert's weights once (the tiled kernels' `_id` instances: a tile's expert from the
//!   tables); `moe_combine` reads each pair's output at its slot. One launch a matrix, nothing
//!   waited for, each chosen expert's weights read once per 64 of its pairs (its run's
//!   padding costs arithmetic, not reads: a GPU is to measure where by id or gathering would
//!   be faster for a step of few pairs an expert).
//! - **Gated on the GPU** (a browser's longer steps of other layouts; natively a short step of
//!   a layer of at most [`GATED_EXPERTS`] experts that did not stack, or every step by
//!   [`crate::GpuBackend::set_experts_routed_on_gpu`]): every
//!   expert's launches are recorded over all the step's rows behind a gate (indirect
//!   dispatches, [`hesper_gpu::Batch::open_gate`]) whose grids `gate_grids` zeroes for the
//!   experts no row chose, so their matrices are never read and nothing waits for the host;
//!   `moe_combine_routed` picks each row's outputs by id. The weights are read once per tile of
//!   rows anyway, so up to a tile this reads what the gathered products read.
//! - **Gathered on the host** (natively, a longer step, e.g. a prefill, of experts that do not
//!   group: that did not stack, or quantized without `dot4I8Packed`): the chosen ids are read
//!   back (a wait for the GPU once a layer and step, which a browser cannot do inside a step), each
//!   chosen expert's rows gathered and multiplied by its matrices once for all of them (its
//!   tiled kernels reading each weight once per tile of its rows), and `moe_combine` adds them
//!   up.
//!
//! Where the layer's output is added to the residual, the combine adds it as it writes.

use hesper_engine::backend::{Backend, BackendError, Expert, GateUp, Moe};
use hesper_engine::config::{Activation, Experts};
use hesper_gpu::GpuBuffer;
use hesper_shaders as k;

use crate::product::{self, glu_mode, Grouped, Picks};
use crate::shared_input::SharedInput;
use crate::{device_error, GpuBackend, GpuMatrix, Quantized};

/// The most experts a layer whose matrices did not stack may have for its short steps to be
/// gated on the GPU natively: each expert's launches are recorded whether or not a row chose
/// it, a few microseconds of host time each, where a read-back costs one wait for the GPU a
/// layer (not yet measured on a GPU).
#[cfg(not(target_arch = "wasm32"))]
const GATED_EXPERTS: usize = 32;

/// The most launches one expert's FFN records routed on the GPU (activation quantizations,
/// the products over their row windows, biases, the activation): its gate's slots.
const EXPERT_LAUNCHES: usize = 16;

/// The buffers of a mixture's FFN, kept from one layer (and step) to the next by the backend:
/// the queue runs each layer's work after the one before, so reusing them changes no value,
/// only the buffers and bind groups a decoded token creates. The grids the host writes are
/// not kept: a layer's table must not be overwritten before its batch runs.
#[derive(Default)]
pub struct Pool {
    floats: [Option<GpuBuffer<f32>>; SLOTS],
    ids: Option<GpuBuffer<u32>>,
    args: Option<GpuBuffer<u32>>,
}

/// The pool's float buffers: the router's logits, the chosen experts' weights, every
/// expert's outputs, the gate, up and activation scratch, one expert's output, its gathered
/// rows.
const SLOTS: usize = 8;
const LOGITS: usize = 0;
const WEIGHTS: usize = 1;
const OUTPUTS: usize = 2;
const GATE: usize = 3;
const UP: usize = 4;
const ACT: usize = 5;
const Y: usize = 6;
#[cfg(not(target_arch = "wasm32"))]
const ROWS: usize = 7;

/// The pool's buffer `slot` if it holds at least `len` floats, else a new one.
fn floats(b: &GpuBackend, slot: usize, len: usize) -> Result<GpuBuffer<f32>, BackendError> {
    let held = b.state.borrow_mut().moe_pool.floats[slot].take();
    match held {
        Some(buffer) if buffer.len() >= len => Ok(buffer),
        _ => b.alloc(len),
    }
}

/// A buffer of at least `len` words from `held` (the pool's), else one `make` creates.
fn words(
    held: Option<GpuBuffer<u32>>,
    len: usize,
    make: impl FnOnce() -> Result<GpuBuffer<u32>, hesper_gpu::GpuError>,
) -> Result<GpuBuffer<u32>, BackendError> {
    match held {
        Some(buffer) if buffer.len() >= len => Ok(buffer),
        _ => make().map_err(device_error),
    }
}

/// Gives the float buffers back to the pool, each to its slot.
fn keep(b: &GpuBackend, buffers: impl IntoIterator<Item = (usize, GpuBuffer<f32>)>) {
    let pool = &mut b.state.borrow_mut().moe_pool;
    for (slot, buffer) in buffers {
        pool.floats[slot] = Some(buffer);
    }
}

/// `out` = the mixture of `moe`'s experts over `n` rows of `x` (see [`Backend::moe_ffn`]), or
/// `out +=` it where `add`, its work recorded, routed on the host or the GPU as the backend is
/// set; a failure to allocate or to read the router back is returned.
#[allow(clippy::too_many_arguments)]
pub fn moe_ffn(
    b: &GpuBackend,
    moe: &Moe<GpuMatrix, GpuBuffer<f32>>,
    routing: &Experts,
    act: Activation,
    x: &GpuBuffer<f32>,
    n: usize,
    out: &mut GpuBuffer<f32>,
    add: bool,
) -> Result<(), BackendError> {
    let (n_expert, n_used) = (routing.n_expert, routing.n_used);
    // The rows the FFN's norm quantized for the stacked gate and up (`Ffn::first` in the
    // engine), kept past a router that reads the norm's floats (and so leaves the scratch as
    // it is) for the products by id.
    let normed = b.state.borrow_mut().quantized.take();
    let packed_dot = b.state.borrow().packed_dot;
    let normed = normed.filter(|_| product::fused_form(moe.router.kind, packed_dot).is_none());
    let mut logits = floats(b, LOGITS, n * n_expert)?;
    b.matmul(&moe.router, x, n, &mut logits);
    if let Some(bias) = &moe.router_bias {
        b.add_bias(&mut logits, bias, n);
    }
    // A longer step of experts that group on the GPU: the slots of its pairs.
    let pairs = n * n_used;
    let grouped = moe
        .stacked
        .as_ref()
        .filter(|s| !by_id_pays(n, routing) && groups(b, s, routing));
    let slots = grouped.map(|_| slots(pairs, n_expert));
    let held = b.state.borrow_mut().moe_pool.ids.take();
    let len = id_words(pairs, slots);
    let mut ids = words(held, len, || b.state.borrow().gpu.zeroed("expert ids", len))?;
    let mut w = floats(b, WEIGHTS, n * n_used)?;
    b.record(|st| {
        st.batch.run(
            &mut st.gpu,
            &k::moe_route::Args {
                logits: &logits,
                ids: &mut ids,
                w: &mut w,
                n_expert: n_expert as u32,
                n_used: n_used as u32,
                normalize: routing.normalize.into(),
                scale: routing.scale,
                n: n as u32,
            },
            k::moe_route::grid_for(n as u32),
        )
    });
    let tables = slots.map(|slots| group(b, &mut ids, n_expert, pairs, slots));
    let mixture = Mixture {
        moe,
        routing,
        act,
        x,
        n,
        ids: &ids,
        w: &w,
        add,
    };
    let done = route(b, mixture, out, normed, tables);
    keep(b, [(LOGITS, logits), (WEIGHTS, w)]);
    b.state.borrow_mut().moe_pool.ids = Some(ids);
    done
}

/// A mixture layer's work once its router has chosen: the layer, its routing, the activation,
/// `n` rows of input `x`, for each row the experts chosen (`ids`) and their weights (`w`), and
/// whether the weighted sum is added to the output (the residual) or stored.
#[derive(Clone, Copy)]
struct Mixture<'a> {
    moe: &'a Moe<GpuMatrix, GpuBuffer<f32>>,
    routing: &'a Experts,
    act: Activation,
    x: &'a GpuBuffer<f32>,
    n: usize,
    ids: &'a GpuBuffer<u32>,
    w: &'a GpuBuffer<f32>,
    add: bool,
}

/// The experts a mixture's rows chose, over those rows into `out`: by id (of the rows, or of
/// the slots `tables` grouped), gathered on the host or gated on the GPU, as [`moe_ffn`] says
/// (`normed`: what the FFN's norm quantized).
fn route(
    b: &GpuBackend,
    mixture: Mixture,
    out: &mut GpuBuffer<f32>,
    normed: Option<Quantized>,
    tables: Option<Tables>,
) -> Result<(), BackendError> {
    if let Some(stacked) = &mixture.moe.stacked {
        if tables.is_some() || by_id_pays(mixture.n, mixture.routing) {
            return by_id(b, stacked, mixture, out, normed, tables);
        }
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let Mixture { n, routing, .. } = mixture;
        let short = n <= k::TOKEN_TILE as usize && routing.n_expert <= GATED_EXPERTS;
        if !short && !b.state.borrow().route_on_gpu {
            return gathered_on_host(b, mixture, out);
        }
    }
    routed_on_gpu(b, mixture, out)
}

/// Whether a step of `n` rows multiplies its chosen experts by id ([`by_id`]): a decode tile
/// of rows, or as many as make no more (row, choice) pairs than the layer has experts (16
/// rows of Qwen3-30B-A3B's 128 choosing 8, 8 of gpt-oss-20b's 32 choosing 4). By id reads an
/// expert's weights once a pair; gathering the rows reads each chosen expert once, on average
/// `n_expert·(1 − (1 − 1/n_expert)^pairs)` of them, at least 63 % of the pairs while there are
/// no more pairs than experts — so by id reads at most 1.6 times the weights, waits for no
/// read-back, and launches each matrix once where gathering launches it once a chosen expert.
fn by_id_pays(n: usize, routing: &Experts) -> bool {
    n <= k::TOKEN_TILE as usize || n * routing.n_used <= routing.n_expert
}

/// Whether a longer step's pairs are grouped by expert on the GPU ([`group`]): every stacked
/// matrix has a tiled `_id` instance ([`product::groups`]), `moe_group` takes the layer's
/// count of experts, and the step is not set to be gated ([`GpuBackend::set_experts_routed_on_gpu`],
/// natively).
fn groups(b: &GpuBackend, stacked: &Expert<GpuMatrix, GpuBuffer<f32>>, routing: &Experts) -> bool {
    let st = b.state.borrow();
    #[cfg(not(target_arch = "wasm32"))]
    if st.route_on_gpu {
        return false;
    }
    let matrices = input_matrices(stacked).into_iter().chain([&stacked.down]);
    routing.n_expert <= k::GROUPED_EXPERTS as usize
        && matrices
            .into_iter()
            .all(|w| product::groups(w, st.packed_dot))
}

/// The slots of a step of `pairs` (row, choice) pairs grouped by expert: at most one partial
/// tile an expert that a pair chose.
fn slots(pairs: usize, n_expert: usize) -> usize {
    let tile = k::GEMM_TOKENS as usize;
    tile * (pairs.div_ceil(tile) + pairs.min(n_expert))
}

/// Words of the ids buffer for `pairs` router ids and, past them, `moe_group`'s tables over
/// `slots` slots (`order`, `gid`, `pos`).
fn id_words(pairs: usize, slots: Option<usize>) -> usize {
    pairs + slots.map_or(0, |slots| 2 * slots + pairs)
}

/// A step's pairs grouped by expert ([`group`]): its slots, where the products find
/// `moe_group`'s `order` and `gid`, and where the combine finds `pos`.
#[derive(Clone, Copy)]
struct Tables {
    slots: usize,
    grouped: Grouped,
    pos_at: u32,
}

/// The step's `pairs` (row, choice) pairs grouped by expert into `slots` slots on the GPU
/// (`moe_group`), its tables written into `ids` past the router's ids ([`id_words`]).
fn group(
    b: &GpuBackend,
    ids: &mut GpuBuffer<u32>,
    n_expert: usize,
    pairs: usize,
    slots: usize,
) -> Tables {
    b.record(|st| {
        st.batch.run(
            &mut st.gpu,
            &k::moe_group::Args {
                ids,
                n_expert: n_expert as u32,
                pairs: pairs as u32,
                slots: slots as u32,
                tile: k::GEMM_TOKENS,
            },
            [1, 1, 1],
        )
    });
    Tables {
        slots,
        grouped: Grouped {
            gid_at: (pairs + slots) as u32,
            order_at: pairs as u32,
            gathered: true,
        },
        pos_at: (pairs + 2 * slots) as u32,
    }
}

/// `expert`'s FFN of `m` rows of `xs` into `y` (`m` rows of the model's width), through the
/// scratch `gate`, `up` and `a` (`m` rows of `ff`); its gate and up products read `xs` from
/// `shared` where it holds them quantized ([`crate::shared_input`]).
#[allow(clippy::too_many_arguments)]
fn expert_ffn(
    b: &GpuBackend,
    expert: &Expert<GpuMatrix, GpuBuffer<f32>>,
    act: Activation,
    xs: &GpuBuffer<f32>,
    m: usize,
    ff: usize,
    [gate, up, a]: [&mut GpuBuffer<f32>; 3],
    y: &mut GpuBuffer<f32>,
    shared: Option<&mut SharedInput>,
) {
    let mut gate_up = |b: &GpuBackend| match (&expert.biases, &expert.gate_up) {
        (Some([gate_bias, up_bias, _]), GateUp::Apart { gate: wg, up: wu }) => {
            b.matmul_many(&[wg, wu], xs, m, &mut [&mut *gate, &mut *up]);
            b.add_bias(gate, gate_bias, m);
            b.add_bias(up, up_bias, m);
            b.glu(gate, up, m * ff, act, a);
        }
        (Some(_), GateUp::Joined(_)) => {
            unreachable!("an expert with biases keeps its gate and up apart (`stack_experts`)")
        }
        (None, w) => b.gate_up(w, xs, m, ff, act, [gate, up], a),
    };
    match shared {
        Some(shared) => b.with_shared_input(shared, gate_up),
        None => gate_up(b),
    }
    b.matmul(&expert.down, a, m, y);
    if let Some([.., down_bias]) = &expert.biases {
        b.add_bias(y, down_bias, m);
    }
}

/// A mixture's experts (each gate and up apart, as loaded), and their matrices and biases
/// stacked for [`by_id`] where every matrix stacks ([`GpuMatrix::stack`]: one shape and route
/// of an `_id` kernel; else `None`, and the experts route as before); the experts' matrices
/// then view their rows in the stacks. Each expert's gate and up are joined first where it has
/// no biases, as a dense pair is.
#[allow(clippy::type_complexity)]
pub fn stack(
    b: &GpuBackend,
    experts: Vec<Expert<GpuMatrix, GpuBuffer<f32>>>,
) -> Result<
    (
        Vec<Expert<GpuMatrix, GpuBuffer<f32>>>,
        Option<Expert<GpuMatrix, GpuBuffer<f32>>>,
    ),
    BackendError,
> {
    let n = experts.len();
    let every = |f: fn(&Expert<GpuMatrix, GpuBuffer<f32>>) -> bool| experts.iter().all(f);
    let all_apart = every(|e| matches!(e.gate_up, GateUp::Apart { .. }));
    let (biased, unbiased) = (every(|e| e.biases.is_some()), every(|e| e.biases.is_none()));
    if n == 0 || !all_apart || !(biased || unbiased) {
        return Ok((experts, None));
    }
    let (mut gates, mut ups, mut downs, mut biases) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for e in experts {
        if let GateUp::Apart { gate, up } = e.gate_up {
            gates.push(gate);
            ups.push(up);
        }
        downs.push(e.down);
        biases.extend(e.biases);
    }
    let mut st = b.state.borrow_mut();
    let gpu = &mut st.gpu;
    let (down, downs) = stacked(gpu, downs)?;
    let (gate_up, gate_ups) = if unbiased {
        // Each pair joined where it fits one window, as a dense pair is (all or none: one
        // shape), the joined matrices stacked where all joined.
        let (mut joined, mut apart) = (Vec::with_capacity(n), Vec::new());
        for (gate, up) in gates.into_iter().zip(ups) {
            match apart.is_empty() {
                true => match GpuMatrix::join(gpu, gate, up).map_err(device_error)? {
                    Ok(m) => joined.push(m),
                    Err(pair) => apart.push(pair),
                },
                false => apart.push((gate, up)),
            }
        }
        let (stack, joined) = match apart.is_empty() {
            true => stacked(gpu, joined)?,
            false => (None, joined),
        };
        let each = joined.into_iter().map(GateUp::Joined);
        let each = each.chain(
            apart
                .into_iter()
                .map(|(gate, up)| GateUp::Apart { gate, up }),
        );
        (stack.map(GateUp::Joined), each.collect::<Vec<_>>())
    } else {
        let ((gate, gates), (up, ups)) = (stacked(gpu, gates)?, stacked(gpu, ups)?);
        let each = gates.into_iter().zip(ups);
        let each: Vec<_> = each.map(|(gate, up)| GateUp::Apart { gate, up }).collect();
        let pair = gate.zip(up).map(|(gate, up)| GateUp::Apart { gate, up });
        (pair, each)
    };
    // The biases one expert after another, where the matrices stacked (copies: a few rows
    // each, so each expert keeps its own).
    let stacks = gate_up.zip(down);
    let stacked_biases = match (&stacks, biases.len() == n) {
        (Some(_), true) => {
            let mut batch = gpu.batch();
            let mut part = |i: usize| {
                let len = biases[0][i].len();
                let mut all = gpu.zeroed::<f32>("experts' biases", n * len)?;
                for (e, b) in biases.iter().enumerate() {
                    batch.copy(&b[i], 0, &mut all, e * len, len)?;
                }
                Ok::<_, hesper_gpu::GpuError>(all)
            };
            let parts = [part(0), part(1), part(2)];
            let [g, u, d] = parts.map(|p| p.map_err(device_error));
            let stacked = [g?, u?, d?];
            gpu.submit(batch).map_err(device_error)?;
            Some(stacked)
        }
        _ => None,
    };
    let mut each_biases = biases.into_iter().map(Some);
    let experts = gate_ups
        .into_iter()
        .zip(downs)
        .map(|(gate_up, down)| Expert {
            gate_up,
            down,
            biases: each_biases.next().flatten(),
        })
        .collect();
    let stacked = stacks.map(|(gate_up, down)| Expert {
        gate_up,
        down,
        biases: stacked_biases,
    });
    Ok((experts, stacked))
}

/// `ms` stacked ([`GpuMatrix::stack`]) and viewing their rows in the stack, or untouched and
/// no stack where they do not stack.
fn stacked(
    gpu: &mut hesper_gpu::Gpu,
    ms: Vec<GpuMatrix>,
) -> Result<(Option<GpuMatrix>, Vec<GpuMatrix>), BackendError> {
    Ok(match GpuMatrix::stack(gpu, ms).map_err(device_error)? {
        Ok((stack, ms)) => (Some(stack), ms),
        Err(ms) => (None, ms),
    })
}

/// The matrices that read an expert's input (its gate and up, or the two joined).
fn input_matrices(expert: &Expert<GpuMatrix, GpuBuffer<f32>>) -> Vec<&GpuMatrix> {
    match &expert.gate_up {
        GateUp::Apart { gate, up } => vec![gate, up],
        GateUp::Joined(m) => vec![m],
    }
}

/// `n` rows of `x` quantized once for every expert's gate and up products, where they all
/// read their input the same way (so one quantization serves each).
fn share_input(
    b: &GpuBackend,
    moe: &Moe<GpuMatrix, GpuBuffer<f32>>,
    x: &GpuBuffer<f32>,
    n: usize,
) -> Result<Option<SharedInput>, BackendError> {
    let Some(first) = moe.experts.first().map(|e| input_matrices(e)[0]) else {
        return Ok(None);
    };
    let alike = moe
        .experts
        .iter()
        .flat_map(input_matrices)
        .all(|w| crate::product::same_input(first, w));
    if !alike {
        return Ok(None);
    }
    b.share_input(first, x, n)
}

/// Each chosen expert's rows gathered on the host from the read-back `ids` (`w`: their
/// weights), multiplied once for all of them.
#[cfg(not(target_arch = "wasm32"))]
fn gathered_on_host(
    b: &GpuBackend,
    mixture: Mixture,
    out: &mut GpuBuffer<f32>,
) -> Result<(), BackendError> {
    let Mixture {
        moe,
        routing,
        act,
        x,
        n,
        ids,
        ..
    } = mixture;
    let d = moe.router.desc.cols;
    let (n_used, ff) = (routing.n_used, routing.n_ff);
    let chosen =
        pollster::block_on(b.submit_for_read(ids, n * n_used)?.wait()).map_err(device_error)?;
    // Each expert's rows, with the expert's rank among the row's choices.
    let mut rows_of = vec![Vec::new(); routing.n_expert];
    for (k, &e) in chosen.iter().enumerate() {
        rows_of[e as usize].push((k / n_used, k % n_used));
    }
    // Row `t·n_used + rank`: row t's output from its rank-th expert.
    let mut ys = floats(b, OUTPUTS, n * n_used * d)?;
    // Scratch for the expert of the most rows, reused expert after expert.
    let most = rows_of.iter().map(Vec::len).max().unwrap_or(0);
    let (mut gate, mut up) = (floats(b, GATE, most * ff)?, floats(b, UP, most * ff)?);
    let (mut a, mut y) = (floats(b, ACT, most * ff)?, floats(b, Y, most * d)?);
    let mut xs = floats(b, ROWS, most * d)?;
    // An expert that every row chose (each expert of a decoded token) reads `x` itself,
    // quantized once for all of them.
    let every_row = |rows: &[(usize, usize)]| rows.iter().map(|r| r.0).eq(0..n);
    let mut shared = match rows_of.iter().filter(|r| every_row(r)).count() {
        0 | 1 => None,
        _ => share_input(b, moe, x, n)?,
    };
    for (e, rows) in rows_of.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        let m = rows.len();
        let scratch = [&mut gate, &mut up, &mut a];
        if every_row(rows) {
            let expert = &moe.experts[e];
            expert_ffn(b, expert, act, x, m, ff, scratch, &mut y, shared.as_mut());
        } else {
            for (i, &(t, _)) in rows.iter().enumerate() {
                b.copy_rows(x, t, 1, d, &mut xs, i);
            }
            expert_ffn(b, &moe.experts[e], act, &xs, m, ff, scratch, &mut y, None);
        }
        for (i, &(t, rank)) in rows.iter().enumerate() {
            b.copy_rows(&y, i, 1, d, &mut ys, t * n_used + rank);
        }
    }
    b.keep_shared_input(shared);
    combine(b, mixture, &ys, None, None, out);
    keep(
        b,
        [
            (OUTPUTS, ys),
            (GATE, gate),
            (UP, up),
            (ACT, a),
            (Y, y),
            (ROWS, xs),
        ],
    );
    Ok(())
}

/// `out` = each of the mixture's rows' outputs in `ys` (row `t·n_used + rank`: row `t`'s from
/// its rank-th expert, the model's width; or the row the table at `pos_at` of the ids buffer
/// gives that pair) plus its expert's `bias` where given, weighted and added in the order
/// chosen (`out +=` that where the mixture adds).
fn combine(
    b: &GpuBackend,
    mixture: Mixture,
    ys: &GpuBuffer<f32>,
    bias: Option<&GpuBuffer<f32>>,
    pos_at: Option<u32>,
    out: &mut GpuBuffer<f32>,
) {
    let width = mixture.moe.router.desc.cols;
    let len = (mixture.n * width) as u32;
    b.record(|st| {
        st.batch.run(
            &mut st.gpu,
            &k::moe_combine::Args {
                ys,
                w: mixture.w,
                ids: mixture.ids,
                // Unread without biases.
                bias: bias.unwrap_or(mixture.w),
                out,
                width: width as u32,
                n_used: mixture.routing.n_used as u32,
                biased: bias.is_some().into(),
                add: mixture.add.into(),
                pos_at: pos_at.unwrap_or(0),
                n: len,
            },
            k::moe_combine::grid_for(len),
        )
    });
}

/// The chosen experts of a step of a few rows ([`by_id_pays`]) multiplied through the
/// stacks ([`Moe::stacked`]), each product's rows picking their expert from `ids`: one launch
/// a matrix whatever the layer's count of experts, reading only the chosen experts' rows and
/// nothing back. Row `t·n_used + rank` of each product is row `t`'s with its rank-th expert,
/// the products those of each expert alone (the same sums in the same order), and
/// [`combine`] adds them up as the gathered rows are added, so every bit is the other paths'.
/// The gate and up products read the rows the FFN's norm quantized (`normed`) where it did.
/// Where `tables` grouped the pairs by expert (`moe_group`), the products' rows are its slots
/// instead, each tile of them one expert's ([`product::Grouped`]), and the combine reads each
/// pair's output at its slot: the same sums again.
fn by_id(
    b: &GpuBackend,
    stacked: &Expert<GpuMatrix, GpuBuffer<f32>>,
    mixture: Mixture,
    out: &mut GpuBuffer<f32>,
    normed: Option<Quantized>,
    tables: Option<Tables>,
) -> Result<(), BackendError> {
    let (x, n, ids) = (mixture.x, mixture.n, mixture.ids);
    let d = mixture.moe.router.desc.cols;
    let (n_used, ff) = (mixture.routing.n_used, mixture.routing.n_ff);
    let act = mixture.act;
    let pairs = n * n_used;
    // The products' rows: a row's choices one after another, or the slots.
    let rows = tables.map_or(pairs, |t| t.slots);
    let picks = |per_input: usize, gathered: bool| Picks {
        ids,
        per_input: per_input as u32,
        grouped: tables.map(|t| Grouped {
            gathered,
            ..t.grouped
        }),
    };
    let mut a = floats(b, ACT, rows * ff)?;
    let mut ys = floats(b, OUTPUTS, rows * d)?;
    b.state.borrow_mut().quantized = normed;
    let gate_up = (picks(n_used, true), rows);
    match (&stacked.gate_up, &stacked.biases) {
        (GateUp::Joined(m), None) => {
            matmul_by_id(b, &[m], x, n, gate_up, &mut [&mut a], glu_mode(act));
        }
        (GateUp::Apart { gate, up }, biases) => {
            let (mut g, mut u) = (floats(b, GATE, rows * ff)?, floats(b, UP, rows * ff)?);
            let outs = &mut [&mut g, &mut u];
            matmul_by_id(b, &[gate, up], x, n, gate_up, outs, k::STORE);
            match biases {
                Some([gate_bias, up_bias, _]) => {
                    let len = (rows * ff) as u32;
                    b.record(|st| {
                        st.batch.run(
                            &mut st.gpu,
                            &k::biased_glu_by_id::Args {
                                gate: &g,
                                up: &u,
                                bg: gate_bias,
                                bu: up_bias,
                                ids,
                                out: &mut a,
                                width: ff as u32,
                                mode: glu_mode(act),
                                ids_at: tables.map_or(0, |t| t.grouped.gid_at),
                                n: len,
                            },
                            k::biased_glu_by_id::grid_for(len),
                        )
                    });
                }
                None => b.glu(&g, &u, rows * ff, act, &mut a),
            }
            keep(b, [(GATE, g), (UP, u)]);
        }
        (GateUp::Joined(_), Some(_)) => {
            unreachable!("an expert with biases keeps its gate and up apart (`stack_experts`)")
        }
    }
    let down = (picks(1, false), rows);
    matmul_by_id(
        b,
        &[&stacked.down],
        &a,
        rows,
        down,
        &mut [&mut ys],
        k::STORE,
    );
    let down_bias = stacked.biases.as_ref().map(|[.., down]| down);
    combine(b, mixture, &ys, down_bias, tables.map(|t| t.pos_at), out);
    keep(b, [(ACT, a), (OUTPUTS, ys)]);
    Ok(())
}

/// `outs[i]` = the products of the stacked `ws[i]` with `inputs` rows of `x` over `by_id`'s
/// rows, each picking its expert and input row as its [`Picks`] say, written as `mode` says.
fn matmul_by_id(
    b: &GpuBackend,
    ws: &[&GpuMatrix],
    x: &GpuBuffer<f32>,
    inputs: usize,
    by_id: (Picks, usize),
    outs: &mut [&mut GpuBuffer<f32>],
    mode: u32,
) {
    b.record_product(|st| product::multiply_each(st, ws, x, inputs, outs, mode, Some(by_id)));
}

/// Every expert recorded behind a gate over all `n` rows, launched where a row chose it
/// (`ids`; `w`: the weights), then `moe_combine_routed`.
fn routed_on_gpu(
    b: &GpuBackend,
    mixture: Mixture,
    out: &mut GpuBuffer<f32>,
) -> Result<(), BackendError> {
    let Mixture {
        moe,
        routing,
        act,
        x,
        n,
        ids,
        w,
        add,
    } = mixture;
    let d = moe.router.desc.cols;
    let (n_expert, n_used, ff) = (routing.n_expert, routing.n_used, routing.n_ff);
    // `x` quantized once, outside the gates: every expert reads it.
    let mut shared = share_input(b, moe, x, n)?;
    let per_expert = 3 * EXPERT_LAUNCHES;
    let slots = n_expert * per_expert;
    let grids = b.state.borrow().gpu.zeroed::<u32>("expert grids", slots);
    let mut grids = grids.map_err(device_error)?;
    let held = b.state.borrow_mut().moe_pool.args.take();
    let mut args = words(held, slots, || {
        b.state.borrow().gpu.indirect_args("expert launches", slots)
    })?;
    // Each expert's outputs for every row, expert by expert.
    let mut ys = floats(b, OUTPUTS, n_expert * n * d)?;
    let (mut gate, mut up) = (floats(b, GATE, n * ff)?, floats(b, UP, n * ff)?);
    let (mut a, mut y) = (floats(b, ACT, n * ff)?, floats(b, Y, n * d)?);
    let words = (n_expert * per_expert) as u32;
    // `gate_grids` reads the grids the host writes below, so the batch holding it is not
    // submitted before they are written (from it to the write, nothing is flushed).
    let flush = std::mem::replace(&mut b.state.borrow_mut().flush, usize::MAX);
    b.record(|st| {
        st.batch.run(
            &mut st.gpu,
            &k::gate_grids::Args {
                grids: &grids,
                ids,
                args: &mut args,
                per_expert: per_expert as u32,
                n_ids: (n * n_used) as u32,
                n: words,
            },
            k::gate_grids::grid_for(words),
        )
    });
    let mut table = vec![0u32; n_expert * per_expert];
    for (e, expert) in moe.experts.iter().enumerate() {
        b.record(|st| {
            st.batch
                .open_gate(&args, e * EXPERT_LAUNCHES, EXPERT_LAUNCHES)
        });
        let scratch = [&mut gate, &mut up, &mut a];
        expert_ffn(b, expert, act, x, n, ff, scratch, &mut y, shared.as_mut());
        let launched = b.state.borrow_mut().batch.close_gate();
        for (slot, grid) in table[e * per_expert..].chunks_exact_mut(3).zip(launched) {
            slot.copy_from_slice(&grid);
        }
        b.copy_rows(&y, 0, n, d, &mut ys, e * n);
    }
    b.keep_shared_input(shared);
    let written = {
        let mut st = b.state.borrow_mut();
        st.flush = flush;
        st.gpu.write(&mut grids, 0, &table)
    };
    written.map_err(device_error)?;
    let len = (n * d) as u32;
    b.record(|st| {
        st.batch.run(
            &mut st.gpu,
            &k::moe_combine_routed::Args {
                ys: &ys,
                ids,
                w,
                out,
                width: d as u32,
                n_used: n_used as u32,
                rows: n as u32,
                add: add.into(),
                n: len,
            },
            k::moe_combine_routed::grid_for(len),
        )
    });
    keep(b, [(OUTPUTS, ys), (GATE, gate), (UP, up), (ACT, a), (Y, y)]);
    b.state.borrow_mut().moe_pool.args = Some(args);
    Ok(())
}
