//! `Communicator`: the Python face of [`accord::Communicator`].
//!
//! Each method extracts its arrays ([`crate::buffers`]), checks what Python reports as its own
//! exceptions, and hands [`Communicator::run`] one job that builds the core's buffers and calls
//! the one core method; host and CUDA arrays take the same path. Arrays in CUDA memory make the
//! first such call attach the device to the communicator, a collective step (see
//! [`crate::run`]).

use crate::args::{rank_arg, reduce_op};
use crate::buffers::{buf, kept, no_gpu_tag, obj, pair, same_dtype, Buf, Call};
use crate::elementwise::Elementwise;
use crate::errors::to_py as err;
use crate::scalar::Arg;
use accord::{Communicator as CoreComm, Parts};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::sync::OnceLock;
use std::time::Duration;

/// A group of ranks that communicate. Every member must call the same operations in the same
/// order; disagreements raise `accord.DesyncError`.
#[pyclass(module = "accord._native", subclass)]
pub(crate) struct Communicator {
    pub(crate) inner: CoreComm,
    /// The `accord_comm_t` lent to C and C++ code by `c_handle()`, made on first use.
    c_handle: OnceLock<usize>,
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if let Some(&h) = self.c_handle.get() {
            // SAFETY: made by `lend_handle`; the C code it was lent to is told (in
            // `c_handle`'s documentation) not to use it past this object's life.
            unsafe { accord_c::free_handle(h as *mut accord_c::handle::accord_comm_t) };
        }
    }
}

impl Communicator {
    /// The attached device engine's description, if it is NCCL's.
    fn nccl_info(&self) -> PyResult<accord::gpu::DeviceInfo> {
        let info = self.inner.device_info().ok_or_else(|| {
            PyRuntimeError::new_err(
                "no GPU is attached to this communicator yet: its first call with CUDA arrays \
                 attaches one",
            )
        })?;
        match info.engine {
            "NCCL" => Ok(info),
            other => Err(PyRuntimeError::new_err(format!(
                "the attached GPU engine is {other}, not NCCL"
            ))),
        }
    }

    pub(crate) fn wrap(inner: CoreComm) -> Communicator {
        Communicator {
            inner,
            c_handle: OnceLock::new(),
        }
    }
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

