//! `accord._native`: the Python extension module of Accord.
//!
//! It binds the type-erased core ([`accord::Communicator`]'s `*_bytes` methods): arrays arrive
//! through [`array::extract`] (DLPack, `__array_interface__`, buffer protocol), immutable
//! scalars (numpy scalars, Python numbers) as one-element stand-ins whose result is returned as
//! a new scalar ([`scalar`]), every
//! communication runs with the GIL released, and nonblocking calls (`async_op=True`) reserve
//! their place in the communicator's order at call time and run on a thread of their own.
//!
//! CUDA arrays (DLPack device CUDA, `__cuda_array_interface__`) go to the NCCL backend instead
//! ([`accord::gpu`]): each Python communicator creates one [`GpuCommunicator`] per CUDA device
//! the first time it is given arrays on that device, and enqueues every operation on the array
//! framework's current stream without waiting for the GPU. [`Communicator::run`] is the single
//! dispatch point between the two.
//! The pure-Python package `accord` re-exports this module and adds the Ray, Dask and MPI glue.

// pyo3 0.22's #[pymethods] expansion trips this lint on every fallible method.
#![allow(clippy::useless_conversion)]

mod array;
mod errors;
mod scalar;

use accord::gpu::{DeviceSlice, GpuCommunicator, GpuRequest, Stream};
use accord::rendezvous::{self, InitMethod, StoreServer as CoreServer};
use accord::{Communicator as CoreComm, DataType, ReduceOp};
use array::{Array, CudaArray, HostArray};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use scalar::{Arg, Output};
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// An operation on host buffers.
type Job = Box<dyn FnOnce(&CoreComm, &[HostArray]) -> accord::Result<()> + Send>;
/// The same operation on CUDA buffers (in the same order), enqueued on `Stream`.
type GpuJob =
    Box<dyn FnOnce(&GpuCommunicator, &[DeviceSlice], Stream) -> accord::Result<GpuRequest> + Send>;

fn err(e: accord::Error) -> PyErr {
    errors::to_py(e)
}

/// One array argument: host memory, or CUDA memory for the GPU backend.
enum Buf {
    Host(HostArray),
    Cuda(CudaArray),
}

impl Buf {
    fn dtype(&self) -> DataType {
        match self {
            Buf::Host(a) => a.dtype,
            Buf::Cuda(a) => a.dtype,
        }
    }
}

/// The memory of `obj` (`what` names the argument in messages). Devices other than CUDA are
/// refused.
fn buf(obj: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<Buf> {
    match array::extract(obj, what, writable)? {
        Array::Host(a) => Ok(Buf::Host(a)),
        Array::Cuda(a) => Ok(Buf::Cuda(a)),
        Array::Device(kind, id) => Err(PyErr::from_value_bound(
            errors::unsupported_device(obj.py(), what, kind, id)?.into_any(),
        )),
    }
}

fn same_dtype(a: &Buf, b: &Buf, what: &str) -> PyResult<()> {
    if a.dtype() != b.dtype() {
        return Err(PyTypeError::new_err(format!(
            "{what}: input has dtype {} but output has dtype {}; they must match",
            a.dtype(),
            b.dtype()
        )));
    }
    Ok(())
}

/// A reduce/gather input on a rank that has no output: stands in for the output slot.
fn or_self(b: &[DeviceSlice], i: usize) -> DeviceSlice {
    b.get(i).copied().unwrap_or(b[0])
}

fn reduce_op(op: &Bound<'_, PyAny>) -> PyResult<ReduceOp> {
    let name: String = match op.extract::<String>() {
        Ok(s) => s,
        Err(_) => op
            .getattr("value")
            .and_then(|v| v.extract())
            .map_err(|_| {
                PyTypeError::new_err(
                    "op must be a string (sum, prod, min, max, avg, band, bor, bxor) or accord.ReduceOp",
                )
            })?,
    };
    ReduceOp::parse(&name).map_err(|_| {
        PyValueError::new_err(format!(
            "unknown reduce op {name:?}; use one of sum, prod, min, max, avg, band, bor, bxor"
        ))
    })
}

/// The state a [`Request`] and its worker thread share.
#[derive(Default)]
struct Done {
    result: Mutex<Option<accord::Result<()>>>,
    cv: Condvar,
}

/// What a [`Request`] waits for.
enum Pending {
    /// A host operation running on a thread.
    Host(Arc<Done>),
    /// An operation enqueued on a CUDA stream.
    Gpu(GpuRequest),
}

/// A nonblocking operation. `wait()` returns the output array (or `None`) once it is done; the
/// arrays stay alive until then.
#[pyclass(module = "accord._native")]
struct Request {
    pending: Pending,
    output: Option<Output>,
    /// The arrays, kept alive for the caller's sake until completion is observed.
    _keep: Vec<PyObject>,
}

fn wait_timeout_error(timeout: Option<f64>) -> PyErr {
    err(accord::Error::Timeout {
        op: "Request.wait".into(),
        seq: 0,
        comm: "-".into(),
        waiting_for: vec![],
        after: Duration::from_secs_f64(timeout.unwrap_or(0.0).max(0.0)),
        hint: "; the operation is still running".into(),
    })
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
            Pending::Host(done) => {
                let done = done.clone();
                py.allow_threads(move || {
                    let mut g = done.result.lock().unwrap_or_else(|e| e.into_inner());
                    while g.is_none() {
                        match deadline {
                            None => g = done.cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                            Some(d) => {
                                let now = Instant::now();
                                if now >= d {
                                    return None;
                                }
                                g = done
                                    .cv
                                    .wait_timeout(g, d - now)
                                    .unwrap_or_else(|e| e.into_inner())
                                    .0;
                            }
                        }
                    }
                    g.clone()
                })
            }
            Pending::Gpu(req) => py.allow_threads(|| match deadline {
                // The watchdog bounds an unbounded wait by the communicator's timeout.
                None => Some(req.wait()),
                Some(d) => loop {
                    match req.test() {
                        Ok(false) if Instant::now() < d => {
                            std::thread::sleep(Duration::from_micros(50))
                        }
                        Ok(false) => break None,
                        r => break Some(r.map(|_| ())),
                    }
                },
            }),
        };
        match finished {
            None => Err(wait_timeout_error(timeout)),
            Some(Ok(())) => self.output.as_ref().map(|o| o.deliver(py)).transpose(),
            Some(Err(e)) => Err(err(e)),
        }
    }

    /// Whether the operation has finished (successfully or not).
    fn test(&self) -> bool {
        match &self.pending {
            Pending::Host(done) => done
                .result
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some(),
            // A failed communicator has finished the operation, unsuccessfully: wait() raises.
            Pending::Gpu(req) => req.test().unwrap_or(true),
        }
    }

    /// Alias of `test()`, like torch's `Work.is_completed()`.
    fn is_completed(&self) -> bool {
        self.test()
    }

    /// Whether the operation runs on a GPU stream (CUDA arrays) rather than on the host.
    #[getter]
    fn is_gpu(&self) -> bool {
        matches!(self.pending, Pending::Gpu(_))
    }
}

