//! Memory channels: from a symmetric buffer to the same buffer on every peer of this host, as
//! the device handles (`accord::MemoryChannel`) that kernels use through
//! `<accord/channel.cuh>`.
//!
//! Beside the buffer, the channels own a small symmetric region of 64-bit words per rank:
//! `inbound[s]` counts the signals rank `s` gave this rank (peers increment it through their
//! mapping), `expected[s]` counts the waits this rank did on `s` (only this rank touches it), and
//! one error word, where a kernel's wait that ran out of time records which peer never
//! signalled. [`MemoryChannels::check`] turns that record into [`Error::Timeout`].

use super::{LocalGroup, SymmetricBuffer};
use crate::error::{Error, Result};
use crate::gpu::cuda::{CuContext, CuDevicePtr, MemoryChannelHandle};
use std::sync::Arc;

/// Channels from one symmetric buffer to every peer of this host (see [`crate::gpu::symm`]).
pub struct MemoryChannels {
    group: Arc<LocalGroup>,
    /// `inbound[size]`, `expected[size]`, the error word.
    semaphores: SymmetricBuffer,
    /// `size` handles in device memory, indexed by rank.
    handles: CuDevicePtr,
    peers: Vec<usize>,
    timeout: std::time::Duration,
}

impl std::fmt::Debug for MemoryChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryChannels")
            .field("handles", &format_args!("{:#x}", self.handles))
            .field("peers", &self.peers)
            .finish()
    }
}

/// Error word codes (`<accord/channel.cuh>`): bit 63 set, the code in bits 32-47, the peer in
/// bits 0-31.
const WAIT_TIMED_OUT: u64 = 1;
const PACKETS_TIMED_OUT: u64 = 2;

impl MemoryChannels {
    /// Channels over `buf` to every peer of this host. Collective over the buffer's
    /// communicator (it allocates the semaphores on the symmetric heap).
    pub fn new(buf: &SymmetricBuffer) -> Result<MemoryChannels> {
        let group = buf.group().clone();
        let n = group.size();
        let semaphores = group.alloc((2 * n + 1) * 8)?;
        let (cu, ctx) = group.driver();
        cu.make_current(ctx as CuContext)?;
        // SAFETY: this rank's own region, as long as allocated.
        let rc = unsafe { (cu.memset_d8)(semaphores.ptr(), 0, semaphores.len()) };
        cu.check(rc, "cuMemsetD8")?;
        cu.check(unsafe { (cu.ctx_synchronize)() }, "cuCtxSynchronize")?;
        let timeout = group.link().timeout();
        let me = group.rank();
        let word = |base: u64, i: usize| base + 8 * i as u64;
        let table: Vec<MemoryChannelHandle> = (0..n)
            .map(
                |t| match (t != me, buf.peer_ptr(t), semaphores.peer_ptr(t)) {
                    (true, Some(remote), Some(their_sems)) => MemoryChannelHandle {
                        local: buf.ptr(),
                        remote,
                        remote_inbound: word(their_sems, me),
                        inbound: word(semaphores.ptr(), t),
                        expected: word(semaphores.ptr(), n + t),
                        error: word(semaphores.ptr(), 2 * n),
                        timeout_ns: timeout.as_nanos().min(u64::MAX as u128) as u64,
                        peer: t as u32,
                        rank: me as u32,
                    },
                    _ => MemoryChannelHandle::default(),
                },
            )
            .collect();
        let bytes = std::mem::size_of_val(table.as_slice());
        let mut handles = 0;
        // SAFETY: out-pointer to a local.
        cu.check(unsafe { (cu.mem_alloc)(&mut handles, bytes) }, "cuMemAlloc")?;
        // SAFETY: `bytes` bytes of plain data into the allocation just made.
        let rc = unsafe { (cu.memcpy_htod)(handles, table.as_ptr().cast(), bytes) };
        if let Err(e) = cu.check(rc, "cuMemcpyHtoD") {
            // SAFETY: allocated above.
            unsafe { (cu.mem_free)(handles) };
            return Err(e);
        }
        // No peer may signal into a region before its owner cleared it.
        let met = group.link().all_gather_i64(&[0]);
        let peers = buf.peers().iter().copied().filter(|&r| r != me).collect();
        let channels = MemoryChannels {
            group,
            semaphores,
            handles,
            peers,
            timeout,
        };
        met.map(|_| channels)
    }

