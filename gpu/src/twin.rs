//! What a kernel's Rust twin is type-checked against: `#[kernel]` and `#[kernel_fn]` keep the
//! function they translate to WGSL as a Rust function too, with storage buffers as [`Buffer`],
//! workgroup arrays as [`Workgroup`] and the DSL's intrinsics as the functions below, so rustc
//! checks every kernel body (a type error is a compile error at its span). The twins are never
//! run: the GPU runs the WGSL, and these items only give rustc the DSL's types.

use std::marker::PhantomData;
use std::ops::{Index, IndexMut};

/// Why the items below have no behaviour.
const NOT_RUN: &str = "a kernel's Rust twin is type-checked, never run";

/// A storage buffer as a kernel sees it: indexed by `u32`, like WGSL's `array<T>`.
pub struct Buffer<T>(PhantomData<T>);

impl<T> Buffer<T> {
    /// `arrayLength`: the number of elements.
    pub fn len(&self) -> u32 {
        unreachable!("{NOT_RUN}")
    }

    /// Whether the buffer holds no element (never, for a bound buffer).
    pub fn is_empty(&self) -> bool {
        unreachable!("{NOT_RUN}")
    }
}

impl<T> Index<u32> for Buffer<T> {
    type Output = T;
    fn index(&self, _: u32) -> &T {
        unreachable!("{NOT_RUN}")
    }
}

impl<T> IndexMut<u32> for Buffer<T> {
    fn index_mut(&mut self, _: u32) -> &mut T {
        unreachable!("{NOT_RUN}")
    }
}

/// A workgroup array, indexed by `u32` (its length, which may depend on a kernel's
/// compile-time constants, is checked by the macro, not by this type).
pub struct Workgroup<T>(PhantomData<T>);

impl<T> Index<u32> for Workgroup<T> {
    type Output = T;
    fn index(&self, _: u32) -> &T {
        unreachable!("{NOT_RUN}")
    }
}

impl<T> IndexMut<u32> for Workgroup<T> {
    fn index_mut(&mut self, _: u32) -> &mut T {
        unreachable!("{NOT_RUN}")
    }
}

/// A kernel-local array (`let mut s = [0i32; TILE];` in the DSL, `var s = array<i32, N>()` in
/// WGSL), indexed by `u32`.
pub struct Local<T>(PhantomData<T>);

impl<T> Local<T> {
    /// `[value; len]`.
    pub fn splat(_value: T, _len: u32) -> Self {
        unreachable!("{NOT_RUN}")
    }
}

impl<T> Index<u32> for Local<T> {
    type Output = T;
    fn index(&self, _: u32) -> &T {
        unreachable!("{NOT_RUN}")
    }
}

impl<T> IndexMut<u32> for Local<T> {
    fn index_mut(&mut self, _: u32) -> &mut T {
        unreachable!("{NOT_RUN}")
    }
}

/// The element types a generic helper may be instantiated with (`f32`, `i32`, `u32`): what
/// WGSL's arithmetic and comparisons accept for all three.
pub trait Scalar:
    Copy
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::AddAssign
{
}

impl Scalar for f32 {}
impl Scalar for i32 {}
impl Scalar for u32 {}

/// `global_invocation_id.x`.
pub fn gid() -> u32 {
    unreachable!("{NOT_RUN}")
}

/// `local_invocation_id.x`.
pub fn lid() -> u32 {
    unreachable!("{NOT_RUN}")
}

/// `workgroup_id.x`.
pub fn wid() -> u32 {
    unreachable!("{NOT_RUN}")
}

/// `workgroup_id.y`.
pub fn wid_y() -> u32 {
    unreachable!("{NOT_RUN}")
}

/// `workgroupBarrier()`.
pub fn barrier() {
    unreachable!("{NOT_RUN}")
}

/// `storageBarrier()`.
pub fn storage_barrier() {
    unreachable!("{NOT_RUN}")
}

/// WGSL's `select(f, t, cond)`: `t` where `cond`, else `f`.
pub fn select<T>(_f: T, _t: T, _cond: bool) -> T {
    unreachable!("{NOT_RUN}")
}

/// `bitcast<f32>(w)`.
pub fn f32_from_bits(_w: u32) -> f32 {
    unreachable!("{NOT_RUN}")
}

/// `dot4I8Packed(a, b)`: the dot product of four packed signed bytes.
pub fn dot4_i8_packed(_a: u32, _b: u32) -> i32 {
    unreachable!("{NOT_RUN}")
}

