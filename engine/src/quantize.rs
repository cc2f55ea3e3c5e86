//! A model written in other weight types (`hesper-rs quantize`): each tensor's type chosen as
//! llama.cpp's `llama-quantize` chooses it without an importance matrix, the tensors in its
//! order and the metadata as it leaves them, so that where both write a type the files are
//! the same bytes.

use std::io::Write;

use thiserror::Error;

use crate::file::ModelFile;
use crate::gguf::{header, GgmlType, TensorEntry, TensorInfo, Value};
use crate::weights::{requantize, Format, MatrixDesc, WeightError};

/// ggml's quantization format version, written with every quantized file.
const QUANTIZATION_VERSION: u32 = 2;

/// A type `quantize` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantType {
    /// f32.
    F32,
    /// f16.
    F16,
    /// bf16.
    BF16,
    /// Q8_0.
    Q8_0,
    /// Q6_K.
    Q6K,
    /// Q5_K (a tensor type: `--tensor-type`).
    Q5K,
    /// Q4_K (a tensor type: `--tensor-type`).
    Q4K,
    /// llama.cpp's Q5_K_M mix: Q5_K, with Q6_K for the LM head and for the value projections
    /// and FFN down projections of the layers `use_more_bits` picks.
    Q5KM,
    /// llama.cpp's Q4_K_M mix: Q4_K, with Q6_K where Q5_K_M has it.
    Q4KM,
    /// TQ2_0: ternary, 2.06 bits per weight, a scale per 256 values.
    TQ2_0,
    /// TQ1_0: ternary, 1.69 bits per weight, a scale per 256 values.
    TQ1_0,
    /// bitnet.cpp's I2_S: ternary, 2 bits per weight, one scale per tensor (from ternary
    /// values only).
    I2S,
}

impl QuantType {
    /// Every type, in the order `--help` names them.
    pub const ALL: [Self; 12] = [
        Self::Q8_0,
        Self::Q6K,
        Self::Q5KM,
        Self::Q4KM,
        Self::Q5K,
        Self::Q4K,
        Self::TQ2_0,
        Self::TQ1_0,
        Self::I2S,
        Self::F16,
        Self::BF16,
        Self::F32,
    ];

