//! [`GpuCommunicator`]: the public API over one device communicator, as callers knew it before
//! the communicator took device buffers itself. Each method states its call as an [`Op`]
//! ([`Op::new`] checks it) and hands it to the engine-neutral layer ([`DeviceComm`]).
//! How each method states its call is in `calls`.

use super::comm::DeviceComm;
use super::cuda::Driver;
use super::device::{DeviceSlice, Stream};
use super::engine::P2p;
use super::link::HostLink;
use super::request::GpuRequest;
use super::select::{self, Bootstrap};
use crate::dtype::ReduceOp;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, OpKind};
use crate::op::{Op, Request};
use calls::Place;
use std::sync::Arc;
use std::time::Duration;

mod calls;

/// A communicator over GPU buffers, one device per rank (see the [module docs](super)).
///
/// Cheap to clone; clones share the device communicator.
#[derive(Clone)]
pub struct GpuCommunicator {
    comm: Arc<DeviceComm>,
}

impl std::fmt::Debug for GpuCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuCommunicator")
            .field("id", &self.comm.id())
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .field("device", &self.comm.device())
            .finish()
    }
}

impl GpuCommunicator {
    /// Communicators over `devices` for every rank of `host` (see `GpuCommunicator::new`),
    /// bootstrapped as `how` says.
    pub(crate) fn create(
        host: Arc<dyn HostLink>,
        devices: &[usize],
        how: Bootstrap<'_>,
    ) -> Result<Vec<GpuCommunicator>> {
        let joined = select::open(host.as_ref(), devices, how)?;
        let mut out = Vec::with_capacity(joined.len());
        // Engines not wrapped yet are aborted when dropped.
        for j in joined {
            out.push(GpuCommunicator {
                comm: DeviceComm::wrap(&host, j)?,
            });
        }
        Ok(out)
    }

    /// Run the checked collective `op` (see [`DeviceComm::run`]): the entry for callers that
    /// built the [`Op`] themselves. `send` is `None` in place.
    pub(crate) fn run_op(
        &self,
        op: &Op,
        send: Option<DeviceSlice>,
        recv: DeviceSlice,
        stream: Stream,
    ) -> Result<GpuRequest> {
        self.comm.run(op, send, recv, stream)
    }

    pub(crate) fn context(&self) -> (&'static Driver, usize) {
        self.comm.context()
    }

    /// This rank (NCCL rank).
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks (NCCL ranks: processes x GPUs per process).
    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// The device ordinal this communicator works on.
    pub fn device(&self) -> usize {
        self.comm.device()
    }

    /// The communicator's id (shared by all ranks; names its keys in the store).
    pub fn id(&self) -> &str {
        self.comm.id()
    }

    /// The loaded NCCL's version, e.g. `2.28.9`, and where it came from.
    pub fn nccl_version(&self) -> (String, String) {
        self.comm.fallback().version()
    }

    /// The communicator's own stream as a raw `CUstream`.
    pub fn stream(&self) -> usize {
        self.comm.stream()
    }

    /// The raw `ncclComm_t` (for interoperation; do not destroy it).
    pub fn raw_comm(&self) -> usize {
        self.comm.fallback().raw_handle()
    }

    /// Deadline for any one operation (enforced by the watchdog).
    pub fn timeout(&self) -> Duration {
        self.comm.timeout()
    }

    /// Change the deadline.
    pub fn set_timeout(&self, t: Duration) {
        self.comm.set_timeout(t);
    }

    /// The error that failed this communicator, if any.
    pub fn poisoned(&self) -> Option<Error> {
        self.comm.poison()
    }

    /// Abort: stop NCCL's kernels and fail every pending and later operation with `reason`.
    pub fn abort(&self, reason: &str) {
        self.comm.abort(reason);
    }

    /// Block until every operation issued so far has finished; the communicator's failure if
    /// one of them did not finish before it (or, after a desync, finished with mismatched
    /// calls). A failure after they all finished (a peer that exited since) shows at the next
    /// call instead.
    pub fn synchronize(&self) -> Result<()> {
        self.comm.synchronize()
    }

    // -----------------------------------------------------------------------------------------
    // Operations.

