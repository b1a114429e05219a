//! [`DeviceEngine`] for an NCCL communicator.
//!
//! broadcast, reduce, allreduce, allgather and reduce_scatter map to NCCL's own collectives. The
//! variable-count variants, gather, scatter, alltoall(v) and send/recv use grouped `ncclSend` /
//! `ncclRecv` (allgatherv as grouped broadcasts, reduce_scatterv as grouped reduces). The
//! barrier is a one-element allreduce, ordered on the stream. [`ReduceOp::Avg`] uses `ncclAvg`;
//! the bitwise operators do not exist in NCCL, so [`DeviceEngine::supports`] refuses them.

use super::init::{abort_all, settle};
use super::loader::{self as nccl, Nccl, NcclComm, NcclResult, NcclUniqueId};
use crate::atomic_duration::AtomicDuration;
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::fingerprint::OpKind;
use crate::gpu::cuda::{CuContext, CuStream, Driver};
use crate::gpu::device::DeviceSlice;
use crate::gpu::engine::{
    Child, DeviceEngine, EngineResult, Fault, LaunchGroup, P2p, PendingChild,
};
use crate::op::{Collective, Op};
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// One NCCL communicator (a blocking one: see `init`).
pub(crate) struct NcclEngine {
    nccl: &'static Nccl,
    cu: &'static Driver,
    comm: usize,
    ctx: usize,
    rank: usize,
    size: usize,
    /// Bounds the wait for an enqueue NCCL reports in progress.
    timeout: AtomicDuration,
    /// Whether the communicator was aborted or destroyed (NCCL freed it). Queries of it hold
    /// this shared; abort and release hold it exclusively.
    freed: RwLock<bool>,
    /// The unique id the communicator was created from (none for a split child).
    unique_id: Option<[u8; 128]>,
}

impl NcclEngine {
    pub(super) fn new(
        nccl: &'static Nccl,
        cu: &'static Driver,
        comm: NcclComm,
        ctx: CuContext,
        rank: usize,
        size: usize,
        timeout: Duration,
    ) -> Self {
        NcclEngine {
            nccl,
            cu,
            comm: comm as usize,
            ctx: ctx as usize,
            rank,
            size,
            timeout: AtomicDuration::new(timeout),
            freed: RwLock::new(false),
            unique_id: None,
        }
    }

    /// Remember the unique id the communicator was created from (for interoperation).
    pub(super) fn with_unique_id(mut self, uid: &NcclUniqueId) -> Self {
        self.unique_id = Some(uid.internal);
        self
    }

    fn comm(&self) -> NcclComm {
        self.comm as NcclComm
    }

    /// `f` on the communicator, unless NCCL freed it.
    fn unless_freed<R>(&self, f: impl FnOnce(NcclComm) -> R) -> Option<R> {
        let freed = self.freed.read().unwrap_or_else(|p| p.into_inner());
        (!*freed).then(|| f(self.comm()))
    }

    /// [`Error::Gpu`] for `call` failing with `rc`, with the communicator's last error unless it
    /// was freed.
    fn error(&self, call: &str, rc: NcclResult) -> Error {
        let rank = Some(self.rank);
        self.unless_freed(|c| self.nccl.error(call, rc, c, rank))
            .unwrap_or_else(|| self.nccl.error(call, rc, std::ptr::null_mut(), rank))
    }

    /// Map an NCCL result: usage errors are the caller's and leave the communicator usable;
    /// anything else fails it.
    fn rc(&self, what: &str, rc: NcclResult) -> EngineResult<()> {
        let rc = if rc == nccl::NCCL_IN_PROGRESS {
            // Nonblocking communicator: the call finishes in NCCL's thread; wait for it before
            // anything else is enqueued (events, the next call).
            let timeout = self.timeout.get();
            match settle(self.nccl, self.comm(), Instant::now() + timeout) {
                Ok(()) => 0,
                Err(Some(rc)) => rc,
                Err(None) => {
                    return Err(Fault::fatal(Error::Aborted {
                        reason: format!(
                            "{what} on rank {}: NCCL did not finish enqueueing within {timeout:?}",
                            self.rank
                        ),
                    }))
                }
            }
        } else {
            rc
        };
        match rc {
            0 => Ok(()),
            // ncclInvalidArgument, ncclInvalidUsage.
            4 | 5 => Err(Error::invalid(format!(
                "{what}: {}",
                self.unless_freed(|c| self.nccl.describe(rc, c))
                    .unwrap_or_else(|| self.nccl.describe(rc, std::ptr::null_mut()))
            ))
            .into()),
            _ => Err(Fault::fatal(self.error(what, rc))),
        }
    }

