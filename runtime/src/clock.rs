//! Milliseconds for timing statistics: `Instant` natively; the page's clock in a browser,
//! where `std::time::Instant` is not available.

/// A point in time, in milliseconds from an arbitrary origin.
#[cfg(not(target_arch = "wasm32"))]
pub fn now_ms() -> f64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3
}

/// A point in time, in milliseconds from an arbitrary origin.
#[cfg(target_arch = "wasm32")]
pub fn now_ms() -> f64 {
    js_sys::Date::now()
}
