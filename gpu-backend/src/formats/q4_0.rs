//! Q4_0 rows take the Q8_0 route (`matvec_q8_0`), widened without loss: each block's codes less
//! 8 as int8 words and its f16 scale as f32, so the products are Q4_0 × Q8_0's integer sums and
//! float steps (at twice the bytes of the file's blocks).

use std::borrow::Cow;

use half::f16;
use hesper_engine::formats::{q4_0_code, Q4_0, Q4_0_BLOCK_BYTES};

use super::GpuLayout;
use crate::matrix::Kind;

impl GpuLayout for Q4_0 {
    fn route(self, _cols: usize) -> Result<Kind, &'static str> {
        Ok(Kind::Q8_0)
    }

    fn repack(src: &[u8], _cols: usize) -> (Cow<'_, [u8]>, Option<Vec<f32>>) {
        let blocks = src.chunks_exact(Q4_0_BLOCK_BYTES);
        let scales = blocks
            .clone()
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        let values = blocks
            .flat_map(|b| (0..32).map(move |e| (q4_0_code(b, e) as i8 - 8) as u8))
            .collect();
        (Cow::Owned(values), Some(scales))
    }
}