    /// `f` between raw group calls: nests inside a caller's `gpu::group` without arming its
    /// events.
    fn grouped(&self, f: impl FnOnce() -> EngineResult<()>) -> EngineResult<()> {
        let n = self.nccl;
        // SAFETY: no arguments.
        self.rc("ncclGroupStart", unsafe { (n.group_start)() })?;
        let r = f();
        // SAFETY: paired with the start above.
        let e = self.rc("ncclGroupEnd", unsafe { (n.group_end)() });
        r.and(e)
    }

    fn copy(&self, src: DeviceSlice, dst: DeviceSlice, s: CuStream) -> Result<()> {
        if src.bytes() == 0 {
            return Ok(());
        }
        // SAFETY: both ranges were validated against the op.
        let rc = unsafe { (self.cu.memcpy_dtod_async)(dst.ptr(), src.ptr(), src.bytes(), s) };
        self.cu.check(rc, "cuMemcpyDtoDAsync")
    }

    /// Scan and exscan as one reduce-scatter (see [`super::scan`]); the scratch array is
    /// allocated and freed in stream order.
    fn scan(
        &self,
        op: &Op,
        input: DeviceSlice,
        recv: DeviceSlice,
        count: usize,
        exclusive: bool,
        s: CuStream,
    ) -> EngineResult<()> {
        if count == 0 {
            return Ok(());
        }
        let (p, me, es) = (self.size, self.rank, op.dtype.size());
        let reduce = op.reduce_or_sum();
        let (width, bits) = super::scan::identity(op.dtype, reduce)
            .expect("supports() refused the operators NCCL lacks");
        // A rank that fails to stage its blocks must not go on out of step with peers already
        // in the reduce-scatter: such failures fail the communicator.
        let fatal = |e: Error| Fault::fatal(e);
        let mut scratch = 0u64;
        // SAFETY: out-pointer to a local; freed below on the same stream.
        let rc = unsafe { (self.cu.mem_alloc_async)(&mut scratch, p * count * es, s) };
        self.cu.check(rc, "cuMemAllocAsync").map_err(fatal)?;
        let result = (|| -> EngineResult<()> {
            // Blocks of ranks whose prefix leaves this rank out hold the identity.
            let first = if exclusive { me + 1 } else { me };
            super::scan::fill(self.cu, scratch, width, bits, first * count, s).map_err(fatal)?;
            for r in first..p {
                // SAFETY: block `r` of the scratch array, `count` elements.
                let block = unsafe {
                    DeviceSlice::from_raw(scratch + (r * count * es) as u64, count, op.dtype)
                };
                self.copy(input, block, s).map_err(fatal)?;
            }
            // Rank 0 has no exclusive prefix: its block lands in place in the scratch array,
            // leaving its output as it was.
            let out = match exclusive && me == 0 {
                true => scratch as *mut std::ffi::c_void,
                false => recv.as_mut_ptr(),
            };
            let (n, c, o) = (self.nccl, self.comm(), self.reduce_op(op));
            // SAFETY: `scratch` holds `p` blocks of `count`; `out` holds `count` (or is block 0
            // of `scratch`, NCCL's in-place form for rank 0).
            self.rc("ncclReduceScatter", unsafe {
                (n.reduce_scatter)(
                    scratch as *const _,
                    out,
                    count,
                    nccl_dtype(op.dtype),
                    o,
                    c,
                    s,
                )
            })
        })();
        // SAFETY: allocated above on `s`; freed once the work queued before it is done.
        let rc = unsafe { (self.cu.mem_free_async)(scratch, s) };
        result?;
        self.cu.check(rc, "cuMemFreeAsync").map_err(fatal)
    }

    /// On one rank an average is the sum (divided by one). NCCL 2.28 left the last element of a
    /// one-rank f64 average of 65,537 elements unwritten (seen on an H100: it kept what the
    /// buffer held), so the sum it computes correctly is asked for instead.
    fn reduce_op(&self, op: &Op) -> i32 {
        let r = match op.reduce_or_sum() {
            ReduceOp::Avg if self.size == 1 => ReduceOp::Sum,
            r => r,
        };
        nccl_op(r).expect("supports() refused the operators NCCL lacks")
    }

