//! Device buffers: the device engine attached to the communicator runs them.
//!
//! Attaching a device is a collective step (the engine's ranks meet over this communicator), so
//! Rust callers do it explicitly with [`Communicator::attach_device`]; front ends that attach on
//! the first call with device buffers (the Python package, as torch does for NCCL) document that
//! this first call is collective.

use super::*;
use crate::dtype::Element;
use crate::gpu::{DeviceBuffer, DeviceSlice, GpuCommunicator, Stream};

impl Communicator {
    /// Attach GPU `ordinal` to this communicator: later calls with device buffers run on it.
    /// Collective: every rank calls it (each with its own device). Attaching twice to the same
    /// device is a no-op; another device is an error (one device per rank and communicator;
    /// see [`Communicator::attach_devices`] for several GPUs per process).
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
        let host = Arc::new(super::device::AttachedHost(Arc::downgrade(&self.inner)));
        let mut g = GpuCommunicator::create(host, &[ordinal], crate::gpu::Bootstrap::OverHost)?;
        let _ = self.inner.device.set(g.remove(0));
        Ok(())
    }

    /// The GPU attached to this communicator, if any.
    pub fn attached_device(&self) -> Option<usize> {
        self.inner.device.get().map(GpuCommunicator::device)
    }

    /// The attached device engine: its library and version, its stream and handle.
    pub fn device_info(&self) -> Option<crate::gpu::DeviceInfo> {
        self.inner.device.get().map(GpuCommunicator::info)
    }

    /// `len` uninitialised elements on the attached GPU, freed when dropped.
    pub fn device_alloc<T: Element>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        DeviceBuffer::alloc(self.device_engine()?, len)
    }

    /// A copy of `data` on the attached GPU.
    pub fn device_copy<T: Element>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        DeviceBuffer::from_host(self.device_engine()?, data)
    }

    /// Wait until every device operation issued so far has finished; the first error of one
    /// that failed. Nothing to wait for without an attached device.
    pub fn synchronize(&self) -> Result<()> {
        match self.inner.device.get() {
            Some(g) => g.synchronize(),
            None => Ok(()),
        }
    }

    /// Block until everything enqueued on `stream` so far has finished, the caller's own
    /// kernels included (RAFT's `sync_stream`): first every device operation of this
    /// communicator, with its deadline and failure checks, then the stream, within the
    /// communicator's timeout. The communicator's failure if it fails meanwhile. Without an
    /// attached device there is nothing of the communicator's to wait for: its failure, if it
    /// has one.
    pub fn sync_stream(&self, stream: Stream) -> Result<()> {
        match self.inner.device.get() {
            Some(g) => {
                g.synchronize()?;
                g.wait_stream(stream)
            }
            None => self.poisoned().map_or(Ok(()), Err),
        }
    }

    /// A completion for everything enqueued on `stream` so far, through the attached device's
    /// failure and deadline checks: how an operation that ends in stream-ordered work of its
    /// own (after a collective) says when it is done.
    pub(crate) fn stream_completion(&self, stream: Stream) -> Result<Completion> {
        Ok(Completion::device(self.device_engine()?.mark(stream)?))
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

    /// Run a checked collective on device buffers; `staging` names the sides whose blocks go
    /// through a packed copy (displacements).
    pub(super) fn on_device(
        &self,
        op: &Op,
        send: Option<DeviceSlice>,
        recv: DeviceSlice,
        stream: Stream,
        staging: crate::buffer::Staging<'_>,
    ) -> Result<Completion> {
        self.check_poison()?;
        let g = self.device_engine()?;
        self.explain_engine(op, || "the GPU (NCCL)");
        let rec = self.record_device(op);
        let span = self.trace_begin();
        let r = g.run_op(op, send, recv, stream, staging);
        if let Ok(req) = &r {
            self.record_device_seq(rec, req.seq());
        }
        self.record_end(rec, &r);
        if let Some(span) = span {
            let name = format!("enqueue {}", op.kind().name());
            let seq = r.as_ref().ok().map(|q| q.seq());
            self.trace_end(span, (name, seq), &op.fp, crate::observe::Route::Device, &r);
        }
        Ok(Completion::device(r?))
    }
}
