//! A small GGUF (v2/v3) reader over a byte slice.
//!
//! Why our own reader and not `gguf-rs`: that crate truncates metadata arrays (the 128 256-entry
//! tokenizer lists) to a few entries by default and reads type id 36 — bitnet.cpp's I2_S, the
//! type of every projection in the official BitNet b1.58 2B4T file — as a zero-sized type.
//! We also need tensor data as offsets into a memory map (zero copy) and errors that name the
//! broken part of a malformed file instead of panics.
//!
//! [`Gguf::parse`] reads the header, metadata and tensor table and validates every offset and
//! size against the buffer; tensor bytes are then borrowed with [`Gguf::tensor_bytes`].

mod error;
mod reader;
mod types;
mod value;
mod write;

use std::collections::HashMap;

use thiserror::Error;

pub use error::GgufError;
pub use types::{GgmlType, KnownOther};
pub use value::{Array, Value};
pub use write::{header, GgufBuilder, TensorEntry};

use reader::Cursor;

/// Default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Longest tensor name ggml accepts (GGML_MAX_NAME − 1).
pub const MAX_TENSOR_NAME: usize = 63;
/// Most dims a ggml tensor can have.
pub const MAX_DIMS: usize = 4;

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dims, innermost first (`ne[0]` is the row length), always 4 long (missing dims are 1).
    pub ne: [u64; MAX_DIMS],
    /// Number of dims stored in the file.
    pub n_dims: usize,
    /// Element type.
    pub ty: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub start: u64,
    /// Byte size of the data; `None` for a type id hesper-rs cannot size.
    pub nbytes: Option<u64>,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// The stored dims (without the padding ones).
    pub fn dims(&self) -> &[u64] {
        &self.ne[..self.n_dims]
    }
}

/// A parsed GGUF header: metadata and tensor table. Holds no tensor data.
#[derive(Debug, Clone)]
pub struct Gguf {
    /// Container version (2 or 3).
    pub version: u32,
    /// Data alignment in bytes.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: u64,
    metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl Gguf {
    /// Parses and validates the header of a GGUF file held in `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Self, GgufError> {
        Self::parse_prefix(bytes, bytes.len() as u64)
    }

