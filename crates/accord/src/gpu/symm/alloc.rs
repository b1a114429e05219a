//! Device memory another process of the host can map: the driver's virtual memory management
//! (`cuMemCreate` with a POSIX file-descriptor handle, exported, imported, mapped), or CUDA IPC
//! handles (`cuIpcGetMemHandle` on a `cuMemAlloc` allocation) where VMM is unavailable.
//!
//! A VMM allocation lives until every process that mapped it has unmapped it: each mapping holds
//! it, so the handle is released right after mapping and an unmap is all a rank undoes. An IPC
//! allocation belongs to its exporter: peers close their mappings before it frees it.

use crate::error::{Error, Result};
use crate::gpu::cuda::{CuDevicePtr, CuIpcMemHandle, Driver, Vmm};
use std::ffi::{c_int, c_void};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};

const ALLOCATION_PINNED: c_int = 1;
const HANDLE_POSIX_FD: c_int = 1;
const LOCATION_DEVICE: c_int = 1;
const ACCESS_READ_WRITE: c_int = 3;
const GRANULARITY_RECOMMENDED: c_int = 1;
const ATTR_VMM_SUPPORTED: c_int = 102;
const ATTR_POSIX_FD_SUPPORTED: c_int = 103;
const IPC_LAZY_ENABLE_PEER_ACCESS: u32 = 1;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
struct MemLocation {
    kind: c_int,
    id: c_int,
}

/// `CUmemAllocationProp` (CUDA 11-13).
#[repr(C)]
struct AllocationProp {
    kind: c_int,
    handle_types: c_int,
    location: MemLocation,
    win32_metadata: *mut c_void,
    compression: u8,
    gpu_direct_rdma: u8,
    usage: u16,
    reserved: [u8; 4],
}

/// `CUmemAccessDesc`.
#[repr(C)]
struct AccessDesc {
    location: MemLocation,
    flags: c_int,
}

impl AllocationProp {
    fn on(ordinal: usize) -> Self {
        AllocationProp {
            kind: ALLOCATION_PINNED,
            handle_types: HANDLE_POSIX_FD,
            location: MemLocation {
                kind: LOCATION_DEVICE,
                id: ordinal as c_int,
            },
            win32_metadata: std::ptr::null_mut(),
            compression: 0,
            gpu_direct_rdma: 0,
            usage: 0,
            reserved: [0; 4],
        }
    }
}

/// How buffers are shared with the other ranks of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// VMM allocations exported as file descriptors.
    Vmm,
    /// CUDA IPC handles.
    Ipc,
}

/// Whether device `ordinal` can share VMM allocations as file descriptors; why not otherwise.
pub(crate) fn vmm_unsupported(cu: &Driver, ordinal: usize) -> Option<String> {
    let vmm = match cu.vmm() {
        Ok(v) => v,
        Err(e) => return Some(e.to_string()),
    };
    for (attr, what) in [
        (ATTR_VMM_SUPPORTED, "virtual memory management"),
        (ATTR_POSIX_FD_SUPPORTED, "POSIX file-descriptor handles"),
    ] {
        let mut v: c_int = 0;
        // SAFETY: out-pointer to a local; the ordinal was checked by the caller's context.
        let rc = unsafe { (vmm.device_get_attribute)(&mut v, attr, ordinal as c_int) };
        if rc != 0 || v == 0 {
            return Some(format!("GPU {ordinal} does not support {what}"));
        }
    }
    None
}

/// `bytes` rounded up to the device's recommended allocation granularity.
pub(crate) fn rounded(cu: &Driver, ordinal: usize, bytes: usize) -> Result<usize> {
    let vmm = cu.vmm()?;
    let prop = AllocationProp::on(ordinal);
    let mut g = 0usize;
    // SAFETY: out-pointer to a local, a valid property struct.
    let rc = unsafe {
        (vmm.mem_granularity)(
            &mut g,
            &prop as *const _ as *const c_void,
            GRANULARITY_RECOMMENDED,
        )
    };
    cu.check(rc, "cuMemGetAllocationGranularity")?;
    let g = g.max(1);
    Ok(bytes.max(1).div_ceil(g) * g)
}

/// A VMM allocation of `size` bytes (a multiple of the granularity) on `ordinal`, mapped here,
/// and the descriptor that lets peers map it.
pub(crate) fn create(cu: &Driver, ordinal: usize, size: usize) -> Result<(CuDevicePtr, OwnedFd)> {
    let vmm = cu.vmm()?;
    let prop = AllocationProp::on(ordinal);
    let mut handle = 0u64;
    // SAFETY: out-pointer to a local; a valid property struct; flags must be 0.
    let rc = unsafe { (vmm.mem_create)(&mut handle, size, &prop as *const _ as *const c_void, 0) };
    cu.check(rc, "cuMemCreate")?;
    let exported = export(cu, vmm, handle);
    let mapped = exported.and_then(|fd| Ok((map(cu, vmm, ordinal, handle, size)?, fd)));
    // The mapping holds the memory from here on.
    // SAFETY: a handle from cuMemCreate, released once.
    unsafe { (vmm.mem_release)(handle) };
    mapped
}