    /// Gather (blocks flow to the root) and scatter (blocks flow from it) as grouped
    /// send/recv: `whole` is the root's buffer of every block back to back, `mine` this rank's
    /// block of `counts[rank]` elements.
    #[allow(clippy::too_many_arguments)]
    fn rooted_exchange(
        &self,
        what: &str,
        to_root: bool,
        whole: DeviceSlice,
        mine: DeviceSlice,
        counts: &[usize],
        root: usize,
        s: CuStream,
    ) -> EngineResult<()> {
        let (n, c, me) = (self.nccl, self.comm(), self.rank);
        let dt = nccl_dtype(mine.dtype());
        self.grouped(|| {
            if me != root {
                // SAFETY: length checked against the op.
                return self.rc(what, unsafe {
                    if to_root {
                        (n.send)(mine.as_ptr(), counts[me], dt, root as i32, c, s)
                    } else {
                        (n.recv)(mine.as_mut_ptr(), counts[me], dt, root as i32, c, s)
                    }
                });
            }
            let mut off = 0;
            for (r, &cnt) in counts.iter().enumerate() {
                let block = whole.sub(off, cnt)?;
                if r == me {
                    let (src, dst) = if to_root {
                        (mine, block)
                    } else {
                        (block, mine)
                    };
                    self.copy(src, dst, s)?;
                } else {
                    // SAFETY: range checked by `sub`.
                    self.rc(what, unsafe {
                        if to_root {
                            (n.recv)(block.as_mut_ptr(), cnt, dt, r as i32, c, s)
                        } else {
                            (n.send)(block.as_ptr(), cnt, dt, r as i32, c, s)
                        }
                    })?;
                }
                off += cnt;
            }
            Ok(())
        })
    }

    /// alltoall(v) as grouped send/recv to every rank, this one included.
    fn all_to_all(
        &self,
        send: DeviceSlice,
        send_counts: &[usize],
        recv: DeviceSlice,
        recv_counts: &[usize],
        s: CuStream,
    ) -> EngineResult<()> {
        let (n, c, me) = (self.nccl, self.comm(), self.rank);
        let dt = nccl_dtype(send.dtype());
        self.grouped(|| {
            let (mut so, mut ro) = (0, 0);
            for r in 0..send_counts.len() {
                let src = send.sub(so, send_counts[r])?;
                let dst = recv.sub(ro, recv_counts[r])?;
                so += send_counts[r];
                ro += recv_counts[r];
                if r == me {
                    if src.count() != dst.count() {
                        return Err(Error::invalid(format!(
                            "alltoallv: rank {me} sends itself {} elements but expects {}",
                            src.count(),
                            dst.count()
                        ))
                        .into());
                    }
                    if self_block_by_copy() {
                        self.copy(src, dst, s)?;
                        continue;
                    }
                }
                // Peers and (by default) this rank itself: NCCL pairs the send to self with
                // the receive from self inside the group.
                // SAFETY: ranges checked by `sub`.
                unsafe {
                    self.rc(
                        "ncclSend",
                        (n.send)(src.as_ptr(), src.count(), dt, r as i32, c, s),
                    )?;
                    self.rc(
                        "ncclRecv",
                        (n.recv)(dst.as_mut_ptr(), dst.count(), dt, r as i32, c, s),
                    )?;
                }
            }
            Ok(())
        })
    }
}