    /// Check the call and run it.
    fn run(
        &self,
        req: Request<'_>,
        send: DeviceSlice,
        recv: DeviceSlice,
        stream: Stream,
    ) -> Result<GpuRequest> {
        if send.dtype() != recv.dtype() {
            return Err(Error::invalid(format!(
                "send buffer is {} but receive buffer is {}",
                send.dtype(),
                recv.dtype()
            )));
        }
        let op = Op::new(req, self.rank(), self.size())?;
        self.run_op(&op, Some(send), recv, stream)
    }

    fn at(&self) -> Place {
        Place {
            rank: self.rank(),
            size: self.size(),
        }
    }

    /// allreduce: `recv[i] = op over ranks of send[i]`; `send` and `recv` may be the same.
    pub fn all_reduce(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        op: ReduceOp,
        stream: Stream,
    ) -> Result<GpuRequest> {
        self.run(calls::all_reduce(&send, &recv, op), send, recv, stream)
    }

    /// broadcast `send` of `root` into every rank's `recv` (`send` is read on the root only;
    /// pass the same slice twice for in place).
    pub fn broadcast(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        root: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        self.run(calls::broadcast(&send, &recv, root), send, recv, stream)
    }

    /// reduce into `recv` on `root` (`recv` is ignored elsewhere).
    pub fn reduce(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        op: ReduceOp,
        root: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        self.run(calls::reduce(&send, &recv, op, root), send, recv, stream)
    }

    /// allgather: `recv` (size x `send.count`) holds every rank's `send` in rank order.
    pub fn all_gather(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        stream: Stream,
    ) -> Result<GpuRequest> {
        self.run(
            calls::all_gather(self.at(), &send, &recv),
            send,
            recv,
            stream,
        )
    }

    /// allgatherv: rank r contributes `counts[r]` elements; `recv` holds them back to back.
    pub fn all_gather_v(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        counts: &[usize],
        stream: Stream,
    ) -> Result<GpuRequest> {
        let req = calls::all_gather_v(self.at(), &send, &recv, counts);
        self.run(req, send, recv, stream)
    }

    /// gather: `recv` on `root` holds size x `send.count` elements in rank order.
    pub fn gather(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        root: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        let req = calls::gather(self.at(), &send, &recv, root);
        self.run(req, send, recv, stream)
    }

    /// gatherv: rank r sends `counts[r]` elements; `recv` on `root` holds them back to back.
    pub fn gather_v(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        counts: &[usize],
        root: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        let req = calls::gather_v(self.at(), &send, &recv, counts, root);
        self.run(req, send, recv, stream)
    }

    /// scatter: rank r receives elements `r*recv.count ..` of `send` on `root`.
    pub fn scatter(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        root: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        let req = calls::scatter(self.at(), &send, &recv, root);
        self.run(req, send, recv, stream)
    }

    /// scatterv: rank r receives `counts[r]` elements, taken back to back from `send` on `root`.
    pub fn scatter_v(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        counts: &[usize],
        root: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        let req = calls::scatter_v(self.at(), &send, &recv, counts, root);
        self.run(req, send, recv, stream)
    }

    /// reduce_scatter: `recv` (count c) gets block `rank` of the reduction of every rank's
    /// `send` (size x c).
    pub fn reduce_scatter(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        op: ReduceOp,
        stream: Stream,
    ) -> Result<GpuRequest> {
        let req = calls::reduce_scatter(self.at(), &send, &recv, op);
        self.run(req, send, recv, stream)
    }

    /// reduce_scatterv: rank r gets `counts[r]` elements: its block of the reduction of every
    /// rank's `send` (sum(counts) elements, blocks back to back).
    pub fn reduce_scatter_v(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        counts: &[usize],
        op: ReduceOp,
        stream: Stream,
    ) -> Result<GpuRequest> {
        let req = calls::reduce_scatter_v(self.at(), &send, &recv, counts, op);
        self.run(req, send, recv, stream)
    }

