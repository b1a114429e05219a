//! Raw pointers into Accord's buffers: where the memory lives, and host bytes or device slices.
//!
//! A pointer is device memory when CUDA says so; a process that has not loaded the CUDA driver
//! cannot hold any, so host-only programs never load it (and pay tens of nanoseconds a call to
//! learn that it is still not loaded). The first non-null buffer of a call
//! decides where the call runs; every other non-null buffer must live there too.

use crate::status::invalid;
use accord::gpu::{DeviceSlice, Stream};
use accord::{Communicator, DataType, RecvBuf, Result, SendBuf};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Where a call's buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Host,
    /// Device memory of this CUDA ordinal, enqueued on the caller's stream.
    Device(usize, Stream),
}

/// Whether the CUDA driver is loaded in this process (once it is, it stays). The loader's count
/// of objects ever loaded is read on every call (tens of nanoseconds); the list of loaded
/// objects is searched only when that count changed.
pub(crate) fn cuda_loaded() -> bool {
    static LOADED: AtomicBool = AtomicBool::new(false);
    static SEEN: AtomicU64 = AtomicU64::new(u64::MAX);
    if LOADED.load(Ordering::Relaxed) {
        return true;
    }
    let adds = loaded_objects(false).0;
    if adds == SEEN.load(Ordering::Relaxed) {
        return false;
    }
    let (adds, found) = loaded_objects(true);
    // Only ever set: a thread whose search predates the load must not undo another's find.
    if found {
        LOADED.store(true, Ordering::Relaxed);
    }
    SEEN.store(adds, Ordering::Relaxed);
    found
}

/// The loader's count of objects loaded so far and, when `search`, whether one of them is the
/// CUDA driver (`libcuda.so`).
fn loaded_objects(search: bool) -> (u64, bool) {
    struct Scan {
        search: bool,
        adds: u64,
        found: bool,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut std::ffi::c_void,
    ) -> std::ffi::c_int {
        // SAFETY: the loader passes a valid entry; `data` is the `Scan` below.
        let (info, scan) = unsafe { (&*info, &mut *data.cast::<Scan>()) };
        scan.adds = info.dlpi_adds;
        if !scan.search {
            return 1; // the count is on every entry: stop at the first
        }
        if !info.dlpi_name.is_null() {
            // SAFETY: a NUL-terminated path owned by the loader.
            let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
            scan.found |= name.windows(10).any(|w| w == b"libcuda.so");
        }
        scan.found as std::ffi::c_int
    }
    let mut scan = Scan {
        search,
        adds: 0,
        found: false,
    };
    // SAFETY: `visit` only reads the entries and writes `scan`.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut scan as *mut Scan).cast()) };
    (scan.adds, scan.found)
}

/// The CUDA device that owns `ptr`, or `None` for host memory (the driver is loaded).
fn device_of(ptr: *const c_void) -> Option<usize> {
    accord::gpu::cuda::driver().ok()?.device_of(ptr as u64)
}

/// Where the call with these buffers (named for errors) runs; attaches the device to `comm`
/// the first time device memory is used (a collective step, as every rank's first device call
/// is the same call).
pub(crate) fn place(
    comm: &Communicator,
    bufs: &[(&str, *const c_void)],
    stream: *mut c_void,
) -> Result<Place> {
    if !cuda_loaded() {
        return Ok(Place::Host);
    }
    let mut first: Option<(&str, Option<usize>)> = None;
    for &(what, ptr) in bufs.iter().filter(|(_, p)| !p.is_null()) {
        let here = device_of(ptr);
        match first {
            None => first = Some((what, here)),
            Some((w0, d0)) if d0 != here => {
                let at = |d: Option<usize>| match d {
                    Some(d) => format!("device memory (GPU {d})"),
                    None => "host memory".to_string(),
                };
                return Err(invalid(format!(
                    "`{w0}` is in {} but `{what}` is in {}; pass every buffer of one call in \
                     the same memory",
                    at(d0),
                    at(here)
                )));
            }
            Some(_) => {}
        }
    }
    match first.and_then(|f| f.1) {
        None => Ok(Place::Host),
        Some(d) => {
            if comm.attached_device() != Some(d) {
                comm.attach_device(d)?;
            }
            Ok(Place::Device(d, Stream::Raw(stream as usize)))
        }
    }
}

/// Bytes of `count` elements of `dtype`, or an error naming the buffer.
fn bytes(count: usize, dtype: DataType, what: &str) -> Result<usize> {
    count
        .checked_mul(dtype.size())
        .ok_or_else(|| invalid(format!("`{what}`: {count} elements of {dtype} overflow")))
}

