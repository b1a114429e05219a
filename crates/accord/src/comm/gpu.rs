//! Device buffers: the device engine attached to the communicator runs them.
//!
//! Attaching a device is a collective step (the engine's ranks meet over this communicator), so
//! Rust callers do it explicitly with [`Communicator::attach_device`]; front ends that attach on
//! the first call with device buffers (the Python package, as torch does for NCCL) document that
//! this first call is collective.

use super::*;
use crate::gpu::{DeviceSlice, GpuCommunicator, Stream};

impl Communicator {
    /// Attach GPU `ordinal` to this communicator: later calls with device buffers run on it.
    /// Collective: every rank calls it (each with its own device). Attaching twice to the same
    /// device is a no-op; another device is an error (one device per rank and communicator).
    pub fn attach_device(&self, ordinal: usize) -> Result<()> {
        // Two threads' first device calls must not both create an engine.
        let _one_at_a_time = self
            .inner
            .attaching
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(g) = self.inner.device.get() {
            return match g.device() == ordinal {
                true => Ok(()),
                false => Err(Error::invalid(format!(
                    "this communicator is attached to GPU {}; it cannot also use GPU {ordinal}",
                    g.device()
                ))),
            };
        }
        let g = GpuCommunicator::new(self, ordinal)?;
        let _ = self.inner.device.set(g);
        Ok(())
    }

    /// The GPU attached to this communicator, if any.
    pub fn attached_device(&self) -> Option<usize> {
        self.inner.device.get().map(GpuCommunicator::device)
    }

    /// Wait until every device operation issued so far has finished; the first error of one
    /// that failed. Nothing to wait for without an attached device.
    pub fn synchronize(&self) -> Result<()> {
        match self.inner.device.get() {
            Some(g) => g.synchronize(),
            None => Ok(()),
        }
    }

    /// The device engine, or an error saying how to attach one.
    pub(crate) fn device_engine(&self) -> Result<&GpuCommunicator> {
        self.inner.device.get().ok_or_else(|| {
            Error::invalid(
                "device buffers need a device attached to the communicator: call \
                 attach_device(ordinal) on every rank first (it is collective)",
            )
        })
    }

    /// Run a checked collective on device buffers.
    pub(super) fn on_device(
        &self,
        op: &Op,
        send: Option<DeviceSlice>,
        recv: DeviceSlice,
        stream: Stream,
    ) -> Result<Completion> {
        let g = self.device_engine()?;
        self.explain_engine(op, "the GPU (NCCL)");
        let send_or_recv = send.unwrap_or(recv);
        let counts = |c: &Collective| match c {
            Collective::AllGather { counts }
            | Collective::Gather { counts, .. }
            | Collective::Scatter { counts, .. }
            | Collective::ReduceScatter { counts } => counts.clone(),
            _ => Vec::new(),
        };
        let r = op.reduce_or_sum();
        let req = match (op.kind(), &op.coll) {
            (OpKind::Barrier, _) => g.barrier(stream),
            (OpKind::Broadcast, &Collective::Broadcast { root, .. }) => {
                g.broadcast(send_or_recv, recv, root, stream)
            }
            (OpKind::AllReduce, _) => g.all_reduce(send_or_recv, recv, r, stream),
            (OpKind::Reduce, &Collective::Reduce { root, .. }) => {
                g.reduce(send_or_recv, recv, r, root, stream)
            }
            (OpKind::AllGather, _) => g.all_gather(send_or_recv, recv, stream),
            (OpKind::AllGatherV, c) => g.all_gather_v(send_or_recv, recv, &counts(c), stream),
            (OpKind::Gather, &Collective::Gather { root, .. }) => {
                g.gather(send_or_recv, recv, root, stream)
            }
            (OpKind::GatherV, c @ &Collective::Gather { root, .. }) => {
                g.gather_v(send_or_recv, recv, &counts(c), root, stream)
            }
            (OpKind::Scatter, &Collective::Scatter { root, .. }) => {
                g.scatter(send_or_recv, recv, root, stream)
            }
            (OpKind::ScatterV, c @ &Collective::Scatter { root, .. }) => {
                g.scatter_v(send_or_recv, recv, &counts(c), root, stream)
            }
            (OpKind::ReduceScatter, _) => g.reduce_scatter(send_or_recv, recv, r, stream),
            (OpKind::ReduceScatterV, c) => {
                g.reduce_scatter_v(send_or_recv, recv, &counts(c), r, stream)
            }
            (OpKind::AllToAll, _) => g.all_to_all(send_or_recv, recv, stream),
            (
                OpKind::AllToAllV,
                Collective::AllToAll {
                    send_counts,
                    recv_counts,
                },
            ) => g.all_to_all_v(send_or_recv, send_counts, recv, recv_counts, stream),
            (kind, _) => Err(Error::Unsupported(format!("{kind} on device buffers"))),
        }?;
        Ok(Completion::device(req))
    }
}
