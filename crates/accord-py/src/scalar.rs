//! Immutable scalars where an array is expected.
//!
//! A numpy scalar (`np.float32(1.5)`, what `x.sum()` returns) exports its value through
//! `__array_interface__` as a temporary copy, so writing there changes nothing the caller can
//! see; Python ints and floats export no memory at all. Each such scalar is therefore replaced
//! by a fresh one-element array holding its value ([`Arg::new`]). An operation that writes it
//! returns the result as a new scalar of the caller's type ([`Output`]); the object passed is
//! never changed, as it cannot be.

use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyComplex, PyFloat, PyInt, PyList, PyTuple};

/// The kind of immutable scalar an argument was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A numpy scalar (`numpy.generic`): stands in as a 0-d array of its dtype.
    Numpy,
    /// A Python float: stands in as one float64.
    Float,
    /// A Python int: stands in as one int64.
    Int,
    /// A Python bool: stands in as one bool (a `ctypes.c_bool` array, whose buffer says `?`).
    Bool,
    /// A Python complex: stands in as one complex128 (a numpy array: the standard library has
    /// no complex buffer).
    Complex,
}

/// Which kind of immutable scalar `obj` is, if any.
fn kind(obj: &Bound<'_, PyAny>) -> PyResult<Option<Kind>> {
    // The common case, an array, without looking anything up.
    if crate::array::is_ndarray(obj) {
        return Ok(None);
    }
    // numpy scalars first: numpy.float64 is also a Python float. Without numpy imported
    // nothing can be one.
    static GENERIC: pyo3::sync::GILOnceCell<Py<PyAny>> = pyo3::sync::GILOnceCell::new();
    let py = obj.py();
    if let Some(generic) = crate::array::numpy_attr(py, &GENERIC, "generic") {
        if obj.is_instance(generic.bind(py))? {
            return Ok(Some(Kind::Numpy));
        }
    }
    if obj.is_instance_of::<PyBool>() {
        return Ok(Some(Kind::Bool));
    }
    if obj.is_instance_of::<PyComplex>() {
        return Ok(Some(Kind::Complex));
    }
    if obj.is_instance_of::<PyFloat>() {
        return Ok(Some(Kind::Float));
    }
    if obj.is_instance_of::<PyInt>() {
        return Ok(Some(Kind::Int));
    }
    Ok(None)
}

/// One array argument as a call uses it: the caller's object, or the stand-in array of an
/// immutable scalar.
pub struct Arg<'py> {
    pub obj: Bound<'py, PyAny>,
    scalar: Option<Kind>,
}

impl<'py> Arg<'py> {
    /// `obj`, with an immutable scalar replaced by a writable one-element copy of its value.
    /// `what` names the argument in messages.
    pub fn new(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Arg<'py>> {
        let py = obj.py();
        let scalar = kind(obj)?;
        let stand_in = match scalar {
            None => obj.clone(),
            Some(Kind::Numpy) => py.import("numpy")?.getattr("array")?.call1((obj,))?,
            Some(Kind::Bool) => py
                .import("ctypes")?
                .getattr("c_bool")?
                .mul(1)?
                .call1((obj,))?,
            Some(Kind::Complex) => py
                .import("numpy")
                .map_err(|_| {
                    PyTypeError::new_err(format!(
                        "{what} is a Python complex, which needs numpy to stand in as an array \
                         (pip install numpy)"
                    ))
                })?
                .getattr("array")?
                .call1(((obj,), "complex128"))?,
            Some(k) => {
                let code = if k == Kind::Float { "d" } else { "q" };
                let values = PyList::new(py, [obj])?;
                py.import("array")?
                    .getattr("array")?
                    .call1((code, values))
                    .map_err(|e| {
                        if e.is_instance_of::<PyOverflowError>(py) {
                            PyOverflowError::new_err(format!(
                                "{what} = {obj} does not fit in int64, the dtype accord uses for \
                                 a Python int"
                            ))
                        } else {
                            e
                        }
                    })?
            }
        };
        Ok(Arg {
            obj: stand_in,
            scalar,
        })
    }

    /// What a call that writes this argument returns.
    pub fn output(&self) -> Output {
        Output {
            obj: self.obj.clone().unbind(),
            scalar: self.scalar,
        }
    }
}

/// What a call returns once it is done: its output array, or a new scalar read from the
/// stand-in array of an immutable scalar.
pub struct Output {
    obj: PyObject,
    scalar: Option<Kind>,
}

impl Output {
    pub fn deliver(&self, py: Python<'_>) -> PyResult<PyObject> {
        let obj = self.obj.bind(py);
        Ok(match self.scalar {
            None => obj.clone(),
            // arr[()] is the numpy scalar of the 0-d array's dtype; array.array()[0] the number.
            Some(Kind::Numpy) => obj.get_item(PyTuple::empty(py))?,
            // numpy's complex128 scalar back to a Python complex.
            Some(Kind::Complex) => obj.get_item(0)?.call_method0("item")?,
            Some(_) => obj.get_item(0)?,
        }
        .unbind())
    }
}
