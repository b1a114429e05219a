//! `accord._native`: the Python extension module of Accord.
//!
//! It binds the type-erased core ([`accord::Communicator`]'s `*_bytes` methods): arrays arrive
//! through [`array::extract`] (DLPack, `__array_interface__`, buffer protocol), every
//! communication runs with the GIL released, and nonblocking calls (`async_op=True`) reserve
//! their place in the communicator's order at call time and run on a thread of their own.
//! The pure-Python package `accord` re-exports this module and adds the Ray, Dask and MPI glue.

// pyo3 0.22's #[pymethods] expansion trips this lint on every fallible method.
#![allow(clippy::useless_conversion)]

mod array;
mod errors;

use accord::rendezvous::{self, InitMethod, StoreServer as CoreServer};
use accord::{Communicator as CoreComm, DataType, ReduceOp};
use array::{Array, HostArray};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

type Job = Box<dyn FnOnce(&CoreComm, &[HostArray]) -> accord::Result<()> + Send>;

fn err(e: accord::Error) -> PyErr {
    errors::to_py(e)
}

/// Host memory of `obj`, or the single routing point for device arrays (refused until the GPU
/// backend exists).
fn host(obj: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<HostArray> {
    match array::extract(obj, what, writable)? {
        Array::Host(a) => Ok(a),
        Array::Device(kind, id) => Err(PyErr::from_value_bound(
            errors::unsupported_device(obj.py(), what, kind, id)?.into_any(),
        )),
    }
}

fn same_dtype(a: &HostArray, b: &HostArray, what: &str) -> PyResult<()> {
    if a.dtype != b.dtype {
        return Err(PyTypeError::new_err(format!(
            "{what}: input has dtype {} but output has dtype {}; they must match",
            a.dtype, b.dtype
        )));
    }
    Ok(())
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

/// A nonblocking operation. `wait()` returns the output array (or `None`) once it is done; the
/// arrays stay alive until then.
#[pyclass(module = "accord._native")]
struct Request {
    done: Arc<Done>,
    output: Option<PyObject>,
    /// The arrays, kept alive for the caller's sake until completion is observed.
    _keep: Vec<PyObject>,
}

#[pymethods]
impl Request {
    /// Block until the operation finishes (at most `timeout` seconds: then `accord.TimeoutError`,
    /// and the operation keeps running). Raises the operation's error, if any.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<PyObject>> {
        let done = self.done.clone();
        let finished = py.allow_threads(move || {
            let mut g = done.result.lock().unwrap_or_else(|e| e.into_inner());
            let deadline =
                timeout.map(|t| std::time::Instant::now() + Duration::from_secs_f64(t.max(0.0)));
            while g.is_none() {
                match deadline {
                    None => g = done.cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                    Some(d) => {
                        let now = std::time::Instant::now();
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
        });
        match finished {
            None => Err(err(accord::Error::Timeout {
                op: "Request.wait".into(),
                seq: 0,
                comm: "-".into(),
                waiting_for: vec![],
                after: Duration::from_secs_f64(timeout.unwrap_or(0.0).max(0.0)),
                hint: "; the operation is still running".into(),
            })),
            Some(Ok(())) => Ok(self.output.as_ref().map(|o| o.clone_ref(py))),
            Some(Err(e)) => Err(err(e)),
        }
    }

    /// Whether the operation has finished (successfully or not).
    fn test(&self) -> bool {
        self.done
            .result
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Alias of `test()`, like torch's `Work.is_completed()`.
    fn is_completed(&self) -> bool {
        self.test()
    }
}

/// A group of ranks that communicate. Every member must call the same operations in the same
/// order; disagreements raise `accord.DesyncError`.
#[pyclass(module = "accord._native", subclass)]
struct Communicator {
    inner: CoreComm,
}

impl Communicator {
    /// Run `job` on `bufs`: now with the GIL released, or (`async_op`) on a thread, returning a
    /// Request. `output` is what a successful call returns; `keep` what a Request keeps alive.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        py: Python<'_>,
        async_op: bool,
        ordered: bool,
        bufs: Vec<HostArray>,
        output: Option<PyObject>,
        keep: Vec<PyObject>,
        job: Job,
    ) -> PyResult<PyObject> {
        let comm = self.inner.clone();
        if !async_op {
            py.allow_threads(|| job(&comm, &bufs)).map_err(err)?;
            drop(bufs);
            return Ok(output.unwrap_or_else(|| py.None()));
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
                done,
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
        self.inner.set_timeout(Duration::from_secs_f64(seconds));
        Ok(())
    }

    /// Fail every pending and later call, here and (as they notice) on the peers.
    fn abort(&self, reason: &str) {
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

    /// Send `arr` to rank `dst`.
    #[pyo3(signature = (arr, dst, tag=0, async_op=false))]
    fn send(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        dst: usize,
        tag: u32,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let a = host(arr, "arr", false)?;
        self.launch(
            py,
            async_op,
            false,
            vec![a],
            None,
            vec![obj(arr)],
            Box::new(move |c, b| unsafe { c.send_bytes(b[0].bytes(), b[0].dtype, dst, tag) }),
        )
    }

    /// Receive into `arr` from rank `src`; returns `arr`.
    #[pyo3(signature = (arr, src, tag=0, async_op=false))]
    fn recv(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        src: usize,
        tag: u32,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let a = host(arr, "arr", true)?;
        self.launch(
            py,
            async_op,
            false,
            vec![a],
            Some(obj(arr)),
            vec![obj(arr)],
            Box::new(move |c, b| unsafe { c.recv_bytes(b[0].bytes_mut(), b[0].dtype, src, tag) }),
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
        let s = host(send, "send", false)?;
        let r = host(recv, "recv", true)?;
        same_dtype(&s, &r, "sendrecv")?;
        self.launch(
            py,
            false,
            false,
            vec![s, r],
            Some(obj(recv)),
            vec![],
            Box::new(move |c, b| unsafe {
                c.send_bytes(b[0].bytes(), b[0].dtype, dst, tag)?;
                c.recv_bytes(b[1].bytes_mut(), b[1].dtype, src, tag)
            }),
        )
    }

    // ----- collectives

    /// Wait until every rank has entered the barrier.
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

    /// Copy `arr` from `root` to every rank, in place; returns `arr`.
    #[pyo3(signature = (arr, root=0, async_op=false))]
    fn broadcast(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        root: usize,
        async_op: bool,
    ) -> PyResult<PyObject> {
        let a = host(arr, "arr", true)?;
        self.launch(
            py,
            async_op,
            true,
            vec![a],
            Some(obj(arr)),
            vec![obj(arr)],
            Box::new(move |c, b| unsafe { c.broadcast_bytes(b[0].bytes_mut(), b[0].dtype, root) }),
        )
    }

    /// Reduce `arr` over all ranks with `op`; the result goes to `out`, or into `arr` in place
    /// when `out` is None. Returns the array holding the result.
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
                let a = host(arr, "arr", true)?;
                self.launch(
                    py,
                    async_op,
                    true,
                    vec![a],
                    Some(obj(arr)),
                    vec![obj(arr)],
                    Box::new(move |c, b| unsafe {
                        c.all_reduce_bytes(None, b[0].bytes_mut(), b[0].dtype, op)
                    }),
                )
            }
            Some(out) => {
                let a = host(arr, "arr", false)?;
                let o = host(out, "out", true)?;
                same_dtype(&a, &o, "allreduce")?;
                self.launch(
                    py,
                    async_op,
                    true,
                    vec![a, o],
                    Some(obj(out)),
                    vec![obj(arr), obj(out)],
                    Box::new(move |c, b| unsafe {
                        c.all_reduce_bytes(Some(b[0].bytes()), b[1].bytes_mut(), b[0].dtype, op)
                    }),
                )
            }
        }
    }

    /// Reduce `arr` over all ranks into `out` on `root` (into `arr` on root when `out` is None;
    /// other ranks' arrays are left unchanged).
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
        let out = out.filter(|o| !o.is(arr));
        if me == root && out.is_none() {
            let a = host(arr, "arr", true)?;
            return self.launch(
                py,
                async_op,
                true,
                vec![a],
                Some(obj(arr)),
                vec![obj(arr)],
                Box::new(move |c, b| unsafe {
                    c.reduce_bytes(None, b[0].bytes_mut(), b[0].dtype, op, root)
                }),
            );
        }
        let a = host(arr, "arr", false)?;
        let mut bufs = vec![];
        let mut keep = vec![obj(arr)];
        if let Some(out) = out {
            let o = host(out, "out", me == root)?;
            same_dtype(&a, &o, "reduce")?;
            bufs.push(o);
            keep.push(obj(out));
        }
        bufs.insert(0, a);
        let ret = out.map(obj).unwrap_or_else(|| obj(arr));
        self.launch(
            py,
            async_op,
            true,
            bufs,
            Some(ret),
            keep,
            Box::new(move |c, b| unsafe {
                let recv: &mut [u8] = if c.rank() == root {
                    b[1].bytes_mut()
                } else {
                    &mut []
                };
                c.reduce_bytes(Some(b[0].bytes()), recv, b[0].dtype, op, root)
            }),
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
        let (a, o) = self.pair(arr, Some(out), "allgather", true)?;
        self.launch(
            py,
            async_op,
            true,
            vec![a, o.unwrap()],
            Some(obj(out)),
            vec![obj(arr), obj(out)],
            Box::new(move |c, b| unsafe {
                c.all_gather_bytes(b[0].bytes(), b[1].bytes_mut(), b[0].dtype)
            }),
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
        let (a, o) = self.pair(arr, Some(out), "allgatherv", true)?;
        self.launch(
            py,
            async_op,
            true,
            vec![a, o.unwrap()],
            Some(obj(out)),
            vec![obj(arr), obj(out)],
            Box::new(move |c, b| unsafe {
                c.all_gather_v_bytes(b[0].bytes(), b[1].bytes_mut(), &counts, b[0].dtype)
            }),
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
        let (a, o) = self.pair(arr, Some(out), "reduce_scatter", true)?;
        self.launch(
            py,
            async_op,
            true,
            vec![a, o.unwrap()],
            Some(obj(out)),
            vec![obj(arr), obj(out)],
            Box::new(move |c, b| unsafe {
                c.reduce_scatter_bytes(b[0].bytes(), b[1].bytes_mut(), b[0].dtype, op)
            }),
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
        let (a, o) = self.pair(arr, Some(out), "reduce_scatterv", true)?;
        self.launch(
            py,
            async_op,
            true,
            vec![a, o.unwrap()],
            Some(obj(out)),
            vec![obj(arr), obj(out)],
            Box::new(move |c, b| unsafe {
                c.reduce_scatter_v_bytes(b[0].bytes(), b[1].bytes_mut(), &counts, b[0].dtype, op)
            }),
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
        let (a, o) = self.pair(arr, Some(out), "alltoall", true)?;
        self.launch(
            py,
            async_op,
            true,
            vec![a, o.unwrap()],
            Some(obj(out)),
            vec![obj(arr), obj(out)],
            Box::new(move |c, b| unsafe {
                c.all_to_all_bytes(b[0].bytes(), b[1].bytes_mut(), b[0].dtype)
            }),
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
        let (a, o) = self.pair(arr, Some(out), "alltoallv", true)?;
        self.launch(
            py,
            async_op,
            true,
            vec![a, o.unwrap()],
            Some(obj(out)),
            vec![obj(arr), obj(out)],
            Box::new(move |c, b| unsafe {
                c.all_to_all_v_bytes(
                    b[0].bytes(),
                    &send_counts,
                    b[1].bytes_mut(),
                    &recv_counts,
                    b[0].dtype,
                )
            }),
        )
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
        Ok(r.map(|inner| Communicator { inner }))
    }

    /// A communicator of the listed ranks, in that order; None on ranks not listed. Every rank
    /// calls it with the same list.
    fn subgroup(&self, py: Python<'_>, ranks: Vec<usize>) -> PyResult<Option<Communicator>> {
        let c = self.inner.clone();
        let r = py.allow_threads(move || c.subgroup(&ranks)).map_err(err)?;
        Ok(r.map(|inner| Communicator { inner }))
    }
}

impl Communicator {
    /// Input (read) and output (written) of one call, with matching dtypes.
    fn pair(
        &self,
        arr: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        what: &str,
        out_writable: bool,
    ) -> PyResult<(HostArray, Option<HostArray>)> {
        let a = host(arr, "arr", false)?;
        let o = match out {
            Some(o) => {
                let o = host(o, "out", out_writable)?;
                same_dtype(&a, &o, what)?;
                Some(o)
            }
            None => None,
        };
        Ok((a, o))
    }

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
        let (a, o) = self.pair(arr, out, what, true)?;
        let mut bufs = vec![a];
        bufs.extend(o);
        let mut keep = vec![obj(arr)];
        keep.extend(out.map(obj));
        self.launch(
            py,
            async_op,
            true,
            bufs,
            out.map(obj),
            keep,
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
        let o = host(out, "out", true)?;
        let mut keep = vec![obj(out)];
        let mut bufs = vec![o];
        match arr {
            Some(arr) if is_root => {
                let a = host(arr, "arr", false)?;
                same_dtype(&a, &bufs[0], what)?;
                bufs.push(a);
                keep.push(obj(arr));
            }
            None if is_root => {
                return Err(PyValueError::new_err(format!(
                    "{what}: the root needs an input array"
                )))
            }
            _ => {}
        }
        self.launch(
            py,
            async_op,
            true,
            bufs,
            Some(obj(out)),
            keep,
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
    Ok(Communicator { inner })
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
