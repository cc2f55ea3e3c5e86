//! Q5_K rows: the shared K-quant upload (`k_quants`), codes 0..32 with Q4_K's sub-blocks.

use std::borrow::Cow;

use hesper_engine::formats::q4_k::k_d_dmin;
use hesper_engine::formats::q5_k::q5_k_code;
use hesper_engine::formats::Q5K;

use super::k_quants::{repack, KBlock};
use super::q4_k::eight_scales_mins;
use super::GpuLayout;
use crate::matrix::Kind;

impl GpuLayout for Q5K {
    fn route(self, _cols: usize) -> Result<Kind, &'static str> {
        Ok(Kind::Kq {
            sub: 32,
            high: 1,
            offset: 0,
        })
    }

    fn repack(src: &[u8], cols: usize) -> (Cow<'_, [u8]>, Option<Vec<f32>>) {
        let block = KBlock {
            sub: 32,
            high: 1,
            code: q5_k_code,
            scales_mins: eight_scales_mins,
            d_dmin: k_d_dmin,
        };
        repack::<Self>(src, cols, &block)
    }
}
