//! Reading a buffer back without blocking: the copy rides in the step's own submit, and the
//! mapping is awaited. Natively the future first waits on the device (so awaiting it costs what
//! a blocking read did); in a browser it resolves when the page's event loop delivers the map
//! callback, so nothing ever blocks the thread.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::context::GpuError;
#[cfg(not(target_arch = "wasm32"))]
use crate::context::HostTimes;

/// The outcome of `map_async`, and who waits for it.
#[derive(Default)]
struct MapState {
    result: Option<Result<(), String>>,
    waker: Option<Waker>,
}

/// A read-back that was submitted; [`PendingRead::wait`] delivers its elements.
#[must_use = "a pending read holds the read-back buffer mapped until it is waited for"]
pub struct PendingRead<T> {
    /// Polled natively to run the map callback (a browser's event loop runs it).
    #[cfg(not(target_arch = "wasm32"))]
    device: wgpu::Device,
    staging: wgpu::Buffer,
    size: u64,
    len: usize,
    state: Arc<Mutex<MapState>>,
    errors: Arc<Mutex<Option<String>>>,
    /// Host nanoseconds spent waiting for read-backs ([`crate::Gpu::host_times`]; native).
    #[cfg(not(target_arch = "wasm32"))]
    wait_ns: Arc<AtomicU64>,
    _elements: PhantomData<T>,
}

impl<T: bytemuck::Pod> PendingRead<T> {
    /// Asks for `staging[..size]` to be mapped (the copy into it was submitted already).
    pub(crate) fn start(
        device: &wgpu::Device,
        staging: wgpu::Buffer,
        size: u64,
        len: usize,
        errors: Arc<Mutex<Option<String>>>,
        wait_ns: Arc<AtomicU64>,
    ) -> Self {
        let state = Arc::new(Mutex::new(MapState::default()));
        let slot = state.clone();
        staging
            .slice(..size.max(4))
            .map_async(wgpu::MapMode::Read, move |r| {
                let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
                s.result = Some(r.map_err(|e| e.to_string()));
                if let Some(w) = s.waker.take() {
                    w.wake();
                }
            });
        #[cfg(target_arch = "wasm32")]
        let _ = (device, wait_ns);
        Self {
            #[cfg(not(target_arch = "wasm32"))]
            device: device.clone(),
            staging,
            size,
            len,
            state,
            errors,
            #[cfg(not(target_arch = "wasm32"))]
            wait_ns,
            _elements: PhantomData,
        }
    }

    /// The elements, once the GPU has produced them.
    pub async fn wait(self) -> Result<Vec<T>, GpuError> {
        // Natively the map callback runs inside a device poll: wait for the submission here.
        // In a browser the event loop runs it; `poll` would be a no-op there.
        #[cfg(not(target_arch = "wasm32"))]
        HostTimes::time(&self.wait_ns, || {
            self.device.poll(wgpu::PollType::wait_indefinitely())
        })
        .map_err(|e| GpuError::Readback(e.to_string()))?;
        let mapped = Mapped(&self.state).await;
        // A device error explains a failed mapping better than the mapping's own message.
        if let Some(e) = self.errors.lock().unwrap_or_else(|p| p.into_inner()).take() {
            if mapped.is_ok() {
                self.staging.unmap();
            }
            return Err(GpuError::Reported(e));
        }
        mapped.map_err(GpuError::Readback)?;
        let slice = self.staging.slice(..self.size.max(4));
        let out = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| GpuError::Readback(e.to_string()))?;
            let all: &[T] = bytemuck::cast_slice(&view);
            all[..self.len].to_vec()
        };
        self.staging.unmap();
        Ok(out)
    }
}

/// Resolves when the map callback has reported.
struct Mapped<'a>(&'a Mutex<MapState>);

impl Future for Mapped<'_> {
    type Output = Result<(), String>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match s.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