    /// The device array of handles, one per rank (`accord::MemoryChannel*`); this rank's own
    /// entry and those of other hosts' ranks are zero.
    pub fn device_ptr(&self) -> u64 {
        self.handles
    }

    /// Ranks that have a channel (this host's, this rank excluded).
    pub fn peers(&self) -> &[usize] {
        &self.peers
    }

    /// Wait for the device, then report a wait that timed out in a kernel since the last check,
    /// naming the peer that never signalled, and clear the record.
    pub fn check(&self) -> Result<()> {
        let (cu, ctx) = self.group.driver();
        cu.make_current(ctx as CuContext)?;
        // SAFETY: no arguments; waits for this context's work.
        cu.check(unsafe { (cu.ctx_synchronize)() }, "cuCtxSynchronize")?;
        let at = self.semaphores.ptr() + 16 * self.group.size() as u64;
        let mut word = 0u64;
        // SAFETY: 8 bytes from this rank's own semaphore region into a local.
        let rc = unsafe { (cu.memcpy_dtoh)((&mut word as *mut u64).cast(), at, 8) };
        cu.check(rc, "cuMemcpyDtoH")?;
        if word == 0 {
            return Ok(());
        }
        // SAFETY: this rank's own region; the device is idle.
        unsafe { (cu.memset_d8)(at, 0, 8) };
        Err(decode(word, self.group.comm(), self.timeout))
    }

    fn release(&mut self) {
        let (cu, ctx) = self.group.driver();
        if cu.make_current(ctx as CuContext).is_ok() && self.handles != 0 {
            // SAFETY: allocated in `new`, freed once.
            unsafe { (cu.mem_free)(self.handles) };
            self.handles = 0;
        }
    }

    /// Free the channels on every rank (collective; see [`SymmetricBuffer::free`]).
    pub fn free(mut self) -> Result<()> {
        self.release();
        let sems = std::mem::replace(&mut self.semaphores, placeholder(&self.group));
        sems.free()
    }
}

impl Drop for MemoryChannels {
    fn drop(&mut self) {
        self.release();
    }
}

/// A buffer standing in for one given away, owning nothing.
fn placeholder(group: &Arc<LocalGroup>) -> SymmetricBuffer {
    SymmetricBuffer {
        group: group.clone(),
        ptr: 0,
        len: 0,
        requested: 0,
        sharing: super::Sharing::Vmm,
        peers: Default::default(),
        freed: true,
    }
}

/// The error a kernel recorded in the error word.
fn decode(word: u64, comm: &str, after: std::time::Duration) -> Error {
    let peer = (word & 0xffff_ffff) as usize;
    let (op, hint) = match (word >> 32) & 0xffff {
        WAIT_TIMED_OUT => ("channel wait", "; it never signalled"),
        PACKETS_TIMED_OUT => ("channel read_packets", "; its packets never arrived"),
        _ => ("channel", "; unknown error record"),
    };
    Error::Timeout {
        op: op.into(),
        seq: 0,
        comm: comm.to_string(),
        waiting_for: vec![peer],
        after,
        hint: hint.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_words_name_the_silent_peer() {
        let t = std::time::Duration::from_millis(50);
        match decode((1 << 63) | (1 << 32) | 3, "world", t) {
            Error::Timeout {
                waiting_for, op, ..
            } => {
                assert_eq!(waiting_for, vec![3]);
                assert_eq!(op, "channel wait");
            }
            e => panic!("{e}"),
        }
        match decode((1 << 63) | (2 << 32) | 7, "world", t) {
            Error::Timeout {
                waiting_for, op, ..
            } => {
                assert_eq!(
                    (waiting_for, op.as_str()),
                    (vec![7], "channel read_packets")
                )
            }
            e => panic!("{e}"),
        }
    }
}
