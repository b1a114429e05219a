//! Scan and exscan on NCCL, which has neither: one reduce-scatter over a scratch array of one
//! block per rank. Rank `q` puts its input in the blocks of the ranks whose prefix includes it
//! (`r >= q`, or `r > q` for exscan) and the operator's identity in the others, so block `r` of
//! the reduction is rank `r`'s prefix. It moves `p` times the data of a recursive-doubling scan,
//! but stays on the stream, inside NCCL's deadlines and aborts, with NCCL's reductions.

use crate::dtype::{DataType, ReduceOp};
use crate::error::Result;
use crate::gpu::cuda::{CuStream, Driver};

/// The bit pattern of `op`'s identity element in `dtype` and its width in bytes: `x op id == x`
/// for every `x`. `None` for operators without one here (avg and the bitwise ones, which NCCL
/// does not have).
pub(super) fn identity(dtype: DataType, op: ReduceOp) -> Option<(usize, u64)> {
    use DataType as D;
    let w = dtype.size();
    let bits = match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => match dtype {
            D::F16 => 0x3c00,
            D::BF16 => 0x3f80,
            D::F32 => 1f32.to_bits() as u64,
            D::F64 => 1f64.to_bits(),
            _ => 1,
        },
        // The largest value (+inf for floats), and the smallest for max.
        ReduceOp::Min => match dtype {
            D::F16 => 0x7c00,
            D::BF16 => 0x7f80,
            D::F32 => f32::INFINITY.to_bits() as u64,
            D::F64 => f64::INFINITY.to_bits(),
            D::I8 => i8::MAX as u64,
            D::I16 => i16::MAX as u64,
            D::I32 => i32::MAX as u64,
            D::I64 => i64::MAX as u64,
            _ => u64::MAX >> (64 - 8 * w),
        },
        ReduceOp::Max => match dtype {
            D::F16 => 0xfc00,
            D::BF16 => 0xff80,
            D::F32 => f32::NEG_INFINITY.to_bits() as u64,
            D::F64 => f64::NEG_INFINITY.to_bits(),
            D::I8 | D::I16 | D::I32 | D::I64 => 1u64 << (8 * w - 1),
            _ => 0,
        },
        ReduceOp::Avg | ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => return None,
    };
    Some((w, bits))
}

/// Fill `count` elements of `width` bytes at `dst` with `bits`, on stream `s`.
pub(super) fn fill(
    cu: &Driver,
    dst: u64,
    width: usize,
    bits: u64,
    count: usize,
    s: CuStream,
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    // SAFETY (every call): `dst` holds `count` elements of `width` bytes (the caller's scratch).
    let rc = unsafe {
        match width {
            1 => (cu.memset_d8_async)(dst, bits as u8, count, s),
            2 => (cu.memset_d16_async)(dst, bits as u16, count, s),
            4 => (cu.memset_d32_async)(dst, bits as u32, count, s),
            _ => {
                // Two 32-bit halves, each every 8 bytes: a 2-D memset of one word per row.
                let (lo, hi) = (bits as u32, (bits >> 32) as u32);
                let rc = (cu.memset_d2d32_async)(dst, 8, lo, 1, count, s);
                if rc != 0 {
                    rc
                } else {
                    (cu.memset_d2d32_async)(dst + 4, 8, hi, 1, count, s)
                }
            }
        }
    };
    cu.check(rc, "cuMemsetAsync")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::reduce_into;

    #[test]
    fn identities_leave_every_value_unchanged() {
        let natives = &DataType::ALL[..10];
        for &d in natives {
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                let (w, bits) = identity(d, op).unwrap();
                assert_eq!(w, d.size());
                let id = bits.to_le_bytes()[..w].to_vec();
                // Values of every sign and size, as raw bytes of the type.
                for seed in 0u64..64 {
                    let x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes()[..w].to_vec();
                    if d.is_float() && f64_of(d, &x).is_nan() {
                        continue;
                    }
                    let mut y = x.clone();
                    reduce_into(d, op, &mut y, &id);
                    let same = y == x || (d.is_float() && f64_of(d, &y) == f64_of(d, &x));
                    assert!(same, "{d} {op}: {x:?} became {y:?}");
                }
            }
        }
        assert_eq!(identity(DataType::F32, ReduceOp::Avg), None);
    }

    fn f64_of(d: DataType, b: &[u8]) -> f64 {
        match d {
            DataType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
            DataType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
            DataType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
            _ => f64::from_le_bytes(b.try_into().unwrap()),
        }
    }
}
