//! One input quantized once for the first products of many matrices that are not multiplied
//! one after the other: a mixture's experts each multiply the layer's normalized input by their
//! gate and up matrices, then their own activations by their down matrix, which a product
//! quantizes into the same scratch. The shared input is kept in an activation scratch of its
//! own, swapped in for each expert's first products, so it is quantized once a layer instead of
//! once an expert (the same codes, so the same bits).

use hesper_engine::backend::BackendError;
use hesper_gpu::GpuBuffer;

use crate::activations::Activations;
use crate::matrix::GpuMatrix;
use crate::{device_error, product, GpuBackend, Quantized};

/// A scratch holding one input quantized, and what it holds.
pub struct SharedInput {
    scratch: Activations,
    /// The rows the scratch holds, in the form the products that read them expect.
    held: Quantized,
}

impl GpuBackend {
    /// Records the quantization of `n` rows of `x` as `w`'s product reads them, into a scratch
    /// of their own for [`GpuBackend::with_shared_input`]; none for a layout whose products
    /// quantize for themselves (I2_S without `dot4I8Packed`) or read the floats (F32, BF16).
    /// [`GpuBackend::keep_shared_input`] keeps the scratch for the next time.
    pub(crate) fn share_input(
        &self,
        w: &GpuMatrix,
        x: &GpuBuffer<f32>,
        n: usize,
    ) -> Result<Option<SharedInput>, BackendError> {
        let packed_dot = self.state.borrow().packed_dot;
        let Some(form) = product::fused_form(w.kind, packed_dot) else {
            return Ok(None);
        };
        let spare = self.state.borrow_mut().spare_scratch.take();
        let scratch = match spare {
            Some(s) => s,
            None => Activations::new(&self.state.borrow().gpu, "shared activation")
                .map_err(device_error)?,
        };
        let held = Quantized {
            buffer: x.raw().clone(),
            cols: w.desc.cols,
            n,
            form,
        };
        let mut shared = SharedInput { scratch, held };
        self.with_shared_input(&mut shared, |b| {
            b.record(|st| product::quantize(st, w, x, n));
        });
        Ok(Some(shared))
    }

    /// Runs `f` with `shared`'s scratch in place of the products' and its rows marked as
    /// quantized, so the first product of them reads them as they are (a product of another
    /// input, or of another layout, quantizes as ever).
    pub(crate) fn with_shared_input(&self, shared: &mut SharedInput, f: impl FnOnce(&Self)) {
        {
            let mut st = self.state.borrow_mut();
            std::mem::swap(&mut st.act, &mut shared.scratch);
            st.quantized = Some(shared.held.clone());
        }
        f(self);
        let mut st = self.state.borrow_mut();
        st.quantized = None;
        std::mem::swap(&mut st.act, &mut shared.scratch);
    }

    /// Keeps `shared`'s scratch for the next [`GpuBackend::share_input`].
    pub(crate) fn keep_shared_input(&self, shared: Option<SharedInput>) {
        if let Some(s) = shared {
            self.state.borrow_mut().spare_scratch = Some(s.scratch);
        }
    }
}
