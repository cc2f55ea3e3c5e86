//! GGML tensor type ids and their storage sizes.

use std::fmt;

/// A GGML tensor element type as stored in a GGUF tensor-info record.
///
/// Ids that hesper-rs does not know are kept as [`GgmlType::Unknown`]: the file still parses,
/// and only using such a tensor fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the upper half of an f32).
    BF16,
    /// 32-element blocks: f16 scale + 32 × i8.
    Q8_0,
    /// 32-element blocks: f16 scale + 32 four-bit values.
    Q4_0,
    /// 256-element k-quant blocks of 4-bit values with eight 6-bit sub-block scales and
    /// minimums.
    Q4K,
    /// Q4_K with a fifth bit per value.
    Q5K,
    /// 256-element k-quant blocks of 6-bit values with 16 int8 sub-block scales.
    Q6K,
    /// 256-element ternary blocks, 5 trits per byte (1.6875 bits per weight).
    TQ1_0,
    /// 256-element ternary blocks, 2-bit codes LSB-first, f16 scale at the end.
    TQ2_0,
    /// bitnet.cpp's I2_S (id 36 in its files): 2-bit codes in 128-element groups, MSB-first,
    /// one f32 scale per tensor right after the codes, `nbytes = n/4 + 32`.
    I2S,
    /// OCP microscaling FP4 (id 39, gpt-oss's experts): 32-element blocks of an E8M0 exponent
    /// byte and 32 four-bit E2M1 values.
    MXFP4,
    /// A known ggml type that hesper-rs can size but does not compute with.
    Other(KnownOther),
    /// An id hesper-rs does not know at all.
    Unknown(u32),
}

/// Known ggml types that are sized (so files holding them parse) but not computed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KnownOther {
    id: u32,
    name: &'static str,
    block: u64,
    block_bytes: u64,
}

const OTHERS: &[KnownOther] = &[
    KnownOther {
        id: 3,
        name: "Q4_1",
        block: 32,
        block_bytes: 20,
    },
    KnownOther {
        id: 6,
        name: "Q5_0",
        block: 32,
        block_bytes: 22,
    },
    KnownOther {
        id: 7,
        name: "Q5_1",
        block: 32,
        block_bytes: 24,
    },
    KnownOther {
        id: 9,
        name: "Q8_1",
        block: 32,
        block_bytes: 36,
    },
    KnownOther {
        id: 10,
        name: "Q2_K",
        block: 256,
        block_bytes: 84,
    },
    KnownOther {
        id: 11,
        name: "Q3_K",
        block: 256,
        block_bytes: 110,
    },
    KnownOther {
        id: 15,
        name: "Q8_K",
        block: 256,
        block_bytes: 292,
    },
    KnownOther {
        id: 24,
        name: "I8",
        block: 1,
        block_bytes: 1,
    },
    KnownOther {
        id: 25,
        name: "I16",
        block: 1,
        block_bytes: 2,
    },
    KnownOther {
        id: 26,
        name: "I32",
        block: 1,
        block_bytes: 4,
    },
    KnownOther {
        id: 27,
        name: "I64",
        block: 1,
        block_bytes: 8,
    },
    KnownOther {
        id: 28,
        name: "F64",
        block: 1,
        block_bytes: 8,
    },
];

impl GgmlType {
    /// Maps a stored type id to a type; never fails.
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::BF16,
            34 => Self::TQ1_0,
            35 => Self::TQ2_0,
            36 => Self::I2S,
            39 => Self::MXFP4,
            _ => OTHERS
                .iter()
                .find(|o| o.id == id)
                .map_or(Self::Unknown(id), |o| Self::Other(*o)),
        }
    }

    /// The numeric id stored in the file.
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q8_0 => 8,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::BF16 => 30,
            Self::TQ1_0 => 34,
            Self::TQ2_0 => 35,
            Self::I2S => 36,
            Self::MXFP4 => 39,
            Self::Other(o) => o.id,
            Self::Unknown(id) => id,
        }
    }

    /// Elements per block and bytes per block, for block-structured types.
    /// `None` for I2_S (sized per tensor) and unknown ids.
    pub fn block_layout(self) -> Option<(u64, u64)> {
        match self {
            Self::F32 => Some((1, 4)),
            Self::F16 | Self::BF16 => Some((1, 2)),
            Self::Q4_0 => Some((32, 18)),
            Self::Q8_0 => Some((32, 34)),
            Self::Q4K => Some((256, 144)),
            Self::Q5K => Some((256, 176)),
            Self::Q6K => Some((256, 210)),
            Self::TQ1_0 => Some((256, 54)),
            Self::TQ2_0 => Some((256, 66)),
            Self::MXFP4 => Some((32, 17)),
            Self::Other(o) => Some((o.block, o.block_bytes)),
            Self::I2S | Self::Unknown(_) => None,
        }
    }

    /// Storage size of a tensor of this type with dims `ne` (ne[0] innermost).
    ///
    /// `None` when the id is unknown, the row length is not a multiple of the block size, or
    /// the size overflows.
    pub fn nbytes(self, ne: &[u64]) -> Option<u64> {
        let n = ne.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        if self == Self::I2S {
            return (n % 4 == 0).then(|| n / 4 + 32);
        }
        let (block, block_bytes) = self.block_layout()?;
        let row = *ne.first().unwrap_or(&1);
        if !row.is_multiple_of(block) {
            return None;
        }
        (n / block).checked_mul(block_bytes)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::F32 => f.write_str("F32"),
            Self::F16 => f.write_str("F16"),
            Self::BF16 => f.write_str("BF16"),
            Self::Q8_0 => f.write_str("Q8_0"),
            Self::Q4_0 => f.write_str("Q4_0"),
            Self::Q4K => f.write_str("Q4_K"),
            Self::Q5K => f.write_str("Q5_K"),
            Self::Q6K => f.write_str("Q6_K"),
            Self::TQ1_0 => f.write_str("TQ1_0"),
            Self::TQ2_0 => f.write_str("TQ2_0"),
            Self::I2S => f.write_str("I2_S"),
            Self::MXFP4 => f.write_str("MXFP4"),
            Self::Other(o) => f.write_str(o.name),
            Self::Unknown(id) => write!(f, "unknown type {id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for id in 0..64 {
            assert_eq!(GgmlType::from_id(id).id(), id);
        }
    }

    #[test]
    fn sizes_match_the_official_file() {
        // Byte sizes of the 2B4T tensors (spec/formats.md §3.2).
        assert_eq!(GgmlType::F16.nbytes(&[2560, 128256]), Some(656_670_720));
        assert_eq!(GgmlType::I2S.nbytes(&[2560, 2560]), Some(1_638_432));
        assert_eq!(GgmlType::I2S.nbytes(&[6912, 2560]), Some(4_423_712));
        assert_eq!(GgmlType::TQ2_0.nbytes(&[256, 3]), Some(3 * 66));
        assert_eq!(
            GgmlType::Q6K.nbytes(&[2560, 128256]),
            Some(128256 * 10 * 210)
        );
        assert_eq!(GgmlType::Q6K.nbytes(&[2560 + 32, 2]), None);
        assert_eq!(GgmlType::TQ1_0.nbytes(&[200, 3]), None);
        assert_eq!(GgmlType::Unknown(99).nbytes(&[4]), None);
    }
}