/// One call: its name, mode and arrays (named as in messages), what it returns and keeps alive.
struct Call {
    op: &'static str,
    async_op: bool,
    /// Collective (takes a place in the host order); point-to-point calls are not.
    ordered: bool,
    bufs: Vec<(&'static str, Buf)>,
    output: Option<Output>,
    keep: Vec<PyObject>,
}

/// A group of ranks that communicate. Every member must call the same operations in the same
/// order; disagreements raise `accord.DesyncError`.
#[pyclass(module = "accord._native", subclass)]
struct Communicator {
    inner: CoreComm,
    /// The NCCL communicators of this group, by CUDA device, created on first use.
    gpus: Arc<Mutex<BTreeMap<usize, GpuCommunicator>>>,
}

impl Communicator {
    fn wrap(inner: CoreComm) -> Communicator {
        Communicator {
            inner,
            gpus: Arc::default(),
        }
    }

    /// The NCCL communicator for `device`, created (collectively over this group) the first
    /// time.
    fn gpu(&self, py: Python<'_>, device: usize) -> PyResult<GpuCommunicator> {
        let gpus = self.gpus.clone();
        let host = self.inner.clone();
        py.allow_threads(move || {
            let mut m = gpus.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(g) = m.get(&device) {
                return Ok(g.clone());
            }
            let g = GpuCommunicator::new(&host, device)?;
            m.insert(device, g.clone());
            Ok(g)
        })
        .map_err(err)
    }

    fn gpu_list(&self) -> Vec<GpuCommunicator> {
        let m = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
        m.values().cloned().collect()
    }

