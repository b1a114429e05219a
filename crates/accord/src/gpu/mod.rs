//! Collectives on NVIDIA GPU memory, run by the device engine a [`Communicator`] attaches.
//!
//! [`Communicator`]: crate::Communicator
//! [`Communicator::attach_devices`]: crate::Communicator::attach_devices
//! [`Communicator::attach_devices_with_id`]: crate::Communicator::attach_devices_with_id
//! [`Communicator::split`]: crate::Communicator::split
//! [`Communicator::split_devices`]: crate::Communicator::split_devices
//! [`Communicator::set_timeout`]: crate::Communicator::set_timeout
//!
//! CUDA (the driver, `libcuda.so.1`), NCCL and NVRTC are opened at run time, so this module
//! builds and its tests run on machines without them; every entry point then returns
//! [`Error::Unsupported`](crate::Error::Unsupported) saying what is missing. See
//! [`nccl::nccl`] for where NCCL is looked for, [`cuda::nvrtc`] for NVRTC.
//!
//! ## Two engines: Accord's own kernels and NCCL
//!
//! Collectives among the ranks of one host run on Accord's own kernels where they beat NCCL,
//! and on NCCL elsewhere (`own`): one-shot allreduce, allgather, reduce-scatter and alltoall as
//! LL packets (flag and data in every 8-byte store) up to 256 KiB, a two-shot allreduce and
//! bulk allgather, reduce-scatter, broadcast, alltoall and alltoallv through a symmetric scratch
//! every rank of the host maps ([`symm`]), for every element type and reduce operator (the
//! bitwise ones too, which NCCL lacks). Every rank reduces in rank order, so results are
//! bit-identical across ranks. The kernels are CUDA C++ compiled at run time with NVRTC (cached
//! in the process and in `~/.cache/accord`), so nothing needs CUDA at build time.
//!
//! `ACCORD_GPU_ENGINE` chooses: `auto` (the default) gives the kernels the sizes where they were
//! measured faster than NCCL on NVLink, by world size (about 0.4-0.6x NCCL's time up to 512 KiB
//! on two H200s, up to 256 KiB on four, where the allreduce kernels stop at 64 KiB;
//! BENCHMARKS.md) and NCCL the rest and everything multi-host; calls on arrays of the symmetric
//! heap, which the kernels take zero-copy, go to them at more sizes (on two ranks nearly all),
//! and the bitwise reductions always; `accord` runs every call the kernels can; `nccl` never loads them (the
//! kill switch). Which engine a call got enters the progress records the ranks compare, so
//! ranks that chose differently (heap arrays on some only) fail with a desync naming both. `ACCORD_EXPLAIN=1` makes rank 0 print
//! which engine and kernel each kind of call got, and why the others declined. Where NCCL
//! cannot run at all (not installed, or ranks sharing one GPU, which NCCL refuses) the kernels
//! are the communicator's only engine, so several processes can share a GPU; operations they
//! lack then fail with [`Error::Unsupported`](crate::Error::Unsupported) saying so.
//!
//! Calls on either engine can be captured in a CUDA graph: nothing synchronises the host inside
//! a call, and the kernels' flags and barrier epochs live in device memory and advance at each
//! replay. A captured call's [`Completion`](crate::Completion) is complete at once (the work
//! runs at each replay, on the stream it was captured on).
//!
//! ## Attaching a device
//!
//! Device buffers go through the same [`Communicator`] methods as host buffers, once a GPU is
//! attached to it:
//!
//! ```no_run
//! # fn main() -> accord::Result<()> {
//! use accord::ReduceOp;
//! let comm = accord::init()?; // any init method: accord run, torchrun, mpirun, tcp://, file://
//! let local = std::env::var("LOCAL_RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
//! comm.attach_device(local)?; // collective: the device engine's ranks meet over `comm`
//! let mut buf = comm.device_copy(&vec![1.0f32; 1 << 20])?;
//! comm.all_reduce(&mut buf, ReduceOp::Sum)?.wait()?; // enqueued on the communicator's stream
//! # Ok(()) }
//! ```
//!
//! A [`DeviceSlice`] (a device address, a count and a dtype: PyTorch's `data_ptr()`, DLPack's
//! `data + byte_offset`) works where a [`DeviceBuffer`] does, on the communicator's own stream;
//! [`crate::SendBuf::device`] / [`crate::RecvBuf::device`] name another stream
//! ([`Stream::Raw`] with the `CUstream` as an integer: `torch.cuda.current_stream().cuda_stream`,
//! CuPy's `Stream.ptr`). Device operations enqueue their work and return at once; the
//! [`Completion`](crate::Completion) waits for the device ([`Completion::wait`](crate::Completion::wait)),
//! makes another stream wait ([`Completion::stream_wait`](crate::Completion::stream_wait)) or
//! polls. The caller keeps buffers alive until the operation completes on its stream (as with
//! NCCL). Operations of one communicator must be called in the same order on every rank.
//!
//! Rank 0 creates the `ncclUniqueId` and broadcasts it over the communicator, so every way of
//! starting it works unchanged. Before that, all ranks exchange their NCCL versions: different
//! versions fail at once on every rank, naming ranks and versions.
//! ([`Communicator::attach_devices_with_id`] takes an id the caller distributed itself.)
//!
//! Initialisation has a deadline too (the communicator's timeout). NCCL's blocking init cannot
//! be interrupted, so Accord initialises in NCCL's nonblocking mode, waits with the deadline
//! (aborting on expiry, naming the ranks that never started), and then trades that communicator
//! for a blocking twin with `ncclCommSplit`: operations on a nonblocking communicator are
//! launched from an NCCL helper thread and cost about 100 us each. A split of a blocking
//! communicator blocks whatever the child's configuration, so device splits
//! ([`Communicator::split`] of a GPU communicator, [`Communicator::split_devices`]) first meet in
//! the rendezvous store under the deadline (naming ranks that never call split) and only then
//! call NCCL. `ACCORD_NCCL_INIT=blocking` falls back to NCCL's plain blocking init (no deadline).
//!
//! ## Layers
//!
//! - `facade`: the handle a [`Communicator`] keeps on its device engine, which the
//!   communicator hands checked [`Op`](crate::op::Op)s;
//! - `comm`: the engine-neutral device communicator: ordering, sequence numbers and the
//!   fingerprint hash, outstanding operations and their events (`request`), poison, abort,
//!   timeout; `split` (the meeting in the store before a split), [`group()`] (several GPUs
//!   driven from one thread), `watchdog` and `health` (the failure policy, a pure function)
//!   belong to it;
//! - `engine`: the `DeviceEngine` trait, all the neutral layer knows of an engine; `select`
//!   creates a communicator's engines and picks one per operation from an ordered list that
//!   ends with NCCL (or with Accord's kernels where NCCL cannot run);
//! - `own`: Accord's kernels (`collectives.cu`), their plans (`plan`: kernel, grid, the `auto`
//!   ranges) and memory (`scratch`);
//! - [`nccl`]: the NCCL engine, its loader and its deadline-bound initialisation;
//! - [`cuda`]: the driver's entry points; `device`: slices, buffers, streams, events;
//! - `link`: what the layer needs from the host communicator (implemented in `comm::device`),
//!   so nothing here depends on the host communicator's type.
//!
//! ## Operations on NCCL
//!
//! broadcast, reduce, allreduce, allgather, reduce_scatter map to NCCL's own collectives. The
//! variable-count variants, gather, scatter, alltoall(v) and send/recv use grouped `ncclSend` /
//! `ncclRecv` (allgatherv as grouped broadcasts, reduce_scatterv as grouped reduces). Barrier is
//! a one-element allreduce, ordered on the stream. [`ReduceOp::Avg`](crate::ReduceOp::Avg) uses
//! `ncclAvg`; the bitwise operators do not exist in NCCL (Accord's kernels run them; without
//! the kernels they fail with [`Error::Unsupported`](crate::Error::Unsupported)). Device splits
//! use `ncclCommSplit`; children of a split, and communicators of several GPUs per process, use
//! NCCL only.
//!
//! ## Several GPUs per process
//!
//! [`Communicator::attach_devices`] gives one communicator per device (ranks
//! `rank * devices.len() + i`), which take device buffers only. Issue one operation on each
//! inside [`group()`], which wraps `ncclGroupStart`/`ncclGroupEnd`, so a single thread can
//! drive all of them without deadlock. [`Communicator::split_devices`] splits them together
//! (each device may pick its own color).
//!
//! Caveat (CUDA, not Accord): when threads of one process drive several GPUs, a thread that
//! allocates or frees device memory while another GPU's NCCL kernel waits for it can deadlock,
//! because peer mappings make `cuMemAlloc`/`cuMemFree` wait for the other device. Allocate
//! before issuing collectives, or use one process per GPU.
//!
//! ## No silent hangs
//!
//! Each communicator has a watchdog thread. It retires finished operations (one CUDA event each)
//! and checks, every few milliseconds (at most 50):
//!
//! - the host communicator that bootstrapped it, which sees a member's process end (its
//!   connection closes) or a rank abort the world within milliseconds, also while no operation
//!   runs: the failure is [`Error::PeerLost`](crate::Error::PeerLost) naming that rank (or the
//!   abort), shown within 2 s whatever the timeout. An operation issued before the notice gets
//!   a quarter second to finish first (a peer that finished its part and exited leaves this
//!   rank's part to finish); an idle communicator fails at once, so its next call fails naming
//!   the rank;
//! - the engine's asynchronous error (`ncclCommGetAsyncError`), which reports a peer's lost
//!   connection where NCCL notices one;
//! - the oldest unfinished operation against the timeout (the communicator's, from
//!   `ACCORD_TIMEOUT`, or [`Communicator::set_timeout`]).
//!
//! The decision is a pure function of these observations and the clock (module `health`). On a
//! failure the watchdog aborts the engines (`ncclCommAbort`, which also stops NCCL's
//! kernels) and poisons the communicator: waits of unfinished operations and later calls return
//! the error, never before the abort has finished (a process that exits on the error must not
//! tear CUDA down under it). Operations seen finished before the failure keep their results,
//! except after a desync. A timeout names the operation, its sequence number and the ranks that
//! never entered it.
//!
//! Ranks publish their progress — the last entered sequence number and a rolling hash of every
//! operation's fingerprint — to the rendezvous store under `gpu/{id}/progress/{rank}`, from the
//! watchdog thread about once a second when it changed (never on the operation path). The same
//! values detect desynchronisation: when two ranks have entered the same number of operations
//! but their fingerprint hashes differ, both get [`Error::Desync`](crate::Error::Desync) naming
//! each side's last call, and the communicator is aborted instead of hanging or reducing
//! mismatched buffers.
//!
//! Accord's kernels add checks on the device: every barrier compares a hash of the call with
//! the peers' (ranks in different collectives stop with [`Error::Desync`](crate::Error::Desync)
//! within microseconds, before writing their output), every wait gives up at the communicator's
//! deadline recording which peer never came, and an abort raises a word in host memory that every
//! waiting kernel polls. A kernel's recorded failure is read before an operation's completion is
//! believed, so a kernel that gave up never passes for one that finished.

