//! Fuzzes the GGUF reader: any bytes must give `Ok` or `Err`, never a panic or a huge
//! allocation, and an accepted header only describes tensor data inside the buffer.
#![no_main]

use hesper_engine::gguf::Gguf;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = Gguf::parse(data) {
        for t in g.tensors() {
            if let Ok(bytes) = g.tensor_bytes(data, t) {
                assert_eq!(Some(bytes.len() as u64), t.nbytes);
            }
        }
    }
});