    /// Run one call: on the host (`job`) when every array is host memory, on the GPU (`gpu_job`)
    /// when every array is CUDA memory of one device; mixing is a TypeError. Host calls run now
    /// with the GIL released, or (`async_op`) on a thread, returning a Request. GPU calls are
    /// enqueued on the arrays' current stream and return at once (a Request for `async_op`).
    fn run(&self, py: Python<'_>, call: Call, job: Job, gpu_job: GpuJob) -> PyResult<PyObject> {
        let Call {
            op,
            async_op,
            ordered,
            bufs,
            output,
            keep,
        } = call;
        let host = bufs.iter().find(|(_, b)| matches!(b, Buf::Host(_)));
        let cuda = bufs.iter().find(|(_, b)| matches!(b, Buf::Cuda(_)));
        match (host, cuda) {
            (Some((h, _)), Some((c, Buf::Cuda(ca)))) => Err(PyTypeError::new_err(format!(
                "{op}: `{c}` is in CUDA memory (device {}) but `{h}` is in host memory; pass \
                 all arrays of one call on the same device (e.g. tensor.cuda() or tensor.cpu())",
                ca.device
            ))),
            (_, Some(_)) => self.run_gpu(py, op, async_op, bufs, output, keep, gpu_job),
            _ => {
                let bufs = bufs
                    .into_iter()
                    .map(|(_, b)| match b {
                        Buf::Host(a) => a,
                        Buf::Cuda(_) => unreachable!("no CUDA arrays here"),
                    })
                    .collect();
                self.launch(py, async_op, ordered, bufs, output, keep, job)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run_gpu(
        &self,
        py: Python<'_>,
        op: &'static str,
        async_op: bool,
        bufs: Vec<(&'static str, Buf)>,
        output: Option<Output>,
        keep: Vec<PyObject>,
        gpu_job: GpuJob,
    ) -> PyResult<PyObject> {
        let arrays: Vec<(&'static str, CudaArray)> = bufs
            .into_iter()
            .map(|(w, b)| match b {
                Buf::Cuda(a) => (w, a),
                Buf::Host(_) => unreachable!("checked by run"),
            })
            .collect();
        let (first, a0) = &arrays[0];
        if let Some((w, a)) = arrays.iter().find(|(_, a)| a.device != a0.device) {
            return Err(PyValueError::new_err(format!(
                "{op}: `{first}` is on CUDA device {} but `{w}` on device {}; pass all arrays \
                 of one call on the same device",
                a0.device, a.device
            )));
        }
        let (device, stream) = (a0.device, a0.stream);
        // SAFETY: the addresses come from live exports of the arrays (kept below or, for a
        // blocking call, by the caller: the operation is stream-ordered like the framework's
        // own kernels, so stream-ordered allocators reuse the memory only after it).
        let slices: Vec<DeviceSlice> = arrays
            .iter()
            .map(|(_, a)| unsafe { DeviceSlice::from_raw(a.ptr, a.count, a.dtype) })
            .collect();
        let g = self.gpu(py, device)?;
        let req = py
            .allow_threads(move || gpu_job(&g, &slices, Stream::Raw(stream)))
            .map_err(err)?;
        drop(arrays);
        if !async_op {
            return deliver(py, output);
        }
        Ok(Py::new(
            py,
            Request {
                pending: Pending::Gpu(req),
                output,
                _keep: keep,
            },
        )?
        .into_any())
    }

    /// Run `job` on `bufs`: now with the GIL released, or (`async_op`) on a thread, returning a
    /// Request. `output` is what a successful call returns; `keep` what a Request keeps alive.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        py: Python<'_>,
        async_op: bool,
        ordered: bool,
        bufs: Vec<HostArray>,
        output: Option<Output>,
        keep: Vec<PyObject>,
        job: Job,
    ) -> PyResult<PyObject> {
        let comm = self.inner.clone();
        if !async_op {
            py.allow_threads(|| job(&comm, &bufs)).map_err(err)?;
            drop(bufs);
            return deliver(py, output);
        }
        // Take the place in the order now, on the caller's thread, so that requests started in
        // the same order on every rank match up. Point-to-point messages are not ordered.
        let seq = ordered.then(|| comm.reserve_seq());
        let done = Arc::new(Done::default());
        let d2 = done.clone();
        std::thread::Builder::new()
            .name("accord-request".into())
            .spawn(move || {
                let r = match seq {
                    Some(s) => comm.with_seq(s, |c| job(c, &bufs)),
                    None => job(&comm, &bufs),
                };
                *d2.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                d2.cv.notify_all();
                drop(bufs);
            })
            .map_err(|e| PyValueError::new_err(format!("cannot start a thread: {e}")))?;
        Ok(Py::new(
            py,
            Request {
                pending: Pending::Host(done),
                output,
                _keep: keep,
            },
        )?
        .into_any())
    }
}

fn obj(o: &Bound<'_, PyAny>) -> PyObject {
    o.clone().unbind()
}

/// What a blocking call returns: its output, or None.
fn deliver(py: Python<'_>, output: Option<Output>) -> PyResult<PyObject> {
    output.map_or_else(|| Ok(py.None()), |o| o.deliver(py))
}

#[pymethods]
impl Communicator {
    /// This process's rank in the communicator.
    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    /// The communicator's name (`world`, or a group's name).
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_string()
    }

    /// Deadline of every blocking call, in seconds.
    #[getter]
    fn get_timeout(&self) -> f64 {
        self.inner.timeout().as_secs_f64()
    }

    #[setter]
    fn set_timeout(&self, seconds: f64) -> PyResult<()> {
        if !(seconds.is_finite() && seconds > 0.0) {
            return Err(PyValueError::new_err(
                "timeout must be a positive number of seconds",
            ));
        }
        let t = Duration::from_secs_f64(seconds);
        self.inner.set_timeout(t);
        for g in self.gpu_list() {
            g.set_timeout(t);
        }
        Ok(())
    }

    /// Fail every pending and later call, here and (as they notice) on the peers.
    fn abort(&self, reason: &str) {
        for g in self.gpu_list() {
            g.abort(reason);
        }
        self.inner.abort(reason)
    }

    fn __repr__(&self) -> String {
        format!(
            "<accord.Communicator {} rank {} of {} over {}>",
            self.inner.name(),
            self.inner.rank(),
            self.inner.size(),
            self.inner.transport_name()
        )
    }

    // ----- point to point

    /// Send `arr` to rank `dst`. For CUDA arrays, NCCL matches sends and receives in call
    /// order: `tag` must be 0.
    #[pyo3(signature = (arr, dst, tag=0, async_op=false))]
    fn send(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        dst: usize,
        tag: u32,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let arr = &Arg::new(arr, "arr")?.obj;
        let a = buf(arr, "arr", false)?;
        no_gpu_tag(&[&a], tag, "send")?;
        // The message's place among those to `dst` with `tag` is taken now, on this thread,
        // even when the data moves later on another (async_op).
        let turn = self.inner.post_send(dst, tag).map_err(err)?;
        self.run(
            py,
            Call {
                op: "send",
                async_op,
                ordered: false,
                bufs: vec![("arr", a)],
                output: None,
                keep: vec![obj(arr)],
            },
            Box::new(move |c, b| unsafe { c.send_posted(turn, b[0].bytes(), b[0].dtype) }),
            Box::new(move |g, b, s| g.send(b[0], dst, s)),
        )
    }

    /// Receive into `arr` from rank `src`; returns `arr` (a new scalar when `arr` is a numpy
    /// scalar or a Python number, which cannot be written).
    #[pyo3(signature = (arr, src, tag=0, async_op=false))]
    fn recv(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        src: usize,
        tag: u32,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let arr = Arg::new(arr, "arr")?;
        let a = buf(&arr.obj, "arr", true)?;
        no_gpu_tag(&[&a], tag, "recv")?;
        // As for send: receives from `src` with `tag` match messages in the order posted.
        let turn = self.inner.post_recv(src, tag).map_err(err)?;
        self.run(
            py,
            Call {
                op: "recv",
                async_op,
                ordered: false,
                bufs: vec![("arr", a)],
                output: Some(arr.output()),
                keep: vec![obj(&arr.obj)],
            },
            Box::new(move |c, b| unsafe { c.recv_posted(turn, b[0].bytes_mut(), b[0].dtype) }),
            Box::new(move |g, b, s| g.recv(b[0], src, s)),
        )
    }

    /// Send `send` to `dst` and receive `recv` from `src` (no deadlock between pairs); returns
    /// `recv`.
    #[pyo3(signature = (send, dst, recv, src, tag=0))]
    fn sendrecv(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        dst: usize,
        recv: &Bound<'_, PyAny>,
        src: usize,
        tag: u32,
    ) -> PyResult<PyObject> {
        let send = &Arg::new(send, "send")?.obj;
        let recv = Arg::new(recv, "recv")?;
        let s = buf(send, "send", false)?;
        let r = buf(&recv.obj, "recv", true)?;
        same_dtype(&s, &r, "sendrecv")?;
        no_gpu_tag(&[&s, &r], tag, "sendrecv")?;
        self.run(
            py,
            Call {
                op: "sendrecv",
                async_op: false,
                ordered: false,
                bufs: vec![("send", s), ("recv", r)],
                output: Some(recv.output()),
                keep: vec![],
            },
            Box::new(move |c, b| unsafe {
                c.send_bytes(b[0].bytes(), b[0].dtype, dst, tag)?;
                c.recv_bytes(b[1].bytes_mut(), b[1].dtype, src, tag)
            }),
            Box::new(move |g, b, s| g.send_recv(b[0], dst, b[1], src, s)),
        )
    }

    // ----- collectives

    /// Wait until every rank has entered the barrier (a host barrier: it synchronises the
    /// processes, not GPU streams).
    #[pyo3(signature = (async_op=false))]
    fn barrier(&self, py: Python<'_>, async_op: bool) -> PyResult<PyObject> {
        self.launch(
            py,
            async_op,
            true,
            vec![],
            None,
            vec![],
            Box::new(|c, _| c.barrier()),
        )
    }

    /// Copy `arr` from `root` to every rank, in place; returns `arr` (a new scalar when `arr` is
    /// a numpy scalar or a Python number, which cannot be written).
    #[pyo3(signature = (arr, root=0, async_op=false))]
    fn broadcast(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        root: usize,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let arr = Arg::new(arr, "arr")?;
        let a = buf(&arr.obj, "arr", true)?;
        self.run(
            py,
            Call {
                op: "broadcast",
                async_op,
                ordered: true,
                bufs: vec![("arr", a)],
                output: Some(arr.output()),
                keep: vec![obj(&arr.obj)],
            },
            Box::new(move |c, b| unsafe { c.broadcast_bytes(b[0].bytes_mut(), b[0].dtype, root) }),
            Box::new(move |g, b, s| g.broadcast(b[0], b[0], root, s)),
        )
    }

    /// Reduce `arr` over all ranks with `op`; the result goes to `out`, or into `arr` in place
    /// when `out` is None. Returns the array holding the result: a new scalar when that is a
    /// numpy scalar or a Python number, which cannot be written.
    #[pyo3(signature = (arr, op=None, out=None, async_op=false))]
    fn allreduce(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let op = op.map(reduce_op).transpose()?.unwrap_or(ReduceOp::Sum);
        match out.filter(|o| !o.is(arr)) {
            None => {
                let arr = Arg::new(arr, "arr")?;
                let a = buf(&arr.obj, "arr", true)?;
                self.run(
                    py,
                    Call {
                        op: "allreduce",
                        async_op,
                        ordered: true,
                        bufs: vec![("arr", a)],
                        output: Some(arr.output()),
                        keep: vec![obj(&arr.obj)],
                    },
                    Box::new(move |c, b| unsafe {
                        c.all_reduce_bytes(None, b[0].bytes_mut(), b[0].dtype, op)
                    }),
                    Box::new(move |g, b, s| g.all_reduce(b[0], b[0], op, s)),
                )
            }
            Some(out) => {
                let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
                let (a, o) = pair(&arr, &out, "allreduce")?;
                self.run(
                    py,
                    Call {
                        op: "allreduce",
                        async_op,
                        ordered: true,
                        bufs: vec![("arr", a), ("out", o)],
                        output: Some(out.output()),
                        keep: vec![obj(&arr.obj), obj(&out.obj)],
                    },
                    Box::new(move |c, b| unsafe {
                        c.all_reduce_bytes(Some(b[0].bytes()), b[1].bytes_mut(), b[0].dtype, op)
                    }),
                    Box::new(move |g, b, s| g.all_reduce(b[0], b[1], op, s)),
                )
            }
        }
    }

    /// Reduce `arr` over all ranks into `out` on `root` (into `arr` on root when `out` is None;
    /// other ranks' arrays are left unchanged). Returns the array holding the result (a new
    /// scalar for a numpy scalar or a Python number).
    #[pyo3(signature = (arr, op=None, root=0, out=None, async_op=false))]
    fn reduce(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        root: usize,
        out: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let op = op.map(reduce_op).transpose()?.unwrap_or(ReduceOp::Sum);
        let me = self.inner.rank();
        let out = out
            .filter(|o| !o.is(arr))
            .map(|o| Arg::new(o, "out"))
            .transpose()?;
        let arr = Arg::new(arr, "arr")?;
        if me == root && out.is_none() {
            let a = buf(&arr.obj, "arr", true)?;
            return self.run(
                py,
                Call {
                    op: "reduce",
                    async_op,
                    ordered: true,
                    bufs: vec![("arr", a)],
                    output: Some(arr.output()),
                    keep: vec![obj(&arr.obj)],
                },
                Box::new(move |c, b| unsafe {
                    c.reduce_bytes(None, b[0].bytes_mut(), b[0].dtype, op, root)
                }),
                Box::new(move |g, b, s| g.reduce(b[0], b[0], op, root, s)),
            );
        }
        let a = buf(&arr.obj, "arr", false)?;
        let mut bufs = vec![];
        let mut keep = vec![obj(&arr.obj)];
        if let Some(out) = &out {
            let o = buf(&out.obj, "out", me == root)?;
            same_dtype(&a, &o, "reduce")?;
            bufs.push(("out", o));
            keep.push(obj(&out.obj));
        }
        bufs.insert(0, ("arr", a));
        let ret = out.as_ref().unwrap_or(&arr).output();
        self.run(
            py,
            Call {
                op: "reduce",
                async_op,
                ordered: true,
                bufs,
                output: Some(ret),
                keep,
            },
            Box::new(move |c, b| unsafe {
                let recv: &mut [u8] = if c.rank() == root {
                    b[1].bytes_mut()
                } else {
                    &mut []
                };
                c.reduce_bytes(Some(b[0].bytes()), recv, b[0].dtype, op, root)
            }),
            // Off the root NCCL ignores the receive buffer.
            Box::new(move |g, b, s| g.reduce(b[0], or_self(b, 1), op, root, s)),
        )
    }

    /// Every rank's `arr`, concatenated in rank order, into `out` on every rank.
    #[pyo3(signature = (arr, out, async_op=false))]
    fn allgather(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
        let (a, o) = pair(&arr, &out, "allgather")?;
        self.run(
            py,
            two("allgather", async_op, a, o, &arr, &out),
            Box::new(move |c, b| unsafe {
                c.all_gather_bytes(b[0].bytes(), b[1].bytes_mut(), b[0].dtype)
            }),
            Box::new(move |g, b, s| g.all_gather(b[0], b[1], s)),
        )
    }

    /// Like allgather with `counts[r]` elements from rank r.
    #[pyo3(signature = (arr, out, counts, async_op=false))]
    fn allgatherv(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        counts: Vec<usize>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
        let (a, o) = pair(&arr, &out, "allgatherv")?;
        let c2 = counts.clone();
        self.run(
            py,
            two("allgatherv", async_op, a, o, &arr, &out),
            Box::new(move |c, b| unsafe {
                c.all_gather_v_bytes(b[0].bytes(), b[1].bytes_mut(), &counts, b[0].dtype)
            }),
            Box::new(move |g, b, s| g.all_gather_v(b[0], b[1], &c2, s)),
        )
    }

    /// Every rank's `arr`, concatenated in rank order, into `out` on `root` (`out` may be None
    /// elsewhere).
    #[pyo3(signature = (arr, out=None, root=0, async_op=false))]
    fn gather(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        root: usize,
        async_op: bool,
    ) -> PyResult<PyObject> {
        self.rooted_in(py, arr, out, root, async_op, "gather", None)
    }

    /// Like gather with `counts[r]` elements from rank r.
    #[pyo3(signature = (arr, out=None, counts=None, root=0, async_op=false))]
    fn gatherv(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        counts: Option<Vec<usize>>,
        root: usize,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let counts = counts.ok_or_else(|| PyValueError::new_err("gatherv needs counts"))?;
        self.rooted_in(py, arr, out, root, async_op, "gatherv", Some(counts))
    }

    /// Slice r of `arr` on `root` (`arr` may be None elsewhere) into `out` on rank r.
    #[pyo3(signature = (arr, out, root=0, async_op=false))]
    fn scatter(
        &self,
        py: Python<'_>,
        arr: Option<&Bound<'_, PyAny>>,
        out: &Bound<'_, PyAny>,
        root: usize,
        async_op: bool,
    ) -> PyResult<PyObject> {
        self.rooted_out(py, arr, out, root, async_op, "scatter", None)
    }

    /// Like scatter with `counts[r]` elements to rank r.
    #[pyo3(signature = (arr, out, counts, root=0, async_op=false))]
    fn scatterv(
        &self,
        py: Python<'_>,
        arr: Option<&Bound<'_, PyAny>>,
        out: &Bound<'_, PyAny>,
        counts: Vec<usize>,
        root: usize,
        async_op: bool,
    ) -> PyResult<PyObject> {
        self.rooted_out(py, arr, out, root, async_op, "scatterv", Some(counts))
    }

    /// Reduce `arr` (size x len(out)) over all ranks; rank r gets slice r in `out`.
    #[pyo3(signature = (arr, out, op=None, async_op=false))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let op = op.map(reduce_op).transpose()?.unwrap_or(ReduceOp::Sum);
        let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
        let (a, o) = pair(&arr, &out, "reduce_scatter")?;
        self.run(
            py,
            two("reduce_scatter", async_op, a, o, &arr, &out),
            Box::new(move |c, b| unsafe {
                c.reduce_scatter_bytes(b[0].bytes(), b[1].bytes_mut(), b[0].dtype, op)
            }),
            Box::new(move |g, b, s| g.reduce_scatter(b[0], b[1], op, s)),
        )
    }

    /// Like reduce_scatter with `counts[r]` elements to rank r.
    #[pyo3(signature = (arr, out, counts, op=None, async_op=false))]
    fn reduce_scatterv(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        counts: Vec<usize>,
        op: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let op = op.map(reduce_op).transpose()?.unwrap_or(ReduceOp::Sum);
        let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
        let (a, o) = pair(&arr, &out, "reduce_scatterv")?;
        let c2 = counts.clone();
        self.run(
            py,
            two("reduce_scatterv", async_op, a, o, &arr, &out),
            Box::new(move |c, b| unsafe {
                c.reduce_scatter_v_bytes(b[0].bytes(), b[1].bytes_mut(), &counts, b[0].dtype, op)
            }),
            Box::new(move |g, b, s| g.reduce_scatter_v(b[0], b[1], &c2, op, s)),
        )
    }

    /// Slice j of `arr` goes to rank j; slice i of `out` comes from rank i.
    #[pyo3(signature = (arr, out, async_op=false))]
    fn alltoall(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
        let (a, o) = pair(&arr, &out, "alltoall")?;
        self.run(
            py,
            two("alltoall", async_op, a, o, &arr, &out),
            Box::new(move |c, b| unsafe {
                c.all_to_all_bytes(b[0].bytes(), b[1].bytes_mut(), b[0].dtype)
            }),
            Box::new(move |g, b, s| g.all_to_all(b[0], b[1], s)),
        )
    }

    /// Like alltoall with per-rank counts: `send_counts[j]` elements to rank j,
    /// `recv_counts[i]` from rank i.
    #[pyo3(signature = (arr, send_counts, out, recv_counts, async_op=false))]
    fn alltoallv(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        send_counts: Vec<usize>,
        out: &Bound<'_, PyAny>,
        recv_counts: Vec<usize>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
        let (a, o) = pair(&arr, &out, "alltoallv")?;
        let (sc, rc) = (send_counts.clone(), recv_counts.clone());
        self.run(
            py,
            two("alltoallv", async_op, a, o, &arr, &out),
            Box::new(move |c, b| unsafe {
                c.all_to_all_v_bytes(
                    b[0].bytes(),
                    &send_counts,
                    b[1].bytes_mut(),
                    &recv_counts,
                    b[0].dtype,
                )
            }),
            Box::new(move |g, b, s| g.all_to_all_v(b[0], &sc, b[1], &rc, s)),
        )
    }

    // ----- GPU

    /// The CUDA devices (ordinals) for which this communicator has created its NCCL
    /// communicator, in ascending order.
    #[getter]
    fn gpu_devices(&self) -> Vec<usize> {
        let m = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
        m.keys().copied().collect()
    }

    /// Block the host until every GPU operation issued so far on this communicator has
    /// completed (raises the first GPU failure, e.g. a desync or a timeout).
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let gpus = self.gpu_list();
        py.allow_threads(move || gpus.iter().try_for_each(|g| g.synchronize()))
            .map_err(err)
    }

    // ----- groups

    /// Split into communicators of the ranks passing the same `color`, ordered by (`key`, rank).
    /// Ranks passing `color=None` get None. Collective.
    #[pyo3(signature = (color, key=0))]
    fn split(
        &self,
        py: Python<'_>,
        color: Option<u32>,
        key: i64,
    ) -> PyResult<Option<Communicator>> {
        let c = self.inner.clone();
        let r = py.allow_threads(move || c.split(color, key)).map_err(err)?;
        Ok(r.map(Communicator::wrap))
    }

    /// A communicator of the listed ranks, in that order; None on ranks not listed. Every rank
    /// calls it with the same list.
    fn subgroup(&self, py: Python<'_>, ranks: Vec<usize>) -> PyResult<Option<Communicator>> {
        let c = self.inner.clone();
        let r = py.allow_threads(move || c.subgroup(&ranks)).map_err(err)?;
        Ok(r.map(Communicator::wrap))
    }
}

/// Input (read) and output (written) of one call, with matching dtypes.
fn pair(arr: &Arg<'_>, out: &Arg<'_>, what: &str) -> PyResult<(Buf, Buf)> {
    let a = buf(&arr.obj, "arr", false)?;
    let o = buf(&out.obj, "out", true)?;
    same_dtype(&a, &o, what)?;
    Ok((a, o))
}

/// A collective of one input and one output.
fn two(op: &'static str, async_op: bool, a: Buf, o: Buf, arr: &Arg<'_>, out: &Arg<'_>) -> Call {
    Call {
        op,
        async_op,
        ordered: true,
        bufs: vec![("arr", a), ("out", o)],
        output: Some(out.output()),
        keep: vec![obj(&arr.obj), obj(&out.obj)],
    }
}

/// NCCL has no message tags.
fn no_gpu_tag(bufs: &[&Buf], tag: u32, what: &str) -> PyResult<()> {
    if tag != 0 && bufs.iter().any(|b| matches!(b, Buf::Cuda(_))) {
        return Err(PyValueError::new_err(format!(
            "{what}: tags are not supported for CUDA arrays (NCCL matches sends and receives \
             in call order); pass tag=0"
        )));
    }
    Ok(())
}

impl Communicator {
    /// gather / gatherv: input everywhere, output at the root only.
    #[allow(clippy::too_many_arguments)]
    fn rooted_in(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        root: usize,
        async_op: bool,
        what: &'static str,
        counts: Option<Vec<usize>>,
    ) -> PyResult<PyObject> {
        let is_root = self.inner.rank() == root;
        if is_root && out.is_none() {
            return Err(PyValueError::new_err(format!(
                "{what}: the root needs an output array `out`"
            )));
        }
        let out = if is_root { out } else { None };
        let out = out.map(|o| Arg::new(o, "out")).transpose()?;
        let arr = &Arg::new(arr, "arr")?.obj;
        let mut bufs = vec![("arr", buf(arr, "arr", false)?)];
        if let Some(o) = &out {
            let o = buf(&o.obj, "out", true)?;
            same_dtype(&bufs[0].1, &o, what)?;
            bufs.push(("out", o));
        }
        let mut keep = vec![obj(arr)];
        keep.extend(out.as_ref().map(|o| obj(&o.obj)));
        let c2 = counts.clone();
        self.run(
            py,
            Call {
                op: what,
                async_op,
                ordered: true,
                bufs,
                output: out.as_ref().map(Arg::output),
                keep,
            },
            Box::new(move |c, b| unsafe {
                let recv: &mut [u8] = match b.get(1) {
                    Some(o) => o.bytes_mut(),
                    None => &mut [],
                };
                match &counts {
                    None => c.gather_bytes(b[0].bytes(), recv, b[0].dtype, root),
                    Some(n) => c.gather_v_bytes(b[0].bytes(), recv, n, b[0].dtype, root),
                }
            }),
            Box::new(move |g, b, s| {
                let recv = b
                    .get(1)
                    .copied()
                    .unwrap_or_else(|| DeviceSlice::empty(b[0].dtype()));
                match &c2 {
                    None => g.gather(b[0], recv, root, s),
                    Some(n) => g.gather_v(b[0], recv, n, root, s),
                }
            }),
        )
    }

