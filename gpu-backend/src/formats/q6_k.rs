//! Q6_K rows: the shared K-quant upload (`k_quants`), codes less their offset of 32 with
//! sixteen signed sub-block scales of 16 values and no minimums.

use std::borrow::Cow;

use hesper_engine::formats::q6_k::{q6_k_code, q6_k_d, Q6_K_SCALES};
use hesper_engine::formats::Q6K;

use super::k_quants::{repack, KBlock};
use super::GpuLayout;
use crate::matrix::Kind;

impl GpuLayout for Q6K {
    fn route(self, _cols: usize) -> Result<Kind, &'static str> {
        Ok(Kind::Kq {
            sub: 16,
            high: 2,
            offset: 32,
        })
    }

    fn repack(src: &[u8], cols: usize) -> (Cow<'_, [u8]>, Option<Vec<f32>>) {
        let block = KBlock {
            sub: 16,
            high: 2,
            code: q6_k_code,
            // Sub-block s (elements 16s..16s + 16) uses scale s.
            scales_mins: |blk| {
                blk[Q6_K_SCALES..Q6_K_SCALES + 16]
                    .iter()
                    .map(|&s| (s as i8, 0))
                    .collect()
            },
            d_dmin: |blk| (q6_k_d(blk), 0.0),
        };
        repack::<Self>(src, cols, &block)
    }
}
