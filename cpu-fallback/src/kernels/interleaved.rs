//! x86_64 kernels over I2_S weights interleaved sixteen rows deep ([`crate::interleave`]):
//! sixteen rows × `T` tokens per pass, each 32-bit lane a row, each activation dword broadcast
//! to all lanes, so no horizontal sums and no per-row unpacking for every token.
//!
//! One body ([`sweep`]) serves every variant; they differ in the register width and in how
//! unsigned code bytes meet signed activation bytes:
//! * AVX-512 VNNI: 512-bit `vpdpbusd` (four products and the add into i32 in one instruction);
//! * AVX-512BW: 512-bit `vpmaddubsw` + `vpmaddwd` (Skylake-X, no VNNI);
//! * AVX-VNNI: 256-bit VEX `vpdpbusd` (Alder Lake and later without AVX-512).
//!
//! Codes are 0..=2 and activations −128..=127, so every sum is exact and each variant equals
//! the scalar path bit for bit.

use std::arch::x86_64::*;

use crate::interleave::{ROWS, TILE_BYTES};

/// One register of 32-bit lanes, each a row, and the products a variant adds into it.
trait Lanes: Copy {
    /// Bytes per register.
    const BYTES: usize;
    /// A register of zeros.
    unsafe fn zero() -> Self;
    /// `Self::BYTES` bytes at `p`.
    unsafe fn load(p: *const u8) -> Self;
    /// Bits `SHIFT..SHIFT + 2` of every byte.
    unsafe fn plane<const SHIFT: u32>(self) -> Self;
    /// The four bytes at `q` in every lane.
    unsafe fn splat(q: *const i8) -> Self;
    /// `acc + Σ_s Σ_bytes codes[s] · q[s]` per lane (codes unsigned, q signed).
    unsafe fn dot4(acc: Self, codes: [Self; 4], q: [Self; 4]) -> Self;
    /// Adds `self` to the `Self::BYTES / 4` sums at `out`.
    unsafe fn add_to(self, out: *mut i32);
}

/// A 512-bit register for AVX-512 VNNI.
#[derive(Clone, Copy)]
struct Vnni512(__m512i);

/// A 512-bit register for AVX-512BW without VNNI.
#[derive(Clone, Copy)]
struct Bw512(__m512i);

/// A 256-bit register for AVX-VNNI.
#[derive(Clone, Copy)]
struct AvxVnni256(__m256i);

/// The 512-bit operations the AVX-512 variants share.
macro_rules! lanes_512 {
    () => {
        const BYTES: usize = 64;
        #[inline(always)]
        unsafe fn zero() -> Self {
            Self(_mm512_setzero_si512())
        }
        #[inline(always)]
        unsafe fn load(p: *const u8) -> Self {
            // SAFETY: the caller guarantees 64 readable bytes.
            Self(unsafe { _mm512_loadu_si512(p.cast()) })
        }
        #[inline(always)]
        unsafe fn plane<const SHIFT: u32>(self) -> Self {
            Self(_mm512_and_si512(
                _mm512_srli_epi16::<SHIFT>(self.0),
                _mm512_set1_epi8(3),
            ))
        }
        #[inline(always)]
        unsafe fn splat(q: *const i8) -> Self {
            // SAFETY: the caller guarantees four readable bytes.
            Self(_mm512_set1_epi32(unsafe {
                q.cast::<i32>().read_unaligned()
            }))
        }
        #[inline(always)]
        unsafe fn add_to(self, out: *mut i32) {
            // SAFETY: the caller guarantees sixteen writable sums.
            unsafe {
                let sum = _mm512_add_epi32(_mm512_loadu_si512(out.cast()), self.0);
                _mm512_storeu_si512(out.cast(), sum);
            }
        }
    };
}

impl Lanes for Vnni512 {
    lanes_512!();
    #[inline(always)]
    unsafe fn dot4(acc: Self, codes: [Self; 4], q: [Self; 4]) -> Self {
        let mut acc = acc.0;
        for (c, q) in codes.into_iter().zip(q) {
            acc = _mm512_dpbusd_epi32(acc, c.0, q.0);
        }
        Self(acc)
    }
}

