//! Activation quantization for the ternary BitLinear kernels.

use hesper_dsl::{kernel, kernel_fn};

use crate::half::f16_bits;
use crate::reduce::{tree_max, tree_sum};

/// Per-token int8 (bitnet.cpp's I2_S activations, the BitNet b1.58 A8 rule), one row per
/// workgroup: `s = 127 / max(max|x|, 1e-5)`, `q = clamp(rne(x·s), −128, 127)`, `scale[row] = s`.
#[kernel(workgroup = 256, uses(tree_max))]
pub fn quantize_i8(
    x: &[f32],
    q: &mut [i32],
    scale: &mut [f32],
    #[uniform] cols: u32,
    #[shared] acc: &mut [f32; 256],
) {
    let row = wid();
    let t = lid();
    let base = row * cols;
    let mut m: f32 = 0.0;
    for i in (t..cols).step_by(256) {
        m = m.max(x[base + i].abs());
    }
    acc[t] = m;
    barrier();
    tree_max(acc, t, 256u32);
    let s = 127.0 / acc[0].max(0.00001);
    for i in (t..cols).step_by(256) {
        q[base + i] = (x[base + i] * s).round().clamp(-128.0, 127.0) as i32;
    }
    if t == 0 {
        scale[row] = s;
    }
}

/// The signed value of the largest magnitude among the workgroup's 256 values (thread `t`
/// holds `v`), the first on ties, for every thread: the scale of a ggml Q8_K block. Every
/// thread of a 256-thread workgroup calls it; `vals` and `idxs` are free when it is called.
#[kernel_fn]
pub fn q8k_block_max(vals: &mut [f32; 256], idxs: &mut [u32; 256], t: u32, v: f32) -> f32 {
    vals[t] = v;
    idxs[t] = t;
    barrier();
    let mut stride: u32 = 128;
    while stride > 0 {
        if t < stride {
            let o = t + stride;
            let a = vals[t].abs();
            let c = vals[o].abs();
            if c > a || (c == a && idxs[o] < idxs[t]) {
                vals[t] = vals[o];
                idxs[t] = idxs[o];
            }
        }
        barrier();
        stride = stride >> 1u32;
    }
    vals[0]
}

/// The Q8_K code of `v` in a block whose [`q8k_block_max`] is `max`: `min(127, rne(iscale·v))`
/// with `iscale = −127/max` (0 for an all-zero block).
#[kernel_fn]
pub fn q8k_code(v: f32, max: f32) -> i32 {
    let mut code: i32 = 0;
    if max != 0.0 {
        code = ((-127.0 / max) * v).round().min(127.0) as i32;
    }
    code
}

/// The scale `d = 1/iscale` of a Q8_K block whose [`q8k_block_max`] is `max` (0 for an all-zero
/// block).
#[kernel_fn]
pub fn q8k_scale(max: f32) -> f32 {
    let mut d: f32 = 0.0;
    if max != 0.0 {
        d = 1.0 / (-127.0 / max);
    }
    d
}

/// ggml Q8_K blocks (mainline's TQ activations), one 256-value block per workgroup: the
/// signed value with the largest magnitude (first on ties) gives `iscale = −127/max`,
/// `q = min(127, rne(iscale·x))`, `d[block] = 1/iscale` (0 for an all-zero block).
#[kernel(workgroup = 256, uses(q8k_block_max, q8k_code, q8k_scale))]
pub fn quantize_q8k(
    x: &[f32],
    q: &mut [i32],
    d: &mut [f32],
    #[shared] vals: &mut [f32; 256],
    #[shared] idxs: &mut [u32; 256],
) {
    let b = wid();
    let t = lid();
    let v = x[b * 256u32 + t];
    let max = q8k_block_max(vals, idxs, t, v);
    q[b * 256u32 + t] = q8k_code(v, max);
    if t == 0 {
        d[b] = q8k_scale(max);
    }
}

/// The largest magnitude among the 32 values of thread `t`'s Q8_0 block (threads `32k ..
/// 32k + 32` hold one block, `a = |v|` each), for every thread. Every thread of the workgroup
/// calls it; `acc` is free when it is called.
#[kernel_fn]
pub fn q8_0_block_max(acc: &mut [f32; 256], t: u32, a: f32) -> f32 {
    let lane = t % 32u32;
    acc[t] = a;
    barrier();
    let mut stride: u32 = 16;
    while stride > 0 {
        if lane < stride {
            acc[t] = acc[t].max(acc[t + stride]);
        }
        barrier();
        stride = stride >> 1u32;
    }
    acc[t - lane]
}