    /// Deadline of every blocking call, in seconds. The GPU engine takes the deadline in force
    /// when the device is attached (the first call with CUDA arrays).
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
        self.inner.set_timeout(Duration::from_secs_f64(seconds));
        Ok(())
    }

    /// `nbytes` on GPU `device` that every rank of this host maps (collective: every rank asks
    /// for the same size). See `accord.cuda.empty_symmetric`.
    fn alloc_symmetric(
        &self,
        py: Python<'_>,
        nbytes: usize,
        device: usize,
    ) -> PyResult<crate::cuda::SymmetricBuffer> {
        let c = self.inner.clone();
        let b = py
            .allow_threads(move || c.alloc_symmetric_on(device, nbytes))
            .map_err(crate::errors::to_py)?;
        Ok(crate::cuda::SymmetricBuffer::wrap(b))
    }

    /// The ranks whose symmetric buffers this rank maps (None before the first allocation).
    fn symmetric_peers(&self) -> Option<Vec<usize>> {
        self.inner.symmetric_peers()
    }

    /// Fail every pending and later call, here and (as they notice) on the peers. The GPU
    /// engine's watchdog sees the abort and stops its operations too.
    fn abort(&self, reason: &str) {
        self.inner.abort(reason)
    }

    /// Close the communicator: every later call on it raises `accord.InvalidArgumentError`
    /// (a `ValueError`, as a closed file's calls do). The world communicator (what
    /// `accord.init` returns) also says goodbye to every peer and closes its connections: the
    /// groups split from it end with it, and a peer still waiting for this rank is told that it
    /// closed instead of waiting for its deadline. Memory and GPU resources go when the last
    /// reference does. Closing again does nothing more. `with accord.init() as comm:` closes
    /// it at the end of the block.
    fn close(&self, py: Python<'_>) {
        // The goodbye waits (briefly) for the peers' answers.
        py.allow_threads(|| self.inner.close())
    }

    /// The calls this communicator's flight recorder still holds, oldest first per lane, as
    /// a dump writes them: a dict with `name`, `rank`, `size`, `error`, `metrics`, `waiting`
    /// and `records` (each with `lane`, `seq`, `op`, `dtype`, `count`, `state`, `engine`,
    /// `start_us`, `end_us`...). See `accord analyze` for reading the ranks' records together.
    fn flight_record(&self, py: Python<'_>) -> PyResult<PyObject> {
        let json = py.import("json")?;
        Ok(json
            .call_method1("loads", (self.inner.flight_record_json(),))?
            .unbind())
    }

    /// Counters since the communicator was created: `host_ops`, `device_ops`, `p2p_ops`,
    /// `bytes`, `errors` and `blocked_ns` (time calls spent blocked waiting for peers).
    fn metrics(&self, py: Python<'_>) -> PyResult<PyObject> {
        let m = self.inner.metrics();
        let d = pyo3::types::PyDict::new(py);
        d.set_item("host_ops", m.host_ops)?;
        d.set_item("device_ops", m.device_ops)?;
        d.set_item("p2p_ops", m.p2p_ops)?;
        d.set_item("bytes", m.bytes)?;
        d.set_item("errors", m.errors)?;
        d.set_item("blocked_ns", m.blocked_ns)?;
        Ok(d.into_any().unbind())
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
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
    ///
    /// Args:
    ///     arr: the array to send.
    ///     dst: the receiving rank.
    ///     tag: matches `recv`s with the same tag, in order.
    ///     async_op: return a `Request` at once instead of waiting (see `Request.wait`).
    ///
    /// Returns:
    ///     None (a `Request` with `async_op`).
    ///
    /// Raises:
    ///     accord.TimeoutError: `dst` did not take the message within the timeout.
    ///     accord.PeerLostError: `dst` died or closed its communicator.
    #[pyo3(signature = (arr, dst, tag=0, async_op=false))]
    fn send(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        dst: i64,
        tag: u32,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let dst = rank_arg(dst, "dst")?;
        let arr = &Arg::new(arr, "arr")?.obj;
        let a = buf(arr, "arr", false)?;
        no_gpu_tag(&[&a], tag, "send")?;
        // A host message's place among those to `dst` with `tag` is taken now, on this
        // thread, even when the data moves later on another (async_op). CUDA messages are
        // ordered by their stream.
        let turn = a.is_host().then(|| self.inner.post_send(dst, tag));
        let turn = turn.transpose().map_err(err)?;
        let call = Call {
            op: "send",
            async_op,
            ordered: false,
            bufs: vec![("arr", a)],
            output: None,
            keep: kept(async_op, [arr]),
        };
        self.run(
            py,
            call,
            Box::new(move |c, b| match turn {
                Some(t) => unsafe { c.send_posted(t, b[0].send()) }.map(|()| None),
                None => unsafe { c.send(b[0].send(), dst, tag) }.map(Some),
            }),
        )
    }

    /// Receive into `arr` from rank `src`; returns `arr` (a new scalar when `arr` is a numpy
    /// scalar or a Python number, which cannot be written).
    ///
    /// Args:
    ///     arr: where the message goes (its size and dtype must be the sender's).
    ///     src: the sending rank.
    ///     tag: as the sender's.
    ///     async_op: return a `Request` at once instead of waiting (see `Request.wait`).
    ///
    /// Returns:
    ///     `arr` (a `Request` with `async_op`).
    ///
    /// Raises:
    ///     accord.TimeoutError: nothing came within the timeout.
    ///     accord.PeerLostError: `src` died or closed its communicator.
    ///     ValueError: `arr` cannot be written.
    #[pyo3(signature = (arr, src, tag=0, async_op=false))]
    fn recv(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        src: i64,
        tag: u32,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let src = rank_arg(src, "src")?;
        let arr = Arg::new(arr, "arr")?;
        let a = buf(&arr.obj, "arr", true)?;
        no_gpu_tag(&[&a], tag, "recv")?;
        // As for send: receives from `src` with `tag` match messages in the order posted.
        let turn = a.is_host().then(|| self.inner.post_recv(src, tag));
        let turn = turn.transpose().map_err(err)?;
        let call = Call {
            op: "recv",
            async_op,
            ordered: false,
            bufs: vec![("arr", a)],
            output: Some(arr.output()),
            keep: kept(async_op, [&arr.obj]),
        };
        self.run(
            py,
            call,
            Box::new(move |c, b| match turn {
                Some(t) => unsafe { c.recv_posted(t, b[0].recv()) }.map(|()| None),
                None => unsafe { c.recv(b[0].recv(), src, tag) }.map(Some),
            }),
        )
    }

    /// Send `send` to `dst` and receive `recv` from `src` (no deadlock between pairs); returns
    /// `recv`.
    ///
    /// Args:
    ///     send: the array sent to `dst`.
    ///     dst: the rank that receives `send`.
    ///     recv: where the message from `src` goes.
    ///     src: the rank whose message is received.
    ///     tag: as in `send`/`recv`.
    ///
    /// Returns:
    ///     `recv`.
    ///
    /// Raises:
    ///     accord.TimeoutError, accord.PeerLostError: as for `send` and `recv`.
    #[pyo3(signature = (send, dst, recv, src, tag=0))]
    fn sendrecv(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        dst: i64,
        recv: &Bound<'_, PyAny>,
        src: i64,
        tag: u32,
    ) -> PyResult<PyObject> {
        let dst = rank_arg(dst, "dst")?;
        let src = rank_arg(src, "src")?;
        let send = &Arg::new(send, "send")?.obj;
        let recv = Arg::new(recv, "recv")?;
        let s = buf(send, "send", false)?;
        let r = buf(&recv.obj, "recv", true)?;
        same_dtype(&s, &r, "sendrecv")?;
        no_gpu_tag(&[&s, &r], tag, "sendrecv")?;
        let call = Call {
            op: "sendrecv",
            async_op: false,
            ordered: false,
            bufs: vec![("send", s), ("recv", r)],
            output: Some(recv.output()),
            keep: vec![],
        };
        self.run(
            py,
            call,
            Box::new(move |c, b| {
                unsafe { c.sendrecv(b[0].send(), dst, b[1].recv(), src, tag) }.map(Some)
            }),
        )
    }

    /// Wait for the message from `src` with `tag` that a `recv` posted now would take, and say
    /// what it holds without taking it (MPI's `Probe`), so that the receiver can size its
    /// array: `out = np.empty(count, dtype)`.
    ///
    /// Args:
    ///     src: the sending rank.
    ///     tag: the message's tag.
    ///
    /// Returns:
    ///     `(count, dtype)`: its number of elements and numpy dtype name (`"float32"` ...).
    ///
    /// Raises:
    ///     accord.TimeoutError: no such message came within the timeout.
    ///     accord.PeerLostError: `src` died or closed its communicator.
    #[pyo3(signature = (src, tag=0))]
    fn probe(&self, py: Python<'_>, src: i64, tag: u32) -> PyResult<(usize, &'static str)> {
        let src = rank_arg(src, "src")?;
        let m = py
            .allow_threads(|| self.inner.probe(src, tag))
            .map_err(err)?;
        Ok((m.count, crate::array::numpy_name(m.dtype)))
    }

    /// `probe` without waiting (MPI's `Iprobe`): `None` while the message has not arrived (or
    /// receives posted earlier from `src` with `tag` are not done).
    #[pyo3(signature = (src, tag=0))]
    fn iprobe(&self, src: i64, tag: u32) -> PyResult<Option<(usize, &'static str)>> {
        let src = rank_arg(src, "src")?;
        let m = self.inner.iprobe(src, tag).map_err(err)?;
        Ok(m.map(|m| (m.count, crate::array::numpy_name(m.dtype))))
    }

    // ----- collectives

    /// Wait until every rank has entered the barrier (a host barrier: it synchronises the
    /// processes, not GPU streams).
    ///
    /// Args:
    ///     async_op: return a `Request` at once instead of waiting (see `Request.wait`).
    ///
    /// Returns:
    ///     None (a `Request` with `async_op`).
    ///
    /// Raises:
    ///     accord.TimeoutError: a rank did not take part within the timeout (`waiting_for` names it).
    ///     accord.DesyncError: the ranks called different operations, sizes, dtypes, ops or roots.
    ///     accord.PeerLostError: a rank died or closed its communicator.
    #[pyo3(signature = (async_op=false))]
    fn barrier(&self, py: Python<'_>, async_op: bool) -> PyResult<PyObject> {
        let call = Call {
            op: "barrier",
            async_op,
            ordered: true,
            bufs: vec![],
            output: None,
            keep: vec![],
        };
        self.run(py, call, Box::new(|c, _| c.barrier().map(|()| None)))
    }

    /// Copy `arr` from `root` to every rank, in place; returns `arr` (a new scalar when `arr` is
    /// a numpy scalar or a Python number, which cannot be written).
    ///
    /// Args:
    ///     arr: the data on `root`; where it lands elsewhere.
    ///     root: the rank whose data is copied.
    ///     async_op: return a `Request` at once instead of waiting (see `Request.wait`).
    ///
    /// Returns:
    ///     `arr` (a new scalar for a scalar; a `Request` with `async_op`).
    ///
    /// Raises:
    ///     accord.TimeoutError: a rank did not take part within the timeout (`waiting_for` names it).
    ///     accord.DesyncError: the ranks called different operations, sizes, dtypes, ops or roots.
    ///     accord.PeerLostError: a rank died or closed its communicator.
    ///     TypeError, ValueError: an unsupported dtype, a non-contiguous or read-only output, sizes
    ///         that do not fit, a root or rank outside the communicator.
    #[pyo3(signature = (arr, root=0, async_op=false))]
    fn broadcast(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        root: i64,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let root = rank_arg(root, "root")?;
        let arr = Arg::new(arr, "arr")?;
        let a = buf(&arr.obj, "arr", true)?;
        self.run(
            py,
            Call::one("broadcast", async_op, a, &arr),
            Box::new(move |c, b| unsafe { c.broadcast(b[0].recv(), root) }.map(Some)),
        )
    }

    /// Reduce `arr` over all ranks with `op`; the result goes to `out`, or into `arr` in place
    /// when `out` is None. Returns the array holding the result: a new scalar when that is a
    /// numpy scalar or a Python number, which cannot be written.
    ///
    /// Args:
    ///     arr: this rank's contribution.
    ///     op: `sum` (default), `prod`, `min`, `max`, `avg`, `band`, `bor`, `bxor`, or an
    ///         `accord.ReduceOp`.
    ///     out: where the result goes (default: `arr`, in place).
    ///     async_op: return a `Request` at once instead of waiting (see `Request.wait`).
    ///
    /// Returns:
    ///     the array holding the result (a new scalar for a scalar; a `Request` with `async_op`).
    ///
    /// Raises:
    ///     accord.TimeoutError: a rank did not take part within the timeout (`waiting_for` names it).
    ///     accord.DesyncError: the ranks called different operations, sizes, dtypes, ops or roots.
    ///     accord.PeerLostError: a rank died or closed its communicator.
    ///     TypeError, ValueError: an unsupported dtype, a non-contiguous or read-only output, sizes
    ///         that do not fit, a root or rank outside the communicator.
    #[pyo3(signature = (arr, op=None, out=None, async_op=false))]
    fn allreduce(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        self.elementwise(py, Elementwise::AllReduce, arr, op, out, async_op)
    }

    /// Prefix reduction (MPI's `Scan`): rank r gets the reduction of the arrays of ranks
    /// 0..r, both included. Returns the array holding the result, as `allreduce` does.
    ///
    /// Args:
    ///     arr: this rank's contribution.
    ///     op: as for `allreduce`, except `avg` (each rank's prefix has its own length).
    ///     out: where the result goes (default: `arr`, in place).
    ///     async_op: return a `Request` at once instead of waiting (see `Request.wait`).
    ///
    /// Returns:
    ///     the array holding the result (a new scalar for a scalar; a `Request` with `async_op`).
    ///
    /// Raises:
    ///     accord.TimeoutError, accord.DesyncError, accord.PeerLostError: as for `allreduce`.
    ///     TypeError, ValueError: as for `allreduce`; `op="avg"`.
    #[pyo3(signature = (arr, op=None, out=None, async_op=false))]
    fn scan(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        self.elementwise(py, Elementwise::Scan, arr, op, out, async_op)
    }

    /// Exclusive prefix reduction (MPI's `Exscan`): rank r gets the reduction of the arrays of
    /// ranks 0..r-1. Rank 0 has no such prefix: its result array is left as it was (`arr`
    /// itself, in place).
    ///
    /// Args:
    ///     arr: this rank's contribution.
    ///     op: as for `scan`.
    ///     out: where the result goes (default: `arr`, in place).
    ///     async_op: return a `Request` at once instead of waiting (see `Request.wait`).
    ///
    /// Returns:
    ///     the array holding the result (a new scalar for a scalar; a `Request` with `async_op`).
    ///
    /// Raises:
    ///     as for `scan`.
    #[pyo3(signature = (arr, op=None, out=None, async_op=false))]
    fn exscan(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        self.elementwise(py, Elementwise::ExScan, arr, op, out, async_op)
    }

    /// Reduce `arr` over all ranks into `out` on `root` (into `arr` on root when `out` is None;
    /// other ranks' arrays are left unchanged). Returns the array holding the result (a new
    /// scalar for a numpy scalar or a Python number).
    ///
    /// Args:
    ///     arr: this rank's contribution.
    ///     op: as for `allreduce`.
    ///     root: the rank that gets the result.
    ///     out: where the result goes on `root` (default: `arr`).
    ///     async_op: return a `Request` at once instead of waiting (see `Request.wait`).
    ///
    /// Returns:
    ///     the array holding the result on `root`, `arr` elsewhere (a `Request` with `async_op`).
    ///
    /// Raises:
    ///     accord.TimeoutError: a rank did not take part within the timeout (`waiting_for` names it).
    ///     accord.DesyncError: the ranks called different operations, sizes, dtypes, ops or roots.
    ///     accord.PeerLostError: a rank died or closed its communicator.
    ///     TypeError, ValueError: an unsupported dtype, a non-contiguous or read-only output, sizes
    ///         that do not fit, a root or rank outside the communicator.
    #[pyo3(signature = (arr, op=None, root=0, out=None, async_op=false))]
    fn reduce(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        root: i64,
        out: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let root = rank_arg(root, "root")?;
        let op = reduce_op(op)?;
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
                Call::one("reduce", async_op, a, &arr),
                Box::new(move |c, b| unsafe { c.reduce(b[0].recv(), op, root) }.map(Some)),
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
        let call = Call {
            op: "reduce",
            async_op,
            ordered: true,
            bufs,
            output: Some(out.as_ref().unwrap_or(&arr).output()),
            keep,
        };
        self.run(
            py,
            call,
            // Off the root nothing is written: `out` (read-only there) is not passed.
            Box::new(move |c, b| unsafe {
                let recv = match b.get(1) {
                    Some(o) if c.rank() == root => o.recv(),
                    _ => b[0].empty_recv(),
                };
                c.reduce((b[0].send(), recv), op, root).map(Some)
            }),
        )
    }

    /// Every rank's `arr`, concatenated in rank order, into `out` on every rank.
    ///
    /// Args:
    ///     arr: this rank's block.
    ///     out: `size` blocks, in rank order.
    ///     async_op: return a `Request` at once instead of waiting (see `Request.wait`).
    ///
    /// Returns:
    ///     `out` (a `Request` with `async_op`).
    ///
    /// Raises:
    ///     accord.TimeoutError: a rank did not take part within the timeout (`waiting_for` names it).
    ///     accord.DesyncError: the ranks called different operations, sizes, dtypes, ops or roots.
    ///     accord.PeerLostError: a rank died or closed its communicator.
    ///     TypeError, ValueError: an unsupported dtype, a non-contiguous or read-only output, sizes
    ///         that do not fit, a root or rank outside the communicator.
    #[pyo3(signature = (arr, out, async_op=false))]
    fn allgather(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
        let bufs = pair(&arr, &out, "allgather")?;
        self.run(
            py,
            Call::two("allgather", async_op, bufs, [&arr, &out]),
            Box::new(move |c, b| unsafe { c.all_gather(b[0].send(), b[1].recv()) }.map(Some)),
        )
    }

    /// Like allgather with `counts[r]` elements from rank r.
    ///
    /// Blocks lie back to back in rank order in `out`; with `displs`, rank r's block starts at
    /// element `displs[r]` of `out` (MPI's displacements: blocks in any order, with gaps, which
    /// are left as they were; blocks must not overlap and must fit in `out`).
    #[pyo3(signature = (arr, out, counts, async_op=false, *, displs=None))]
    fn allgatherv(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        counts: Vec<usize>,
        async_op: bool,
        displs: Option<Vec<usize>>,
    ) -> PyResult<PyObject> {
        let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
        let bufs = pair(&arr, &out, "allgatherv")?;
        self.run(
            py,
            Call::two("allgatherv", async_op, bufs, [&arr, &out]),
            Box::new(move |c, b| {
                let counts = b[1].counts(&counts);
                let displs = displs.as_deref().map(|d| b[1].counts(d));
                let recv = Parts::placed(unsafe { b[1].recv() }, &counts, displs.as_deref());
                c.all_gather(unsafe { b[0].send() }, recv).map(Some)
            }),
        )
    }

    /// Every rank's `arr`, concatenated in rank order, into `out` on `root` (`out` may be None
    /// elsewhere).
    ///
    /// Args:
    ///     arr: this rank's block.
    ///     out: `size` blocks on `root`; None elsewhere.
    ///     root: the rank that gathers.
    ///     async_op: return a `Request` at once instead of waiting (see `Request.wait`).
    ///
    /// Returns:
    ///     `out` (None where not given; a `Request` with `async_op`).
    ///
    /// Raises:
    ///     accord.TimeoutError: a rank did not take part within the timeout (`waiting_for` names it).
    ///     accord.DesyncError: the ranks called different operations, sizes, dtypes, ops or roots.
    ///     accord.PeerLostError: a rank died or closed its communicator.
    ///     TypeError, ValueError: an unsupported dtype, a non-contiguous or read-only output, sizes
    ///         that do not fit, a root or rank outside the communicator.
    #[pyo3(signature = (arr, out=None, root=0, async_op=false))]
    fn gather(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        root: i64,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let root = rank_arg(root, "root")?;
        self.rooted_in(py, arr, out, root, async_op, "gather", None)
    }

    /// Like gather with `counts[r]` elements from rank r.
    ///
    /// With `displs`, rank r's block starts at element `displs[r]` of the root's `out` (blocks
    /// in any order, with gaps left as they were; they must not overlap). Ignored off the root.
    #[pyo3(signature = (arr, out=None, counts=None, root=0, async_op=false, *, displs=None))]
    #[allow(clippy::too_many_arguments)]
    fn gatherv(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        counts: Option<Vec<usize>>,
        root: i64,
        async_op: bool,
        displs: Option<Vec<usize>>,
    ) -> PyResult<PyObject> {
        let root = rank_arg(root, "root")?;
        let counts = counts.ok_or_else(|| PyValueError::new_err("gatherv needs counts"))?;
        let v = Some((counts, displs));
        self.rooted_in(py, arr, out, root, async_op, "gatherv", v)
    }

    /// Slice r of `arr` on `root` (`arr` may be None elsewhere) into `out` on rank r.
    ///
    /// Args:
    ///     arr: `size` blocks on `root`; None elsewhere.
    ///     out: this rank's block.
    ///     root: the rank that scatters.
    ///     async_op: return a `Request` at once instead of waiting (see `Request.wait`).
    ///
    /// Returns:
    ///     `out` (a `Request` with `async_op`).
    ///
    /// Raises:
    ///     accord.TimeoutError: a rank did not take part within the timeout (`waiting_for` names it).
    ///     accord.DesyncError: the ranks called different operations, sizes, dtypes, ops or roots.
    ///     accord.PeerLostError: a rank died or closed its communicator.
    ///     TypeError, ValueError: an unsupported dtype, a non-contiguous or read-only output, sizes
    ///         that do not fit, a root or rank outside the communicator.
    #[pyo3(signature = (arr, out, root=0, async_op=false))]
    fn scatter(
        &self,
        py: Python<'_>,
        arr: Option<&Bound<'_, PyAny>>,
        out: &Bound<'_, PyAny>,
        root: i64,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let root = rank_arg(root, "root")?;
        self.rooted_out(py, arr, out, root, async_op, "scatter", None)
    }

    /// Like scatter with `counts[r]` elements to rank r.
    ///
    /// With `displs`, rank r's block starts at element `displs[r]` of the root's `arr` (blocks
    /// in any order, with gaps; they may overlap). Ignored off the root.
    #[pyo3(signature = (arr, out, counts, root=0, async_op=false, *, displs=None))]
    #[allow(clippy::too_many_arguments)]
    fn scatterv(
        &self,
        py: Python<'_>,
        arr: Option<&Bound<'_, PyAny>>,
        out: &Bound<'_, PyAny>,
        counts: Vec<usize>,
        root: i64,
        async_op: bool,
        displs: Option<Vec<usize>>,
    ) -> PyResult<PyObject> {
        let root = rank_arg(root, "root")?;
        let v = Some((counts, displs));
        self.rooted_out(py, arr, out, root, async_op, "scatterv", v)
    }

    /// Reduce `arr` (size x len(out)) over all ranks; rank r gets slice r in `out`.
    ///
    /// Args:
    ///     arr: `size` blocks, this rank's contribution to each.
    ///     out: the reduced block of this rank.
    ///     op: as for `allreduce`.
    ///     async_op: return a `Request` at once instead of waiting (see `Request.wait`).
    ///
    /// Returns:
    ///     `out` (a `Request` with `async_op`).
    ///
    /// Raises:
    ///     accord.TimeoutError: a rank did not take part within the timeout (`waiting_for` names it).
    ///     accord.DesyncError: the ranks called different operations, sizes, dtypes, ops or roots.
    ///     accord.PeerLostError: a rank died or closed its communicator.
    ///     TypeError, ValueError: an unsupported dtype, a non-contiguous or read-only output, sizes
    ///         that do not fit, a root or rank outside the communicator.
    #[pyo3(signature = (arr, out, op=None, async_op=false))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let op = reduce_op(op)?;
        let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
        let bufs = pair(&arr, &out, "reduce_scatter")?;
        self.run(
            py,
            Call::two("reduce_scatter", async_op, bufs, [&arr, &out]),
            Box::new(move |c, b| {
                unsafe { c.reduce_scatter(b[0].send(), b[1].recv(), op) }.map(Some)
            }),
        )
    }

    /// Like reduce_scatter with `counts[r]` elements to rank r.
    ///
    /// With `displs`, the block reduced for rank r starts at element `displs[r]` of this rank's
    /// `arr` (blocks in any order, with gaps; they may overlap).
    #[pyo3(signature = (arr, out, counts, op=None, async_op=false, *, displs=None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatterv(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        counts: Vec<usize>,
        op: Option<&Bound<'_, PyAny>>,
        async_op: bool,
        displs: Option<Vec<usize>>,
    ) -> PyResult<PyObject> {
        let op = reduce_op(op)?;
        let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
        let bufs = pair(&arr, &out, "reduce_scatterv")?;
        self.run(
            py,
            Call::two("reduce_scatterv", async_op, bufs, [&arr, &out]),
            Box::new(move |c, b| {
                let send = Parts::placed(unsafe { b[0].send() }, &counts, displs.as_deref());
                c.reduce_scatter(send, unsafe { b[1].recv() }, op).map(Some)
            }),
        )
    }

    /// Slice j of `arr` goes to rank j; slice i of `out` comes from rank i.
    ///
    /// Args:
    ///     arr: `size` blocks, block j for rank j.
    ///     out: `size` blocks, block i from rank i.
    ///     async_op: return a `Request` at once instead of waiting (see `Request.wait`).
    ///
    /// Returns:
    ///     `out` (a `Request` with `async_op`).
    ///
    /// Raises:
    ///     accord.TimeoutError: a rank did not take part within the timeout (`waiting_for` names it).
    ///     accord.DesyncError: the ranks called different operations, sizes, dtypes, ops or roots.
    ///     accord.PeerLostError: a rank died or closed its communicator.
    ///     TypeError, ValueError: an unsupported dtype, a non-contiguous or read-only output, sizes
    ///         that do not fit, a root or rank outside the communicator.
    #[pyo3(signature = (arr, out, async_op=false))]
    fn alltoall(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
        let bufs = pair(&arr, &out, "alltoall")?;
        // The core splits bytes for a dtype moved as bytes: the blocks must be whole elements.
        if let (Buf::Host(a), Some(r)) = (&bufs.0, bufs.0.raw()) {
            let (n, size) = (a.len / r.itemsize, self.inner.size());
            if n % size != 0 {
                return Err(err(accord::Error::invalid(format!(
                    "alltoall: send buffer has {n} elements, not a multiple of the {size} ranks"
                ))));
            }
        }
        self.run(
            py,
            Call::two("alltoall", async_op, bufs, [&arr, &out]),
            Box::new(move |c, b| unsafe { c.all_to_all(b[0].send(), b[1].recv()) }.map(Some)),
        )
    }

    /// Like alltoall with per-rank counts: `send_counts[j]` elements to rank j,
    /// `recv_counts[i]` from rank i.
    ///
    /// With `send_displs`, the block for rank j starts at element `send_displs[j]` of `arr`
    /// (blocks may overlap); with `recv_displs`, the block from rank i lands at element
    /// `recv_displs[i]` of `out` (blocks must not overlap; gaps are left as they were).
    #[pyo3(signature = (arr, send_counts, out, recv_counts, async_op=false, *, send_displs=None, recv_displs=None))]
    #[allow(clippy::too_many_arguments)]
    fn alltoallv(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        send_counts: Vec<usize>,
        out: &Bound<'_, PyAny>,
        recv_counts: Vec<usize>,
        async_op: bool,
        send_displs: Option<Vec<usize>>,
        recv_displs: Option<Vec<usize>>,
    ) -> PyResult<PyObject> {
        let (arr, out) = (Arg::new(arr, "arr")?, Arg::new(out, "out")?);
        let bufs = pair(&arr, &out, "alltoallv")?;
        self.run(
            py,
            Call::two("alltoallv", async_op, bufs, [&arr, &out]),
            Box::new(move |c, b| {
                let (sc, rc) = (b[0].counts(&send_counts), b[1].counts(&recv_counts));
                let sd = send_displs.as_deref().map(|d| b[0].counts(d));
                let rd = recv_displs.as_deref().map(|d| b[1].counts(d));
                let send = Parts::placed(unsafe { b[0].send() }, &sc, sd.as_deref());
                let recv = Parts::placed(unsafe { b[1].recv() }, &rc, rd.as_deref());
                c.all_to_all(send, recv).map(Some)
            }),
        )
    }

    // ----- GPU

    /// The CUDA device attached to this communicator (by its first call with CUDA arrays), as a
    /// list: `[]` before that, else `[ordinal]`.
    #[getter]
    fn gpu_devices(&self) -> Vec<usize> {
        self.inner.attached_device().into_iter().collect()
    }

    /// Attach CUDA device `ordinal` now instead of at the first call with CUDA arrays, so that
    /// the device engine exists before any work is issued. Collective: every rank calls it, each
    /// with its own device. The same device again is a no-op; another one is an error.
    fn attach_device(&self, py: Python<'_>, ordinal: usize) -> PyResult<()> {
        let comm = self.inner.clone();
        py.allow_threads(move || comm.attach_device(ordinal))
            .map_err(err)
    }

    /// Block the host until every GPU operation issued so far on this communicator has
    /// completed (raises the first GPU failure, e.g. a desync or a timeout).
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let comm = self.inner.clone();
        py.allow_threads(move || comm.synchronize()).map_err(err)
    }

    /// This communicator as an `accord_comm_t*` for C and C++ code, as an integer: pass it to
    /// an extension (pybind11, Cython, ctypes) that wraps it with
    /// `accord::comms::from_handle(h)` from `<accord/comms.hpp>` or calls the functions of
    /// `<accord.h>`. The calls go to this module's Accord (the extension links none of its
    /// own). The handle is lent: it stays valid while this Communicator object lives; do not
    /// `accord_finalize` it.
    fn c_handle(&self) -> usize {
        *self
            .c_handle
            .get_or_init(|| accord_c::lend_handle(self.inner.clone()) as usize)
    }

    /// The attached GPU's NCCL communicator (`ncclComm_t`, as an integer), for libraries that
    /// take one (e.g. pylibraft's `inject_comms_on_handle_coll_only`). Do not destroy it: it
    /// belongs to this communicator. Raises `RuntimeError` before a GPU is attached (the first
    /// call with CUDA arrays) or when the attached engine is not NCCL.
    fn nccl_comm(&self) -> PyResult<usize> {
        Ok(self.nccl_info()?.raw_handle)
    }

    /// The `ncclUniqueId` (128 bytes) the attached GPU's NCCL communicator was created from.
    /// Raises `RuntimeError` as `nccl_comm` does, and for a communicator made by `split`
    /// (NCCL splits have no id).
    fn nccl_unique_id<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let info = self.nccl_info()?;
        let id = info.unique_id.ok_or_else(|| {
            PyRuntimeError::new_err(
                "this communicator's NCCL communicator was split from another: it has no unique id",
            )
        })?;
        Ok(pyo3::types::PyBytes::new(py, &id))
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