    /// Parses the header from the first bytes of a file of `file_len` bytes (a streamed load
    /// reads the tensors later); tensor ranges are checked against `file_len`. When `prefix`
    /// is shorter than the file, an error for which [`GgufError::may_need_more`] holds may
    /// only mean that the header goes on past it: read more and parse again.
    pub fn parse_prefix(prefix: &[u8], file_len: u64) -> Result<Self, GgufError> {
        let mut c = Cursor::new(prefix);
        let magic: [u8; 4] = c.array(&|| "magic".into())?;
        if &magic != b"GGUF" {
            return Err(GgufError::BadMagic(magic));
        }
        let version = c.u32(&|| "version".into())?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::BadVersion(version));
        }
        let n_tensors = c.u64(&|| "tensor count".into())?;
        let n_kv = c.u64(&|| "metadata count".into())?;
        // A KV record is at least 8 (key length) + 1 (key) + 4 (type) + 1 bytes.
        let n_kv = c.check_count(n_kv, 14, &|| "metadata count".into())?;
        let mut metadata = Vec::with_capacity(n_kv);
        let mut index = HashMap::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = c.string(&|| format!("metadata key #{i}"))?;
            if key.is_empty() {
                return Err(GgufError::BadName {
                    name: key,
                    why: "metadata key is empty",
                });
            }
            let type_id = c.u32(&|| format!("type of metadata {key:?}"))?;
            let value = read_value(&mut c, &key, type_id)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey(key));
            }
            metadata.push((key, value));
        }
        let alignment = match index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
            Some(other) => {
                return Err(GgufError::BadAlignment(format!(
                    "{other} ({})",
                    other.type_name()
                )))
            }
        };
        // A tensor-info record is at least 8 (name length) + 1 (name) + 4 (n_dims) + 4 (type)
        // + 8 (offset) bytes: a scalar (n_dims 0) stores no dims.
        let n_tensors = c.check_count(n_tensors, 25, &|| "tensor count".into())?;
        let mut tensors = Vec::with_capacity(n_tensors);
        let mut tensor_index = HashMap::with_capacity(n_tensors);
        let mut relative = Vec::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let (info, offset) = read_tensor_info(&mut c, i)?;
            if tensor_index
                .insert(info.name.clone(), tensors.len())
                .is_some()
            {
                return Err(GgufError::DuplicateTensor(info.name));
            }
            tensors.push(info);
            relative.push(offset);
        }
        let data_start = c.pos().div_ceil(alignment) * alignment;
        let len = file_len;
        for (info, offset) in tensors.iter_mut().zip(relative) {
            if offset % alignment != 0 {
                return Err(GgufError::Misaligned {
                    name: info.name.clone(),
                    offset,
                    alignment,
                });
            }
            let start = data_start.checked_add(offset);
            let end = start.zip(info.nbytes).and_then(|(s, n)| s.checked_add(n));
            match (start, end) {
                (Some(s), Some(e)) if e <= len => info.start = s,
                (Some(s), None) if info.nbytes.is_none() && s <= len => info.start = s,
                _ => {
                    return Err(GgufError::OutOfBounds {
                        name: info.name.clone(),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        len,
                    })
                }
            }
        }
        Ok(Self {
            version,
            alignment,
            data_start,
            metadata,
            index,
            tensors,
            tensor_index,
        })
    }

    /// The first two tensors whose data ranges overlap, the one starting first first (empty
    /// and unsized tensors take no room). The format allows it (views may alias); a model
    /// whose declared sizes run into each other refuses it ([`crate::model::Model::load`]).
    pub fn first_overlap(&self) -> Option<(&TensorInfo, &TensorInfo)> {
        let mut sized: Vec<&TensorInfo> = self
            .tensors
            .iter()
            .filter(|t| t.nbytes.is_some_and(|n| n > 0))
            .collect();
        sized.sort_unstable_by_key(|t| t.start);
        sized
            .windows(2)
            .find(|w| w[0].start + w[0].nbytes.unwrap_or(0) > w[1].start)
            .map(|w| (w[0], w[1]))
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value stored under `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// An integer value of any width, as u64.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// A float (or integer) value, as f64.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// An array value.
    pub fn get_array(&self, key: &str) -> Option<&Array> {
        match self.get(key)? {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The data of `info` inside `file` (the same bytes that were parsed).
    ///
    /// Fails for a tensor whose type hesper-rs cannot size, naming the tensor and the id, and
    /// for an `info` whose range does not lie in `file` (another buffer, or an edited
    /// [`TensorInfo`]: its fields are public, so `start + nbytes` may even overflow).
    pub fn tensor_bytes<'f>(
        &self,
        file: &'f [u8],
        info: &TensorInfo,
    ) -> Result<&'f [u8], TensorError> {
        let n = info.nbytes.ok_or_else(|| TensorError::UnknownType {
            name: info.name.clone(),
            id: info.ty.id(),
        })?;
        let range = usize::try_from(info.start)
            .ok()
            .zip(usize::try_from(n).ok())
            .and_then(|(start, n)| Some(start..start.checked_add(n)?));
        range
            .and_then(|r| file.get(r))
            .ok_or_else(|| TensorError::NotInBuffer {
                name: info.name.clone(),
            })
    }
}

/// Errors raised when a tensor is used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TensorError {
    /// The tensor's type id is not one hesper-rs knows.
    #[error("tensor {name:?} has ggml type id {id}, which hesper-rs does not support{}", unknown_type_hint(*id))]
    UnknownType {
        /// Tensor name.
        name: String,
        /// Stored id.
        id: u32,
    },
    /// The buffer passed is not the one the header was parsed from.
    #[error("tensor {name:?} lies outside the buffer it was read from")]
    NotInBuffer {
        /// Tensor name.
        name: String,
    },
}

/// What to do about a type id hesper-rs does not know, where something can be said.
fn unknown_type_hint(id: u32) -> &'static str {
    match id {
        38 => " (bitnet.cpp's TL1 lookup-table layout, which belongs to the build that wrote it: convert the model to I2_S, which hesper-rs runs)",
        39 => " (llama.cpp's MXFP4, or bitnet.cpp's TL2 lookup-table layout: convert a BitNet model to I2_S, which hesper-rs runs)",
        _ => "",
    }
}

fn read_value(c: &mut Cursor<'_>, key: &str, type_id: u32) -> Result<Value, GgufError> {
    let what = || format!("value of {key:?}");
    Ok(match type_id {
        0 => Value::U8(c.array::<1>(&what)?[0]),
        1 => Value::I8(c.array::<1>(&what)?[0] as i8),
        2 => Value::U16(u16::from_le_bytes(c.array(&what)?)),
        3 => Value::I16(i16::from_le_bytes(c.array(&what)?)),
        4 => Value::U32(c.u32(&what)?),
        5 => Value::I32(i32::from_le_bytes(c.array(&what)?)),
        6 => Value::F32(f32::from_le_bytes(c.array(&what)?)),
        7 => Value::Bool(c.array::<1>(&what)?[0] != 0),
        8 => Value::String(c.string(&what)?),
        9 => Value::Array(read_array(c, key)?),
        10 => Value::U64(c.u64(&what)?),
        11 => Value::I64(i64::from_le_bytes(c.array(&what)?)),
        12 => Value::F64(f64::from_le_bytes(c.array(&what)?)),
        _ => {
            return Err(GgufError::BadValueType {
                key: key.to_string(),
                type_id,
            })
        }
    })
}

fn read_array(c: &mut Cursor<'_>, key: &str) -> Result<Array, GgufError> {
    let elem = c.u32(&|| format!("array element type of {key:?}"))?;
    let count = c.u64(&|| format!("array length of {key:?}"))?;
    let what = || format!("array {key:?}");
    let size = match elem {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        _ => {
            return Err(GgufError::BadValueType {
                key: key.to_string(),
                type_id: elem,
            })
        }
    };
    let n = c.check_count(count, size, &|| format!("length of array {key:?}"))?;
    macro_rules! fixed {
        ($variant:ident, $t:ty) => {{
            let raw = c.take(n as u64 * size, &what)?;
            Array::$variant(
                raw.chunks_exact(size as usize)
                    .map(|b| <$t>::from_le_bytes(b.try_into().unwrap_or_default()))
                    .collect(),
            )
        }};
    }
    Ok(match elem {
        0 => Array::U8(c.take(n as u64, &what)?.to_vec()),
        1 => Array::I8(c.take(n as u64, &what)?.iter().map(|&b| b as i8).collect()),
        2 => fixed!(U16, u16),
        3 => fixed!(I16, i16),
        4 => fixed!(U32, u32),
        5 => fixed!(I32, i32),
        6 => fixed!(F32, f32),
        7 => Array::Bool(c.take(n as u64, &what)?.iter().map(|&b| b != 0).collect()),
        8 => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(c.string(&|| format!("element {i} of array {key:?}"))?);
            }
            Array::String(v)
        }
        10 => fixed!(U64, u64),
        11 => fixed!(I64, i64),
        _ => fixed!(F64, f64),
    })
}

fn read_tensor_info(c: &mut Cursor<'_>, i: usize) -> Result<(TensorInfo, u64), GgufError> {
    let name = c.string(&|| format!("name of tensor #{i}"))?;
    if name.is_empty() || name.len() > MAX_TENSOR_NAME {
        return Err(GgufError::BadName {
            name,
            why: "tensor names must be 1 to 63 bytes",
        });
    }
    let n_dims = c.u32(&|| format!("dims of tensor {name:?}"))? as usize;
    if n_dims > MAX_DIMS {
        return Err(GgufError::BadShape {
            name,
            dims: vec![n_dims as u64],
        });
    }
    let mut ne = [1u64; MAX_DIMS];
    for d in ne.iter_mut().take(n_dims) {
        *d = c.u64(&|| format!("shape of tensor {name:?}"))?;
    }
    let ty = GgmlType::from_id(c.u32(&|| format!("type of tensor {name:?}"))?);
    let offset = c.u64(&|| format!("offset of tensor {name:?}"))?;
    let elements = ne.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    if ne.contains(&0) || elements.is_none_or(|n| n > i64::MAX as u64) {
        return Err(GgufError::BadShape {
            name,
            dims: ne[..n_dims].to_vec(),
        });
    }
    let nbytes = ty.nbytes(&ne);
    if nbytes.is_none() && !matches!(ty, GgmlType::Unknown(_)) {
        // Rows that fit the block size but a byte size past u64 are a bad shape, not a bad
        // block shape.
        let row_fits = ty
            .block_layout()
            .is_none_or(|(block, _)| ne[0] % block == 0);
        if row_fits && ty != GgmlType::I2S {
            return Err(GgufError::BadShape {
                name,
                dims: ne[..n_dims].to_vec(),
            });
        }
        return Err(GgufError::BadBlockShape {
            name,
            ty: ty.to_string(),
            dims: ne[..n_dims].to_vec(),
        });
    }
    Ok((
        TensorInfo {
            name,
            ne,
            n_dims,
            ty,
            start: 0,
            nbytes,
        },
        offset,
    ))
}

#[cfg(test)]
mod tests;
