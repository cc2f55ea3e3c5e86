//! Q8_0 rows: their int8 values as words (8 per block) and their f16 block scales as f32
//! (`matvec_q8_0`).

use std::borrow::Cow;

use half::f16;
use hesper_engine::formats::{Q8_0, Q8_0_BLOCK_BYTES};

use super::GpuLayout;
use crate::matrix::Kind;

impl GpuLayout for Q8_0 {
    fn route(self, _cols: usize) -> Result<Kind, &'static str> {
        Ok(Kind::Q8_0)
    }

    fn repack(src: &[u8], _cols: usize) -> (Cow<'_, [u8]>, Option<Vec<f32>>) {
        let blocks = src.chunks_exact(Q8_0_BLOCK_BYTES);
        let scales = blocks
            .clone()
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        let values = blocks.flat_map(|b| b[2..].iter().copied()).collect();
        (Cow::Owned(values), Some(scales))
    }
}
