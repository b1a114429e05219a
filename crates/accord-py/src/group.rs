//! Launch groups of device operations (`accord.group()`), as NCCL's `ncclGroupStart` /
//! `ncclGroupEnd` and the C API's `accord_group_start` / `accord_group_end`.
//!
//! Between `group_start()` and the matching `group_end()` on one thread, the device operations
//! that thread issues (CUDA arrays, on any communicator) are launched together when the
//! outermost group ends, so a batch may post its receives before its sends on every rank
//! without deadlock. Host operations are not deferred: a blocking one runs at its call (use
//! `async_op=True` for host messages that must not wait for each other). A device call made
//! inside a group returns before its work is launched; its request is armed at the group's end.
//! Creating a device communicator (the first call with CUDA arrays attaches one) and splitting
//! one are refused inside a group: attach first (`Communicator.attach_device`).

use crate::errors::to_py;
use pyo3::prelude::*;

/// Open a launch group on this thread (groups nest; each needs its `group_end`).
#[pyfunction]
pub fn group_start() -> PyResult<()> {
    accord::gpu::group_start().map_err(to_py)
}

/// End this thread's innermost launch group; the outermost launches the device operations
/// issued since the matching `group_start` (the first error of the launch).
#[pyfunction]
pub fn group_end(py: Python<'_>) -> PyResult<()> {
    // The GIL is released on this same thread (the group's state is per thread) while the
    // libraries launch: a nonblocking library may wait for its enqueue to finish.
    py.allow_threads(accord::gpu::group_end).map_err(to_py)
}

/// How many launch groups are open on this thread (0 outside any): a device operation issued
/// while one is open is launched only when the outermost ends.
#[pyfunction]
pub fn group_depth() -> usize {
    accord::gpu::group_depth()
}
