//! Element types, reduction operators and the reduction loops.
//!
//! The core of Accord is type-erased: it moves `(bytes, DataType)` around. The typed front end
//! uses [`Element`] to map a Rust type to its [`DataType`]. Reductions are plain loops over slices
//! of the concrete type, which the compiler vectorises; `f16`/`bf16` are widened to `f32` per
//! element, as NCCL and Gloo do on CPUs.
//!
//! Besides the real numeric types there are `bool` (reduced as logic: sum and max are *or*,
//! product and min are *and*, as torch does) and the complex types `c64` / `c128` (numpy's
//! `complex64` / `complex128`, Rust's `Complex<f32>` / `Complex<f64>`), which sum, multiply and
//! average but have no order (no min/max) and no bits to mask.

use crate::error::{Error, Result};
use half::{bf16, f16};
pub use num_complex::Complex;
use std::fmt;

/// The element types Accord can communicate and reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DataType {
    /// IEEE half precision.
    F16 = 1,
    /// bfloat16.
    BF16 = 2,
    /// 32-bit float.
    F32 = 3,
    /// 64-bit float.
    F64 = 4,
    /// 8-bit signed integer.
    I8 = 5,
    /// 32-bit signed integer.
    I32 = 6,
    /// 64-bit signed integer.
    I64 = 7,
    /// 8-bit unsigned integer (also used for raw bytes).
    U8 = 8,
    /// 32-bit unsigned integer.
    U32 = 9,
    /// 64-bit unsigned integer.
    U64 = 10,
    /// Boolean: one byte, 0 or 1 (any non-zero byte reads as true).
    Bool = 11,
    /// 16-bit signed integer.
    I16 = 12,
    /// 16-bit unsigned integer.
    U16 = 13,
    /// Complex of two 32-bit floats, real part first (numpy's `complex64`).
    C64 = 14,
    /// Complex of two 64-bit floats, real part first (numpy's `complex128`).
    C128 = 15,
}