impl Lanes for Bw512 {
    lanes_512!();
    #[inline(always)]
    unsafe fn dot4(acc: Self, codes: [Self; 4], q: [Self; 4]) -> Self {
        // Each i16 pair sum is at most 2·2·128 = 512 in magnitude, four of them 2048: no
        // saturation, so widening once per four planes is exact.
        let sum16 = _mm512_add_epi16(
            _mm512_add_epi16(
                _mm512_maddubs_epi16(codes[0].0, q[0].0),
                _mm512_maddubs_epi16(codes[1].0, q[1].0),
            ),
            _mm512_add_epi16(
                _mm512_maddubs_epi16(codes[2].0, q[2].0),
                _mm512_maddubs_epi16(codes[3].0, q[3].0),
            ),
        );
        Self(_mm512_add_epi32(
            acc.0,
            _mm512_madd_epi16(sum16, _mm512_set1_epi16(1)),
        ))
    }
}

/// The 256-bit operations (`dot4` aside) of the AVX-VNNI variant and its test twin.
macro_rules! lanes_256 {
    () => {
        const BYTES: usize = 32;
        #[inline(always)]
        unsafe fn zero() -> Self {
            Self(_mm256_setzero_si256())
        }
        #[inline(always)]
        unsafe fn load(p: *const u8) -> Self {
            // SAFETY: the caller guarantees 32 readable bytes.
            Self(unsafe { _mm256_loadu_si256(p.cast()) })
        }
        #[inline(always)]
        unsafe fn plane<const SHIFT: u32>(self) -> Self {
            // A shift by a register count (a constant here, so an immediate once compiled):
            // the immediate form's parameter is an `i32` a generic `u32` cannot become.
            let count = _mm_cvtsi32_si128(SHIFT as i32);
            Self(_mm256_and_si256(
                _mm256_srl_epi16(self.0, count),
                _mm256_set1_epi8(3),
            ))
        }
        #[inline(always)]
        unsafe fn splat(q: *const i8) -> Self {
            // SAFETY: the caller guarantees four readable bytes.
            Self(_mm256_set1_epi32(unsafe {
                q.cast::<i32>().read_unaligned()
            }))
        }
        #[inline(always)]
        unsafe fn add_to(self, out: *mut i32) {
            // SAFETY: the caller guarantees eight writable sums.
            unsafe {
                let sum = _mm256_add_epi32(_mm256_loadu_si256(out.cast()), self.0);
                _mm256_storeu_si256(out.cast(), sum);
            }
        }
    };
}

impl Lanes for AvxVnni256 {
    lanes_256!();
    #[inline(always)]
    unsafe fn dot4(acc: Self, codes: [Self; 4], q: [Self; 4]) -> Self {
        let mut acc = acc.0;
        for (c, q) in codes.into_iter().zip(q) {
            acc = _mm256_dpbusd_avx_epi32(acc, c.0, q.0);
        }
        Self(acc)
    }
}

/// Σ code·q of the sixteen rows in `tiles` against `T` tokens, `U` tiles in flight per token
/// (independent chains for when `T` alone cannot hide the multiply's latency). A register
/// narrower than a tile sweeps the block once per slice of rows it holds.
///
/// # Safety
/// The CPU runs `V`'s instructions; `tiles` is one interleaved block of `q[t].len() / 4`
/// bytes per row, `q[t].len()` a multiple of 128, the same for every `t`.
#[inline(always)]
unsafe fn sweep<V: Lanes, const T: usize, const U: usize>(
    tiles: &[u8],
    q: [&[i8]; T],
) -> [[i32; ROWS]; T] {
    let cols = q[0].len();
    assert!(
        q.iter().all(|q| q.len() == cols) && cols.is_multiple_of(128) && tiles.len() == cols * 4
    );
    let n_tiles = tiles.len() / TILE_BYTES;
    let mut out = [[0i32; ROWS]; T];
    for slice in 0..TILE_BYTES / V::BYTES {
        // SAFETY (whole block): tile j lies at bytes [64j, 64j + 64) of `tiles`, and its
        // activations at columns 128(j / 8) + 32s + 4(j % 8) .. +4 (s < 4) of each q.
        unsafe {
            let mut acc = [[V::zero(); T]; U];
            for j0 in (0..n_tiles).step_by(U) {
                for (u, acc) in acc.iter_mut().enumerate() {
                    let j = j0 + u;
                    let v = V::load(tiles.as_ptr().add(j * TILE_BYTES + slice * V::BYTES));
                    // Bits 7-6 pair with columns 128g + 4w, bits 1-0 with 128g + 96 + 4w.
                    let codes = [
                        v.plane::<6>(),
                        v.plane::<4>(),
                        v.plane::<2>(),
                        v.plane::<0>(),
                    ];
                    let col = 128 * (j / 8) + 4 * (j % 8);
                    for (a, q) in acc.iter_mut().zip(q) {
                        let p = q.as_ptr().add(col);
                        let qv = [
                            V::splat(p),
                            V::splat(p.add(32)),
                            V::splat(p.add(64)),
                            V::splat(p.add(96)),
                        ];
                        *a = V::dot4(*a, codes, qv);
                    }
                }
            }
            for acc in acc {
                for (a, o) in acc.into_iter().zip(out.iter_mut()) {
                    a.add_to(o.as_mut_ptr().add(slice * V::BYTES / 4));
                }
            }
        }
    }
    out
}

