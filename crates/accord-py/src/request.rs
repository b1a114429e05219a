//! `Request`: what a nonblocking call (`async_op=True`) returns.
//!
//! A host operation runs on a thread of its own and reports to a [`Done`]; a device operation is
//! the core's [`Completion`], enqueued on its stream. Either way `wait()` returns the call's
//! output once the operation has finished, and the request keeps the arrays alive until then.

use crate::errors;
use crate::scalar::Output;
use accord::Completion;
use pyo3::prelude::*;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The state a host operation's [`Request`] and its thread share.
#[derive(Default)]
pub(crate) struct Done {
    result: Mutex<Option<accord::Result<()>>>,
    cv: Condvar,
}

impl Done {
    /// Record the operation's result and wake the waiters.
    pub(crate) fn finish(&self, r: accord::Result<()>) {
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        self.cv.notify_all();
    }

    fn finished(&self) -> bool {
        self.result
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// The result, once there is one before `deadline` (`None`: no deadline).
    fn wait(&self, deadline: Option<Instant>) -> Option<accord::Result<()>> {
        let mut g = self.result.lock().unwrap_or_else(|e| e.into_inner());
        while g.is_none() {
            g = match deadline {
                None => self.cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    let w = self.cv.wait_timeout(g, d - now);
                    w.unwrap_or_else(|e| e.into_inner()).0
                }
            };
        }
        g.clone()
    }
}

/// What a [`Request`] waits for.
pub(crate) enum Pending {
    /// A host operation running on a thread.
    Host(Arc<Done>),
    /// An operation enqueued on a CUDA stream.
    Device(Arc<Completion>),
}

/// A nonblocking operation. `wait()` returns the output array (or `None`) once it is done; the
/// arrays stay alive until then.
#[pyclass(module = "accord._native")]
pub(crate) struct Request {
    pub(crate) pending: Pending,
    pub(crate) output: Option<Output>,
    /// The arrays, kept alive for the caller's sake until completion is observed.
    pub(crate) _keep: Vec<PyObject>,
}

fn wait_timeout_error(timeout: Option<f64>) -> PyErr {
    errors::to_py(accord::Error::Timeout {
        op: "Request.wait".into(),
        seq: 0,
        comm: "-".into(),
        waiting_for: vec![],
        after: Duration::from_secs_f64(timeout.unwrap_or(0.0).max(0.0)),
        hint: "; the operation is still running".into(),
    })
}

/// Poll `c` until it has finished or `deadline` passes (`None`: still running).
fn poll_until(c: &Completion, deadline: Instant) -> Option<accord::Result<()>> {
    loop {
        match c.test() {
            Ok(false) if Instant::now() < deadline => std::thread::sleep(Duration::from_micros(50)),
            Ok(false) => return None,
            r => return Some(r.map(|_| ())),
        }
    }
}

#[pymethods]
impl Request {
    /// Block until the operation finishes (at most `timeout` seconds: then `accord.TimeoutError`,
    /// and the operation keeps running). Raises the operation's error, if any. For GPU arrays
    /// this blocks the host until the operation has completed on the GPU.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<PyObject>> {
        let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        let finished = match &self.pending {
            Pending::Host(done) => py.allow_threads(|| done.wait(deadline)),
            Pending::Device(c) => py.allow_threads(|| match deadline {
                // The watchdog bounds an unbounded wait by the communicator's timeout.
                None => Some(c.wait()),
                Some(d) => poll_until(c, d),
            }),
        };
        match finished {
            None => Err(wait_timeout_error(timeout)),
            Some(Ok(())) => self.output.as_ref().map(|o| o.deliver(py)).transpose(),
            Some(Err(e)) => Err(errors::to_py(e)),
        }
    }

    /// Whether the operation has finished (successfully or not).
    fn test(&self) -> bool {
        match &self.pending {
            Pending::Host(done) => done.finished(),
            // A failed communicator has finished the operation, unsuccessfully: wait() raises.
            Pending::Device(c) => c.test().unwrap_or(true),
        }
    }

    /// Alias of `test()`, like torch's `Work.is_completed()`.
    fn is_completed(&self) -> bool {
        self.test()
    }

    /// Whether the operation runs on a GPU stream (CUDA arrays) rather than on the host.
    #[getter]
    fn is_gpu(&self) -> bool {
        matches!(self.pending, Pending::Device(_))
    }
}
