//! hesper-engine: the parts of hesper-rs every backend shares.
//!
//! * [`gguf`]: our GGUF reader (why not `gguf-rs`: see the module docs) and [`file`], a
//!   memory-mapped model file; [`source`]: a file read tensor by tensor (a streamed load);
//! * [`weights`]: typed views of tensor data; [`formats`]: every weight layout, one file each,
//!   with its reference decoder;
//! * [`config`]: the model hyper-parameters and the architecture's family read from metadata;
//! * [`backend`] and [`model`]: the forward pass of every family, written once over a backend trait;
//!   [`attention`]: the KV cache's element type and the sparse attention pattern;
//!   [`memory`]: a session sized and checked before anything is allocated;
//! * [`tokenizer`], [`sampler`], [`chat`]: text in, tokens out.

pub mod attention;
pub mod backend;
pub mod chat;
pub mod config;
pub mod file;
pub mod formats;
pub mod gguf;
pub mod memory;
pub mod model;
pub mod quantize;
pub mod sampler;
pub mod source;
pub mod tokenizer;
pub mod weights;