impl DeviceEngine for NcclEngine {
    fn name(&self) -> &'static str {
        "NCCL"
    }

    fn supports(&self, op: &Op, _heap: bool) -> std::result::Result<(), String> {
        match op.reduce {
            Some(r) => nccl_op(r).map(|_| ()),
            None => Ok(()),
        }
    }

    fn enqueue(
        &self,
        op: &Op,
        send: Option<DeviceSlice>,
        recv: DeviceSlice,
        s: CuStream,
    ) -> EngineResult<()> {
        let (n, c, me) = (self.nccl, self.comm(), self.rank);
        let input = send.unwrap_or(recv);
        let dt = nccl_dtype(op.dtype);
        // SAFETY (every call below): the slices hold what the op reads and writes on this rank
        // (checked by the neutral layer); the caller keeps them alive (DeviceSlice contract).
        match (op.kind(), &op.coll) {
            (_, Collective::Barrier) => self.rc("ncclAllReduce", unsafe {
                // One i32 (NCCL type 2), summed (0), in place in the scratch word.
                (n.all_reduce)(recv.as_ptr(), recv.as_mut_ptr(), 1, 2, 0, c, s)
            }),
            (_, &Collective::Broadcast { count, root }) => self.rc("ncclBroadcast", unsafe {
                (n.broadcast)(
                    input.as_ptr(),
                    recv.as_mut_ptr(),
                    count,
                    dt,
                    root as i32,
                    c,
                    s,
                )
            }),
            (_, &Collective::AllReduce { count }) => {
                let o = self.reduce_op(op);
                self.rc("ncclAllReduce", unsafe {
                    (n.all_reduce)(input.as_ptr(), recv.as_mut_ptr(), count, dt, o, c, s)
                })
            }
            (_, &Collective::Reduce { count, root }) => {
                let o = self.reduce_op(op);
                self.rc("ncclReduce", unsafe {
                    (n.reduce)(
                        input.as_ptr(),
                        recv.as_mut_ptr(),
                        count,
                        dt,
                        o,
                        root as i32,
                        c,
                        s,
                    )
                })
            }
            (OpKind::AllGather, Collective::AllGather { counts }) => self
                .rc("ncclAllGather", unsafe {
                    (n.all_gather)(input.as_ptr(), recv.as_mut_ptr(), counts[me], dt, c, s)
                }),
            (_, Collective::AllGather { counts }) => self.grouped(|| {
                // allgatherv: one broadcast per rank, each from its own block.
                let mut off = 0;
                for (r, &cnt) in counts.iter().enumerate() {
                    let dst = recv.sub(off, cnt)?;
                    let src = if r == me {
                        input.as_ptr()
                    } else {
                        dst.as_ptr()
                    };
                    // SAFETY: ranges checked by `sub`.
                    self.rc("ncclBroadcast", unsafe {
                        (n.broadcast)(src, dst.as_mut_ptr(), cnt, dt, r as i32, c, s)
                    })?;
                    off += cnt;
                }
                Ok(())
            }),
            (_, Collective::Gather { counts, root }) => {
                self.rooted_exchange("ncclSend/ncclRecv", true, recv, input, counts, *root, s)
            }
            (_, Collective::Scatter { counts, root }) => {
                self.rooted_exchange("ncclSend/ncclRecv", false, input, recv, counts, *root, s)
            }
            (OpKind::ReduceScatter, Collective::ReduceScatter { counts }) => {
                let o = self.reduce_op(op);
                self.rc("ncclReduceScatter", unsafe {
                    (n.reduce_scatter)(input.as_ptr(), recv.as_mut_ptr(), counts[me], dt, o, c, s)
                })
            }
            (_, Collective::ReduceScatter { counts }) => {
                // reduce_scatterv: one reduce per rank, each to its own block.
                let o = self.reduce_op(op);
                self.grouped(|| {
                    let mut off = 0;
                    for (r, &cnt) in counts.iter().enumerate() {
                        let src = input.sub(off, cnt)?;
                        let dst = if r == me {
                            recv.as_mut_ptr()
                        } else {
                            std::ptr::null_mut()
                        };
                        // SAFETY: range checked by `sub`; `dst` only used on the root `r`.
                        self.rc("ncclReduce", unsafe {
                            (n.reduce)(src.as_ptr(), dst, cnt, dt, o, r as i32, c, s)
                        })?;
                        off += cnt;
                    }
                    Ok(())
                })
            }
            (
                _,
                Collective::AllToAll {
                    send_counts,
                    recv_counts,
                },
            ) => self.all_to_all(input, send_counts, recv, recv_counts, s),
            (_, &Collective::Scan { count, exclusive }) => {
                self.scan(op, input, recv, count, exclusive, s)
            }
        }
    }

    fn enqueue_p2p(&self, ops: &[P2p], s: CuStream) -> EngineResult<()> {
        let (n, c) = (self.nccl, self.comm());
        let issue = |o: &P2p| match *o {
            // SAFETY: DeviceSlice contract.
            P2p::Send { buf, peer } => self.rc("ncclSend", unsafe {
                (n.send)(
                    buf.as_ptr(),
                    buf.count(),
                    nccl_dtype(buf.dtype()),
                    peer as i32,
                    c,
                    s,
                )
            }),
            // SAFETY: DeviceSlice contract.
            P2p::Recv { buf, peer } => self.rc("ncclRecv", unsafe {
                (n.recv)(
                    buf.as_mut_ptr(),
                    buf.count(),
                    nccl_dtype(buf.dtype()),
                    peer as i32,
                    c,
                    s,
                )
            }),
        };
        match ops {
            [one] => issue(one),
            _ => self.grouped(|| ops.iter().try_for_each(issue)),
        }
    }

    fn finish_enqueue(&self, what: &str) -> EngineResult<()> {
        self.rc(what, nccl::NCCL_IN_PROGRESS)
    }

    fn async_error(&self) -> Option<Error> {
        let mut rc = 0;
        // SAFETY: a communicator that no abort can free while the query runs.
        self.unless_freed(|c| unsafe { (self.nccl.comm_get_async_error)(c, &mut rc) })?;
        (rc != 0 && rc != nccl::NCCL_IN_PROGRESS).then(|| self.error("ncclCommGetAsyncError", rc))
    }

    fn abort(&self) {
        let mut freed = self.freed.write().unwrap_or_else(|p| p.into_inner());
        if !*freed {
            *freed = true;
            // SAFETY: a live communicator, aborted once, with no query in flight (they hold
            // the lock shared); abort is allowed from any thread and makes NCCL's kernels
            // return.
            unsafe { (self.nccl.comm_abort)(self.comm()) };
        }
    }

    fn close(&self) {
        let mut freed = self.freed.write().unwrap_or_else(|p| p.into_inner());
        if !*freed {
            *freed = true;
            // SAFETY: a live, idle communicator (the caller waited for its stream), destroyed
            // once.
            unsafe { (self.nccl.comm_destroy)(self.comm()) };
        }
    }

    fn split_begin(&self, color: i32, key: i32) -> EngineResult<Box<dyn PendingChild>> {
        let pending = Box::new(NcclSplit {
            nccl: self.nccl,
            cu: self.cu,
            ctx: self.ctx,
            timeout: self.timeout.get(),
            took_part: color >= 0,
            slot: Box::into_raw(Box::new(std::ptr::null_mut())),
        });
        self.cu.make_current(self.ctx as CuContext)?;
        let rc = self
            .unless_freed(|c| {
                // SAFETY: a live blocking communicator; the slot stays allocated until the
                // pending child is dropped, after the group that finishes the split ended; a
                // null config inherits the parent's settings.
                unsafe { (self.nccl.comm_split)(c, color, key, pending.slot, std::ptr::null_mut()) }
            })
            .ok_or_else(|| Error::invalid("ncclCommSplit: the communicator was aborted"))?;
        self.rc("ncclCommSplit", rc)?;
        Ok(pending)
    }

    fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }

    fn version(&self) -> (String, String) {
        (self.nccl.version_string(), self.nccl.path.clone())
    }

    fn raw_handle(&self) -> usize {
        self.comm
    }

    fn unique_id(&self) -> Option<Vec<u8>> {
        self.unique_id.map(|u| u.to_vec())
    }
}

