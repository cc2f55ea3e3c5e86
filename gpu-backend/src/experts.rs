//! The mixture-of-experts FFN on the GPU, as the CPU backend computes it: the router's logits
//! (with gpt-oss's bias) are read back and routed on the host
//! ([`hesper_engine::config::Experts::routes`]); each chosen expert's rows are gathered and
//! multiplied by its matrices once for all of them (its biases added, where the family has
//! them, to its gate and up products before the activation and to its down product); every
//! row's outputs are then weighted and added in the order of its choice (`moe_combine`).
//!
//! The read-back waits for the GPU once per layer and step, so natively only: a browser cannot
//! wait inside a step (there the mixture's files are refused at load).

use hesper_engine::backend::{Backend, BackendError, GateUp, Moe};
use hesper_engine::config::{Activation, Experts, Routes};
use hesper_gpu::GpuBuffer;
use hesper_shaders as k;

use crate::{GpuBackend, GpuMatrix};

/// `out` = the mixture of `moe`'s experts over `n` rows of `x` (see [`Backend::moe_ffn`]), its
/// work recorded; a failure to allocate or to read the router back is returned.
pub fn moe_ffn(
    b: &GpuBackend,
    moe: &Moe<GpuMatrix, GpuBuffer<f32>>,
    routing: &Experts,
    act: Activation,
    x: &GpuBuffer<f32>,
    n: usize,
    out: &mut GpuBuffer<f32>,
) -> Result<(), BackendError> {
    let d = moe.router.desc.cols;
    let (n_expert, n_used, ff) = (routing.n_expert, routing.n_used, routing.n_ff);
    let mut logits = b.alloc(n * n_expert)?;
    b.matmul(&moe.router, x, n, &mut logits);
    if let Some(bias) = &moe.router_bias {
        b.add_bias(&mut logits, bias, n);
    }
    let mut host = vec![0.0; n * n_expert];
    pollster::block_on(b.read(&logits, &mut host))?;
    let Routes { chosen, rows_of } = routing.routes(&host);
    // Row `t·n_used + rank`: row t's output from its rank-th expert.
    let mut ys = b.alloc(n * n_used * d)?;
    for (e, rows) in rows_of.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        let m = rows.len();
        let mut xs = b.alloc(m * d)?;
        for (i, &(t, _)) in rows.iter().enumerate() {
            b.copy_rows(x, t, 1, d, &mut xs, i);
        }
        let expert = &moe.experts[e];
        let (mut gate, mut up, mut a) = (b.alloc(m * ff)?, b.alloc(m * ff)?, b.alloc(m * ff)?);
        match (&expert.biases, &expert.gate_up) {
            (Some([gate_bias, up_bias, _]), GateUp::Apart { gate: wg, up: wu }) => {
                b.matmul(wg, &xs, m, &mut gate);
                b.add_bias(&mut gate, gate_bias, m);
                b.matmul(wu, &xs, m, &mut up);
                b.add_bias(&mut up, up_bias, m);
                b.glu(&gate, &up, m * ff, act, &mut a);
            }
            (Some(_), GateUp::Joined(_)) => {
                unreachable!("the loader keeps an expert's gate and up apart where it has biases")
            }
            (None, w) => b.gate_up(w, &xs, m, ff, act, [&mut gate, &mut up], &mut a),
        }
        let mut y = b.alloc(m * d)?;
        b.matmul(&expert.down, &a, m, &mut y);
        if let Some([.., down_bias]) = &expert.biases {
            b.add_bias(&mut y, down_bias, m);
        }
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
