//! The mixture-of-experts FFN on the CPU: each row routed on the host
//! ([`hesper_engine::config::Experts::route`]), the rows of a step grouped by expert so that
//! each chosen expert's matrices are read once for all its rows, then every row's outputs
//! weighted and summed in the order of its choice (as llama.cpp adds them up). Where the
//! family has biases (gpt-oss), the router's is added to its logits and each expert's to its
//! gate, up and down products.

use hesper_engine::backend::{Backend, GateUp, Moe};
use hesper_engine::config::{Activation, Experts, Routes};

use crate::{CpuBackend, CpuMatrix};

/// `out` = the mixture of `moe`'s experts over `n` rows of `x` (see [`Backend::moe_ffn`]).
#[allow(clippy::ptr_arg)] // the backend's buffers, as its products take them
pub fn moe_ffn(
    b: &CpuBackend,
    moe: &Moe<CpuMatrix, Vec<f32>>,
    routing: &Experts,
    act: Activation,
    x: &Vec<f32>,
    n: usize,
    out: &mut [f32],
) {
    let d = moe.router.desc.cols;
    let (n_expert, ff) = (routing.n_expert, routing.n_ff);
    let mut logits = vec![0.0; n * n_expert];
    b.matmul(&moe.router, x, n, &mut logits);
    if let Some(bias) = &moe.router_bias {
        b.add_bias(&mut logits, bias, n);
    }
    let Routes { chosen, rows_of } = routing.routes(&logits);
    let n_used = routing.n_used;
    let mut ys = vec![0.0f32; n * n_used * d];
    for (e, rows) in rows_of.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        let m = rows.len();
        let mut xs = Vec::with_capacity(m * d);
        for &(t, _) in rows {
            xs.extend_from_slice(&x[t * d..(t + 1) * d]);
        }
        let expert = &moe.experts[e];
        let (mut gate, mut up, mut a) = (vec![0.0; m * ff], vec![0.0; m * ff], vec![0.0; m * ff]);
        match &expert.biases {
            Some([gate_bias, up_bias, _]) => {
                let GateUp::Apart { gate: wg, up: wu } = &expert.gate_up else {
                    unreachable!("the CPU keeps gate and up apart (the default join_gate_up)")
                };
                b.matmul(wg, &xs, m, &mut gate);
                b.add_bias(&mut gate, gate_bias, m);
                b.matmul(wu, &xs, m, &mut up);
                b.add_bias(&mut up, up_bias, m);
                b.glu(&gate, &up, m * ff, act, &mut a);
            }
            None => b.gate_up(
                &expert.gate_up,
                &xs,
                m,
                ff,
                act,
                [&mut gate, &mut up],
                &mut a,
            ),
        }
        let mut y = vec![0.0; m * d];
        b.matmul(&expert.down, &a, m, &mut y);
        if let Some([.., down_bias]) = &expert.biases {
            b.add_bias(&mut y, down_bias, m);
        }
        for (&(t, rank), yr) in rows.iter().zip(y.chunks_exact(d)) {
            ys[(t * n_used + rank) * d..][..d].copy_from_slice(yr);
        }
    }
    for (t, (route, o)) in chosen.iter().zip(out.chunks_exact_mut(d)).enumerate() {
        for (rank, &(_, w)) in route.iter().enumerate() {
            let y = &ys[(t * n_used + rank) * d..][..d];
            if rank == 0 {
                o.iter_mut().zip(y).for_each(|(o, &y)| *o = y * w);
            } else {
                o.iter_mut().zip(y).for_each(|(o, &y)| *o += y * w);
            }
        }
    }
}