    /// scatter / scatterv: input at the root only, output everywhere.
    #[allow(clippy::too_many_arguments)]
    fn rooted_out(
        &self,
        py: Python<'_>,
        arr: Option<&Bound<'_, PyAny>>,
        out: &Bound<'_, PyAny>,
        root: usize,
        async_op: bool,
        what: &'static str,
        counts: Option<Vec<usize>>,
    ) -> PyResult<PyObject> {
        let is_root = self.inner.rank() == root;
        let out = Arg::new(out, "out")?;
        let mut keep = vec![obj(&out.obj)];
        let mut bufs = vec![("out", buf(&out.obj, "out", true)?)];
        match arr {
            Some(arr) if is_root => {
                let arr = &Arg::new(arr, "arr")?.obj;
                let a = buf(arr, "arr", false)?;
                same_dtype(&a, &bufs[0].1, what)?;
                bufs.push(("arr", a));
                keep.push(obj(arr));
            }
            None if is_root => {
                return Err(PyValueError::new_err(format!(
                    "{what}: the root needs an input array"
                )))
            }
            _ => {}
        }
        let c2 = counts.clone();
        self.run(
            py,
            Call {
                op: what,
                async_op,
                ordered: true,
                bufs,
                output: Some(out.output()),
                keep,
            },
            Box::new(move |c, b| unsafe {
                let send: &[u8] = match b.get(1) {
                    Some(a) => a.bytes(),
                    None => &[],
                };
                let dtype = b[0].dtype;
                match &counts {
                    None => c.scatter_bytes(send, b[0].bytes_mut(), dtype, root),
                    Some(n) => c.scatter_v_bytes(send, b[0].bytes_mut(), n, dtype, root),
                }
            }),
            Box::new(move |g, b, s| {
                let send = b
                    .get(1)
                    .copied()
                    .unwrap_or_else(|| DeviceSlice::empty(b[0].dtype()));
                match &c2 {
                    None => g.scatter(send, b[0], root, s),
                    Some(n) => g.scatter_v(send, b[0], n, root, s),
                }
            }),
        )
    }
}

/// A rendezvous store server in this process: other processes reach it at `host:port` with the
/// same `token`. Pass it to `init(store=...)` on the rank that hosts it, which then keeps it
/// alive for the communicator's lifetime.
#[pyclass(module = "accord._native")]
struct StoreServer {
    server: Mutex<Option<CoreServer>>,
    port: u16,
    token: String,
}

#[pymethods]
impl StoreServer {
    /// Listen on `host:port` (port 0: a free port). A random token is made when none is given.
    #[new]
    #[pyo3(signature = (host="0.0.0.0", port=0, token=None))]
    fn new(host: &str, port: u16, token: Option<String>) -> PyResult<Self> {
        let token = token.unwrap_or_else(|| accord::auth::Token::random().as_str());
        let addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let server = CoreServer::bind(&addr, accord::auth::Token::new(&token)).map_err(err)?;
        Ok(StoreServer {
            port: server.addr().port(),
            server: Mutex::new(Some(server)),
            token,
        })
    }

