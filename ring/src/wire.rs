//! Hidden states on the wire: f32 (exact), f16 (half the bytes) or Q8_0 (blocks of 32 values
//! as an f16 scale and 32 signed bytes: 34 bytes per 128, ~3.8× fewer than f32).

use half::f16;
use thiserror::Error;

use crate::frame::Dtype;

/// Values per Q8_0 block.
const Q8_BLOCK: usize = 32;

/// A payload that does not hold the floats its header promises.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("a {dtype:?} payload of {got} bytes cannot hold {n} values ({want} bytes)")]
pub struct WireError {
    /// The format.
    pub dtype: Dtype,
    /// Values expected.
    pub n: usize,
    /// Bytes those take.
    pub want: usize,
    /// Bytes there.
    pub got: usize,
}

/// Bytes `n` values take in `dtype` (`None` for a non-float dtype).
pub fn encoded_len(dtype: Dtype, n: usize) -> Option<usize> {
    match dtype {
        Dtype::None => None,
        Dtype::F32 => n.checked_mul(4),
        Dtype::F16 => n.checked_mul(2),
        Dtype::Q8_0 => n.checked_add(n.div_ceil(Q8_BLOCK).checked_mul(2)?),
    }
}

/// `values` stored as `dtype` (F32 when `dtype` is not a float format).
pub fn encode(dtype: Dtype, values: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::None | Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::Q8_0 => {
            let mut out = Vec::with_capacity(encoded_len(dtype, values.len()).unwrap_or(0));
            for block in values.chunks(Q8_BLOCK) {
                let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = f16::from_f32(amax / 127.0);
                let inv = if d.to_f32() > 0.0 {
                    1.0 / d.to_f32()
                } else {
                    0.0
                };
                out.extend_from_slice(&d.to_le_bytes());
                out.extend(
                    block
                        .iter()
                        .map(|&v| (v * inv).round().clamp(-127.0, 127.0) as i8 as u8),
                );
            }
            out
        }
    }
}

/// The `n` values a `dtype` payload holds.
pub fn decode(dtype: Dtype, bytes: &[u8], n: usize) -> Result<Vec<f32>, WireError> {
    let want = encoded_len(dtype, n).filter(|&w| w == bytes.len());
    if want.is_none() {
        return Err(WireError {
            dtype,
            n,
            want: encoded_len(dtype, n).unwrap_or(usize::MAX),
            got: bytes.len(),
        });
    }
    Ok(match dtype {
        Dtype::None => unreachable!("a non-float dtype has no encoded length"),
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::Q8_0 => {
            let mut out = Vec::with_capacity(n);
            let mut rest = bytes;
            while out.len() < n {
                let len = (n - out.len()).min(Q8_BLOCK);
                let (block, tail) = rest.split_at(2 + len);
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                out.extend(block[2..].iter().map(|&q| f32::from(q as i8) * d));
                rest = tail;
            }
            out
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173)
            .collect()
    }

    #[test]
    fn f32_is_exact_and_the_others_are_within_their_step() {
        let v = values(70); // two whole Q8_0 blocks and a short one
        assert_eq!(decode(Dtype::F32, &encode(Dtype::F32, &v), 70).unwrap(), v);
        let h = decode(Dtype::F16, &encode(Dtype::F16, &v), 70).unwrap();
        // f16 keeps 11 significant bits: a relative error of at most 2^-11.
        assert!(v
            .iter()
            .zip(&h)
            .all(|(a, b)| (a - b).abs() <= a.abs() / 2048.0));
        let q = encode(Dtype::Q8_0, &v);
        assert_eq!(q.len(), 70 + 3 * 2);
        let q = decode(Dtype::Q8_0, &q, 70).unwrap();
        // Q8_0 rounds to a step of amax/127 per block: at most half a step (and the f16
        // rounding of the scale, 2^-11 of each value) away.
        for (block, got) in v.chunks(32).zip(q.chunks(32)) {
            let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (a, b) in block.iter().zip(got) {
                assert!((a - b).abs() <= amax / 254.0 + a.abs() / 2048.0, "{a} {b}");
            }
        }
    }

    #[test]
    fn a_payload_of_the_wrong_size_is_refused() {
        let bytes = encode(Dtype::F16, &values(8));
        assert_eq!(
            decode(Dtype::F16, &bytes, 9),
            Err(WireError {
                dtype: Dtype::F16,
                n: 9,
                want: 18,
                got: 16
            })
        );
        assert!(decode(Dtype::Q8_0, &bytes, 8).is_err());
        assert!(decode(Dtype::None, &bytes, 4).is_err());
    }
}