    /// Its name as llama-quantize spells it (any case is read).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q8_0 => "Q8_0",
            Self::Q6K => "Q6_K",
            Self::Q5K => "Q5_K",
            Self::Q4K => "Q4_K",
            Self::Q5KM => "Q5_K_M",
            Self::Q4KM => "Q4_K_M",
            Self::TQ2_0 => "TQ2_0",
            Self::TQ1_0 => "TQ1_0",
            Self::I2S => "I2_S",
        }
    }

    /// The type a name gives.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// The type a file's `TYPE` names: as [`QuantType::from_name`], with llama-quantize's
    /// aliases (`Q4_K` is `Q4_K_M`, `Q5_K` is `Q5_K_M`).
    pub fn for_file(name: &str) -> Option<Self> {
        match Self::from_name(name)? {
            Self::Q4K => Some(Self::Q4KM),
            Self::Q5K => Some(Self::Q5KM),
            t => Some(t),
        }
    }

    /// Whether this is a mix of tensor types (a file type, not a tensor's).
    pub fn is_mix(self) -> bool {
        matches!(self, Self::Q4KM | Self::Q5KM)
    }

    /// The tensor type of most of a mix's matrices (the type itself otherwise).
    fn base(self) -> Self {
        match self {
            Self::Q4KM => Self::Q4K,
            Self::Q5KM => Self::Q5K,
            t => t,
        }
    }

    /// Whether the type is quantized (llama.cpp chooses per tensor only then).
    fn is_quantized(self) -> bool {
        !matches!(self, Self::F32 | Self::F16 | Self::BF16)
    }

    fn ggml(self) -> GgmlType {
        match self {
            Self::F32 => GgmlType::F32,
            Self::F16 => GgmlType::F16,
            Self::BF16 => GgmlType::BF16,
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q6K => GgmlType::Q6K,
            Self::Q5K | Self::Q5KM => GgmlType::Q5K,
            Self::Q4K | Self::Q4KM => GgmlType::Q4K,
            Self::TQ2_0 => GgmlType::TQ2_0,
            Self::TQ1_0 => GgmlType::TQ1_0,
            Self::I2S => GgmlType::I2S,
        }
    }

    fn format(self) -> Format {
        match self {
            Self::F32 => Format::F32,
            Self::F16 => Format::F16,
            Self::BF16 => Format::BF16,
            Self::Q8_0 => Format::Q8_0,
            Self::Q6K => Format::Q6K,
            Self::Q5K | Self::Q5KM => Format::Q5K,
            Self::Q4K | Self::Q4KM => Format::Q4K,
            Self::TQ2_0 => Format::TQ2_0,
            Self::TQ1_0 => Format::TQ1_0,
            // β is found in the values.
            Self::I2S => Format::I2S { beta: 0.0 },
        }
    }

    /// Values per block.
    fn block(self) -> u64 {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q8_0 => 32,
            Self::Q6K | Self::TQ2_0 | Self::TQ1_0 => 256,
            Self::Q5K | Self::Q4K | Self::Q5KM | Self::Q4KM => 256,
            Self::I2S => 128,
        }
    }

    /// llama.cpp's `general.file_type` for a file mostly of this type.
    fn file_type(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q8_0 => 7,
            Self::Q6K => 18,
            Self::BF16 => 32,
            Self::Q4K | Self::Q4KM => 15,
            Self::Q5K | Self::Q5KM => 17,
            Self::TQ1_0 => 36,
            Self::TQ2_0 => 37,
            // bitnet.cpp's number.
            Self::I2S => 40,
        }
    }

    /// llama.cpp's fallback where rows are not whole blocks of this type (for the ternary
    /// types llama.cpp writes Q4_0, for Q4_K Q5_0 and for Q5_K Q5_1, which hesper-rs does not
    /// encode: Q8_0 here).
    fn fallback(self) -> Self {
        match self {
            Self::F32 | Self::F16 | Self::BF16 | Self::Q8_0 => Self::F16,
            _ => Self::Q8_0,
        }
    }

    /// Whether the type holds ternary values.
    fn is_ternary(self) -> bool {
        matches!(self, Self::TQ2_0 | Self::TQ1_0 | Self::I2S)
    }
}

/// What becomes of one tensor.
#[derive(Debug, Clone)]
pub struct TensorPlan {
    /// The tensor as the input holds it.
    pub info: TensorInfo,
    /// Its new type; `None` keeps it as it is.
    pub to: Option<QuantType>,
    /// Why it got another type than asked, when it did.
    pub note: Option<String>,
}