impl DataType {
    /// Every data type, in wire order.
    pub const ALL: [DataType; 15] = [
        DataType::F16,
        DataType::BF16,
        DataType::F32,
        DataType::F64,
        DataType::I8,
        DataType::I32,
        DataType::I64,
        DataType::U8,
        DataType::U32,
        DataType::U64,
        DataType::Bool,
        DataType::I16,
        DataType::U16,
        DataType::C64,
        DataType::C128,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 | DataType::Bool => 1,
            DataType::F16 | DataType::BF16 | DataType::I16 | DataType::U16 => 2,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F64 | DataType::I64 | DataType::U64 | DataType::C64 => 8,
            DataType::C128 => 16,
        }
    }

    /// Whether this is a real floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::BF16 | DataType::F32 | DataType::F64
        )
    }

    /// Whether this is a complex type.
    pub const fn is_complex(self) -> bool {
        matches!(self, DataType::C64 | DataType::C128)
    }

    /// Whether this is an integer type (not `bool`).
    pub const fn is_integer(self) -> bool {
        !self.is_float() && !self.is_complex() && !matches!(self, DataType::Bool)
    }

    /// The real type of one component: `f32` for `c64`, `f64` for `c128`, the type itself
    /// otherwise.
    pub const fn component(self) -> DataType {
        match self {
            DataType::C64 => DataType::F32,
            DataType::C128 => DataType::F64,
            t => t,
        }
    }

    /// Short name as used in messages and on the command line (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::F16 => "f16",
            DataType::BF16 => "bf16",
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::I8 => "i8",
            DataType::I32 => "i32",
            DataType::I64 => "i64",
            DataType::U8 => "u8",
            DataType::U32 => "u32",
            DataType::U64 => "u64",
            DataType::Bool => "bool",
            DataType::I16 => "i16",
            DataType::U16 => "u16",
            DataType::C64 => "c64",
            DataType::C128 => "c128",
        }
    }

    /// Parse a name such as `f32` or `float32`.
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.to_ascii_lowercase();
        let t = match s.as_str() {
            "f16" | "float16" | "half" => DataType::F16,
            "bf16" | "bfloat16" => DataType::BF16,
            "f32" | "float32" | "float" => DataType::F32,
            "f64" | "float64" | "double" => DataType::F64,
            "i8" | "int8" => DataType::I8,
            "i32" | "int32" => DataType::I32,
            "i64" | "int64" => DataType::I64,
            "u8" | "uint8" | "byte" => DataType::U8,
            "u32" | "uint32" => DataType::U32,
            "u64" | "uint64" => DataType::U64,
            "bool" | "boolean" => DataType::Bool,
            "i16" | "int16" | "short" => DataType::I16,
            "u16" | "uint16" => DataType::U16,
            "c64" | "complex64" | "cfloat" => DataType::C64,
            "c128" | "complex128" | "cdouble" => DataType::C128,
            _ => return Err(Error::invalid(format!("unknown data type {s:?}"))),
        };
        Ok(t)
    }

    /// Decode the wire byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| *t as u8 == v)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reduction operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum.
    Sum = 1,
    /// Product.
    Prod = 2,
    /// Minimum.
    Min = 3,
    /// Maximum.
    Max = 4,
    /// Arithmetic mean (floating and complex types only): a sum divided by the number of ranks.
    Avg = 5,
    /// Bitwise and (integer and bool types only).
    BAnd = 6,
    /// Bitwise or (integer and bool types only).
    BOr = 7,
    /// Bitwise xor (integer and bool types only).
    BXor = 8,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
        ReduceOp::BAnd,
        ReduceOp::BOr,
        ReduceOp::BXor,
    ];

    /// Lower-case name (`sum`, `band`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
            ReduceOp::BAnd => "band",
            ReduceOp::BOr => "bor",
            ReduceOp::BXor => "bxor",
        }
    }

    /// Parse a name such as `sum` or `bxor`.
    pub fn parse(s: &str) -> Result<Self> {
        let lower = s.to_ascii_lowercase();
        Self::ALL
            .iter()
            .copied()
            .find(|o| o.name() == lower)
            .ok_or_else(|| Error::invalid(format!("unknown reduce op {s:?}")))
    }

    /// Decode the wire byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.iter().copied().find(|o| *o as u8 == v)
    }

    /// Whether `self` is defined for `dtype`: avg needs a floating or complex type, bitwise
    /// ops an integer or bool one, min and max an ordered (not complex) one.
    pub fn supports(self, dtype: DataType) -> bool {
        let fractional = dtype.is_float() || dtype.is_complex();
        match self {
            ReduceOp::Avg => fractional,
            ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => !fractional,
            ReduceOp::Min | ReduceOp::Max => !dtype.is_complex(),
            ReduceOp::Sum | ReduceOp::Prod => true,
        }
    }

    /// Error unless `self` is defined for `dtype`.
    pub fn check(self, dtype: DataType) -> Result<()> {
        if self.supports(dtype) {
            return Ok(());
        }
        let why = match self {
            ReduceOp::Avg => "is defined only for floating-point and complex types",
            ReduceOp::Min | ReduceOp::Max => {
                "is not defined for complex types (they have no order)"
            }
            _ => "is defined only for integer and bool types",
        };
        Err(Error::invalid(format!(
            "reduce op {self} {why}, not {dtype}"
        )))
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type Accord can send and reduce.
///
/// # Safety
/// Implementors must be plain old data whose layout matches [`Element::DTYPE`] exactly: any bit
/// pattern of `size_of::<Self>()` bytes is a valid value and there is no padding.
pub unsafe trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The matching erased type.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        // SAFETY: primitive numeric types are Pod with the size their DataType names.
        unsafe impl Element for $t { const DTYPE: DataType = DataType::$d; }
    )*};
}
element!(f16 => F16, bf16 => BF16, f32 => F32, f64 => F64, i8 => I8, i32 => I32, i64 => I64,
         u8 => U8, u32 => U32, u64 => U64, i16 => I16, u16 => U16,
         Complex<f32> => C64, Complex<f64> => C128);