    /// The port listened on.
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// The shared secret clients must know.
    #[getter]
    fn token(&self) -> String {
        self.token.clone()
    }

    /// Stop serving (unless a communicator has taken it over).
    fn close(&self) {
        if let Some(mut s) = self.server.lock().unwrap_or_else(|e| e.into_inner()).take() {
            s.shutdown();
        }
    }
}

/// Join a job and return the world communicator. See `accord.init` for the arguments; `token`
/// and `store_external` override `ACCORD_TOKEN` / `ACCORD_STORE_EXTERNAL`, and `store` is a
/// StoreServer of this process that the communicator takes over.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (method="env://", rank=None, world_size=None, timeout=None, token=None, store_external=false, store=None))]
fn init(
    py: Python<'_>,
    method: &str,
    rank: Option<usize>,
    world_size: Option<usize>,
    timeout: Option<f64>,
    token: Option<String>,
    store_external: bool,
    store: Option<PyRef<'_, StoreServer>>,
) -> PyResult<Communicator> {
    let method = InitMethod::parse(method).map_err(err)?;
    let timeout = match timeout {
        Some(t) if t.is_finite() && t > 0.0 => Duration::from_secs_f64(t),
        Some(_) => {
            return Err(PyValueError::new_err(
                "timeout must be a positive number of seconds",
            ))
        }
        None => accord::comm::timeout_from_env(),
    };
    let external = store_external || store.is_some();
    let vars = move |k: &str| match k {
        "ACCORD_TOKEN" if token.is_some() => token.clone(),
        "ACCORD_STORE_EXTERNAL" if external => Some("1".into()),
        _ => std::env::var(k).ok(),
    };
    let mut rdv = py
        .allow_threads(|| {
            rendezvous::init_with_vars(&method, rank, world_size, Some(timeout), vars)
        })
        .map_err(err)?;
    if let Some(s) = store {
        rdv.server = s.server.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
    let inner = py
        .allow_threads(move || accord::from_rendezvous(rdv, timeout))
        .map_err(err)?;
    Ok(Communicator::wrap(inner))
}

/// Run the `accord` command line (`run`, `bench`, `store`) in this process; returns the exit
/// code. `self_cmd` is the command that starts it again (for `bench`'s ranks).
#[pyfunction]
fn cli_main(py: Python<'_>, args: Vec<String>, self_cmd: Vec<String>) -> i32 {
    py.allow_threads(move || accord_cli::main_with(args, self_cmd))
}

/// The dtypes accord can communicate, by their usual names.
#[pyfunction]
fn dtypes() -> Vec<String> {
    DataType::ALL.iter().map(|d| d.to_string()).collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Communicator>()?;
    m.add_class::<Request>()?;
    m.add_class::<StoreServer>()?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(dtypes, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
