//! F32 and F16 rows go to the GPU as stored (`matvec_f32`, `matvec_f16`); BF16 has no kernel.

use hesper_engine::formats::{Bf16, F16, F32};

use super::{GpuLayout, NO_KERNEL};
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
    fn route(self, _cols: usize) -> Result<Kind, &'static str> {
        Err(NO_KERNEL)
    }
}