/// The Q8_0 code of `v` in a block whose largest magnitude is `amax`: `v · (127/amax)` rounded
/// half to even (WGSL's `round`), 0 for an all-zero block. The block's scale is
/// `amax/127` rounded to the nearest half (`f16_bits`).
#[kernel_fn]
pub fn q8_0_code(v: f32, amax: f32) -> i32 {
    let mut inv: f32 = 0.0;
    if amax != 0.0 {
        inv = 127.0 / amax;
    }
    (v * inv).round() as i32
}

/// Thread `t`'s int8 `code` and those of the three threads beside it (`t - t % 4 ..`), packed
/// four to a word (the first in the low byte), for every thread; through `codes`. Every thread
/// of a 256-thread workgroup calls it.
#[kernel_fn]
pub fn pack_codes(codes: &mut [u32; 256], t: u32, code: i32) -> u32 {
    codes[t] = (code as u32) & 255u32;
    barrier();
    let a = t - t % 4u32;
    codes[a] | (codes[a + 1u32] << 8u32) | (codes[a + 2u32] << 16u32) | (codes[a + 3u32] << 24u32)
}

/// ggml Q8_0 blocks (activations multiplied with Q8_0 weights), 8 blocks of 32 per workgroup, as
/// llama.cpp's x86 CPU backend quantizes them: `d = amax/127` (kept rounded to the nearest
/// f16, ties to even), `q = x · (127/amax)` rounded half to even, the codes four to a word
/// (element `4i + b` in byte `b` of word `i`) for `dot4I8Packed`.
#[kernel(workgroup = 256, uses(f16_bits, q8_0_block_max, q8_0_code, pack_codes))]
pub fn quantize_q8_0(
    x: &[f32],
    q: &mut [u32],
    d: &mut [f32],
    #[uniform] blocks: u32,
    #[shared] acc: &mut [f32; 256],
    #[shared] codes: &mut [u32; 256],
) {
    let t = lid();
    let b = wid() * 8u32 + t / 32u32;
    let mut v: f32 = 0.0;
    if b < blocks {
        v = x[b * 32u32 + t % 32u32];
    }
    let amax = q8_0_block_max(acc, t, v.abs());
    let word = pack_codes(codes, t, q8_0_code(v, amax));
    if b < blocks {
        if t % 4u32 == 0u32 {
            q[(b * 32u32 + t % 32u32) / 4u32] = word;
        }
        if t % 32u32 == 0u32 {
            d[b] = unpack_f16_lo(f16_bits(amax / 127.0));
        }
    }
}

/// Per-token int8 like [`quantize_i8`], packed four to a word (element `4i + b` in byte `b`)
/// for `dot4I8Packed`, with `Σq` of each row in `sum` (the packed BitLinear multiplies codes
/// 0, 1, 2 and subtracts it). `cols` is a multiple of 4.
#[kernel(workgroup = 256, uses(tree_max, tree_sum))]
pub fn quantize_i8_packed(
    x: &[f32],
    q: &mut [u32],
    scale: &mut [f32],
    sum: &mut [i32],
    #[uniform] cols: u32,
    #[shared] acc: &mut [f32; 256],
    #[shared] sums: &mut [i32; 256],
) {
    let row = wid();
    let t = lid();
    let base = row * cols;
    let mut m: f32 = 0.0;
    for i in (t..cols).step_by(256) {
        m = m.max(x[base + i].abs());
    }
    acc[t] = m;
    barrier();
    tree_max(acc, t, 256u32);
    let s = 127.0 / acc[0].max(0.00001);
    let words = cols / 4u32;
    let mut total: i32 = 0;
    for w in (t..words).step_by(256) {
        let mut packed: u32 = 0u32;
        for b in 0..4u32 {
            let v = (x[base + 4u32 * w + b] * s).round().clamp(-128.0, 127.0) as i32;
            total += v;
            packed = packed | (((v as u32) & 255u32) << (8u32 * b));
        }
        q[row * words + w] = packed;
    }
    sums[t] = total;
    barrier();
    tree_sum(sums, t, 256u32);
    if t == 0 {
        scale[row] = s;
        sum[row] = sums[0];
    }
}