fn non_null(ptr: *const c_void, count: usize, what: &str) -> Result<()> {
    match ptr.is_null() && count > 0 {
        true => Err(invalid(format!(
            "`{what}` is NULL but its count is {count}"
        ))),
        false => Ok(()),
    }
}

impl Place {
    /// `count` elements at `ptr`, read by the call.
    ///
    /// # Safety
    /// `ptr` holds `count` elements of `dtype` for the call (host: until it returns; device:
    /// until the stream passes it).
    pub(crate) unsafe fn send<'a>(
        self,
        ptr: *const c_void,
        count: usize,
        dtype: DataType,
        what: &str,
    ) -> Result<SendBuf<'a>> {
        non_null(ptr, count, what)?;
        let n = bytes(count, dtype, what)?;
        Ok(match self {
            _ if n == 0 && self == Place::Host => SendBuf::bytes(&[], dtype),
            Place::Host => SendBuf::bytes(std::slice::from_raw_parts(ptr.cast(), n), dtype),
            Place::Device(_, s) if n == 0 => SendBuf::device(DeviceSlice::empty(dtype), s),
            Place::Device(_, s) => {
                SendBuf::device(DeviceSlice::from_raw(ptr as u64, count, dtype), s)
            }
        })
    }

    /// `count` elements at `ptr`, written by the call.
    ///
    /// # Safety
    /// As [`Place::send`], and nothing else reads or writes them meanwhile.
    pub(crate) unsafe fn recv<'a>(
        self,
        ptr: *mut c_void,
        count: usize,
        dtype: DataType,
        what: &str,
    ) -> Result<RecvBuf<'a>> {
        non_null(ptr, count, what)?;
        let n = bytes(count, dtype, what)?;
        Ok(match self {
            _ if n == 0 && self == Place::Host => RecvBuf::bytes(&mut [], dtype),
            Place::Host => RecvBuf::bytes(std::slice::from_raw_parts_mut(ptr.cast(), n), dtype),
            Place::Device(_, s) if n == 0 => RecvBuf::device(DeviceSlice::empty(dtype), s),
            Place::Device(_, s) => {
                RecvBuf::device(DeviceSlice::from_raw(ptr as u64, count, dtype), s)
            }
        })
    }
}

impl Place {
    /// Run `f` on a call's send and receive buffers, the send side copied first where it
    /// overlaps the receive side ([`overlapping_copy`]): no `&mut` to the receive memory exists
    /// while the caller's send memory is still read through a shared slice.
    ///
    /// # Safety
    /// As [`Place::send`] and [`Place::recv`].
    pub(crate) unsafe fn pair<R>(
        self,
        send: (*const c_void, usize),
        recv: (*mut c_void, usize),
        dtype: DataType,
        f: impl for<'b> FnOnce(SendBuf<'b>, RecvBuf<'b>) -> Result<R>,
    ) -> Result<R> {
        let copy = overlapping_copy(self, send, (recv.0, recv.1), dtype)?;
        let from = copy.as_ref().map_or(send.0, |c| c.as_ptr().cast());
        let send = self.send(from, send.1, dtype, "sendbuf")?;
        f(send, self.recv(recv.0, recv.1, dtype, "recvbuf")?)
    }
}

/// A host send buffer that overlaps the receive buffer (MPI's in-place layouts, e.g. an
/// allgather whose input is its own block of the output): a copy of it, so the call never reads
/// memory it writes. `None` when they do not overlap (or the call is on the device, where
/// the engines handle such layouts themselves). Call it before making the receive buffer.
fn overlapping_copy(
    place: Place,
    send: (*const c_void, usize),
    recv: (*const c_void, usize),
    dtype: DataType,
) -> Result<Option<Vec<u128>>> {
    let sn = bytes(send.1, dtype, "sendbuf")?;
    let rn = bytes(recv.1, dtype, "recvbuf")?;
    let (s, r) = (send.0 as usize, recv.0 as usize);
    let apart = s.checked_add(sn).is_some_and(|end| end <= r)
        || r.checked_add(rn).is_some_and(|end| end <= s);
    if place != Place::Host || sn == 0 || rn == 0 || send.0.is_null() || apart {
        return Ok(None);
    }
    let mut copy = vec![0u128; sn.div_ceil(16)];
    // SAFETY: the caller's `send` holds `sn` bytes; the copy is at least that long.
    unsafe { std::ptr::copy_nonoverlapping(send.0.cast::<u8>(), copy.as_mut_ptr().cast(), sn) };
    Ok(Some(copy))
}
