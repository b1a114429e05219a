//! Running one call: where its arrays live decides only *when* it completes, never which core
//! method runs it.
//!
//! - Host arrays: a blocking call runs now with the GIL released; a nonblocking one takes its
//!   place in the communicator's order at call time ([`accord::Communicator::reserve`], or the
//!   turn its `post_send`/`post_recv` took) and runs on a thread, returning a [`Request`].
//! - CUDA arrays: the first call attaches the device to the communicator
//!   ([`accord::Communicator::attach_device`], a collective step, as torch's NCCL process group
//!   creates its communicator on first use); every call is enqueued on the framework's current
//!   stream and returns at once (a [`Request`] over the [`Completion`] for `async_op`).

use crate::buffers::{Buf, Call};
use crate::communicator::Communicator;
use crate::errors::to_py as err;
use crate::request::{Done, Pending, Request};
use crate::scalar::Output;
use accord::{Communicator as CoreComm, Completion};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::Arc;

/// One operation: it builds its buffers from the call's arrays and calls the core once, on host
/// or CUDA arrays alike. `None`: it finished on the host without a [`Completion`] (a posted
/// message).
pub(crate) type Job =
    Box<dyn FnOnce(&CoreComm, &Arrays) -> accord::Result<Option<Completion>> + Send>;

/// The arrays of a call in argument order (`arrays[i]`), as the call named them.
pub(crate) struct Arrays(Vec<(&'static str, Buf)>);

impl Arrays {
    /// Array `i`, if the call has that many.
    pub(crate) fn get(&self, i: usize) -> Option<&Buf> {
        self.0.get(i).map(|(_, b)| b)
    }
}

impl std::ops::Index<usize> for Arrays {
    type Output = Buf;
    fn index(&self, i: usize) -> &Buf {
        &self.0[i].1
    }
}

/// What a blocking call returns: its output, or None.
pub(crate) fn deliver(py: Python<'_>, output: Option<Output>) -> PyResult<PyObject> {
    output.map_or_else(|| Ok(py.None()), |o| o.deliver(py))
}

impl Communicator {
    /// Run one call (see the module docs): `output` is what it returns once done, `keep` what a
    /// Request keeps alive.
    pub(crate) fn run(&self, py: Python<'_>, mut call: Call, job: Job) -> PyResult<PyObject> {
        call.check_reducible()?;
        match call.device()? {
            Some(device) => self.run_device(py, call, device, job),
            None => self.run_host(py, call, job),
        }
    }

    fn run_host(&self, py: Python<'_>, call: Call, job: Job) -> PyResult<PyObject> {
        let bufs = Arrays(call.bufs);
        let comm = self.inner.clone();
        if !call.async_op {
            // A collective of a one-rank world never waits: releasing the GIL would cost more
            // than the call. (A message to itself may wait for another thread's: it releases.)
            if call.ordered && comm.size() == 1 {
                job(&comm, &bufs).map_err(err)?;
            } else {
                py.allow_threads(|| job(&comm, &bufs)).map_err(err)?;
            }
            drop(bufs);
            return deliver(py, call.output);
        }
        // Take the place in the order now, on the caller's thread, so that requests started in
        // the same order on every rank match up.
        let handle = if call.ordered { comm.reserve() } else { comm };
        let done = Arc::new(Done::default());
        let d2 = done.clone();
        std::thread::Builder::new()
            .name("accord-request".into())
            .spawn(move || {
                d2.finish(job(&handle, &bufs).map(|_| ()));
                drop(bufs);
            })
            .map_err(|e| PyValueError::new_err(format!("cannot start a thread: {e}")))?;
        let req = Request {
            pending: Pending::Host(done),
            output: call.output,
            _keep: call.keep,
        };
        Ok(Py::new(py, req)?.into_any())
    }

    fn run_device(
        &self,
        py: Python<'_>,
        call: Call,
        device: usize,
        job: Job,
    ) -> PyResult<PyObject> {
        let bufs = Arrays(call.bufs);
        let comm = &self.inner;
        // Collective the first time (every rank's first call with CUDA arrays); after that
        // only another device reaches the core, which refuses it.
        if comm.attached_device() != Some(device) {
            py.allow_threads(|| comm.attach_device(device))
                .map_err(err)?;
        }
        // The addresses stay valid for the operation: a Request keeps the arrays; after a
        // blocking call the caller's references do, and stream-ordered allocators reuse the
        // memory only after the operation, which is enqueued on the same stream.
        let completion = py.allow_threads(|| job(comm, &bufs)).map_err(err)?;
        drop(bufs);
        let pending = match completion {
            Some(c) => Pending::Device(Arc::new(c)),
            None => {
                let done = Done::default();
                done.finish(Ok(()));
                Pending::Host(Arc::new(done))
            }
        };
        if !call.async_op {
            return deliver(py, call.output);
        }
        let req = Request {
            pending,
            output: call.output,
            _keep: call.keep,
        };
        Ok(Py::new(py, req)?.into_any())
    }
}
