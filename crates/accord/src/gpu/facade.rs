//! [`GpuCommunicator`]: the device engine a [`crate::Communicator`] holds once a GPU is attached
//! ([`crate::Communicator::attach_device`], [`crate::Communicator::attach_devices`]): a handle
//! on the engine-neutral device communicator ([`DeviceComm`]) with what the communicator asks
//! of it. Operations arrive as checked [`Op`]s.

use super::comm::DeviceComm;
use super::cuda::Driver;
use super::device::{DeviceSlice, Stream};
use super::engine::P2p;
use super::link::HostLink;
use super::request::GpuRequest;
use super::select::{self, Bootstrap};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, OpKind};
use crate::op::Op;
use std::sync::Arc;
use std::time::Duration;

/// A device communicator, one device per rank (see the [module docs](super)). Cheap to clone;
/// clones share the device communicator.
#[derive(Clone)]
pub(crate) struct GpuCommunicator {
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

/// What a communicator's device engine is, for tools and interoperation
/// ([`crate::Communicator::device_info`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceInfo {
    /// The device ordinal.
    pub ordinal: usize,
    /// The engine's library, e.g. `NCCL`.
    pub engine: &'static str,
    /// Its version, e.g. `2.28.9`, and where it was loaded from.
    pub version: (String, String),
    /// The communicator's own stream (`CUstream`), which [`Stream::Comm`] names.
    pub stream: usize,
    /// The library's communicator handle (`ncclComm_t`; do not destroy it).
    pub raw_handle: usize,
    /// The unique id the library's communicator was created from (`ncclUniqueId`, 128 bytes),
    /// so that code of its own can join or identify it; `None` for a split communicator.
    pub unique_id: Option<Vec<u8>>,
}

impl GpuCommunicator {
    /// Communicators over `devices` for every rank of `host`, bootstrapped as `how` says.
    pub(crate) fn create(
        host: Arc<dyn HostLink>,
        devices: &[usize],
        how: Bootstrap<'_>,
    ) -> Result<Vec<GpuCommunicator>> {
        let joined = select::open(&host, devices, how)?;
        let mut out = Vec::with_capacity(joined.len());
        // Engines not wrapped yet are aborted when dropped.
        for j in joined {
            out.push(GpuCommunicator {
                comm: DeviceComm::wrap(&host, j)?,
            });
        }
        Ok(out)
    }

    /// Run the checked collective `op` (see [`DeviceComm::run`]). `send` is `None` in place;
    /// `staging` names the sides that go through a packed copy.
    pub(crate) fn run_op(
        &self,
        op: &Op,
        send: Option<DeviceSlice>,
        recv: DeviceSlice,
        stream: Stream,
        staging: crate::buffer::Staging<'_>,
    ) -> Result<GpuRequest> {
        self.comm.run(op, send, recv, stream, staging)
    }

    pub(crate) fn context(&self) -> (&'static Driver, usize) {
        self.comm.context()
    }

    pub(crate) fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub(crate) fn size(&self) -> usize {
        self.comm.size()
    }

    pub(crate) fn device(&self) -> usize {
        self.comm.device()
    }

    /// Whether this process drives several GPUs of the communicator (they split together).
    pub(crate) fn multi(&self) -> bool {
        self.comm.multi
    }

    /// The rank of the bootstrapping communicator that holds each rank, where known.
    pub(crate) fn host_of(&self) -> Option<&[usize]> {
        self.comm.host_of.as_deref()
    }

    pub(crate) fn info(&self) -> DeviceInfo {
        let engine = self.comm.fallback();
        DeviceInfo {
            ordinal: self.device(),
            engine: engine.name(),
            version: engine.version(),
            stream: self.comm.stream(),
            raw_handle: engine.raw_handle(),
            unique_id: engine.unique_id(),
        }
    }

    pub(crate) fn set_timeout(&self, t: Duration) {
        self.comm.set_timeout(t);
    }

    /// The issue count of the oldest operation not yet seen finished on the GPU; `None` when
    /// every operation issued so far has finished.
    pub(crate) fn oldest_unfinished(&self) -> Option<u64> {
        self.comm.oldest_unfinished()
    }

    pub(crate) fn poisoned(&self) -> Option<Error> {
        self.comm.poison()
    }

    /// Stop the engine's kernels and fail every pending and later operation with `reason`.
    pub(crate) fn abort(&self, reason: &str) {
        self.comm.abort(reason);
    }

    /// Release the engine now (a closed communicator; see [`DeviceComm::shutdown`]).
    pub(crate) fn shutdown(&self, e: crate::error::Error) {
        self.comm.shutdown(e);
    }

    /// Block until every operation issued so far has finished (see
    /// [`DeviceComm::synchronize`]).
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.comm.synchronize()
    }

    /// Block until the work on `stream` has finished (see [`DeviceComm::wait_stream`]).
    pub(crate) fn wait_stream(&self, stream: Stream) -> Result<()> {
        self.comm.wait_stream(stream)
    }

    /// The `CUstream` behind `s` (the communicator's own for [`Stream::Comm`]).
    pub(crate) fn raw_stream(&self, s: Stream) -> usize {
        self.comm.stream_of(s) as usize
    }

    /// A request completing with the work enqueued on `stream` so far (see
    /// [`DeviceComm::mark`]).
    pub(crate) fn mark(&self, stream: Stream) -> Result<GpuRequest> {
        self.comm.mark(stream)
    }

    /// Send `buf` to `peer` (matched by the peer's receive, in call order; no tags).
    pub(crate) fn send(&self, buf: DeviceSlice, peer: usize, stream: Stream) -> Result<GpuRequest> {
        let fp = Fingerprint::new(OpKind::P2p, buf.dtype(), buf.count());
        self.comm.run_p2p(fp, &[P2p::Send { buf, peer }], stream)
    }

    /// Receive `buf.count` elements from `peer`.
    pub(crate) fn recv(&self, buf: DeviceSlice, peer: usize, stream: Stream) -> Result<GpuRequest> {
        let fp = Fingerprint::new(OpKind::P2p, buf.dtype(), buf.count());
        self.comm.run_p2p(fp, &[P2p::Recv { buf, peer }], stream)
    }

    /// Send `send` to `to` and receive `recv` from `from` in one step (no deadlock on rings).
    pub(crate) fn sendrecv(
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

    /// Barrier on the communicator's stream: completes once every rank has reached it.
    pub(crate) fn barrier(&self) -> Result<GpuRequest> {
        let none = DeviceSlice::empty(crate::dtype::DataType::U8);
        self.run_op(&Op::barrier(), None, none, Stream::Comm, Default::default())
    }

    /// Split this process's communicators together: `how[i]` is the `(color, key)` of
    /// `comms[i]` (see `split::split_group`).
    pub(crate) fn split_group(
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