/// What a conversion cannot do.
#[derive(Debug, Error)]
pub enum QuantizeError {
    /// A tensor cannot be read as a matrix of its type.
    #[error("{0}")]
    Weight(#[from] WeightError),
    /// Writing failed.
    #[error("cannot write the output: {0}")]
    Io(#[from] std::io::Error),
    /// A tensor's type has no size.
    #[error("tensor {0:?} has a type hesper-rs cannot size")]
    Unsized(String),
}

/// Whether llama-quantize converts the tensor `info`: a weight matrix, not a norm, a MoE
/// router, a position or token-type embedding.
fn is_quantizable(info: &TensorInfo) -> bool {
    let n = info.name.as_str();
    n.ends_with("weight")
        && info.n_dims >= 2
        && !n.contains("_norm.weight")
        && !n.contains("ffn_gate_inp.weight")
        && n != "position_embd.weight"
        && n != "token_types.weight"
}

/// Whether a `--tensor-type` pattern names `name`: `*` matches any run of characters;
/// without one, the pattern matches anywhere in the name (as llama-quantize's regex search
/// of a plain word does).
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    if !pattern.contains('*') {
        return name.contains(pattern);
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// llama.cpp's tensor order: the tensors outside the layers first, then layer by layer, each
/// group by name.
fn order_key(name: &str) -> (i64, &str) {
    let layer = name
        .strip_prefix("blk.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|n| n.parse::<i64>().ok())
        .unwrap_or(-1);
    (layer, name)
}

/// Each tensor of `tensors` with its new type: `default` for every weight matrix, or the type
/// of the last `overrides` pattern that names it, and llama.cpp's fallback where the rows are
/// not whole blocks of it. In llama.cpp's order.
pub fn plan(
    tensors: &[TensorInfo],
    default: QuantType,
    overrides: &[(String, QuantType)],
) -> Vec<TensorPlan> {
    let mut sorted: Vec<&TensorInfo> = tensors.iter().collect();
    sorted.sort_by(|a, b| order_key(&a.name).cmp(&order_key(&b.name)));
    let mut mix = Mix::new(tensors);
    sorted
        .into_iter()
        .map(|info| {
            let keep = |note: Option<String>| TensorPlan {
                info: info.clone(),
                to: None,
                note,
            };
            if !is_quantizable(info) {
                return keep(None);
            }
            let named = overrides
                .iter()
                .rev()
                .find(|(p, _)| pattern_matches(p, &info.name))
                .map(|(_, t)| *t);
            // Ternary files keep their embedding and LM head in wider types (bitnet.cpp's
            // and llama.cpp's alike): a ternary default leaves them unless a pattern names them.
            let outer = ["token_embd.weight", "output.weight"].contains(&info.name.as_str());
            if named.is_none() && default.is_ternary() && outer {
                return keep(Some(format!(
                    "kept as {}: {} is for the layers' matrices (--tensor-type names it to convert it)",
                    info.ty,
                    default.name()
                )));
            }
            let mut to = named.unwrap_or_else(|| mix.type_of(info, default));
            let mut note = None;
            while !info.ne[0].is_multiple_of(to.block()) {
                let next = to.fallback();
                note = Some(format!(
                    "rows of {} values are not whole {} blocks: {} instead",
                    info.ne[0],
                    to.name(),
                    next.name()
                ));
                to = next;
            }
            TensorPlan {
                info: info.clone(),
                to: (to.ggml() != info.ty).then_some(to),
                note,
            }
        })
        .collect()
}

/// llama.cpp's choice of a tensor's type from the file's (`llama_tensor_get_type` for the
/// dense families hesper-rs runs): the LM head (or a tied embedding) in Q6_K unless the type is
/// Q8_0; in a K-quant mix, Q6_K for the value and FFN down projections of the layers
/// `use_more_bits` picks, counted in llama.cpp's order.
struct Mix {
    /// No `output.weight`: the embedding is the LM head.
    tied: bool,
    /// Value projections, and those seen so far.
    attn_v: (usize, usize),
    /// FFN down projections, and those seen so far.
    ffn_down: (usize, usize),
}

impl Mix {
    fn new(tensors: &[TensorInfo]) -> Self {
        let attn_v = tensors
            .iter()
            .filter(|t| t.name.contains("attn_v.weight"))
            .count();
        // llama.cpp counts the layers for the down projections.
        let n_layer = tensors
            .iter()
            .filter_map(|t| order_key(&t.name).0.checked_add(1))
            .max()
            .unwrap_or(0)
            .max(0) as usize;
        Self {
            tied: !tensors.iter().any(|t| t.name == "output.weight"),
            attn_v: (attn_v, 0),
            ffn_down: (n_layer, 0),
        }
    }

    fn type_of(&mut self, info: &TensorInfo, file: QuantType) -> QuantType {
        let base = file.base();
        let head = info.name == "output.weight" || (self.tied && info.name == "token_embd.weight");
        if !file.is_quantized() {
            return base;
        }
        if head {
            return match base {
                _ if !info.ne[0].is_multiple_of(base.block()) => QuantType::Q8_0,
                QuantType::Q8_0 => QuantType::Q8_0,
                _ => QuantType::Q6K,
            };
        }
        let counter = match () {
            _ if info.name.contains("attn_v.weight") => &mut self.attn_v,
            _ if info.name.contains("ffn_down") => &mut self.ffn_down,
            _ => return base,
        };
        let (n, i) = *counter;
        counter.1 += 1;
        if file.is_mix() && use_more_bits(i, n) {
            QuantType::Q6K
        } else {
            base
        }
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third
/// between.
fn use_more_bits(i: usize, n: usize) -> bool {
    let (i, n) = (i as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The input's metadata as llama-quantize leaves it: every entry but the split keys, then
/// `general.quantization_version` and `general.file_type` (moved to the end).
pub fn metadata(input: &[(String, Value)], default: QuantType) -> Vec<(String, Value)> {
    let moved = ["general.quantization_version", "general.file_type"];
    let mut out: Vec<(String, Value)> = input
        .iter()
        .filter(|(k, _)| !moved.contains(&k.as_str()) && !k.starts_with("split."))
        .cloned()
        .collect();
    out.push((moved[0].into(), Value::U32(QUANTIZATION_VERSION)));
    out.push((moved[1].into(), Value::U32(default.file_type())));
    out
}

/// Writes `file` with each tensor as `plans` says (from [`plan`]) and `default`'s file type;
/// `on_tensor(done, total)` after each. Returns the bytes written.
pub fn write(
    file: &ModelFile,
    plans: &[TensorPlan],
    default: QuantType,
    out: &mut impl Write,
    on_tensor: &mut dyn FnMut(usize, usize),
) -> Result<u64, QuantizeError> {
    let g = file.header();
    let align = g.alignment as usize;
    let entries = plans
        .iter()
        .map(|p| {
            let ty = p.to.map_or(p.info.ty, QuantType::ggml);
            let nbytes = ty
                .nbytes(&p.info.ne[..p.info.n_dims])
                .ok_or_else(|| QuantizeError::Unsized(p.info.name.clone()))?;
            Ok(TensorEntry {
                name: p.info.name.clone(),
                ne: p.info.ne[..p.info.n_dims].to_vec(),
                type_id: ty.id(),
                nbytes,
            })
        })
        .collect::<Result<Vec<_>, QuantizeError>>()?;
    let head = header(&metadata(g.metadata(), default), &entries, align);
    out.write_all(&head)?;
    let mut written = head.len() as u64;
    for (i, (p, entry)) in plans.iter().zip(&entries).enumerate() {
        let data = file.tensor_bytes(&p.info).map_err(WeightError::from)?;
        let converted;
        let bytes: &[u8] = match p.to {
            None => data,
            Some(to) => {
                let cols = p.info.ne[0] as usize;
                let rows = (p.info.n_elements() / p.info.ne[0].max(1)) as usize;
                let desc = MatrixDesc::new(&p.info, file.bytes(), rows, cols)?;
                let (desc, mut data) = requantize(&desc, file.bytes(), to.format())?;
                if let Format::I2S { beta } = desc.format {
                    // bitnet.cpp's tail: β, then padding to 32 bytes.
                    data.extend(beta.to_le_bytes());
                    data.resize(data.len() + 28, 0);
                }
                converted = data;
                &converted
            }
        };
        debug_assert_eq!(bytes.len() as u64, entry.nbytes);
        out.write_all(bytes)?;
        let padded = bytes.len().div_ceil(align) * align;
        out.write_all(&vec![0u8; padded - bytes.len()])?;
        written += padded as u64;
        on_tensor(i + 1, plans.len());
    }
    out.flush()?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_llama_quantize_reads_them() {
        assert!(pattern_matches("attn_v", "blk.3.attn_v.weight"));
        assert!(!pattern_matches("attn_v", "blk.3.attn_q.weight"));
        assert!(pattern_matches(
            "blk.*.ffn_down.weight",
            "blk.12.ffn_down.weight"
        ));
        assert!(!pattern_matches(
            "blk.*.ffn_down.weight",
            "blk.12.ffn_up.weight"
        ));
        assert!(pattern_matches("*", "output.weight"));
        assert!(pattern_matches("blk.1*", "blk.10.attn_k.weight"));
    }

    #[test]
    fn llama_cpp_orders_the_tensors_outside_the_layers_first() {
        let mut names = [
            "blk.10.a",
            "blk.2.b",
            "token_embd.weight",
            "blk.2.a",
            "output.weight",
        ];
        names.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
        assert_eq!(
            names,
            [
                "output.weight",
                "token_embd.weight",
                "blk.2.a",
                "blk.2.b",
                "blk.10.a"
            ]
        );
    }

    #[test]
    fn the_file_type_and_version_move_to_the_end() {
        let input = vec![
            (
                "general.architecture".to_string(),
                Value::String("llama".into()),
            ),
            ("general.file_type".to_string(), Value::U32(1)),
            ("split.count".to_string(), Value::U16(1)),
            (
                "tokenizer.ggml.model".to_string(),
                Value::String("none".into()),
            ),
        ];
        let keys: Vec<String> = metadata(&input, QuantType::Q6K)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            keys,
            [
                "general.architecture",
                "tokenizer.ggml.model",
                "general.quantization_version",
                "general.file_type"
            ]
        );
    }
}