/// A child of `ncclCommSplit`, which NCCL writes into `slot` when the group around the split
/// ends. Aborted when dropped unfinished.
struct NcclSplit {
    nccl: &'static Nccl,
    cu: &'static Driver,
    ctx: usize,
    timeout: Duration,
    took_part: bool,
    /// A heap cell of its own (not a field): NCCL keeps its address until the group ends.
    slot: *mut NcclComm,
}

// SAFETY: the slot is written by NCCL during the group end on the thread that split, and only
// read after it; NCCL communicators may be used from any thread.
unsafe impl Send for NcclSplit {}

impl NcclSplit {
    fn take(&mut self) -> NcclComm {
        // SAFETY: the slot is ours and NCCL no longer writes it (its group ended).
        unsafe { std::mem::replace(&mut *self.slot, std::ptr::null_mut()) }
    }
}

impl PendingChild for NcclSplit {
    fn finish(mut self: Box<Self>) -> EngineResult<Option<Child>> {
        let new = self.take();
        if !self.took_part || new.is_null() {
            return Ok(None);
        }
        let n = self.nccl;
        let (mut rank, mut size) = (0, 0);
        // SAFETY: a ready communicator; each call writes one int.
        let rcs = unsafe {
            (
                (n.comm_user_rank)(new, &mut rank),
                (n.comm_count)(new, &mut size),
            )
        };
        match rcs {
            (0, 0) => Ok(Some(Child {
                engine: Box::new(NcclEngine::new(
                    n,
                    self.cu,
                    new,
                    self.ctx as CuContext,
                    rank as usize,
                    size as usize,
                    self.timeout,
                )),
                rank: rank as usize,
                size: size as usize,
            })),
            (0, rc) | (rc, _) => {
                let e = n.error("ncclCommUserRank/ncclCommCount", rc, new, None);
                abort_all(n, &[new]);
                Err(e.into())
            }
        }
    }
}

