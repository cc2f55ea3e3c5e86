//! I2_S rows go to the GPU as stored, with β as the output scale (`bitlinear_i2s`, or
//! `bitlinear_i2s_dp4` where the device has packed int8 dot products).

use hesper_engine::formats::I2s;

use super::GpuLayout;
use crate::matrix::Kind;

impl GpuLayout for I2s {
    fn route(self, _cols: usize) -> Result<Kind, &'static str> {
        Ok(Kind::I2s { beta: self.beta })
    }
}