/// View a typed slice as bytes.
pub fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

/// View a typed mutable slice as bytes.
pub fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

/// `dst[i] = dst[i] op src[i]` over raw bytes of type `dtype`.
///
/// Both slices must have the same length, a multiple of the element size. `Avg` accumulates a
/// sum here; [`finalize`] divides once all contributions are in.
pub fn reduce_into(dtype: DataType, op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "reduce_into: length mismatch");
    debug_assert_eq!(dst.len() % dtype.size(), 0);
    match dtype {
        DataType::F16 => reduce_half::<f16>(op, dst, src),
        DataType::BF16 => reduce_half::<bf16>(op, dst, src),
        DataType::F32 => reduce_typed::<f32>(op, dst, src),
        DataType::F64 => reduce_typed::<f64>(op, dst, src),
        DataType::I8 => reduce_typed::<i8>(op, dst, src),
        DataType::I32 => reduce_typed::<i32>(op, dst, src),
        DataType::I64 => reduce_typed::<i64>(op, dst, src),
        DataType::U8 => reduce_typed::<u8>(op, dst, src),
        DataType::U32 => reduce_typed::<u32>(op, dst, src),
        DataType::U64 => reduce_typed::<u64>(op, dst, src),
        DataType::I16 => reduce_typed::<i16>(op, dst, src),
        DataType::U16 => reduce_typed::<u16>(op, dst, src),
        DataType::C64 => reduce_typed::<Complex<f32>>(op, dst, src),
        DataType::C128 => reduce_typed::<Complex<f64>>(op, dst, src),
        DataType::Bool => reduce_bool(op, dst, src),
    }
}

/// Bools reduce as logic on truth values (any non-zero byte is true) and always store 0 or 1:
/// sum and max are *or*, product and min are *and*.
fn reduce_bool(op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    let f: fn(bool, bool) -> bool = match op {
        ReduceOp::Sum | ReduceOp::Max | ReduceOp::BOr => |a, b| a | b,
        ReduceOp::Prod | ReduceOp::Min | ReduceOp::BAnd => |a, b| a & b,
        ReduceOp::BXor => |a, b| a ^ b,
        ReduceOp::Avg => unreachable!("avg is rejected for bool before any data moves"),
    };
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d != 0, *s != 0) as u8;
    }
}

/// Apply the operator's final step to a fully reduced buffer: `Avg` divides by `world`.
pub fn finalize(dtype: DataType, op: ReduceOp, buf: &mut [u8], world: usize) {
    if op != ReduceOp::Avg {
        return;
    }
    let n = world as f64;
    match dtype {
        DataType::F16 => map_half::<f16>(buf, |x| x / n as f32),
        DataType::BF16 => map_half::<bf16>(buf, |x| x / n as f32),
        DataType::F32 | DataType::C64 => {
            with_typed_mut::<f32>(buf, |s| s.iter_mut().for_each(|x| *x /= n as f32))
        }
        DataType::F64 | DataType::C128 => {
            with_typed_mut::<f64>(buf, |s| s.iter_mut().for_each(|x| *x /= n))
        }
        _ => unreachable!("avg is rejected for integer types before any data moves"),
    }
}

/// Arithmetic that every element type supports; integers wrap like NCCL and MPI do.
trait Arith: bytemuck::Pod {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn band(self, o: Self) -> Self;
    fn bor(self, o: Self) -> Self;
    fn bxor(self, o: Self) -> Self;
}

