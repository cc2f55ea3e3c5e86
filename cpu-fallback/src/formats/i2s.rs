//! I2_S rows: 2-bit codes dotted with per-row int8 activations (bitnet.cpp's rule). The
//! kernels sum `code·q` (codes 0..2); [`output`] turns a sum into the ternary product. Rows
//! may also be interleaved sixteen deep ([`crate::interleave`]) for [`rows16_dot`].

use hesper_engine::formats::I2s;

use super::{each_of_four_rows, ActivationKind, CpuLayout};
use crate::interleave::ROWS;
#[cfg(target_arch = "aarch64")]
use crate::kernels::neon;
#[cfg(target_arch = "x86_64")]
use crate::kernels::{avx2, interleaved};
use crate::kernels::{scalar, Isa};
use crate::quant::{quantize_i8_row, I8Row};

impl CpuLayout for I2s {
    type Act = I8Row;
    const ACT: ActivationKind = ActivationKind::I8Row;

    fn quantize(x: &[f32]) -> I8Row {
        quantize_i8_row(x)
    }

    #[inline]
    fn dot(self, isa: Isa, row: &[u8], a: &I8Row) -> f32 {
        output(code_dot(isa, row, &a.q), a, self.beta)
    }

    #[inline]
    fn dot_x4(self, isa: Isa, row: &[u8], a: [&I8Row; 4]) -> Option<[f32; 4]> {
        let sums = code_dot_x4(isa, row, a.map(|a| a.q.as_slice()));
        Some(std::array::from_fn(|k| output(sums[k], a[k], self.beta)))
    }

    #[inline]
    fn dot_rows4(self, isa: Isa, rows: &[u8], a: &I8Row) -> Option<[f32; 4]> {
        Some(code_dot_rows4(isa, rows, &a.q).map(|s| output(s, a, self.beta)))
    }
}

/// bitnet.cpp's I2_S epilogue: the ternary sum Σ(code−1)·q = Σcode·q − Σq, divided by the
/// activation scale and multiplied by the weight scale, in f32.
#[inline]
pub fn output(code_sum: i32, act: &I8Row, beta: f32) -> f32 {
    (code_sum - act.sum) as f32 / act.scale * beta
}

/// [`output`] of sixteen rows at once, times the matrix's `scale` if any: the same
/// operations per lane, written so that the compiler vectorizes them (one division per row
/// is a measurable share of prefill when each is issued alone).
#[inline]
pub fn outputs(sums: &[i32; ROWS], act: &I8Row, beta: f32, scale: Option<f32>) -> [f32; ROWS] {
    let mut v = [0.0f32; ROWS];
    for (v, &s) in v.iter_mut().zip(sums) {
        *v = output(s, act, beta);
    }
    if let Some(scale) = scale {
        v.iter_mut().for_each(|v| *v *= scale);
    }
    v
}

/// Σ code·q over an I2_S row.
#[inline]
pub fn code_dot(isa: Isa, row: &[u8], q: &[i8]) -> i32 {
    by_isa!(isa,
        x86: avx2::i2s_code_dot(row, q),
        neon: i2s_code_dot(row, q),
        scalar: scalar::i2s_code_dot(row, q),
    )
}

/// Σ code·q of four consecutive I2_S rows (`rows` holds all four) against one token row.
#[inline]
pub fn code_dot_rows4(isa: Isa, rows: &[u8], q: &[i8]) -> [i32; 4] {
    by_isa!(isa,
        x86: avx2::i2s_code_dot_rows4(rows, q),
        neon: i2s_code_dot_rows4(rows, q),
        scalar: each_of_four_rows(rows, |row| scalar::i2s_code_dot(row, q)),
    )
}

/// Σ code·q of one I2_S row against four token rows.
#[inline]
pub fn code_dot_x4(isa: Isa, row: &[u8], q: [&[i8]; 4]) -> [i32; 4] {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for `code_dot`, for each of the four rows; `Avx512Vnni` has
        // AVX-512 F/VL/VNNI and `AvxVnni` AVX-VNNI besides AVX2 and F16C.
        Isa::Avx512Vnni => unsafe { avx2::i2s_code_dot_x4_vnni(row, q) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::AvxVnni => unsafe { avx2::i2s_code_dot_x4_avxvnni(row, q) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 | Isa::Avx512Bw => unsafe { avx2::i2s_code_dot_x4_avx2(row, q) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::plain::i2s_code_dot_x4(row, q),
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as for `code_dot`.
        Isa::NeonDot => unsafe { neon::dotprod::i2s_code_dot_x4(row, q) },
        _ => q.map(|q| scalar::i2s_code_dot(row, q)),
    }
}

/// Σ code·q of sixteen I2_S rows interleaved into one block (`tiles`, see
/// [`crate::interleave`]) against `T` token rows: `out[t][l]` is row `l`'s sum for token
/// `t`. Every `q[t]` is as long as a row has columns, a multiple of 128.
#[inline]
pub fn rows16_dot<const T: usize>(isa: Isa, tiles: &[u8], q: [&[i8]; T]) -> [[i32; 16]; T] {
    // Independent chains per token: one token alone keeps four tiles in flight, two to
    // four tokens two; eight tokens take two tiles at a time where the registers hold them
    // (sixteen 512-bit accumulators: 5 % faster than one tile), one with 256-bit ones.
    #[cfg(target_arch = "x86_64")]
    macro_rules! variant {
        ($kernel:ident, $many:literal) => {
            match T {
                1 => interleaved::$kernel::<T, 4>(tiles, q),
                2..=4 => interleaved::$kernel::<T, 2>(tiles, q),
                _ => interleaved::$kernel::<T, $many>(tiles, q),
            }
        };
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: each variant is constructed only when the CPU reports its features
        // (`detect`; `CpuBackend::with_isa` refuses it otherwise); `sweep` asserts the
        // shapes before reading.
        Isa::Avx512Vnni => unsafe { variant!(i2s_rows16_vnni512, 2) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512Bw => unsafe { variant!(i2s_rows16_bw512, 2) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::AvxVnni => unsafe { variant!(i2s_rows16_avxvnni, 1) },
        _ => {
            // The reference: each row taken back out of the block.
            let row_bytes = tiles.len() / 16;
            let mut row = vec![0u8; row_bytes];
            let mut out = [[0i32; 16]; T];
            for l in 0..16 {
                crate::interleave::row(tiles, row_bytes, l, &mut row);
                for (o, q) in out.iter_mut().zip(q) {
                    o[l] = scalar::i2s_code_dot(&row, q);
                }
            }
            out
        }
    }
}