fn export(cu: &Driver, vmm: &Vmm, handle: u64) -> Result<OwnedFd> {
    let mut fd: c_int = -1;
    // SAFETY: a POSIX-fd handle is written into an int; the handle is live.
    let rc = unsafe {
        (vmm.mem_export)(
            &mut fd as *mut c_int as *mut c_void,
            handle,
            HANDLE_POSIX_FD,
            0,
        )
    };
    cu.check(rc, "cuMemExportToShareableHandle")?;
    // SAFETY: the driver made a new descriptor for us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Map a peer's exported allocation of `size` bytes into this process, for device `ordinal`.
pub(crate) fn import(cu: &Driver, ordinal: usize, fd: OwnedFd, size: usize) -> Result<CuDevicePtr> {
    let vmm = cu.vmm()?;
    let raw = fd.into_raw_fd();
    let mut handle = 0u64;
    // SAFETY: a POSIX-fd handle is passed as the descriptor's value cast to a pointer.
    let rc = unsafe { (vmm.mem_import)(&mut handle, raw as isize as *mut c_void, HANDLE_POSIX_FD) };
    // SAFETY: the descriptor is ours; the driver keeps its own reference once imported.
    drop(unsafe { OwnedFd::from_raw_fd(raw) });
    cu.check(rc, "cuMemImportFromShareableHandle")?;
    let mapped = map(cu, vmm, ordinal, handle, size);
    // SAFETY: an imported handle, released once; the mapping holds the memory.
    unsafe { (vmm.mem_release)(handle) };
    mapped
}

fn map(cu: &Driver, vmm: &Vmm, ordinal: usize, handle: u64, size: usize) -> Result<CuDevicePtr> {
    let mut ptr: CuDevicePtr = 0;
    // SAFETY: out-pointer to a local; no fixed address or alignment asked.
    let rc = unsafe { (vmm.mem_address_reserve)(&mut ptr, size, 0, 0, 0) };
    cu.check(rc, "cuMemAddressReserve")?;
    let access = AccessDesc {
        location: MemLocation {
            kind: LOCATION_DEVICE,
            id: ordinal as c_int,
        },
        flags: ACCESS_READ_WRITE,
    };
    // SAFETY: the reserved range is ours and as large as the allocation.
    let done = unsafe { (vmm.mem_map)(ptr, size, 0, handle, 0) };
    let done = cu.check(done, "cuMemMap").and_then(|()| {
        // SAFETY: a mapped range and one access descriptor.
        let rc =
            unsafe { (vmm.mem_set_access)(ptr, size, &access as *const _ as *const c_void, 1) };
        cu.check(rc, "cuMemSetAccess").inspect_err(|_| {
            // SAFETY: mapped just above.
            unsafe { (vmm.mem_unmap)(ptr, size) };
        })
    });
    if let Err(e) = done {
        // SAFETY: reserved above, nothing mapped.
        unsafe { (vmm.mem_address_free)(ptr, size) };
        return Err(e);
    }
    Ok(ptr)
}

/// Undo [`create`] or [`import`]: unmap and give the address range back.
pub(crate) fn unmap(cu: &Driver, ptr: CuDevicePtr, size: usize) {
    if let Ok(vmm) = cu.vmm() {
        // SAFETY: a range this module mapped, undone once.
        unsafe {
            (vmm.mem_unmap)(ptr, size);
            (vmm.mem_address_free)(ptr, size);
        }
    }
}

/// A plain allocation and the IPC handle that names it to peers.
pub(crate) fn ipc_create(cu: &Driver, size: usize) -> Result<(CuDevicePtr, CuIpcMemHandle)> {
    let vmm = cu.vmm()?;
    let mut ptr = 0;
    // SAFETY: out-pointer to a local.
    cu.check(unsafe { (cu.mem_alloc)(&mut ptr, size) }, "cuMemAlloc")?;
    let mut h = CuIpcMemHandle { reserved: [0; 64] };
    // SAFETY: out-pointer to a local; a live allocation.
    let rc = unsafe { (vmm.ipc_get_mem_handle)(&mut h, ptr) };
    if let Err(e) = cu.check(rc, "cuIpcGetMemHandle") {
        // SAFETY: allocated above.
        unsafe { (cu.mem_free)(ptr) };
        return Err(e);
    }
    Ok((ptr, h))
}

/// Open a peer's IPC handle here.
pub(crate) fn ipc_open(cu: &Driver, h: CuIpcMemHandle) -> Result<CuDevicePtr> {
    let vmm = cu.vmm()?;
    let mut ptr = 0;
    // SAFETY: out-pointer to a local; a handle from a peer of this job.
    let rc = unsafe { (vmm.ipc_open_mem_handle)(&mut ptr, h, IPC_LAZY_ENABLE_PEER_ACCESS) };
    cu.check(rc, "cuIpcOpenMemHandle")?;
    Ok(ptr)
}

/// Close a peer's IPC mapping.
pub(crate) fn ipc_close(cu: &Driver, ptr: CuDevicePtr) {
    if let Ok(vmm) = cu.vmm() {
        // SAFETY: a mapping opened by ipc_open, closed once.
        unsafe { (vmm.ipc_close_mem_handle)(ptr) };
    }
}

/// Free this rank's own IPC-shared allocation.
pub(crate) fn ipc_free(cu: &Driver, ptr: CuDevicePtr) {
    // SAFETY: allocated by ipc_create, freed once.
    unsafe { (cu.mem_free)(ptr) };
}

/// Why a sharing mode failed, for messages.
pub(crate) fn unsupported(reason: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("unsupported: symmetric memory: {reason}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_structs_have_cuda_h_layouts() {
        // cuda.h (11-13): CUmemLocation 8 bytes; CUmemAllocationProp 32, its pointer at 16 and
        // allocFlags at 24; CUmemAccessDesc 12.
        assert_eq!(std::mem::size_of::<MemLocation>(), 8);
        assert_eq!(std::mem::size_of::<AllocationProp>(), 32);
        assert_eq!(std::mem::offset_of!(AllocationProp, win32_metadata), 16);
        assert_eq!(std::mem::offset_of!(AllocationProp, compression), 24);
        assert_eq!(std::mem::size_of::<AccessDesc>(), 12);
        assert_eq!(std::mem::offset_of!(AccessDesc, flags), 8);
    }
}