/// AVX-512 VNNI: [`sweep`] with 512-bit `vpdpbusd`.
///
/// # Safety
/// The CPU supports AVX-512 F, BW and VNNI; shapes as for [`sweep`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn i2s_rows16_vnni512<const T: usize, const U: usize>(
    tiles: &[u8],
    q: [&[i8]; T],
) -> [[i32; ROWS]; T] {
    // SAFETY: forwarded from the caller.
    unsafe { sweep::<Vnni512, T, U>(tiles, q) }
}

/// AVX-512BW: [`sweep`] with 512-bit `vpmaddubsw`.
///
/// # Safety
/// The CPU supports AVX-512 F and BW; shapes as for [`sweep`].
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn i2s_rows16_bw512<const T: usize, const U: usize>(
    tiles: &[u8],
    q: [&[i8]; T],
) -> [[i32; ROWS]; T] {
    // SAFETY: forwarded from the caller.
    unsafe { sweep::<Bw512, T, U>(tiles, q) }
}

/// AVX-VNNI: [`sweep`] with 256-bit VEX `vpdpbusd`.
///
/// # Safety
/// The CPU supports AVX2 and AVX-VNNI; shapes as for [`sweep`].
#[target_feature(enable = "avx2,avxvnni")]
pub unsafe fn i2s_rows16_avxvnni<const T: usize, const U: usize>(
    tiles: &[u8],
    q: [&[i8]; T],
) -> [[i32; ROWS]; T] {
    // SAFETY: forwarded from the caller.
    unsafe { sweep::<AvxVnni256, T, U>(tiles, q) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-VNNI body run with the EVEX encoding of the same instruction (AVX-512 VL +
    /// VNNI), so a host without AVX-VNNI (AMD Zen 4) still checks everything but the opcode.
    #[derive(Clone, Copy)]
    struct EvexVnni256(__m256i);

    impl Lanes for EvexVnni256 {
        lanes_256!();
        #[inline(always)]
        unsafe fn dot4(acc: Self, codes: [Self; 4], q: [Self; 4]) -> Self {
            let mut acc = acc.0;
            for (c, q) in codes.into_iter().zip(q) {
                acc = _mm256_dpbusd_epi32(acc, c.0, q.0);
            }
            Self(acc)
        }
    }

    #[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
    unsafe fn evex256<const T: usize, const U: usize>(
        tiles: &[u8],
        q: [&[i8]; T],
    ) -> [[i32; ROWS]; T] {
        // SAFETY: forwarded from the caller.
        unsafe { sweep::<EvexVnni256, T, U>(tiles, q) }
    }

    #[test]
    fn the_256_bit_body_matches_the_scalar_path() {
        if !(is_x86_feature_detected!("avx512vl") && is_x86_feature_detected!("avx512vnni")) {
            println!("this host has no AVX-512 VNNI: the 256-bit body is only compiled");
            return;
        }
        let cols = 384;
        let row_bytes = cols / 4;
        let data: Vec<u8> = (0..ROWS * row_bytes)
            .map(|i| {
                let c = |k: usize| ((i * 31 + k * 7) / 3 % 3) as u8;
                c(0) << 6 | c(1) << 4 | c(2) << 2 | c(3)
            })
            .collect();
        let tiles = crate::interleave::interleave(&data, row_bytes);
        let qs: Vec<Vec<i8>> = (0..3)
            .map(|t| {
                (0..cols)
                    .map(|k| ((k * 37 + t * 11) % 256) as u8 as i8)
                    .collect()
            })
            .collect();
        // SAFETY: the features were checked above; one whole block of 16 rows.
        let got = unsafe { evex256::<3, 2>(&tiles, [&qs[0], &qs[1], &qs[2]]) };
        for (t, q) in qs.iter().enumerate() {
            for (l, row) in data.chunks_exact(row_bytes).enumerate() {
                let want = crate::kernels::scalar::i2s_code_dot(row, q);
                assert_eq!(got[t][l], want, "token {t}, row {l}");
            }
        }
    }
}