impl Drop for NcclSplit {
    fn drop(&mut self) {
        let left = self.take();
        abort_all(self.nccl, &[left]);
        // SAFETY: allocated with Box::into_raw in split_begin, freed once.
        drop(unsafe { Box::from_raw(self.slot) });
    }
}

/// An engine dropped without [`DeviceEngine::close`] (a communicator that failed to wrap, a
/// split child not handed out) is aborted.
impl Drop for NcclEngine {
    fn drop(&mut self) {
        self.abort();
    }
}

fn nccl_dtype(d: DataType) -> i32 {
    match d {
        DataType::I8 => 0,
        DataType::U8 => 1,
        DataType::I32 => 2,
        DataType::U32 => 3,
        DataType::I64 => 4,
        DataType::U64 => 5,
        DataType::F16 => 6,
        DataType::F32 => 7,
        DataType::F64 => 8,
        DataType::BF16 => 9,
        // Re-expressed in the types above before they reach an engine (see `gpu::lower`).
        DataType::Bool | DataType::I16 | DataType::U16 | DataType::C64 | DataType::C128 => {
            unreachable!("{d} reaches NCCL only as bytes or components")
        }
    }
}

/// NCCL's code for `op`, or why NCCL cannot reduce with it.
fn nccl_op(op: ReduceOp) -> std::result::Result<i32, String> {
    Ok(match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Avg => 4,
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
            return Err(format!(
                "reduce op {op} is not available on GPU buffers (NCCL has no bitwise reductions); \
                 use sum/prod/min/max/avg, or reduce on the host"
            ))
        }
    })
}

/// Whether alltoall(v) moves a rank's own block with `cuMemcpyDtoDAsync` before the NCCL kernel
/// (`ACCORD_GPU_ALLTOALL_SELF=copy`) instead of as a send/receive to itself inside the NCCL
/// group (the default). The copy runs serially ahead of the kernel on the same stream, so it
/// adds its whole duration; inside the group NCCL overlaps it with the transfers to the peers.
fn self_block_by_copy() -> bool {
    static COPY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *COPY.get_or_init(|| {
        std::env::var("ACCORD_GPU_ALLTOALL_SELF").is_ok_and(|v| v.eq_ignore_ascii_case("copy"))
    })
}

/// NCCL's launch group (`ncclGroupStart` / `ncclGroupEnd`).
struct NcclGroup;

static GROUP: NcclGroup = NcclGroup;

/// NCCL's launch group, once NCCL is loaded.
pub(crate) fn launch_group() -> Result<&'static dyn LaunchGroup> {
    nccl::nccl()?;
    Ok(&GROUP)
}

impl LaunchGroup for NcclGroup {
    fn start(&self) -> Result<()> {
        let n = nccl::nccl()?;
        // SAFETY: no arguments.
        let rc = unsafe { (n.group_start)() };
        if rc != 0 {
            return Err(n.error("ncclGroupStart", rc, std::ptr::null_mut(), None));
        }
        Ok(())
    }

    fn end(&self) -> Result<bool> {
        let n = nccl::nccl()?;
        // SAFETY: no arguments; paired with a start.
        match unsafe { (n.group_end)() } {
            0 => Ok(false),
            nccl::NCCL_IN_PROGRESS => Ok(true),
            rc => Err(n.error("ncclGroupEnd", rc, std::ptr::null_mut(), None)),
        }
    }

    fn end_name(&self) -> &'static str {
        "ncclGroupEnd"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitwise_ops_are_unsupported_with_a_reason() {
        let why = nccl_op(ReduceOp::BXor).unwrap_err();
        assert!(why.contains("NCCL has no bitwise"), "{why}");
        assert_eq!(nccl_op(ReduceOp::Avg), Ok(4));
        assert_eq!(nccl_op(ReduceOp::Min), Ok(3));
    }
}