pub mod cuda;
pub mod nccl;

mod comm;
mod device;
mod engine;
mod exit;
mod facade;
mod group;
mod health;
pub mod inventory;
mod link;
mod lower;
mod outstanding;
pub use lower::reduces_on_device;
pub(crate) mod own;
mod request;
mod select;
mod split;
pub mod symm;
mod timeline;
mod watchdog;

pub use device::{DeviceBuffer, DeviceSlice, Stream};
pub use facade::DeviceInfo;
pub(crate) use facade::GpuCommunicator;
pub(crate) use group::not_in_group;
pub use group::{group, group_depth, group_end, group_start};
pub(crate) use link::HostLink;
pub use nccl::unique_id;
pub use request::GpuRequest;
pub(crate) use select::Bootstrap;

/// Why GPU work cannot run here, or `None` if CUDA, a device and NCCL are all present. Tests and
/// tools print this and skip.
pub fn unavailable_reason() -> Option<String> {
    let cu = match cuda::driver() {
        Ok(c) => c,
        Err(e) => return Some(e.to_string()),
    };
    match cu.device_count() {
        Ok(0) => return Some("no CUDA device visible".into()),
        Err(e) => return Some(e.to_string()),
        _ => {}
    }
    nccl::nccl().err().map(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DataType;

    #[test]
    fn sub_slices_are_bounds_checked() {
        // SAFETY: never dereferenced.
        let s = unsafe { DeviceSlice::from_raw(0x1000, 10, DataType::F32) };
        assert_eq!(s.sub(2, 3).unwrap().ptr(), 0x1008);
        assert!(s.sub(8, 3).is_err());
        assert!(s.sub(usize::MAX, 2).is_err());
    }
}
