//! Q6_K has no GPU kernel yet; a re-quantized head (`--lm-head q8_0`) takes the Q8_0 route.

use hesper_engine::formats::Q6K;

use super::{GpuLayout, NO_KERNEL};
use crate::matrix::Kind;

impl GpuLayout for Q6K {
    fn route(self, _cols: usize) -> Result<Kind, &'static str> {
        Err(NO_KERNEL)
    }
}
