//! The device side of [`Redistribute`]: blocks packed and unpacked with 3-D copies on the
//! caller's stream, around the device engine's alltoallv on the same stream.

use super::device::{copy_3d, Copy3d};
use super::redistribute::Redistribute;
use super::subarray::{walk, BlockCopy};
use crate::buffer::{Parts, RecvBuf, SendBuf};
use crate::comm::{Communicator, Completion};
use crate::error::Result;
use crate::gpu::cuda::Driver;
use crate::gpu::{DeviceSlice, Stream};

impl Redistribute {
    /// Pack, exchange and unpack on `stream`; the completion covers the unpacking too.
    pub(super) fn device(
        &self,
        comm: &Communicator,
        src: DeviceSlice,
        dst: DeviceSlice,
        stream: Stream,
    ) -> Result<Completion> {
        let (ordinal, raw, cu) = attached(comm, stream)?;
        let (send, recv) = (&self.send, &self.recv);
        let scratch = Scratch::new(cu, send.packed * !send.direct as usize, raw)?;
        let scratch_recv = Scratch::new(cu, recv.packed * !recv.direct as usize, raw)?;
        let dtype = self.dtype;
        let unit = dtype.size();
        let as_slice = |ptr: u64, bytes: usize| {
            // SAFETY: a live allocation of `bytes` (the caller's array or our scratch).
            unsafe { DeviceSlice::from_raw(ptr, bytes / unit, dtype) }
        };
        let send_buf = if send.direct {
            src
        } else {
            for c in send.copies.iter().flatten() {
                // SAFETY: both ranges lie inside the caller's input and the packed buffer.
                unsafe { run_copy(ordinal, c, src.ptr(), scratch.ptr, raw)? };
            }
            as_slice(scratch.ptr, send.packed)
        };
        let recv_buf = if recv.direct {
            dst
        } else {
            as_slice(scratch_recv.ptr, recv.packed)
        };
        let exchanged = comm.all_to_all(
            Parts::new(SendBuf::device(send_buf, stream), &send.counts),
            Parts::new(RecvBuf::device(recv_buf, stream), &recv.counts),
        )?;
        if recv.direct {
            return Ok(exchanged);
        }
        for c in recv.copies.iter().flatten() {
            // SAFETY: both ranges lie inside the packed buffer and the caller's output.
            unsafe { run_copy(ordinal, c, scratch_recv.ptr, dst.ptr(), raw)? };
        }
        drop((scratch, scratch_recv));
        comm.stream_completion(stream)
    }
}

/// The attached device's ordinal, `stream` as a raw `CUstream`, and the driver, with the
/// device's context made current on this thread: what every device step of a plan needs.
pub(super) fn attached(
    comm: &Communicator,
    stream: Stream,
) -> Result<(usize, usize, &'static Driver)> {
    let engine = comm.device_engine()?;
    let (cu, ctx) = engine.context();
    cu.make_current(ctx as _)?;
    Ok((engine.device(), engine.raw_stream(stream), cu))
}

/// A packing buffer allocated and freed in stream order (`cuMemAllocAsync`), so that freeing it
/// right after enqueueing the work that uses it is safe.
pub(super) struct Scratch {
    cu: &'static Driver,
    pub(super) ptr: u64,
    stream: usize,
}

impl Scratch {
    pub(super) fn new(cu: &'static Driver, bytes: usize, stream: usize) -> Result<Scratch> {
        let mut ptr = 0;
        if bytes > 0 {
            // SAFETY: an out-pointer to a local; the stream is live.
            let rc = unsafe { (cu.mem_alloc_async)(&mut ptr, bytes, stream as _) };
            cu.check(rc, "cuMemAllocAsync (redistribute packing buffer)")?;
        }
        Ok(Scratch { cu, ptr, stream })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.ptr != 0 {
            // SAFETY: allocated on this stream by `new`; every use was enqueued before.
            unsafe { (self.cu.mem_free_async)(self.ptr, self.stream as _) };
        }
    }
}

/// Run one block copy as 3-D device copies: the two innermost loops of the nest become the
/// copy's rows and planes, any further loops repeat it.
///
/// # Safety
/// `src + c.src_offset` and `dst + c.dst_offset` start ranges the nest stays inside.
unsafe fn run_copy(ordinal: usize, c: &BlockCopy, src: u64, dst: u64, stream: usize) -> Result<()> {
    if c.run == 0 {
        return Ok(());
    }
    let n = c.dims.len();
    let (outer, inner) = c.dims.split_at(n.saturating_sub(2));
    let mut copy = match inner {
        [] => plain(c.run, 1, 1, c.run, c.run),
        [(h, sp, dp)] => plain(c.run, *h, 1, *sp, *dp),
        [(d, sd, dd), (h, sp, dp)] => {
            // C-order strides: a plane's stride is a whole number of rows'.
            let mut k = plain(c.run, *h, *d, *sp, *dp);
            (k.src_rows, k.dst_rows) = (sd / sp, dd / dp);
            k
        }
        _ => unreachable!("split_at(n - 2) leaves at most two loops"),
    };
    let mut result = Ok(());
    walk(outer, c.src_offset, c.dst_offset, &mut |s, d| {
        if result.is_ok() {
            copy.src = src + s as u64;
            copy.dst = dst + d as u64;
            result = copy_3d(ordinal, &copy, stream);
        }
    });
    result
}

/// A copy of `depth` planes of `height` rows of `width` bytes, the rows `src_pitch` and
/// `dst_pitch` apart (plane strides set by the caller).
fn plain(width: usize, height: usize, depth: usize, src_pitch: usize, dst_pitch: usize) -> Copy3d {
    Copy3d {
        width,
        height,
        depth,
        src: 0,
        src_pitch,
        src_rows: height,
        dst: 0,
        dst_pitch,
        dst_rows: height,
    }
}
