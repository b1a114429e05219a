//! The memory Accord's kernels work in, per communicator:
//!
//! - a symmetric scratch buffer (every rank of the host maps every other's): signal words
//!   `[MAX_BLOCKS][MAX_RANKS]`, meta words `[MAX_BLOCKS][MAX_RANKS][4]`, the packet area of the one-shot
//!   allreduce (`[2 halves][size sources][2 x LL_MAX_BYTES]`: a 16-byte line carries 8 data
//!   bytes) and the bulk area (`[2 halves][in, out][size sources][chunk]`);
//! - per-block counters in this rank's device memory (barrier epochs, packet sequence numbers),
//!   which outlive every kernel so that CUDA graph replays keep counting, and the dead word a
//!   failed or aborted kernel sets, after which this rank's kernels signal no one;
//! - two words of pinned host memory the kernels map: the abort word (the host raises it to
//!   make running kernels return; a failing kernel raises it for the others) and the error word
//!   (the first failure: `(1 << 63) | (code << 32) | peer`).

use super::plan::{LL_MAX_BYTES, MAX_BLOCKS, MAX_RANKS};
use crate::error::{Error, Result};
use crate::gpu::cuda::{CuContext, CuDevicePtr, Driver};
use crate::gpu::symm::{LocalGroup, SymmetricBuffer};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

/// Where each area starts in the scratch buffer (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub ll_off: u64,
    pub ll_slot: u64,
    pub bulk_off: u64,
    pub chunk: u64,
    pub total: u64,
}

impl Layout {
    /// For `size` ranks and rounds of `chunk` bytes.
    pub fn new(size: usize, chunk: usize) -> Layout {
        // Signal words, then four meta words per block and rank.
        let words = 5 * (MAX_BLOCKS as u64) * MAX_RANKS as u64 * 8;
        let ll_off = words.next_multiple_of(4096);
        let ll_slot = 2 * LL_MAX_BYTES as u64;
        let bulk_off = ll_off + 2 * size as u64 * ll_slot;
        let chunk = chunk as u64;
        Layout {
            ll_off,
            ll_slot,
            bulk_off,
            chunk,
            total: bulk_off + 4 * size as u64 * chunk,
        }
    }
}

/// `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP`.
const HOST_ALLOC_FLAGS: u32 = 0x01 | 0x02;

/// Error word codes (`collectives.cu`); any other (1) is a wait that timed out.
pub(crate) const DESYNC: u64 = 3;
pub(crate) const SIZES_DIFFER: u64 = 4;
pub(crate) const UNKNOWN_ARRAY: u64 = 5;

/// The scratch, counters and control words of one communicator.
pub(crate) struct Scratch {
    cu: &'static Driver,
    ctx: usize,
    pub buf: SymmetricBuffer,
    /// `u32 [2][MAX_BLOCKS]` and the dead word, this rank's.
    pub counters: CuDevicePtr,
    /// Pinned host memory: the abort word (u32 at 0), the error word (u64 at 8).
    control: *mut u8,
    /// The same, as kernels address it.
    pub control_dev: u64,
    pub layout: Layout,
}

// SAFETY: `control` points to pinned memory owned by this value, written only through volatile
// accesses; the rest are plain handles.
unsafe impl Send for Scratch {}
// SAFETY: as above.
unsafe impl Sync for Scratch {}

impl Scratch {
    /// Allocate and clear everything (collective over the group: the scratch is symmetric), and
    /// meet the other ranks, so no peer signals into memory before its owner cleared it.
    pub fn new(group: &Arc<LocalGroup>, chunk: usize) -> Result<Scratch> {
        let (cu, ctx) = group.driver();
        let layout = Layout::new(group.size(), chunk);
        let buf = group.alloc(layout.total as usize)?;
        cu.make_current(ctx as CuContext)?;
        let launch = cu.launch()?;
        let mut control: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; 64 bytes of pinned host memory.
        cu.check(
            unsafe { (launch.mem_host_alloc)(&mut control, 64, HOST_ALLOC_FLAGS) },
            "cuMemHostAlloc",
        )?;
        let mut scratch = Scratch {
            cu,
            ctx,
            buf,
            counters: 0,
            control: control.cast(),
            control_dev: 0,
            layout,
        };
        // SAFETY: the 64 bytes just allocated.
        unsafe { std::ptr::write_bytes(scratch.control, 0, 64) };
        // SAFETY: out-pointer to a field; the pointer was allocated with DEVICEMAP.
        cu.check(
            unsafe { (launch.mem_host_get_device_pointer)(&mut scratch.control_dev, control, 0) },
            "cuMemHostGetDevicePointer",
        )?;
        // The counters, then the dead word (`collectives.cu`).
        let counter_bytes = 2 * MAX_BLOCKS as usize * 4 + 16;
        // SAFETY: out-pointer to a field; cleared below before any kernel runs.
        cu.check(
            unsafe { (cu.mem_alloc)(&mut scratch.counters, counter_bytes) },
            "cuMemAlloc",
        )?;
        // SAFETY: this rank's own allocations, whole.
        unsafe {
            cu.check(
                (cu.memset_d8)(scratch.counters, 0, counter_bytes),
                "cuMemsetD8",
            )?;
            cu.check(
                (cu.memset_d8)(scratch.buf.ptr(), 0, scratch.buf.len()),
                "cuMemsetD8",
            )?;
            cu.check((cu.ctx_synchronize)(), "cuCtxSynchronize")?;
        }
        group.link().all_gather_i64(&[0])?;
        Ok(scratch)
    }

