//! Element types the device engines lack, re-expressed in types they have.
//!
//! NCCL and Accord's kernels know the real numeric types of 8, 32 and 64 bits and the 16-bit
//! floats. The others (`bool`, `i16`, `u16`, `c64`, `c128`) reach them re-expressed: whatever
//! only moves data moves bytes (`u8`, count x size); a complex sum or average is a sum or average
//! of its real components (`f32`/`f64`, count x 2); bool *or* and *and* are `u8` max and min
//! (bools must hold 0 or 1, as torch and CuPy store them: other bytes reduce as bytes, where the
//! host reads any non-zero byte as true). What has no such form (a complex product, a 16-bit integer reduction) is
//! refused before anything is enqueued, with the reason. The fingerprint keeps the caller's
//! type, so ranks that disagree on it are still told apart.

use super::device::DeviceSlice;
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::op::Op;

/// Whether the device engines have `dtype` itself.
pub(crate) fn native(dtype: DataType) -> bool {
    !matches!(
        dtype,
        DataType::Bool | DataType::I16 | DataType::U16 | DataType::C64 | DataType::C128
    )
}

/// `op` in types the device engines have; `None` when it already is in them.
pub(crate) fn lower(op: &Op) -> Result<Option<Op>> {
    if native(op.dtype) {
        return Ok(None);
    }
    let (dtype, reduce) = match op.reduce {
        None => (DataType::U8, None),
        Some(r) => {
            let lowered = match (op.dtype, r) {
                (DataType::C64, ReduceOp::Sum | ReduceOp::Avg) => (DataType::F32, r),
                (DataType::C128, ReduceOp::Sum | ReduceOp::Avg) => (DataType::F64, r),
                (DataType::Bool, ReduceOp::Sum | ReduceOp::Max | ReduceOp::BOr) => {
                    (DataType::U8, ReduceOp::Max)
                }
                (DataType::Bool, ReduceOp::Prod | ReduceOp::Min | ReduceOp::BAnd) => {
                    (DataType::U8, ReduceOp::Min)
                }
                (DataType::Bool, ReduceOp::BXor) => (DataType::U8, ReduceOp::BXor),
                (d, r) => return Err(unavailable(d, r)),
            };
            (lowered.0, Some(lowered.1))
        }
    };
    let k = op.dtype.size() / dtype.size();
    Ok(Some(Op {
        coll: op.coll.scaled(k),
        fp: op.fp,
        dtype,
        reduce,
        in_place: op.in_place,
    }))
}

/// Whether the device engines can reduce `dtype` with `op`, as far as types go: every pair the
/// library defines except complex products and 16-bit integers (an engine may still lack an
/// operator for every type: NCCL has no bitwise reductions).
pub fn reduces_on_device(dtype: DataType, op: ReduceOp) -> bool {
    if !op.supports(dtype) {
        return false;
    }
    match dtype {
        DataType::I16 | DataType::U16 => false,
        DataType::C64 | DataType::C128 => op != ReduceOp::Prod,
        _ => true,
    }
}

/// The same memory as elements of `to` (whose size divides the slice's element size).
pub(crate) fn view(s: DeviceSlice, to: DataType) -> DeviceSlice {
    debug_assert_eq!(s.dtype().size() % to.size(), 0);
    // SAFETY: the same bytes, counted in smaller elements.
    unsafe { DeviceSlice::from_raw(s.ptr(), s.bytes() / to.size(), to) }
}

/// A slice the device engines can move: itself, or its bytes.
pub(crate) fn movable(s: DeviceSlice) -> DeviceSlice {
    match native(s.dtype()) {
        true => s,
        false => view(s, DataType::U8),
    }
}

fn unavailable(dtype: DataType, op: ReduceOp) -> Error {
    let why = match dtype {
        DataType::I16 | DataType::U16 => {
            "NCCL and Accord's kernels have no 16-bit integers; widen to 32 bits or reduce on \
             the host"
        }
        _ => "the device engines do not multiply complex numbers; reduce on the host",
    };
    Error::invalid(format!(
        "reduce op {op} on {dtype} is not available on GPU buffers: {why}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::OpKind;
    use crate::op::{Extent, Request};

    fn allreduce(dtype: DataType, op: ReduceOp, count: usize) -> Result<Option<Op>> {
        let req = Request {
            kind: OpKind::AllReduce,
            dtype,
            reduce: Some(op),
            root: None,
            send: Some(Extent::len(count)),
            recv: Extent::len(count),
        };
        lower(&Op::new(req, 0, 2)?)
    }

    #[test]
    fn complex_sums_become_component_sums_and_keep_the_fingerprint() {
        let low = allreduce(DataType::C128, ReduceOp::Avg, 5)
            .unwrap()
            .unwrap();
        assert_eq!(
            (low.dtype, low.reduce),
            (DataType::F64, Some(ReduceOp::Avg))
        );
        assert_eq!(low.coll, crate::op::Collective::AllReduce { count: 10 });
        assert_eq!(low.fp.dtype, DataType::C128);
        let err = allreduce(DataType::C64, ReduceOp::Prod, 5).unwrap_err();
        assert!(err.to_string().contains("prod on c64"), "{err}");
        assert!(allreduce(DataType::I16, ReduceOp::Sum, 5).is_err());
    }

    #[test]
    fn bool_logic_becomes_byte_max_and_min() {
        let or = allreduce(DataType::Bool, ReduceOp::Sum, 3)
            .unwrap()
            .unwrap();
        assert_eq!((or.dtype, or.reduce), (DataType::U8, Some(ReduceOp::Max)));
        let and = allreduce(DataType::Bool, ReduceOp::Prod, 3)
            .unwrap()
            .unwrap();
        assert_eq!(and.reduce, Some(ReduceOp::Min));
        assert!(allreduce(DataType::F32, ReduceOp::Sum, 3)
            .unwrap()
            .is_none());
    }

    #[test]
    fn moved_data_becomes_bytes() {
        let s = unsafe { DeviceSlice::from_raw(64, 3, DataType::C128) };
        let b = movable(s);
        assert_eq!((b.dtype(), b.count(), b.ptr()), (DataType::U8, 48, 64));
        let f = unsafe { DeviceSlice::from_raw(64, 3, DataType::F32) };
        assert_eq!(movable(f), f);
    }
}