    /// alltoall: block r (of `send.count / size` elements) of `send` goes to rank r; `recv`
    /// gets the blocks in rank order.
    pub fn all_to_all(
        &self,
        send: DeviceSlice,
        recv: DeviceSlice,
        stream: Stream,
    ) -> Result<GpuRequest> {
        self.run(calls::all_to_all(&send, &recv), send, recv, stream)
    }

    /// alltoallv: `send_counts[r]` elements go to rank r (blocks back to back in `send`);
    /// `recv_counts[r]` arrive from rank r.
    pub fn all_to_all_v(
        &self,
        send: DeviceSlice,
        send_counts: &[usize],
        recv: DeviceSlice,
        recv_counts: &[usize],
        stream: Stream,
    ) -> Result<GpuRequest> {
        let req = calls::all_to_all_v(&send, send_counts, &recv, recv_counts);
        self.run(req, send, recv, stream)
    }

    /// Send `buf` to `peer` (matched by the peer's [`GpuCommunicator::recv`], in call order;
    /// NCCL has no tags).
    pub fn send(&self, buf: DeviceSlice, peer: usize, stream: Stream) -> Result<GpuRequest> {
        let fp = Fingerprint::new(OpKind::P2p, buf.dtype(), buf.count());
        self.comm.run_p2p(fp, &[P2p::Send { buf, peer }], stream)
    }

    /// Receive `buf.count` elements from `peer`.
    pub fn recv(&self, buf: DeviceSlice, peer: usize, stream: Stream) -> Result<GpuRequest> {
        let fp = Fingerprint::new(OpKind::P2p, buf.dtype(), buf.count());
        self.comm.run_p2p(fp, &[P2p::Recv { buf, peer }], stream)
    }

    /// Send `send` to `to` and receive `recv` from `from` in one step (no deadlock on rings).
    pub fn send_recv(
        &self,
        send: DeviceSlice,
        to: usize,
        recv: DeviceSlice,
        from: usize,
        stream: Stream,
    ) -> Result<GpuRequest> {
        let fp = Fingerprint::new(OpKind::SendRecv, send.dtype(), send.count());
        let ops = [
            P2p::Send {
                buf: send,
                peer: to,
            },
            P2p::Recv {
                buf: recv,
                peer: from,
            },
        ];
        self.comm.run_p2p(fp, &ops, stream)
    }

    /// Barrier, ordered on the stream: completes once every rank has reached it.
    pub fn barrier(&self, stream: Stream) -> Result<GpuRequest> {
        let none = DeviceSlice::empty(crate::dtype::DataType::U8);
        self.run_op(&Op::barrier(), None, none, stream)
    }

    /// Split into disjoint communicators: ranks passing the same `color` form one, ordered by
    /// (`key`, rank); `None` gets `None`. Collective over this communicator. Communicators from
    /// [`GpuCommunicator::new_multi`] split together, with [`GpuCommunicator::split_group`].
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<GpuCommunicator>> {
        if self.comm.multi {
            return Err(Error::invalid(
                "this communicator drives one of several GPUs of its process: split all of \
                 them at once with GpuCommunicator::split_group",
            ));
        }
        let mut v = Self::split_group(std::slice::from_ref(self), &[(color, key)])?;
        Ok(v.pop().flatten())
    }

    /// Split this process's communicators (one per GPU, from [`GpuCommunicator::new_multi`])
    /// in one NCCL group: `how[i]` is the `(color, key)` of `comms[i]`, as in
    /// [`GpuCommunicator::split`]. Devices of one process may pick different colors.
    ///
    /// Every rank first posts its `(color, key)` to the rendezvous store and waits, under the
    /// timeout, until all ranks of the communicator have: a rank that never calls split is
    /// named in a timeout instead of leaving the others blocked inside NCCL.
    pub fn split_group(
        comms: &[GpuCommunicator],
        how: &[(Option<u32>, i64)],
    ) -> Result<Vec<Option<GpuCommunicator>>> {
        let inner: Vec<Arc<DeviceComm>> = comms.iter().map(|c| c.comm.clone()).collect();
        let children = super::split::split_group(&inner, how)?;
        Ok(children
            .into_iter()
            .map(|c| c.map(|comm| GpuCommunicator { comm }))
            .collect())
    }
}
