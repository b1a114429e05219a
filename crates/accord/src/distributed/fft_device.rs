//! The device side of [`DistributedFft`]: cuFFT for the local transforms, 3-D copies and the
//! device engine's alltoallv for the moves, all on the caller's stream.

use super::device::{scale, DeviceLines};
use super::fft::{Direction, DistributedFft, Stage};
use super::redistribute_device::{attached, Scratch};
use crate::buffer::{RecvBuf, SendBuf};
use crate::comm::{Communicator, Completion};
use crate::error::Result;
use crate::gpu::{DeviceSlice, Stream};
use std::sync::Arc;

impl DistributedFft {
    /// Run the stages on `stream` through two work buffers allocated in stream order; the
    /// completion covers the whole transform.
    pub(super) fn device(
        &self,
        comm: &Communicator,
        src: DeviceSlice,
        dst: DeviceSlice,
        stream: Stream,
        direction: Direction,
        factor: f64,
    ) -> Result<Completion> {
        let (ordinal, raw, cu) = attached(comm, stream)?;
        let most = self.largest_stage_bytes();
        let (mut a, mut b) = (Scratch::new(cu, most, raw)?, Scratch::new(cu, most, raw)?);
        // As on the host: the last stage that writes a new array writes it into `dst` when only
        // in-place transforms follow (cuFFT wants them aligned to the complex size), saving a
        // copy of the array; with no such stage the transforms run in `dst` from the start.
        let n = self.stages.len();
        let last_fresh = self.stages.iter().rposition(Stage::writes_new_array);
        let aligned = dst.ptr().is_multiple_of(16);
        let mut in_dst = aligned && last_fresh.is_none();
        let mut len = src.bytes();
        copy(
            cu,
            if in_dst { dst.ptr() } else { a.ptr },
            src.ptr(),
            len,
            raw,
        )?;
        for (i, stage) in self.stages.iter().enumerate() {
            let to_dst = Some(i) == last_fresh && (aligned || i + 1 == n);
            match stage {
                Stage::Lines(t) => {
                    let out_len = t.output_shape().iter().product::<usize>() * t.output_element();
                    if out_len > 0 {
                        let lines = self.device_lines(i, t, direction, ordinal)?;
                        let here = if in_dst { dst.ptr() } else { a.ptr };
                        if !stage.writes_new_array() {
                            // SAFETY: `here` holds the stage's input, transformed in place.
                            unsafe { lines.run(here, here, raw)? };
                        } else if to_dst {
                            // SAFETY: `a` holds the input, `dst` is the output of its size.
                            unsafe { lines.run(a.ptr, dst.ptr(), raw)? };
                        } else {
                            // SAFETY: `a` holds the input, `b` has room for the output.
                            unsafe { lines.run(a.ptr, b.ptr, raw)? };
                            std::mem::swap(&mut a, &mut b);
                        }
                    }
                    in_dst |= to_dst;
                    len = out_len;
                    if Some(i) == self.last_lines && factor != 1.0 && len > 0 {
                        let reals = len / self.precision.real_size();
                        let here = if in_dst { dst.ptr() } else { a.ptr };
                        // SAFETY: `here` holds `len` bytes of the transform's numbers.
                        unsafe { scale(ordinal, here, reals, self.precision, factor, raw)? };
                    }
                }
                Stage::Move(m) => {
                    let unit = m.dtype.size();
                    // SAFETY: `a` holds `len` bytes, the stage's input (a move never reads
                    // `dst`: only in-place stages follow the one that fills it).
                    let from = unsafe { DeviceSlice::from_raw(a.ptr, len / unit, m.dtype) };
                    let send = SendBuf::device(from, stream);
                    if to_dst && i + 1 == n {
                        return m.execute(comm, send, RecvBuf::device(dst, stream));
                    }
                    let out_len = m.output_shape().iter().product::<usize>() * unit;
                    let target = if to_dst { dst.ptr() } else { b.ptr };
                    // SAFETY: `target` has room for the stage's output.
                    let to = unsafe { DeviceSlice::from_raw(target, out_len / unit, m.dtype) };
                    m.execute(comm, send, RecvBuf::device(to, stream))?;
                    match to_dst {
                        true => in_dst = true,
                        false => std::mem::swap(&mut a, &mut b),
                    }
                    len = out_len;
                }
            }
        }
        if !in_dst {
            copy(cu, dst.ptr(), a.ptr, len, raw)?;
        }
        comm.stream_completion(stream)
    }

    /// The largest array any stage reads or writes on this rank, in bytes.
    fn largest_stage_bytes(&self) -> usize {
        let (i, o) = self.types();
        let ends = [
            self.input_shape().iter().product::<usize>() * i.size(),
            self.output_shape().iter().product::<usize>() * o.size(),
        ];
        self.stages
            .iter()
            .map(|s| match s {
                Stage::Lines(t) => {
                    let n = |shape: Vec<usize>, e: usize| shape.iter().product::<usize>() * e;
                    n(t.shape.clone(), t.input_element())
                        .max(n(t.output_shape(), t.output_element()))
                }
                Stage::Move(m) => {
                    let e = m.dtype.size();
                    (m.input_shape().iter().product::<usize>() * e)
                        .max(m.output_shape().iter().product::<usize>() * e)
                }
            })
            .chain(ends)
            .max()
            .unwrap_or(0)
    }

    fn device_lines(
        &self,
        i: usize,
        t: &super::lines::LineTransform,
        direction: Direction,
        ordinal: usize,
    ) -> Result<Arc<DeviceLines>> {
        let mut plans = self.device_plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plans.get(&(i, direction, ordinal)) {
            return Ok(p.clone());
        }
        let p = Arc::new(DeviceLines::new(&Self::oriented(t, direction), ordinal)?);
        plans.insert((i, direction, ordinal), p.clone());
        Ok(p)
    }
}

/// A stream-ordered device-to-device copy of `len` bytes.
fn copy(
    cu: &crate::gpu::cuda::Driver,
    dst: u64,
    src: u64,
    len: usize,
    stream: usize,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: both ranges are live device allocations of at least `len` bytes.
    let rc = unsafe { (cu.memcpy_dtod_async)(dst, src, len, stream as _) };
    cu.check(rc, "cuMemcpyDtoDAsync (FFT work buffer)")
}
