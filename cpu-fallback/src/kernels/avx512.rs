//! AVX-512 attention kernels (the AVX-512 variants' own; the AVX2 ones serve the others).
//!
//! Scores: each (query, key) dot product is one sixteen-lane accumulator over the head, summed
//! across lanes by one fixed pairing ([`hsum`]: lanes `i` and `i + 8`, then `+ 4`, `+ 2`,
//! `+ 1`). The four-query kernel sums sixteen accumulators at once ([`hsum16`]) with the very
//! same pairing, so a score does not depend on which kernel computed it, and prompt and
//! generation agree bit for bit. Weighted sums are a chain of FMAs per output element, the
//! same whatever the register width, so they equal the AVX2 kernel's.

use std::arch::x86_64::*;

/// The sum of sixteen lanes: `a[i] = v[i] + v[i + 8]`, `b[i] = a[i] + a[i + 4]`,
/// `c[i] = b[i] + b[i + 2]`, `c[0] + c[1]`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn hsum(v: __m512) -> f32 {
    let a = _mm256_add_ps(
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
    );
    let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)))
}

/// [`hsum`] of sixteen vectors at once: lane `k` of the result is `hsum(v[k])`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn hsum16(v: [__m512; 16]) -> [f32; 16] {
    // a: vector pair (2p, 2p + 1) → [a(2p) | a(2p + 1)] (eight lanes each).
    let a: [__m512; 8] = std::array::from_fn(|p| {
        let (x, y) = (v[2 * p], v[2 * p + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
        )
    });
    // b: [a(4p) | a(4p+1)] and [a(4p+2) | a(4p+3)] → 128-bit lanes b(4p), b(4p+1),
    // b(4p+2), b(4p+3).
    let b: [__m512; 4] = std::array::from_fn(|p| {
        let (x, y) = (a[2 * p], a[2 * p + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    });
    // c: per 128-bit lane j, [c0, c1] of b(8p + j) then of b(8p + 4 + j).
    let c: [__m512; 2] = std::array::from_fn(|p| {
        let (x, y) = (b[2 * p], b[2 * p + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(x, y),
            _mm512_shuffle_ps::<0b11_10_11_10>(x, y),
        )
    });
    // d: per 128-bit lane j, the sums of vectors j, 4 + j, 8 + j, 12 + j.
    let d = _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(c[0], c[1]),
        _mm512_shuffle_ps::<0b11_01_11_01>(c[0], c[1]),
    );
    let mut lanes = [0.0f32; 16];
    // SAFETY: `lanes` holds sixteen floats.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), d) };
    std::array::from_fn(|k| lanes[4 * (k % 4) + k / 4])
}

/// The columns past the last whole sixteen, in order.
#[inline]
fn tail(q: &[f32], key: &[f32], vec_end: usize) -> f32 {
    (vec_end..q.len()).map(|i| q[i] * key[i]).sum()
}

/// AVX-512 version of [`crate::kernels::scalar::scores`]: one accumulator per key, four keys
/// in flight.
///
/// # Safety
/// The CPU must support AVX-512 F; `k` holds `(out.len() − 1)·stride + q.len()` floats.
#[target_feature(enable = "avx512f,fma")]
pub unsafe fn scores(q: &[f32], k: &[f32], stride: usize, out: &mut [f32]) {
    let hd = q.len();
    debug_assert!(out.is_empty() || k.len() >= (out.len() - 1) * stride + hd);
    let vec_end = hd / 16 * 16;
    for (j0, o) in out.chunks_mut(4).enumerate().map(|(c, o)| (4 * c, o)) {
        let mut acc = [_mm512_setzero_ps(); 4];
        for i in (0..vec_end).step_by(16) {
            // SAFETY: key j0 + r covers [(j0 + r)·stride, (j0 + r)·stride + hd) of k, and
            // i + 16 <= hd.
            unsafe {
                let qv = _mm512_loadu_ps(q.as_ptr().add(i));
                for (r, a) in acc.iter_mut().enumerate().take(o.len()) {
                    let kv = _mm512_loadu_ps(k.as_ptr().add((j0 + r) * stride + i));
                    *a = _mm512_fmadd_ps(qv, kv, *a);
                }
            }
        }
        for (r, (s, a)) in o.iter_mut().zip(acc).enumerate() {
            // SAFETY: AVX-512 F is enabled here.
            *s = unsafe { hsum(a) };
            if vec_end < hd {
                *s += tail(q, &k[(j0 + r) * stride..][..hd], vec_end);
            }
        }
    }
}

/// [`scores`] of four queries against the same keys, four keys at a time: every score equals
/// the one [`scores`] gives.
///
/// # Safety
/// The CPU must support AVX-512 F; all `q` are as long, all `out` as long, and `k` holds
/// `(out[0].len() − 1)·stride + q[0].len()` floats.
#[target_feature(enable = "avx512f,fma")]
pub unsafe fn scores_x4(q: [&[f32]; 4], k: &[f32], stride: usize, mut out: [&mut [f32]; 4]) {
    let hd = q[0].len();
    let keys = out[0].len();
    debug_assert!(keys == 0 || k.len() >= (keys - 1) * stride + hd);
    let vec_end = hd / 16 * 16;
    let quads = keys / 4 * 4;
    for j in (0..quads).step_by(4) {
        // acc[4g + r]: query g, key j + r.
        let mut acc = [_mm512_setzero_ps(); 16];
        for i in (0..vec_end).step_by(16) {
            // SAFETY: keys j..j + 4 cover [(j + r)·stride, (j + r)·stride + hd) of k, and
            // i + 16 <= hd for every query.
            unsafe {
                let kv: [__m512; 4] =
                    std::array::from_fn(|r| _mm512_loadu_ps(k.as_ptr().add((j + r) * stride + i)));
                for (g, qg) in q.iter().enumerate() {
                    let qv = _mm512_loadu_ps(qg.as_ptr().add(i));
                    for (r, kv) in kv.iter().enumerate() {
                        acc[4 * g + r] = _mm512_fmadd_ps(qv, *kv, acc[4 * g + r]);
                    }
                }
            }
        }
        // SAFETY: AVX-512 F is enabled here.
        let sums = unsafe { hsum16(acc) };
        for (g, o) in out.iter_mut().enumerate() {
            o[j..j + 4].copy_from_slice(&sums[4 * g..4 * g + 4]);
            if vec_end < hd {
                for r in 0..4 {
                    o[j + r] += tail(q[g], &k[(j + r) * stride..][..hd], vec_end);
                }
            }
        }
    }
    if quads < keys {
        for (qg, o) in q.into_iter().zip(out) {
            // SAFETY: forwarded: the keys from `quads` on, one accumulator each as above.
            unsafe { scores(qg, &k[quads * stride..], stride, &mut o[quads..]) };
        }
    }
}

/// [`crate::kernels::avx2::weighted_sum_x4`] with sixteen-lane registers: four probability
/// rows over the same values, 32 output dims of the four at a time. Each output element is
/// the same chain of FMAs as in the AVX2 kernel, so the results are equal.
///
/// # Safety
/// The CPU must support AVX-512 F; all `p` are as long, all `out` as long, and `v` holds
/// `(p[0].len() − 1)·stride + out[0].len()` floats.
#[target_feature(enable = "avx512f,fma")]
pub unsafe fn weighted_sum_x4(p: [&[f32]; 4], v: &[f32], stride: usize, mut out: [&mut [f32]; 4]) {
    let hd = out[0].len();
    let len = p[0].len();
    debug_assert!(len == 0 || v.len() >= (len - 1) * stride + hd);
    let vec_end = hd / 16 * 16;
    let mut d0 = 0;
    while d0 < vec_end {
        // Two registers per query while 32 dims remain, then one.
        let width = ((vec_end - d0) / 16).min(2);
        let mut acc = [[_mm512_setzero_ps(); 2]; 4];
        for j in 0..len {
            // SAFETY: value j covers [j·stride, j·stride + hd) of v; d0 + 16·width <= hd;
            // every p holds len > j probabilities.
            unsafe {
                let row = v.as_ptr().add(j * stride + d0);
                let x = [
                    _mm512_loadu_ps(row),
                    _mm512_loadu_ps(row.add(16 * (width - 1))),
                ];
                for (a, pg) in acc.iter_mut().zip(p) {
                    let pv = _mm512_set1_ps(*pg.get_unchecked(j));
                    for c in 0..width {
                        a[c] = _mm512_fmadd_ps(pv, x[c], a[c]);
                    }
                }
            }
        }
        for (a, o) in acc.iter().zip(out.iter_mut()) {
            for (c, a) in a.iter().enumerate().take(width) {
                // SAFETY: d0 + 16c + 16 <= hd = o.len().
                unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(d0 + 16 * c), *a) };
            }
        }
        d0 += 16 * width;
    }
    if vec_end < hd {
        let rest: [&mut [f32]; 4] = out.map(|o| &mut o[vec_end..]);
        // SAFETY: the AVX2 kernel over the last columns (AVX-512 F implies AVX2 and FMA on
        // every CPU that has it; the variants check all three).
        unsafe { super::avx2::weighted_sum_x4(p, &v[vec_end..], stride, rest) };
    }
}