macro_rules! arith_int {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)] fn min(self, o: Self) -> Self { Ord::min(self, o) }
            #[inline(always)] fn max(self, o: Self) -> Self { Ord::max(self, o) }
            #[inline(always)] fn band(self, o: Self) -> Self { self & o }
            #[inline(always)] fn bor(self, o: Self) -> Self { self | o }
            #[inline(always)] fn bxor(self, o: Self) -> Self { self ^ o }
        }
    )*};
}
arith_int!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! arith_float {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self + o }
            #[inline(always)] fn mul(self, o: Self) -> Self { self * o }
            // NaN-propagating min/max, like torch: a NaN anywhere stays visible. Both operand
            // orders give the same bits (two ranks of a recursive doubling reduce a pair in
            // opposite orders): -0 is below +0, and of two NaNs the larger bit pattern wins.
            #[inline(always)] fn min(self, o: Self) -> Self {
                if self.is_nan() || o.is_nan() { self.either_nan(o) }
                else if self < o || (self == o && self.is_sign_negative()) { self } else { o }
            }
            #[inline(always)] fn max(self, o: Self) -> Self {
                if self.is_nan() || o.is_nan() { self.either_nan(o) }
                else if self > o || (self == o && self.is_sign_positive()) { self } else { o }
            }
            fn band(self, _: Self) -> Self { unreachable!("bitwise op on float") }
            fn bor(self, _: Self) -> Self { unreachable!("bitwise op on float") }
            fn bxor(self, _: Self) -> Self { unreachable!("bitwise op on float") }
        }
    )*};
}
arith_float!(f32, f64);

/// Of two floats at least one of which is NaN, the NaN with the larger bit pattern: the same
/// whichever comes first.
trait EitherNan: Sized {
    fn either_nan(self, o: Self) -> Self;
}
macro_rules! either_nan {
    ($($t:ty),*) => {$(
        impl EitherNan for $t {
            #[inline(always)]
            fn either_nan(self, o: Self) -> Self {
                if o.is_nan() && (!self.is_nan() || o.to_bits() > self.to_bits()) { o } else { self }
            }
        }
    )*};
}
either_nan!(f32, f64);

macro_rules! arith_complex {
    ($($t:ty),*) => {$(
        impl Arith for Complex<$t> {
            #[inline(always)] fn add(self, o: Self) -> Self { self + o }
            #[inline(always)] fn mul(self, o: Self) -> Self { self * o }
            fn min(self, _: Self) -> Self { unreachable!("min of complex numbers") }
            fn max(self, _: Self) -> Self { unreachable!("max of complex numbers") }
            fn band(self, _: Self) -> Self { unreachable!("bitwise op on complex") }
            fn bor(self, _: Self) -> Self { unreachable!("bitwise op on complex") }
            fn bxor(self, _: Self) -> Self { unreachable!("bitwise op on complex") }
        }
    )*};
}
arith_complex!(f32, f64);

#[inline(always)]
fn zip_apply<T: Arith>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

fn reduce_slices<T: Arith>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => zip_apply(dst, src, T::add),
        ReduceOp::Prod => zip_apply(dst, src, T::mul),
        ReduceOp::Min => zip_apply(dst, src, T::min),
        ReduceOp::Max => zip_apply(dst, src, T::max),
        ReduceOp::BAnd => zip_apply(dst, src, T::band),
        ReduceOp::BOr => zip_apply(dst, src, T::bor),
        ReduceOp::BXor => zip_apply(dst, src, T::bxor),
    }
}

fn reduce_typed<T: Arith>(op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    match (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        (Ok(d), Ok(s)) => reduce_slices(op, d, s),
        // Unaligned user memory (possible through the erased API): work on aligned copies.
        (d, s) => {
            let _ = (d, s);
            let mut d: Vec<T> = bytemuck::pod_collect_to_vec(dst);
            let s: Vec<T> = bytemuck::pod_collect_to_vec(src);
            reduce_slices(op, &mut d, &s);
            dst.copy_from_slice(bytemuck::cast_slice(&d));
        }
    }
}

