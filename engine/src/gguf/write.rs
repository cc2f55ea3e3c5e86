//! A minimal GGUF writer: test models and corrupt files in tests, and `hesper-rs quantize`'s
//! header.

use super::{Array, Value, DEFAULT_ALIGNMENT};

/// Builds a GGUF v3 file in memory: metadata, then tensors laid out in order, each padded to
/// the alignment as ggml requires.
#[derive(Debug, Default, Clone)]
pub struct GgufBuilder {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

impl GgufBuilder {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata entry.
    pub fn kv(mut self, key: &str, value: Value) -> Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor with dims `ne` (innermost first), a raw type id and its bytes.
    pub fn tensor(mut self, name: &str, ne: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors
            .push((name.to_string(), ne.to_vec(), type_id, data));
        self
    }

    /// Adds an F32 tensor.
    pub fn f32_tensor(self, name: &str, ne: &[u64], data: &[f32]) -> Self {
        let bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, ne, 0, bytes)
    }

    /// Serialises the file.
    pub fn build(&self) -> Vec<u8> {
        let align = DEFAULT_ALIGNMENT as usize;
        let entries: Vec<TensorEntry> = self
            .tensors
            .iter()
            .map(|(name, ne, ty, data)| TensorEntry {
                name: name.clone(),
                ne: ne.clone(),
                type_id: *ty,
                nbytes: data.len() as u64,
            })
            .collect();
        let mut out = header(&self.metadata, &entries, align);
        for (_, _, _, data) in &self.tensors {
            out.extend(data);
            out.resize(out.len().div_ceil(align) * align, 0);
        }
        out
    }
}

/// One tensor's entry in a file's tensor table.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    /// Its name.
    pub name: String,
    /// Its dims, innermost first.
    pub ne: Vec<u64>,
    /// Its ggml type id.
    pub type_id: u32,
    /// Bytes of its data.
    pub nbytes: u64,
}

/// A GGUF v3 file's header — magic, counts, metadata, tensor table — padded to `align`: the
/// tensors' data follows, each padded to `align` as ggml requires.
pub fn header(metadata: &[(String, Value)], tensors: &[TensorEntry], align: usize) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_str(&mut out, key);
        put_value(&mut out, value, true);
    }
    let mut offset = 0u64;
    for t in tensors {
        put_str(&mut out, &t.name);
        out.extend((t.ne.len() as u32).to_le_bytes());
        for d in &t.ne {
            out.extend(d.to_le_bytes());
        }
        out.extend(t.type_id.to_le_bytes());
        out.extend(offset.to_le_bytes());
        offset += t.nbytes.div_ceil(align as u64) * align as u64;
    }
    out.resize(out.len().div_ceil(align) * align, 0);
    out
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value, with_type: bool) {
    if with_type {
        out.extend(type_id(v).to_le_bytes());
    }
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
        Value::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    let items: Vec<Value> = match a {
        Array::U8(v) => v.iter().map(|&x| Value::U8(x)).collect(),
        Array::I8(v) => v.iter().map(|&x| Value::I8(x)).collect(),
        Array::U16(v) => v.iter().map(|&x| Value::U16(x)).collect(),
        Array::I16(v) => v.iter().map(|&x| Value::I16(x)).collect(),
        Array::U32(v) => v.iter().map(|&x| Value::U32(x)).collect(),
        Array::I32(v) => v.iter().map(|&x| Value::I32(x)).collect(),
        Array::F32(v) => v.iter().map(|&x| Value::F32(x)).collect(),
        Array::Bool(v) => v.iter().map(|&x| Value::Bool(x)).collect(),
        Array::String(v) => v.iter().map(|x| Value::String(x.clone())).collect(),
        Array::U64(v) => v.iter().map(|&x| Value::U64(x)).collect(),
        Array::I64(v) => v.iter().map(|&x| Value::I64(x)).collect(),
        Array::F64(v) => v.iter().map(|&x| Value::F64(x)).collect(),
    };
    let elem = match a {
        Array::U8(_) => 0u32,
        Array::I8(_) => 1,
        Array::U16(_) => 2,
        Array::I16(_) => 3,
        Array::U32(_) => 4,
        Array::I32(_) => 5,
        Array::F32(_) => 6,
        Array::Bool(_) => 7,
        Array::String(_) => 8,
        Array::U64(_) => 10,
        Array::I64(_) => 11,
        Array::F64(_) => 12,
    };
    out.extend(elem.to_le_bytes());
    out.extend((items.len() as u64).to_le_bytes());
    for item in &items {
        put_value(out, item, false);
    }
}