    /// Raise the abort word: running and later kernels return.
    pub fn raise_abort(&self) {
        // SAFETY: the first 4 bytes of our pinned block; the device reads it volatile.
        unsafe { std::ptr::write_volatile(self.control.cast::<u32>(), 1) };
    }

    /// The error word (0: no failure recorded).
    pub fn error_word(&self) -> u64 {
        // SAFETY: bytes 8..16 of our pinned block, 8-aligned; written by kernels.
        unsafe { std::ptr::read_volatile(self.control.add(8).cast::<u64>()) }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let cu = self.cu;
        if cu.make_current(self.ctx as CuContext).is_err() {
            return;
        }
        // A kernel of ours may still run on a caller's stream (or return from an abort): the
        // memory goes only once the device is idle.
        // SAFETY: no arguments.
        unsafe { (cu.ctx_synchronize)() };
        // SAFETY: allocated in `new`, released once, no kernel of ours runs any more.
        unsafe {
            if self.counters != 0 {
                (cu.mem_free)(self.counters);
            }
            if let Ok(launch) = cu.launch() {
                (launch.mem_free_host)(self.control.cast());
            }
        }
    }
}

/// The error a kernel recorded on rank `me` of communicator `comm`, whose last call into the
/// kernels was `mine`.
pub(crate) fn decode(word: u64, comm: &str, me: usize, mine: &str, after: Duration) -> Error {
    let peer = (word & 0xffff_ffff) as usize;
    match (word >> 32) & 0xffff {
        DESYNC => Error::Desync {
            me,
            mine: format!("{mine} (or a call before it still running)"),
            peer,
            theirs: "a different collective (seen by Accord's GPU kernels)".into(),
            comm: comm.to_string(),
            seq: 0,
        },
        SIZES_DIFFER => Error::invalid(format!(
            "alltoallv on {comm}: rank {peer} sends rank {me} a different number of elements \
             than rank {me} expects from it ({mine}); nothing was written here (the other ranks stop at \
             their deadline waiting for this one)"
        )),
        UNKNOWN_ARRAY => Error::invalid(format!(
            "{mine} on {comm}: rank {peer} passed an array of the symmetric heap that rank {me} \
             does not map (freed or dropped on some ranks only?); nothing was written here (the \
             other ranks stop at their deadline waiting for this one)"
        )),
        _ => Error::Timeout {
            op: mine.to_string(),
            seq: 0,
            comm: comm.to_string(),
            waiting_for: vec![peer],
            after,
            hint: "; it never reached the matching Accord GPU kernel (the kernel's deadline \
                   passed)"
                .into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMED_OUT: u64 = 1;

    #[test]
    fn areas_do_not_overlap_and_stay_aligned() {
        for size in [1, 2, 3, 8, 16] {
            let l = Layout::new(size, 1 << 20);
            assert!(l.ll_off >= 5 * 64 * 16 * 8);
            assert_eq!(l.ll_off % 4096, 0);
            assert_eq!(l.bulk_off, l.ll_off + 2 * size as u64 * l.ll_slot);
            assert_eq!(l.bulk_off % 16, 0);
            assert_eq!(l.total, l.bulk_off + 4 * size as u64 * (1 << 20));
        }
    }

    #[test]
    fn error_words_become_errors_naming_the_peer() {
        let t = std::time::Duration::from_secs(1);
        match decode((1 << 63) | (TIMED_OUT << 32) | 2, "w", 0, "allreduce", t) {
            Error::Timeout { waiting_for, .. } => assert_eq!(waiting_for, vec![2]),
            e => panic!("{e}"),
        }
        match decode((1 << 63) | (DESYNC << 32) | 5, "w", 1, "allgather", t) {
            Error::Desync { peer, me, .. } => assert_eq!((peer, me), (5, 1)),
            e => panic!("{e}"),
        }
    }
}
