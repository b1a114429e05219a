//! Gather and scatter, whose one-sided array exists only at the root: `out` of gather is
//! ignored off the root (and may be None there), `arr` of scatter likewise. Ranks without one
//! pass the core an empty buffer in the memory of their other array.

use crate::buffers::{buf, obj, same_dtype, Call};
use crate::communicator::Communicator;
use crate::scalar::Arg;
use accord::Parts;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

impl Communicator {
    /// gather / gatherv (`counts`, and `displs` where given): input everywhere, output at the
    /// root only.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rooted_in(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        root: usize,
        async_op: bool,
        what: &'static str,
        counts: Option<(Vec<usize>, Option<Vec<usize>>)>,
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
        let call = Call {
            op: what,
            async_op,
            ordered: true,
            bufs,
            output: out.as_ref().map(Arg::output),
            keep,
        };
        self.run(
            py,
            call,
            Box::new(move |c, b| {
                let send = unsafe { b[0].send() };
                let recv = match b.get(1) {
                    Some(o) => unsafe { o.recv() },
                    None => b[0].empty_recv(),
                };
                match &counts {
                    None => c.gather(send, recv, root),
                    Some((n, d)) => {
                        let (n, d) = (b[0].counts(n), d.as_deref().map(|d| b[0].counts(d)));
                        c.gather(send, Parts::placed(recv, &n, d.as_deref()), root)
                    }
                }
                .map(Some)
            }),
        )
    }

    /// scatter / scatterv (`counts`, and `displs` where given): input at the root only, output
    /// everywhere.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rooted_out(
        &self,
        py: Python<'_>,
        arr: Option<&Bound<'_, PyAny>>,
        out: &Bound<'_, PyAny>,
        root: usize,
        async_op: bool,
        what: &'static str,
        counts: Option<(Vec<usize>, Option<Vec<usize>>)>,
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
        let call = Call {
            op: what,
            async_op,
            ordered: true,
            bufs,
            output: Some(out.output()),
            keep,
        };
        self.run(
            py,
            call,
            Box::new(move |c, b| {
                let send = match b.get(1) {
                    Some(a) => unsafe { a.send() },
                    None => b[0].empty_send(),
                };
                let recv = unsafe { b[0].recv() };
                match &counts {
                    None => c.scatter(send, recv, root),
                    Some((n, d)) => {
                        let (n, d) = (b[0].counts(n), d.as_deref().map(|d| b[0].counts(d)));
                        c.scatter(Parts::placed(send, &n, d.as_deref()), recv, root)
                    }
                }
                .map(Some)
            }),
        )
    }
}
