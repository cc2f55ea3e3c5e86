//! Q4_K rows: the shared K-quant upload (`k_quants`), codes 0..16 with eight sub-blocks of 32.

use std::borrow::Cow;

use hesper_engine::formats::q4_k::{k_d_dmin, k_scales_mins, q4_k_code};
use hesper_engine::formats::Q4K;

use super::k_quants::{repack, KBlock};
use super::GpuLayout;
use crate::matrix::Kind;

/// The eight six-bit scales and minimums of a Q4_K or Q5_K block (a scale fits an i8).
pub(super) fn eight_scales_mins(blk: &[u8]) -> Vec<(i8, u8)> {
    let (scales, mins) = k_scales_mins(blk);
    scales
        .iter()
        .zip(mins)
        .map(|(&s, m)| (s as i8, m))
        .collect()
}

impl GpuLayout for Q4K {
    fn route(self, _cols: usize) -> Result<Kind, &'static str> {
        Ok(Kind::Kq {
            sub: 32,
            high: 0,
            offset: 0,
        })
    }

    fn repack(src: &[u8], cols: usize) -> (Cow<'_, [u8]>, Option<Vec<f32>>) {
        let block = KBlock {
            sub: 32,
            high: 0,
            code: q4_k_code,
            scales_mins: eight_scales_mins,
            d_dmin: k_d_dmin,
        };
        repack::<Self>(src, cols, &block)
    }
}
