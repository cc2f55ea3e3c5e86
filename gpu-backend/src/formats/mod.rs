//! The GPU side of every weight layout, one file each: which kernel route its rows take
//! ([`Kind`], run by `crate::product`) and how they are repacked for it at upload
//! ([`GpuLayout`]). A layout without a GPU kernel for some shape says why, and the load stops
//! with that line.

mod float;
mod i2s;
mod k_quants;
mod mxfp4;
mod q4_0;
mod q4_k;
mod q5_k;
mod q6_k;
mod q8_0;
mod ternary;

use std::borrow::Cow;

use hesper_engine::formats::Layout;

use crate::matrix::Kind;

/// A weight layout on the GPU.
pub trait GpuLayout: Layout {
    /// The kernel route rows of `cols` values take, or why they cannot go to the GPU.
    fn route(self, cols: usize) -> Result<Kind, &'static str>;

    /// Whole stored rows `src` (of `cols` values) as the route's kernel reads them: the
    /// weight bytes, and the block scales where it reads them. As stored unless the layout
    /// says otherwise.
    fn repack(src: &[u8], _cols: usize) -> (Cow<'_, [u8]>, Option<Vec<f32>>) {
        (Cow::Borrowed(src), None)
    }
}
