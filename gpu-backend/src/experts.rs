//! The mixture-of-experts FFN on the GPU, as the CPU backend computes it: each chosen expert's
//! gate and up products (its biases added, where the family has them, before the activation),
//! its down product (and bias), then every row's outputs weighted and added in the order of
//! its choice. Two routings, the same products for each row:
//!
//! - **On the host** (natively, by default): the router's logits (with gpt-oss's bias) are read
//!   back and routed by [`hesper_engine::config::Experts::routes`], the same routine as the
//!   CPU's; each chosen expert's rows are gathered and multiplied by its matrices once for all
//!   of them (`moe_combine` adds them up). The read-back waits for the GPU once a layer and
//!   step, which a browser cannot do inside a step.
//! - **On the GPU** (a browser; natively by [`crate::GpuBackend::set_experts_routed_on_gpu`]):
//!   `moe_route` chooses each row's experts into a buffer; every expert's launches are
//!   recorded over all the step's rows behind a gate (indirect dispatches,
//!   [`hesper_gpu::Batch::open_gate`]) whose grids `gate_grids` zeroes for the experts no row
//!   chose, so their matrices are never read; `moe_combine_routed` picks each row's outputs
//!   by the chosen ids. A decoded token reads only its experts' rows; a prefill reads each
//!   expert any row chose once per tile of rows, as the host routing does, and computes it for
//!   every row.

use hesper_engine::backend::{Backend, BackendError, Expert, GateUp, Moe};
use hesper_engine::config::{Activation, Experts};
use hesper_gpu::GpuBuffer;
use hesper_shaders as k;

use crate::{device_error, GpuBackend, GpuMatrix};

/// The most launches one expert's FFN records routed on the GPU (activation quantizations,
/// the products over their row windows, biases, the activation): its gate's slots.
const EXPERT_LAUNCHES: usize = 16;

/// `out` = the mixture of `moe`'s experts over `n` rows of `x` (see [`Backend::moe_ffn`]), its
/// work recorded, routed on the host or the GPU as the backend is set; a failure to allocate
/// or to read the router back is returned.
pub fn moe_ffn(
    b: &GpuBackend,
    moe: &Moe<GpuMatrix, GpuBuffer<f32>>,
    routing: &Experts,
    act: Activation,
    x: &GpuBuffer<f32>,
    n: usize,
    out: &mut GpuBuffer<f32>,
) -> Result<(), BackendError> {
    let mut logits = b.alloc(n * routing.n_expert)?;
    b.matmul(&moe.router, x, n, &mut logits);
    if let Some(bias) = &moe.router_bias {
        b.add_bias(&mut logits, bias, n);
    }
    #[cfg(not(target_arch = "wasm32"))]
    if !b.state.borrow().route_on_gpu {
        return routed_on_host(b, moe, routing, act, x, n, &logits, out);
    }
    routed_on_gpu(b, moe, routing, act, x, n, &logits, out)
}

/// `expert`'s FFN of `m` rows of `xs` into `y` (`m` rows of the model's width), through the
/// scratch `gate`, `up` and `a` (`m` rows of `ff`).
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
) {
    match (&expert.biases, &expert.gate_up) {
        (Some([gate_bias, up_bias, _]), GateUp::Apart { gate: wg, up: wu }) => {
            b.matmul(wg, xs, m, gate);
            b.add_bias(gate, gate_bias, m);
            b.matmul(wu, xs, m, up);
            b.add_bias(up, up_bias, m);
            b.glu(gate, up, m * ff, act, a);
        }
        (Some(_), GateUp::Joined(_)) => {
            unreachable!("the loader keeps an expert's gate and up apart where it has biases")
        }
        (None, w) => b.gate_up(w, xs, m, ff, act, [gate, up], a),
    }
    b.matmul(&expert.down, a, m, y);
    if let Some([.., down_bias]) = &expert.biases {
        b.add_bias(y, down_bias, m);
    }
}

