//! MXFP4 rows take the Q8_0 route (`matvec_q8_0`), widened without loss: each block's doubled
//! E2M1 values as int8 words and its power-of-two factor as f32, so the products are MXFP4 ×
//! Q8_0's integer sums and float steps, as ggml's CPU computes them (at twice the bytes of the
//! file's blocks).

use std::borrow::Cow;

use hesper_engine::formats::{mxfp4_code, mxfp4_scale, Mxfp4, MXFP4_BLOCK_BYTES, MXFP4_VALUES};

use super::GpuLayout;
use crate::matrix::Kind;

impl GpuLayout for Mxfp4 {
    fn route(self, _cols: usize) -> Result<Kind, &'static str> {
        Ok(Kind::Q8_0)
    }

    fn repack(src: &[u8], _cols: usize) -> (Cow<'_, [u8]>, Option<Vec<f32>>) {
        let blocks = src.chunks_exact(MXFP4_BLOCK_BYTES);
        let scales = blocks.clone().map(|b| mxfp4_scale(b[0])).collect();
        let values = blocks
            .flat_map(|b| (0..32).map(move |e| MXFP4_VALUES[usize::from(mxfp4_code(b, e))] as u8))
            .collect();
        (Cow::Owned(values), Some(scales))
    }
}
