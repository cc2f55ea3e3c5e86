//! A model file in a browser `Blob` (a picked `File`, or one kept in the Origin Private File
//! System), read a slice at a time: the page never holds the whole file in wasm memory.

use hesper_engine::source::{ReadError, TensorSource};
use js_sys::{Function, Uint8Array};
use wasm_bindgen::JsValue;
use wasm_bindgen_futures::JsFuture;
use web_sys::Blob;

/// A `Blob` read slice by slice, reporting the bytes read so far.
pub struct BlobSource {
    blob: Blob,
    name: String,
    /// Bytes read so far (the header's reads count too; capped at the size).
    read: u64,
    progress: Function,
}

impl BlobSource {
    /// Reads `blob`, calling `progress(bytes_read, bytes_total)` after each read.
    pub fn new(blob: Blob, name: String, progress: Function) -> Self {
        Self {
            blob,
            name,
            read: 0,
            progress,
        }
    }

    /// Tells the page that `done` of the file's bytes are in.
    pub fn report(&self, done: u64) {
        // A failing progress callback must not stop the load.
        let _ = self.progress.call2(
            &JsValue::NULL,
            &JsValue::from_f64(done as f64),
            &JsValue::from_f64(self.blob.size()),
        );
    }
}

/// The message a JavaScript error carries.
pub fn js_message(e: &JsValue) -> String {
    e.as_string()
        .or_else(|| js_sys::Error::from(e.clone()).message().as_string())
        .unwrap_or_else(|| format!("{e:?}"))
}

impl TensorSource for BlobSource {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn len(&self) -> u64 {
        self.blob.size() as u64
    }

    async fn read(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, ReadError> {
        let fail = |e: JsValue| ReadError {
            source_name: self.name.clone(),
            offset,
            len,
            why: js_message(&e),
        };
        let end = offset + len as u64;
        let slice = self
            .blob
            .slice_with_f64_and_f64(offset as f64, end as f64)
            .map_err(fail)?;
        let buffer = JsFuture::from(slice.array_buffer()).await.map_err(fail)?;
        let bytes = Uint8Array::new(&buffer);
        if bytes.length() as usize != len {
            return Err(ReadError {
                source_name: self.name.clone(),
                offset,
                len,
                why: format!("the file gave {} bytes (was it changed?)", bytes.length()),
            });
        }
        self.read = (self.read + len as u64).min(self.len());
        self.report(self.read);
        Ok(bytes.to_vec())
    }
}
