//! Python arguments that are not arrays: ranks and reduce operators.

use accord::ReduceOp;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A rank argument (`root`, `dst`, `src`): Python ints may be negative, which no rank is.
pub(crate) fn rank_arg(v: i64, what: &str) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| {
        PyValueError::new_err(format!(
            "{what} must be a rank of the communicator (0 or more), not {v}"
        ))
    })
}

/// The reduce operator of an `op` argument: a name (`"sum"`...) or `accord.ReduceOp`; `None`
/// is sum.
pub(crate) fn reduce_op(op: Option<&Bound<'_, PyAny>>) -> PyResult<ReduceOp> {
    let Some(op) = op else {
        return Ok(ReduceOp::Sum);
    };
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
