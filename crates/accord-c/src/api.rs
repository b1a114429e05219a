//! The function table every handle carries (see [`crate::handle`]): the C++ wrapper calls
//! through it, so it works with a handle of any copy of Accord of the same ABI version.

use crate::collectives::*;
use crate::handle::accord_comm_t;
use crate::lifetime::*;
use crate::p2p::*;
use crate::status::accord_status_t;
use crate::types::{accord_dtype_t, accord_op_t, accord_stream_t};
use std::ffi::{c_char, c_double, c_int, c_void};

/// The version of `accord_api_t` and of the handle's layout; a table of another version is
/// never called.
pub const ACCORD_ABI_VERSION: u32 = 1;

/// The functions of one copy of Accord, with the same signatures as the exported ones.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct accord_api_t {
    /// `ACCORD_ABI_VERSION` of the library that made the table.
    pub abi_version: u32,
    /// `sizeof(accord_api_t)` there.
    pub size: u32,
    /// `accord_finalize`.
    pub finalize: unsafe extern "C" fn(*mut accord_comm_t) -> accord_status_t,
    /// `accord_comm_rank`.
    pub comm_rank: unsafe extern "C" fn(*const accord_comm_t) -> c_int,
    /// `accord_comm_size`.
    pub comm_size: unsafe extern "C" fn(*const accord_comm_t) -> c_int,
    /// `accord_comm_split`.
    pub comm_split: unsafe extern "C" fn(
        *mut accord_comm_t,
        c_int,
        c_int,
        *mut *mut accord_comm_t,
    ) -> accord_status_t,
    /// `accord_comm_set_timeout`.
    pub comm_set_timeout: unsafe extern "C" fn(*mut accord_comm_t, c_double) -> accord_status_t,
    /// `accord_barrier`.
    pub barrier: unsafe extern "C" fn(*mut accord_comm_t) -> accord_status_t,
    /// `accord_abort`.
    pub abort: unsafe extern "C" fn(*mut accord_comm_t, *const c_char) -> accord_status_t,
    /// `accord_attach_device`.
    pub attach_device: unsafe extern "C" fn(*mut accord_comm_t, c_int) -> accord_status_t,
    /// `accord_stream_sync`.
    pub stream_sync: unsafe extern "C" fn(*mut accord_comm_t, accord_stream_t) -> accord_status_t,
    /// `accord_comm_check`.
    pub comm_check: unsafe extern "C" fn(*const accord_comm_t) -> accord_status_t,
    /// `accord_last_error`.
    pub last_error: extern "C" fn() -> *const c_char,
    /// `accord_status_name`.
    pub status_name: extern "C" fn(accord_status_t) -> *const c_char,
    /// `accord_allreduce`.
    pub allreduce: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        *mut c_void,
        usize,
        accord_dtype_t,
        accord_op_t,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_scan`.
    pub scan: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        *mut c_void,
        usize,
        accord_dtype_t,
        accord_op_t,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_exscan`.
    pub exscan: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        *mut c_void,
        usize,
        accord_dtype_t,
        accord_op_t,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_broadcast`.
    pub broadcast: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        *mut c_void,
        usize,
        accord_dtype_t,
        c_int,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_reduce`.
    pub reduce: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        *mut c_void,
        usize,
        accord_dtype_t,
        accord_op_t,
        c_int,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_allgather`.
    pub allgather: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        *mut c_void,
        usize,
        accord_dtype_t,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_allgatherv`.
    pub allgatherv: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        usize,
        *mut c_void,
        *const usize,
        *const usize,
        accord_dtype_t,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_gather`.
    pub gather: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        *mut c_void,
        usize,
        accord_dtype_t,
        c_int,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_gatherv`.
    pub gatherv: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        usize,
        *mut c_void,
        *const usize,
        *const usize,
        accord_dtype_t,
        c_int,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_scatter`.
    pub scatter: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        *mut c_void,
        usize,
        accord_dtype_t,
        c_int,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_scatterv`.
    pub scatterv: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        *const usize,
        *const usize,
        *mut c_void,
        usize,
        accord_dtype_t,
        c_int,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_reduce_scatter`.
    pub reduce_scatter: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        *mut c_void,
        usize,
        accord_dtype_t,
        accord_op_t,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_reduce_scatterv`.
    pub reduce_scatterv: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        *mut c_void,
        *const usize,
        accord_dtype_t,
        accord_op_t,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_alltoall`.
    pub alltoall: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        *mut c_void,
        usize,
        accord_dtype_t,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_alltoallv`.
    pub alltoallv: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        *const usize,
        *const usize,
        *mut c_void,
        *const usize,
        *const usize,
        accord_dtype_t,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_send`.
    pub send: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        usize,
        accord_dtype_t,
        c_int,
        c_int,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_recv`.
    pub recv: unsafe extern "C" fn(
        *mut accord_comm_t,
        *mut c_void,
        usize,
        accord_dtype_t,
        c_int,
        c_int,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_isend`.
    pub isend: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        usize,
        accord_dtype_t,
        c_int,
        c_int,
        accord_stream_t,
        *mut *mut accord_request_t,
    ) -> accord_status_t,
    /// `accord_irecv`.
    pub irecv: unsafe extern "C" fn(
        *mut accord_comm_t,
        *mut c_void,
        usize,
        accord_dtype_t,
        c_int,
        c_int,
        accord_stream_t,
        *mut *mut accord_request_t,
    ) -> accord_status_t,
    /// `accord_sendrecv`.
    pub sendrecv: unsafe extern "C" fn(
        *mut accord_comm_t,
        *const c_void,
        usize,
        c_int,
        *mut c_void,
        usize,
        c_int,
        accord_dtype_t,
        c_int,
        accord_stream_t,
    ) -> accord_status_t,
    /// `accord_wait`.
    pub wait: unsafe extern "C" fn(*mut accord_request_t) -> accord_status_t,
    /// `accord_test`.
    pub test: unsafe extern "C" fn(*mut accord_request_t, *mut c_int) -> accord_status_t,
    /// `accord_waitall`.
    pub waitall: unsafe extern "C" fn(usize, *mut *mut accord_request_t) -> accord_status_t,
    /// `accord_group_start`.
    pub group_start: extern "C" fn() -> accord_status_t,
    /// `accord_group_end`.
    pub group_end: extern "C" fn() -> accord_status_t,
}

/// This library's table.
pub static API: accord_api_t = accord_api_t {
    abi_version: ACCORD_ABI_VERSION,
    size: std::mem::size_of::<accord_api_t>() as u32,
    finalize: accord_finalize,
    comm_rank: accord_comm_rank,
    comm_size: accord_comm_size,
    comm_split: accord_comm_split,
    comm_set_timeout: accord_comm_set_timeout,
    barrier: accord_barrier,
    abort: accord_abort,
    attach_device: accord_attach_device,
    stream_sync: accord_stream_sync,
    comm_check: accord_comm_check,
    last_error: accord_last_error,
    status_name: accord_status_name,
    allreduce: accord_allreduce,
    scan: accord_scan,
    exscan: accord_exscan,
    broadcast: accord_broadcast,
    reduce: accord_reduce,
    allgather: accord_allgather,
    allgatherv: accord_allgatherv,
    gather: accord_gather,
    gatherv: accord_gatherv,
    scatter: accord_scatter,
    scatterv: accord_scatterv,
    reduce_scatter: accord_reduce_scatter,
    reduce_scatterv: accord_reduce_scatterv,
    alltoall: accord_alltoall,
    alltoallv: accord_alltoallv,
    send: accord_send,
    recv: accord_recv,
    isend: accord_isend,
    irecv: accord_irecv,
    sendrecv: accord_sendrecv,
    wait: accord_wait,
    test: accord_test,
    waitall: accord_waitall,
    group_start: accord_group_start,
    group_end: accord_group_end,
};