/// `unpack2x16float(w).x`: the f16 in the low half of `w`.
pub fn unpack_f16_lo(_w: u32) -> f32 {
    unreachable!("{NOT_RUN}")
}

/// `unpack2x16float(w).y`: the f16 in the high half of `w`.
pub fn unpack_f16_hi(_w: u32) -> f32 {
    unreachable!("{NOT_RUN}")
}

/// `bitcast<u32>(x)`.
pub fn f32_to_bits(_x: f32) -> u32 {
    unreachable!("{NOT_RUN}")
}

/// `subgroupAdd(x)`.
pub fn subgroup_add<T>(_x: T) -> T {
    unreachable!("{NOT_RUN}")
}

/// `subgroupMax(x)`.
pub fn subgroup_max<T>(_x: T) -> T {
    unreachable!("{NOT_RUN}")
}

/// `subgroup_invocation_id`.
pub fn subgroup_invocation() -> u32 {
    unreachable!("{NOT_RUN}")
}

/// `subgroup_size`.
pub fn subgroup_size() -> u32 {
    unreachable!("{NOT_RUN}")
}

/// `subgroup_id`.
pub fn subgroup_index() -> u32 {
    unreachable!("{NOT_RUN}")
}

/// `num_subgroups`.
pub fn subgroup_count() -> u32 {
    unreachable!("{NOT_RUN}")
}

/// WGSL's `f16`: the element of a kernel's half-precision workgroup arrays (the operands of a
/// cooperative-matrix product); written with [`to_f16`], read by the `coop_load_*` functions.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy)]
pub struct f16(PhantomData<u16>);

/// The values [`to_f16`] converts: WGSL converts each of them to `f16`.
pub trait ToHalf: Copy {}

impl ToHalf for f32 {}
impl ToHalf for i32 {}
impl ToHalf for u32 {}

/// `f16(x)`. The conversion rounds as the implementation likes where `x` has no exact half
/// (WGSL allows either neighbour), so kernels convert only values a half holds exactly
/// (integers up to 2048 in magnitude, halves unpacked from their bits).
pub fn to_f16<T: ToHalf>(_x: T) -> f16 {
    unreachable!("{NOT_RUN}")
}

/// A 16×16 `f16` matrix, the left operand `A` of [`coop_multiply_add`] (WGSL
/// `coop_mat16x16<f16, A>`), held by a subgroup together.
#[derive(Clone, Copy)]
pub struct CoopA(PhantomData<()>);

/// A 16×16 `f16` matrix, the right operand `B` of [`coop_multiply_add`] (WGSL
/// `coop_mat16x16<f16, B>`).
#[derive(Clone, Copy)]
pub struct CoopB(PhantomData<()>);

/// A 16×16 `f32` accumulator `C` (WGSL `coop_mat16x16<f32, C>`).
#[derive(Clone, Copy)]
pub struct CoopC(PhantomData<()>);

/// `coop_mat16x16<f32, C>()`: an accumulator of zeros.
pub fn coop_zero() -> CoopC {
    unreachable!("{NOT_RUN}")
}

/// `coopLoadT<coop_mat16x16<f16, A>>(&a[offset], stride)`: `A[m][k]` from `a[offset + m·stride
/// + k]` (the matrix stored row by row).
pub fn coop_load_a_rows(_a: &Workgroup<f16>, _offset: u32, _stride: u32) -> CoopA {
    unreachable!("{NOT_RUN}")
}

/// `coopLoad<coop_mat16x16<f16, B>>(&b[offset], stride)`: `B[k][n]` from `b[offset + n·stride
/// + k]` (the matrix stored column by column: each of the 16 columns' `k` values together).
pub fn coop_load_b_columns(_b: &Workgroup<f16>, _offset: u32, _stride: u32) -> CoopB {
    unreachable!("{NOT_RUN}")
}

/// `coopMultiplyAdd(a, b, c)`: `a · b + c`.
pub fn coop_multiply_add(_a: CoopA, _b: CoopB, _c: CoopC) -> CoopC {
    unreachable!("{NOT_RUN}")
}

/// `coopStore(c, &out[offset], stride)`: `C[m][n]` into `out[offset + n·stride + m]` (column
/// by column).
pub fn coop_store_columns(_c: CoopC, _out: &mut Workgroup<f32>, _offset: u32, _stride: u32) {
    unreachable!("{NOT_RUN}")
}