/// The two 16-bit float types, reduced through `f32`.
trait HalfLike: bytemuck::Pod {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}
impl HalfLike for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl HalfLike for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

fn reduce_half<H: HalfLike>(op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    let f: fn(f32, f32) -> f32 = match op {
        ReduceOp::Sum | ReduceOp::Avg => |a, b| a + b,
        ReduceOp::Prod => |a, b| a * b,
        ReduceOp::Min => <f32 as Arith>::min,
        ReduceOp::Max => <f32 as Arith>::max,
        _ => unreachable!("bitwise op on a 16-bit float"),
    };
    for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(2)) {
        let a = H::to_f32(bytemuck::pod_read_unaligned(d));
        let b = H::to_f32(bytemuck::pod_read_unaligned(s));
        d.copy_from_slice(bytemuck::bytes_of(&H::from_f32(f(a, b))));
    }
}

/// The 16-bit float type that `dtype` averages through `f32`, if it is one: a sum of
/// representable values may not be representable (two ranks averaging 60000 in f16 would
/// reach inf before the division), so such averages are computed wide, as NCCL and torch
/// accumulate half precision in f32.
pub(crate) fn averages_wide(dtype: DataType, op: ReduceOp) -> bool {
    op == ReduceOp::Avg && matches!(dtype, DataType::F16 | DataType::BF16)
}

/// 16-bit floats (`F16`/`BF16` bytes) as the bytes of `f32` values.
pub(crate) fn widen_half(dtype: DataType, src: &[u8]) -> Vec<u8> {
    let to_f32: fn([u8; 2]) -> f32 = match dtype {
        DataType::F16 => |b| f16::from_le_bytes(b).to_f32(),
        DataType::BF16 => |b| bf16::from_le_bytes(b).to_f32(),
        _ => unreachable!("only 16-bit floats widen"),
    };
    let mut out = Vec::with_capacity(src.len() * 2);
    for c in src.chunks_exact(2) {
        out.extend_from_slice(&to_f32([c[0], c[1]]).to_le_bytes());
    }
    out
}

/// The inverse of [`widen_half`]: `f32` bytes rounded into `dst` (`F16`/`BF16` bytes).
pub(crate) fn narrow_half(dtype: DataType, src: &[u8], dst: &mut [u8]) {
    debug_assert_eq!(src.len(), dst.len() * 2);
    let from_f32: fn(f32) -> [u8; 2] = match dtype {
        DataType::F16 => |x| f16::from_f32(x).to_le_bytes(),
        DataType::BF16 => |x| bf16::from_f32(x).to_le_bytes(),
        _ => unreachable!("only 16-bit floats narrow"),
    };
    for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(4)) {
        d.copy_from_slice(&from_f32(f32::from_le_bytes([s[0], s[1], s[2], s[3]])));
    }
}

fn map_half<H: HalfLike>(buf: &mut [u8], f: impl Fn(f32) -> f32) {
    for d in buf.chunks_exact_mut(2) {
        let a = H::to_f32(bytemuck::pod_read_unaligned(d));
        d.copy_from_slice(bytemuck::bytes_of(&H::from_f32(f(a))));
    }
}