/// The host routing: the router's `logits` read back, each chosen expert's rows gathered.
#[cfg(not(target_arch = "wasm32"))]
#[allow(clippy::too_many_arguments)]
fn routed_on_host(
    b: &GpuBackend,
    moe: &Moe<GpuMatrix, GpuBuffer<f32>>,
    routing: &Experts,
    act: Activation,
    x: &GpuBuffer<f32>,
    n: usize,
    logits: &GpuBuffer<f32>,
    out: &mut GpuBuffer<f32>,
) -> Result<(), BackendError> {
    let d = moe.router.desc.cols;
    let (n_used, ff) = (routing.n_used, routing.n_ff);
    let mut host = vec![0.0; n * routing.n_expert];
    pollster::block_on(b.read(logits, &mut host))?;
    let hesper_engine::config::Routes { chosen, rows_of } = routing.routes(&host);
    // Row `t·n_used + rank`: row t's output from its rank-th expert.
    let mut ys = b.alloc(n * n_used * d)?;
    for (e, rows) in rows_of.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        let m = rows.len();
        let mut xs = b.alloc(m * d)?;
        for (i, &(t, _)) in rows.iter().enumerate() {
            b.copy_rows(x, t, 1, d, &mut xs, i);
        }
        let (mut gate, mut up, mut a) = (b.alloc(m * ff)?, b.alloc(m * ff)?, b.alloc(m * ff)?);
        let mut y = b.alloc(m * d)?;
        let scratch = [&mut gate, &mut up, &mut a];
        expert_ffn(b, &moe.experts[e], act, &xs, m, ff, scratch, &mut y);
        for (i, &(t, rank)) in rows.iter().enumerate() {
            b.copy_rows(&y, i, 1, d, &mut ys, t * n_used + rank);
        }
    }
    let weights: Vec<f32> = chosen
        .iter()
        .flat_map(|route| route.iter().map(|&(_, w)| w))
        .collect();
    let mut w = b.alloc(n * n_used)?;
    b.write(&mut w, &weights)?;
    let len = (n * d) as u32;
    b.record(|st| {
        st.batch.run(
            &mut st.gpu,
            &k::moe_combine::Args {
                ys: &ys,
                w: &w,
                out,
                width: d as u32,
                n_used: n_used as u32,
                n: len,
            },
            k::moe_combine::grid_for(len),
        )
    });
    Ok(())
}

/// The GPU routing: `moe_route` into ids and weights, every expert recorded behind a gate
/// over all `n` rows, `moe_combine_routed`.
#[allow(clippy::too_many_arguments)]
fn routed_on_gpu(
    b: &GpuBackend,
    moe: &Moe<GpuMatrix, GpuBuffer<f32>>,
    routing: &Experts,
    act: Activation,
    x: &GpuBuffer<f32>,
    n: usize,
    logits: &GpuBuffer<f32>,
    out: &mut GpuBuffer<f32>,
) -> Result<(), BackendError> {
    let d = moe.router.desc.cols;
    let (n_expert, n_used, ff) = (routing.n_expert, routing.n_used, routing.n_ff);
    let per_expert = 3 * EXPERT_LAUNCHES;
    let (ids, grids, args) = {
        let st = b.state.borrow();
        let g = &st.gpu;
        (
            g.zeroed::<u32>("expert ids", n * n_used),
            g.zeroed::<u32>("expert grids", n_expert * per_expert),
            g.indirect_args("expert launches", n_expert * per_expert),
        )
    };
    let mut ids = ids.map_err(device_error)?;
    let (mut grids, mut args) = (grids.map_err(device_error)?, args.map_err(device_error)?);
    let mut w = b.alloc(n * n_used)?;
    let words = (n_expert * per_expert) as u32;
    b.record(|st| {
        st.batch.run(
            &mut st.gpu,
            &k::moe_route::Args {
                logits,
                ids: &mut ids,
                w: &mut w,
                n_expert: n_expert as u32,
                n_used: n_used as u32,
                normalize: routing.normalize.into(),
                scale: routing.scale,
                n: n as u32,
            },
            k::moe_route::grid_for(n as u32),
        )?;
        st.batch.run(
            &mut st.gpu,
            &k::gate_grids::Args {
                grids: &grids,
                ids: &ids,
                args: &mut args,
                per_expert: per_expert as u32,
                n_ids: (n * n_used) as u32,
                n: words,
            },
            k::gate_grids::grid_for(words),
        )
    });
    // Each expert's outputs for every row, expert by expert.
    let mut ys = b.alloc(n_expert * n * d)?;
    let (mut gate, mut up, mut a) = (b.alloc(n * ff)?, b.alloc(n * ff)?, b.alloc(n * ff)?);
    let mut y = b.alloc(n * d)?;
    // `gate_grids` reads the grids the host writes below, so the batch holding it is not
    // submitted before they are written.
    let flush = std::mem::replace(&mut b.state.borrow_mut().flush, usize::MAX);
    let mut table = vec![0u32; n_expert * per_expert];
    for (e, expert) in moe.experts.iter().enumerate() {
        b.record(|st| {
            st.batch
                .open_gate(&args, e * EXPERT_LAUNCHES, EXPERT_LAUNCHES)
        });
        let scratch = [&mut gate, &mut up, &mut a];
        expert_ffn(b, expert, act, x, n, ff, scratch, &mut y);
        let launched = b.state.borrow_mut().batch.close_gate();
        for (slot, grid) in table[e * per_expert..].chunks_exact_mut(3).zip(launched) {
            slot.copy_from_slice(&grid);
        }
        b.copy_rows(&y, 0, n, d, &mut ys, e * n);
    }
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
                ids: &ids,
                w: &w,
                out,
                width: d as u32,
                n_used: n_used as u32,
                rows: n as u32,
                n: len,
            },
            k::moe_combine_routed::grid_for(len),
        )
    });
    Ok(())
}
