//! The optional table: virtual memory management (`cuMem*`) and IPC (`cuIpc*`), for engines
//! that map one process's device memory into another's. A driver without these calls still runs
//! everything else; [`super::Driver::vmm`] says which are missing.

use super::{CuDevicePtr, CuResult};
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

/// `CUipcMemHandle`: 64 opaque bytes naming an allocation to another process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CuIpcMemHandle {
    /// The bytes.
    pub reserved: [u8; 64],
}

super::symbol_table! {
    /// Function pointers for virtual memory management and IPC.
    Vmm {
        mem_create: "cuMemCreate" => fn(*mut u64, usize, *const c_void, c_ulonglong) -> CuResult;
        mem_release: "cuMemRelease" => fn(u64) -> CuResult;
        mem_export: "cuMemExportToShareableHandle" => fn(*mut c_void, u64, c_int, c_ulonglong) -> CuResult;
        mem_import: "cuMemImportFromShareableHandle" => fn(*mut u64, *mut c_void, c_int) -> CuResult;
        mem_address_reserve: "cuMemAddressReserve" => fn(*mut CuDevicePtr, usize, usize, CuDevicePtr, c_ulonglong) -> CuResult;
        mem_address_free: "cuMemAddressFree" => fn(CuDevicePtr, usize) -> CuResult;
        mem_map: "cuMemMap" => fn(CuDevicePtr, usize, usize, u64, c_ulonglong) -> CuResult;
        mem_unmap: "cuMemUnmap" => fn(CuDevicePtr, usize) -> CuResult;
        mem_set_access: "cuMemSetAccess" => fn(CuDevicePtr, usize, *const c_void, usize) -> CuResult;
        mem_granularity: "cuMemGetAllocationGranularity" => fn(*mut usize, *const c_void, c_int) -> CuResult;
        ipc_get_mem_handle: "cuIpcGetMemHandle" => fn(*mut CuIpcMemHandle, CuDevicePtr) -> CuResult;
        ipc_open_mem_handle: "cuIpcOpenMemHandle_v2" => fn(*mut CuDevicePtr, CuIpcMemHandle, c_uint) -> CuResult;
        ipc_close_mem_handle: "cuIpcCloseMemHandle" => fn(CuDevicePtr) -> CuResult;
        device_get_attribute: "cuDeviceGetAttribute" => fn(*mut c_int, c_int, c_int) -> CuResult;
    }
}
