//! Element types, reduce operators and streams as C sees them: plain integers with named
//! constants (a C enum holding a value Rust does not know would be undefined behaviour), checked
//! on the way in.

use crate::status::invalid;
use accord::{DataType, ReduceOp};
use std::ffi::{c_int, c_void};

/// An element type: one of the `ACCORD_<TYPE>` constants (the values of Accord's wire codes).
#[allow(non_camel_case_types)]
pub type accord_dtype_t = c_int;

/// IEEE half precision.
pub const ACCORD_FLOAT16: accord_dtype_t = 1;
/// bfloat16.
pub const ACCORD_BFLOAT16: accord_dtype_t = 2;
/// 32-bit float.
pub const ACCORD_FLOAT32: accord_dtype_t = 3;
/// 64-bit float.
pub const ACCORD_FLOAT64: accord_dtype_t = 4;
/// 8-bit signed integer.
pub const ACCORD_INT8: accord_dtype_t = 5;
/// 32-bit signed integer.
pub const ACCORD_INT32: accord_dtype_t = 6;
/// 64-bit signed integer.
pub const ACCORD_INT64: accord_dtype_t = 7;
/// 8-bit unsigned integer (also raw bytes).
pub const ACCORD_UINT8: accord_dtype_t = 8;
/// 32-bit unsigned integer.
pub const ACCORD_UINT32: accord_dtype_t = 9;
/// 64-bit unsigned integer.
pub const ACCORD_UINT64: accord_dtype_t = 10;
/// One byte, 0 or 1.
pub const ACCORD_BOOL: accord_dtype_t = 11;
/// 16-bit signed integer.
pub const ACCORD_INT16: accord_dtype_t = 12;
/// 16-bit unsigned integer.
pub const ACCORD_UINT16: accord_dtype_t = 13;
/// Two 32-bit floats, real part first.
pub const ACCORD_COMPLEX64: accord_dtype_t = 14;
/// Two 64-bit floats, real part first.
pub const ACCORD_COMPLEX128: accord_dtype_t = 15;

/// A reduce operator: one of the `ACCORD_<OP>` constants.
#[allow(non_camel_case_types)]
pub type accord_op_t = c_int;

/// Sum.
pub const ACCORD_SUM: accord_op_t = 1;
/// Product.
pub const ACCORD_PROD: accord_op_t = 2;
/// Minimum.
pub const ACCORD_MIN: accord_op_t = 3;
/// Maximum.
pub const ACCORD_MAX: accord_op_t = 4;
/// Mean over the ranks (floating and complex types).
pub const ACCORD_AVG: accord_op_t = 5;
/// Bitwise and (integer and bool types).
pub const ACCORD_BAND: accord_op_t = 6;
/// Bitwise or (integer and bool types).
pub const ACCORD_BOR: accord_op_t = 7;
/// Bitwise xor (integer and bool types).
pub const ACCORD_BXOR: accord_op_t = 8;

/// The color that leaves a rank out of `accord_comm_split` (MPI's `MPI_UNDEFINED`).
pub const ACCORD_UNDEFINED: c_int = -1;

/// A CUDA stream (`cudaStream_t` / `CUstream`; NULL: the legacy default stream). Ignored for
/// host memory.
#[allow(non_camel_case_types)]
pub type accord_stream_t = *mut c_void;

pub(crate) fn dtype(d: accord_dtype_t) -> accord::Result<DataType> {
    u8::try_from(d)
        .ok()
        .and_then(DataType::from_u8)
        .ok_or_else(|| {
            invalid(format!(
                "dtype {d} is not one of the ACCORD_<TYPE> constants"
            ))
        })
}

pub(crate) fn op(o: accord_op_t) -> accord::Result<ReduceOp> {
    u8::try_from(o)
        .ok()
        .and_then(ReduceOp::from_u8)
        .ok_or_else(|| invalid(format!("op {o} is not one of the ACCORD_<OP> constants")))
}

/// A rank argument (`root`, `peer`) of a communicator of `size` ranks.
pub(crate) fn rank(r: c_int, what: &str, size: usize) -> accord::Result<usize> {
    usize::try_from(r)
        .ok()
        .filter(|&r| r < size)
        .ok_or_else(|| {
            invalid(format!(
                "{what} {r} is not a rank of this {size}-rank communicator"
            ))
        })
}

/// A message tag (0 or more).
pub(crate) fn tag(t: c_int) -> accord::Result<u32> {
    u32::try_from(t).map_err(|_| invalid(format!("tag {t} is negative")))
}
