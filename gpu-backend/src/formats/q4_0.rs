//! Q4_0 has no GPU kernel yet: the load stops with [`NO_KERNEL`]'s line.

use hesper_engine::formats::Q4_0;

use super::{GpuLayout, NO_KERNEL};
use crate::matrix::Kind;

impl GpuLayout for Q4_0 {
    fn route(self, _cols: usize) -> Result<Kind, &'static str> {
        Err(NO_KERNEL)
    }
}