fn with_typed_mut<T: bytemuck::Pod>(buf: &mut [u8], f: impl FnOnce(&mut [T])) {
    match bytemuck::try_cast_slice_mut::<u8, T>(buf) {
        Ok(s) => f(s),
        Err(_) => {
            let mut v: Vec<T> = bytemuck::pod_collect_to_vec(buf);
            f(&mut v);
            buf.copy_from_slice(bytemuck::cast_slice(&v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ranks of a recursive doubling reduce a pair in opposite orders and must still end
    /// with the same bits: signed zeros and NaN payloads included.
    #[test]
    fn min_and_max_give_the_same_bits_in_either_order() {
        let nan_a = f64::from_bits(0x7ff8_0000_0000_0001);
        let nan_b = f64::from_bits(0xfff8_0000_0000_0002);
        let vals = [
            0.0,
            -0.0,
            1.5,
            -1.5,
            f64::INFINITY,
            f64::NEG_INFINITY,
            nan_a,
            nan_b,
        ];
        for op in [ReduceOp::Min, ReduceOp::Max] {
            for a in vals {
                for b in vals {
                    for dtype in [DataType::F64, DataType::F32, DataType::F16, DataType::BF16] {
                        let bytes = |v: f64| -> Vec<u8> {
                            match dtype {
                                DataType::F64 => v.to_le_bytes().to_vec(),
                                DataType::F32 => (v as f32).to_le_bytes().to_vec(),
                                DataType::F16 => f16::from_f64(v).to_le_bytes().to_vec(),
                                _ => bf16::from_f64(v).to_le_bytes().to_vec(),
                            }
                        };
                        let (mut ab, mut ba) = (bytes(a), bytes(b));
                        reduce_into(dtype, op, &mut ab, &bytes(b));
                        reduce_into(dtype, op, &mut ba, &bytes(a));
                        assert_eq!(ab, ba, "{op:?} {dtype:?} of {a} and {b}");
                    }
                }
            }
            let mut lo = 0.0f64.to_le_bytes();
            reduce_into(DataType::F64, op, &mut lo, &(-0.0f64).to_le_bytes());
            let want = if op == ReduceOp::Min { -0.0f64 } else { 0.0 };
            assert_eq!(lo, want.to_le_bytes(), "{op:?} of signed zeros");
        }
    }

    #[test]
    fn sizes_and_names_round_trip() {
        for t in DataType::ALL {
            assert_eq!(DataType::parse(t.name()).unwrap(), t);
            assert_eq!(DataType::from_u8(t as u8), Some(t));
        }
        for o in ReduceOp::ALL {
            assert_eq!(ReduceOp::parse(o.name()).unwrap(), o);
        }
        assert!(DataType::parse("f128").is_err());
    }

    #[test]
    fn op_type_compatibility() {
        assert!(ReduceOp::Avg.check(DataType::I32).is_err());
        assert!(ReduceOp::BXor.check(DataType::F32).is_err());
        assert!(ReduceOp::BXor.check(DataType::U8).is_ok());
        let msg = ReduceOp::Avg.check(DataType::I64).unwrap_err().to_string();
        assert!(msg.contains("avg") && msg.contains("i64"), "{msg}");
    }

    #[test]
    fn integer_ops() {
        let mut d = [6i32, -3, 7];
        let s = [3i32, 5, -1];
        let cases = [
            (ReduceOp::Sum, [9, 2, 6]),
            (ReduceOp::Prod, [18, -15, -7]),
            (ReduceOp::Min, [3, -3, -1]),
            (ReduceOp::Max, [6, 5, 7]),
            (ReduceOp::BAnd, [6 & 3, -3 & 5, 7]),
            (ReduceOp::BOr, [6 | 3, -3 | 5, 7 | -1]),
            (ReduceOp::BXor, [6 ^ 3, -3 ^ 5, 7 ^ -1]),
        ];
        for (op, want) in cases {
            let mut x = d;
            reduce_into(DataType::I32, op, as_bytes_mut(&mut x), as_bytes(&s));
            assert_eq!(x, want, "{op}");
        }
        reduce_into(
            DataType::I32,
            ReduceOp::Sum,
            as_bytes_mut(&mut d),
            as_bytes(&s),
        );
    }

    #[test]
    fn half_and_avg() {
        let mut d = [bf16::from_f32(1.5), bf16::from_f32(-2.0)];
        let s = [bf16::from_f32(2.5), bf16::from_f32(4.0)];
        reduce_into(
            DataType::BF16,
            ReduceOp::Avg,
            as_bytes_mut(&mut d),
            as_bytes(&s),
        );
        finalize(DataType::BF16, ReduceOp::Avg, as_bytes_mut(&mut d), 2);
        assert_eq!(d.map(|x| x.to_f32()), [2.0, 1.0]);
    }

    #[test]
    fn bool_reduces_as_logic_and_stores_zero_or_one() {
        let (a, b) = ([0u8, 0, 1, 1, 2, 7], [0u8, 1, 0, 1, 3, 0]);
        let cases = [
            (ReduceOp::Sum, [0, 1, 1, 1, 1, 1]),
            (ReduceOp::Max, [0, 1, 1, 1, 1, 1]),
            (ReduceOp::BOr, [0, 1, 1, 1, 1, 1]),
            (ReduceOp::Prod, [0, 0, 0, 1, 1, 0]),
            (ReduceOp::Min, [0, 0, 0, 1, 1, 0]),
            (ReduceOp::BAnd, [0, 0, 0, 1, 1, 0]),
            (ReduceOp::BXor, [0, 1, 1, 0, 0, 1]),
        ];
        for (op, want) in cases {
            let mut x = a;
            reduce_into(DataType::Bool, op, &mut x, &b);
            assert_eq!(x, want, "{op}");
        }
        assert!(ReduceOp::Avg.check(DataType::Bool).is_err());
    }

    #[test]
    fn complex_sum_prod_avg_and_no_order() {
        let mut d = [Complex::new(1.0f32, 2.0), Complex::new(-1.0, 0.5)];
        let s = [Complex::new(3.0f32, -1.0), Complex::new(2.0, 2.0)];
        let mut p = d;
        reduce_into(
            DataType::C64,
            ReduceOp::Prod,
            as_bytes_mut(&mut p),
            as_bytes(&s),
        );
        assert_eq!(p, [Complex::new(5.0, 5.0), Complex::new(-3.0, -1.0)]);
        reduce_into(
            DataType::C64,
            ReduceOp::Avg,
            as_bytes_mut(&mut d),
            as_bytes(&s),
        );
        finalize(DataType::C64, ReduceOp::Avg, as_bytes_mut(&mut d), 2);
        assert_eq!(d, [Complex::new(2.0, 0.5), Complex::new(0.5, 1.25)]);
        let mut w = [Complex::new(1.0f64, -1.0)];
        let c = w;
        reduce_into(
            DataType::C128,
            ReduceOp::Sum,
            as_bytes_mut(&mut w),
            as_bytes(&c),
        );
        assert_eq!(w, [Complex::new(2.0, -2.0)]);
        for op in [ReduceOp::Min, ReduceOp::Max, ReduceOp::BXor] {
            let msg = op.check(DataType::C128).unwrap_err().to_string();
            assert!(msg.contains("c128") && msg.contains(op.name()), "{msg}");
        }
    }

    #[test]
    fn sixteen_bit_integers_wrap() {
        let mut d = [i16::MAX, -2];
        reduce_into(
            DataType::I16,
            ReduceOp::Sum,
            as_bytes_mut(&mut d),
            as_bytes(&[1i16, -3]),
        );
        assert_eq!(d, [i16::MIN, -5]);
        let mut u = [40000u16, 3];
        reduce_into(
            DataType::U16,
            ReduceOp::Max,
            as_bytes_mut(&mut u),
            as_bytes(&[2u16, 9]),
        );
        assert_eq!(u, [40000, 9]);
    }

    #[test]
    fn unaligned_reduce() {
        let mut raw = [0u8; 17];
        let src = [1.0f64, 2.0];
        raw[1..17].copy_from_slice(as_bytes(&[3.0f64, 4.0]));
        reduce_into(
            DataType::F64,
            ReduceOp::Prod,
            &mut raw[1..17],
            as_bytes(&src),
        );
        let out: Vec<f64> = bytemuck::pod_collect_to_vec(&raw[1..17]);
        assert_eq!(out, [3.0, 8.0]);
    }
}
