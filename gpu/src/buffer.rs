//! Typed storage buffers.

use std::marker::PhantomData;

/// A storage buffer of `len` elements of `T` on the device. Kernel arguments take
/// `&GpuBuffer<T>` for inputs and `&mut GpuBuffer<T>` for outputs, so the element type must
/// match the kernel's and one buffer cannot be bound as both input and output.
pub struct GpuBuffer<T> {
    raw: wgpu::Buffer,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T: bytemuck::Pod> GpuBuffer<T> {
    pub(crate) fn new(raw: wgpu::Buffer, len: usize) -> Self {
        Self {
            raw,
            len,
            _elem: PhantomData,
        }
    }

    /// Elements it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> u64 {
        (self.len * std::mem::size_of::<T>()) as u64
    }

    /// The same bytes as elements of another 4-byte type (f32 scales moved by a `u32` kernel).
    pub fn into_elements<U: bytemuck::Pod>(self) -> GpuBuffer<U> {
        const { assert!(std::mem::size_of::<T>() == std::mem::size_of::<U>()) };
        GpuBuffer::new(self.raw, self.len)
    }

    /// Runs `f` on the same bytes as elements of another 4-byte type while `self` is borrowed
    /// (a kernel whose one output is floats or packed words, as its caller asks).
    pub fn as_elements_mut<U: bytemuck::Pod, R>(
        &mut self,
        f: impl FnOnce(&mut GpuBuffer<U>) -> R,
    ) -> R {
        const { assert!(std::mem::size_of::<T>() == std::mem::size_of::<U>()) };
        f(&mut GpuBuffer::new(self.raw.clone(), self.len))
    }

    /// Runs `f` on the same bytes as elements of another 4-byte type, read-only, while `self`
    /// is borrowed (one buffer bound twice as inputs of one kernel: packed words and, past
    /// them, their f32 scales).
    pub fn as_elements<U: bytemuck::Pod, R>(&self, f: impl FnOnce(&GpuBuffer<U>) -> R) -> R {
        const { assert!(std::mem::size_of::<T>() == std::mem::size_of::<U>()) };
        f(&GpuBuffer::new(self.raw.clone(), self.len))
    }

    /// The wgpu buffer (for bindings and copies).
    pub fn raw(&self) -> &wgpu::Buffer {
        &self.raw
    }
}
