//! Typed storage buffers.

use std::marker::PhantomData;

/// A storage buffer of `len` elements of `T` on the device, or a view of `len` elements of
/// one ([`crate::Gpu::view`]). Kernel arguments take `&GpuBuffer<T>` for inputs and
/// `&mut GpuBuffer<T>` for outputs, so the element type must match the kernel's and one buffer
/// cannot be bound as both input and output.
pub struct GpuBuffer<T> {
    raw: wgpu::Buffer,
    /// Where its elements start in `raw`, in bytes (0 but for a view).
    offset: u64,
    /// Whether it is a view (its binding covers its own bytes, not the whole buffer).
    view: bool,
    len: usize,
    _elem: PhantomData<T>,
}

/// The bytes of a buffer one binding of a kernel covers.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Bound {
    /// The wgpu buffer.
    pub buffer: wgpu::Buffer,
    /// Where the binding starts, in bytes.
    pub offset: u64,
    /// Its bytes, or `None` for the whole buffer.
    pub size: Option<u64>,
}

impl<T: bytemuck::Pod> GpuBuffer<T> {
    pub(crate) fn new(raw: wgpu::Buffer, len: usize) -> Self {
        Self::at(raw, 0, false, len)
    }

    fn at(raw: wgpu::Buffer, offset: u64, view: bool, len: usize) -> Self {
        Self {
            raw,
            offset,
            view,
            len,
            _elem: PhantomData,
        }
    }

    /// `len` elements from element `at` on, as a buffer of their own sharing these bytes (the
    /// caller checks the device's offset alignment: [`crate::Gpu::view`]).
    pub(crate) fn view(&self, at: usize, len: usize) -> Self {
        let offset = self.offset + (at * std::mem::size_of::<T>()) as u64;
        Self::at(self.raw.clone(), offset, true, len)
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
        GpuBuffer::at(self.raw, self.offset, self.view, self.len)
    }

    /// Runs `f` on the same bytes as elements of another 4-byte type while `self` is borrowed
    /// (a kernel whose one output is floats or packed words, as its caller asks).
    pub fn as_elements_mut<U: bytemuck::Pod, R>(
        &mut self,
        f: impl FnOnce(&mut GpuBuffer<U>) -> R,
    ) -> R {
        const { assert!(std::mem::size_of::<T>() == std::mem::size_of::<U>()) };
        f(&mut GpuBuffer::at(
            self.raw.clone(),
            self.offset,
            self.view,
            self.len,
        ))
    }

    /// Runs `f` on the same bytes as elements of another 4-byte type, read-only, while `self`
    /// is borrowed (one buffer bound twice as inputs of one kernel: packed words and, past
    /// them, their f32 scales).
    pub fn as_elements<U: bytemuck::Pod, R>(&self, f: impl FnOnce(&GpuBuffer<U>) -> R) -> R {
        const { assert!(std::mem::size_of::<T>() == std::mem::size_of::<U>()) };
        f(&GpuBuffer::at(
            self.raw.clone(),
            self.offset,
            self.view,
            self.len,
        ))
    }

    /// The wgpu buffer (for bindings and copies; a view's elements start at
    /// [`GpuBuffer::offset`] in it).
    pub fn raw(&self) -> &wgpu::Buffer {
        &self.raw
    }

    /// Where its elements start in [`GpuBuffer::raw`], in bytes (0 but for a view).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// What a kernel's binding of it covers: the whole wgpu buffer, or a view's bytes.
    pub fn bound(&self) -> Bound {
        Bound {
            buffer: self.raw.clone(),
            offset: self.offset,
            size: self.view.then(|| self.bytes()),
        }
    }
}
