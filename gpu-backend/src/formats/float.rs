//! F32, F16 and BF16 rows go to the GPU as stored (`matvec_f32`, `matvec_f16`, `matvec_bf16`).

use hesper_engine::formats::{Bf16, F16, F32};

use super::GpuLayout;
use crate::matrix::Kind;

impl GpuLayout for F32 {
    fn route(self, _cols: usize) -> Result<Kind, &'static str> {
        Ok(Kind::F32)
    }
}

impl GpuLayout for F16 {
    fn route(self, cols: usize) -> Result<Kind, &'static str> {
        // The kernel reads pairs of halves as one word.
        if cols.is_multiple_of(2) {
            Ok(Kind::F16)
        } else {
            Err("F16 rows must have an even length")
        }
    }
}

impl GpuLayout for Bf16 {
    fn route(self, cols: usize) -> Result<Kind, &'static str> {
        // The kernel reads pairs of bf16 as one word.
        if cols.is_multiple_of(2) {
            Ok(Kind::Bf16)
        } else {
            Err("BF16 rows must have an even length")
        }
    }
}
