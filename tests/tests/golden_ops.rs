//! Op-by-op teacher forcing on the CPU backend (scalar and the best SIMD kernels); the
//! comparison itself and its bound are in `hesper_tests::ops`. The GPU runs the same check in
//! `golden_gpu.rs`.

use hesper_cpu::CpuBackend;
use hesper_tests::{isas, ops::run_ops, ALL};

#[test]
fn every_op_matches_the_reference_cpu() {
    for isa in isas() {
        let backend = CpuBackend::with_isa(2, isa).expect("backend");
        for stem in ALL {
            let worst = run_ops(&backend, stem);
            println!("{stem} {isa:?}: worst op |Δ|/scale = {worst:.2e}");
        }
    }
}
