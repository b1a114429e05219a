//! `accord._native`: the Python extension module of Accord.
//!
//! It binds [`accord::Communicator`], whose operations take buffers that carry their memory
//! kind. Arrays arrive through [`array::extract`] (DLPack, `__cuda_array_interface__`,
//! `__array_interface__`, buffer protocol) and become the core's host or device buffers
//! ([`buffers`]); immutable scalars (numpy scalars, Python numbers) are one-element stand-ins
//! whose result is returned as a new scalar ([`scalar`]). Each method of [`communicator`] calls
//! one core method for host and CUDA arrays alike; [`run`] decides only how the call completes:
//! host calls run with the GIL released, or (`async_op=True`) take their place in the
//! communicator's order at call time and run on a thread of their own ([`request`]); CUDA calls
//! attach the device on first use (a collective step) and are enqueued on the array framework's
//! current stream without waiting for the GPU. [`init`] joins a job.
//! The pure-Python package `accord` re-exports this module and adds the Ray, Dask and MPI glue.

// pyo3 0.22's #[pymethods] expansion trips this lint on every fallible method.
#![allow(clippy::useless_conversion)]

mod args;
mod array;
mod buffers;
mod communicator;
mod cuda;
mod distributed;
mod elementwise;
mod errors;
mod group;
mod init;
mod request;
mod rooted;
mod run;
mod scalar;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<communicator::Communicator>()?;
    m.add_class::<request::Request>()?;
    m.add_class::<cuda::SymmetricBuffer>()?;
    m.add_class::<cuda::MemoryChannels>()?;
    m.add_class::<cuda::Kernel>()?;
    m.add_function(wrap_pyfunction!(cuda::compile_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_include_dir, m)?)?;
    m.add_class::<distributed::RedistributePlan>()?;
    m.add_class::<distributed::FftPlan>()?;
    m.add_function(wrap_pyfunction!(distributed::grid_box, m)?)?;
    m.add_function(wrap_pyfunction!(group::group_start, m)?)?;
    m.add_function(wrap_pyfunction!(group::group_end, m)?)?;
    m.add_function(wrap_pyfunction!(group::group_depth, m)?)?;
    m.add_class::<init::StoreServer>()?;
    m.add_function(wrap_pyfunction!(init::init, m)?)?;
    m.add_function(wrap_pyfunction!(init::cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(init::dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(dump_flight_records, m)?)?;
    m.add_function(wrap_pyfunction!(flush_trace, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// Write every live communicator's flight record of this process now (one file per rank, in
/// `ACCORD_FLIGHT_DIR`); the files written.
#[pyfunction]
#[pyo3(signature = (reason="request"))]
fn dump_flight_records(py: Python<'_>, reason: &str) -> Vec<String> {
    py.allow_threads(|| accord::observe::dump_all(reason))
        .into_iter()
        .map(|p| p.display().to_string())
        .collect()
}

/// Write the timeline recorded so far (`ACCORD_TRACE`) now; the files written (none when the
/// timeline is off). It is also written when the world communicator closes and at exit.
#[pyfunction]
fn flush_trace(py: Python<'_>) -> PyResult<Vec<String>> {
    let files = py
        .allow_threads(accord::observe::trace::flush)
        .map_err(|e| {
            pyo3::exceptions::PyOSError::new_err(format!("cannot write the trace: {e}"))
        })?;
    Ok(files.into_iter().map(|p| p.display().to_string()).collect())
}
