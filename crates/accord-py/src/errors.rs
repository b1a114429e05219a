//! Accord errors as Python exceptions.
//!
//! The exception classes live in `accord/_errors.py` (so that they can inherit from both
//! `AccordError` and a builtin such as `TimeoutError` or `ValueError`); this module picks the
//! class for each [`Error`] variant and copies the variant's fields onto the instance.

use accord::Error;
use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::IntoPyObjectExt;

fn make<'py>(
    py: Python<'py>,
    class: &str,
    msg: String,
    attrs: Vec<(&str, PyObject)>,
) -> PyResult<Bound<'py, PyAny>> {
    let module = py.import("accord._errors")?;
    let exc = module.getattr(class)?.call1((msg,))?;
    for (k, v) in attrs {
        exc.setattr(k, v)?;
    }
    Ok(exc)
}

fn convert(py: Python<'_>, e: &Error) -> PyResult<PyErr> {
    let msg = e.to_string();
    let exc = match e {
        Error::Timeout {
            op,
            seq,
            comm,
            waiting_for,
            after,
            hint,
        } => make(
            py,
            "TimeoutError",
            msg,
            vec![
                ("op", op.into_py_any(py)?),
                ("seq", seq.into_py_any(py)?),
                ("comm", comm.into_py_any(py)?),
                (
                    "waiting_for",
                    PyList::new(py, waiting_for)?.into_py_any(py)?,
                ),
                ("after", after.as_secs_f64().into_py_any(py)?),
                ("hint", hint.into_py_any(py)?),
            ],
        )?,
        Error::Desync {
            me,
            mine,
            peer,
            theirs,
            comm,
            seq,
        } => make(
            py,
            "DesyncError",
            msg,
            vec![
                ("rank", me.into_py_any(py)?),
                ("mine", mine.into_py_any(py)?),
                ("peer", peer.into_py_any(py)?),
                ("theirs", theirs.into_py_any(py)?),
                ("comm", comm.into_py_any(py)?),
                ("seq", seq.into_py_any(py)?),
            ],
        )?,
        Error::PeerLost { rank, cause } => make(
            py,
            "PeerLostError",
            msg,
            vec![
                ("rank", rank.into_py_any(py)?),
                ("peer", rank.into_py_any(py)?),
                ("cause", cause.into_py_any(py)?),
            ],
        )?,
        Error::Aborted { reason } => make(
            py,
            "AbortedError",
            msg,
            vec![("reason", reason.into_py_any(py)?)],
        )?,
        Error::InvalidArgument(m) => make(
            py,
            "InvalidArgumentError",
            msg,
            vec![("detail", m.into_py_any(py)?)],
        )?,
        Error::Unauthorized(m) => make(
            py,
            "UnauthorizedError",
            msg,
            vec![("detail", m.into_py_any(py)?)],
        )?,
        Error::Unsupported(m) => make(
            py,
            "UnsupportedError",
            msg,
            vec![("detail", m.into_py_any(py)?)],
        )?,
        Error::Protocol(m) => make(
            py,
            "ProtocolError",
            msg,
            vec![("detail", m.into_py_any(py)?)],
        )?,
        Error::Io {
            context, message, ..
        } => make(
            py,
            "ConnectionError",
            msg,
            vec![
                ("context", context.into_py_any(py)?),
                ("detail", message.into_py_any(py)?),
            ],
        )?,
        Error::Store(m) => make(py, "StoreError", msg, vec![("detail", m.into_py_any(py)?)])?,
        // A failed GPU library call fails its communicator, as an abort does.
        Error::Gpu { .. } => make(
            py,
            "AbortedError",
            msg.clone(),
            vec![("reason", msg.into_py_any(py)?)],
        )?,
        _ => make(py, "AccordError", msg, Vec::new())?,
    };
    Ok(PyErr::from_value(exc))
}

/// The Python exception for `e`.
pub fn to_py(e: Error) -> PyErr {
    Python::with_gil(|py| convert(py, &e).unwrap_or_else(|err| err))
}

/// `accord.UnsupportedError` for an array on a device accord cannot use (not CUDA).
pub fn unsupported_device<'py>(
    py: Python<'py>,
    what: &str,
    device: &str,
    id: i32,
) -> PyResult<Bound<'py, PyAny>> {
    make(
        py,
        "UnsupportedError",
        format!(
            "{what} lives in {device} memory (device {id}); accord's GPU backend takes CUDA \
             arrays only. Copy it to the host (e.g. tensor.cpu()) or use a host array"
        ),
        vec![("device", device.into_py_any(py)?)],
    )
}
