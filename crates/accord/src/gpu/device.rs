//! Device memory as the GPU layer sees it: [`DeviceSlice`] (raw address, count, type), Rust-owned
//! [`DeviceBuffer`]s, which [`Stream`] an operation runs on, and the pooled CUDA events that mark
//! each operation's end on its stream.

use super::cuda::{self, CuContext, CuEvent, CuStream, Driver};
use super::GpuCommunicator;
use crate::dtype::{DataType, Element};
use crate::error::{Error, Result};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A span of device memory: address, element count and element type.
///
/// Construct from raw parts with [`DeviceSlice::from_raw`] (bindings) or from a
/// [`DeviceBuffer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSlice {
    ptr: u64,
    count: usize,
    dtype: DataType,
}

impl DeviceSlice {
    /// A slice of `count` elements of `dtype` at device address `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` must be a device (or managed) address valid for `count * dtype.size()` bytes on the
    /// communicator's device until every operation using it has completed on its stream.
    pub unsafe fn from_raw(ptr: u64, count: usize, dtype: DataType) -> Self {
        DeviceSlice { ptr, count, dtype }
    }

    /// An empty slice (for ranks that receive nothing, e.g. non-roots of a gather).
    pub fn empty(dtype: DataType) -> Self {
        DeviceSlice {
            ptr: 0,
            count: 0,
            dtype,
        }
    }

    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Number of elements.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }

    /// Elements `start .. start + count` of this slice.
    pub fn sub(&self, start: usize, count: usize) -> Result<DeviceSlice> {
        if start.checked_add(count).is_none_or(|end| end > self.count) {
            return Err(Error::invalid(format!(
                "elements {start}..{} are outside a device buffer of {}",
                start.saturating_add(count),
                self.count
            )));
        }
        Ok(DeviceSlice {
            ptr: self.ptr + (start * self.dtype.size()) as u64,
            count,
            dtype: self.dtype,
        })
    }

    pub(crate) fn as_ptr(&self) -> *const c_void {
        self.ptr as *const c_void
    }

    pub(crate) fn as_mut_ptr(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }
}

/// Which CUDA stream an operation is enqueued on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The communicator's own non-blocking stream.
    Comm,
    /// A caller's `CUstream` / `cudaStream_t`, as an integer (0 is the legacy default stream).
    Raw(usize),
}

/// A CUDA event taken from its communicator's pool, returned there when dropped.
pub(crate) struct Event {
    pub(crate) handle: usize,
    pool: Arc<EventPool>,
    /// Recorded behind its operation. Inside [`super::group()`] that happens only when the group
    /// ends, and CUDA reports an event never recorded (or last recorded for an earlier
    /// operation) as complete.
    pub(crate) armed: AtomicBool,
    /// Seen complete while the communicator was not aborted: the result is the operation's,
    /// not what an abort left behind.
    pub(crate) finished: AtomicBool,
}

impl Event {
    pub(crate) fn record(&self, stream: CuStream) {
        // SAFETY: a live event and a stream of the same context.
        unsafe { (self.pool.cu.event_record)(self.handle as CuEvent, stream) };
        self.armed.store(true, Ordering::Release);
    }

    /// Whether the GPU has passed the event. After an abort this says nothing about the
    /// operation's result (aborted kernels return early): see `DeviceComm::settled`.
    pub(crate) fn done(&self) -> Result<bool> {
        if !self.armed.load(Ordering::Acquire) {
            return Ok(false);
        }
        self.pool.cu.event_done(self.handle as CuEvent)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(mut free) = self.pool.free.lock() {
            free.push(self.handle);
        }
    }
}

pub(crate) struct EventPool {
    cu: &'static Driver,
    free: Mutex<Vec<usize>>,
}

impl EventPool {
    pub(crate) fn new(cu: &'static Driver) -> Arc<Self> {
        Arc::new(EventPool {
            cu,
            free: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn take(self: &Arc<Self>) -> Result<Event> {
        let h = self.free.lock().ok().and_then(|mut f| f.pop());
        let handle = match h {
            Some(h) => h,
            None => self.cu.new_event(cuda::CU_EVENT_DISABLE_TIMING)? as usize,
        };
        Ok(Event {
            handle,
            pool: self.clone(),
            armed: AtomicBool::new(false),
            finished: AtomicBool::new(false),
        })
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        for h in self.free.get_mut().map(std::mem::take).unwrap_or_default() {
            // SAFETY: every pooled event is live and unused.
            unsafe { (self.cu.event_destroy)(h as CuEvent) };
        }
    }
}

/// Device memory owned by Rust, for tests, benchmarks and callers without an array library.
pub struct DeviceBuffer<T: Element> {
    ptr: u64,
    len: usize,
    ctx: usize,
    _t: std::marker::PhantomData<T>,
}

// SAFETY: a device allocation is not tied to a host thread.
unsafe impl<T: Element> Send for DeviceBuffer<T> {}
// SAFETY: as above; mutation goes through the GPU.
unsafe impl<T: Element> Sync for DeviceBuffer<T> {}

impl<T: Element> DeviceBuffer<T> {
    /// `len` uninitialised elements on `comm`'s device (plain `cuMemAlloc`).
    pub(crate) fn alloc(comm: &GpuCommunicator, len: usize) -> Result<Self> {
        let (cu, ctx) = comm.context();
        cu.make_current(ctx as CuContext)?;
        let mut ptr = 0u64;
        if len > 0 {
            // SAFETY: out-pointer to a local.
            cu.check(
                unsafe { (cu.mem_alloc)(&mut ptr, len * T::DTYPE.size()) },
                "cuMemAlloc",
            )?;
        }
        Ok(DeviceBuffer {
            ptr,
            len,
            ctx,
            _t: std::marker::PhantomData,
        })
    }

    /// A copy of `data` on `comm`'s device.
    pub(crate) fn from_host(comm: &GpuCommunicator, data: &[T]) -> Result<Self> {
        let b = Self::alloc(comm, data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }

    /// Overwrite the start of the buffer with `data`; returns once the data is on the device.
    pub fn copy_from_host(&self, data: &[T]) -> Result<()> {
        let cu = cuda::driver()?;
        if data.len() > self.len {
            return Err(Error::invalid("host data longer than the device buffer"));
        }
        if data.is_empty() {
            return Ok(());
        }
        cu.make_current(self.ctx as CuContext)?;
        let bytes = crate::dtype::as_bytes(data);
        // SAFETY: both ranges hold `bytes.len()` bytes.
        cu.check(
            unsafe { (cu.memcpy_htod)(self.ptr, bytes.as_ptr().cast(), bytes.len()) },
            "cuMemcpyHtoD",
        )?;
        // From pageable memory the copy returns once the data is staged, and the DMA finishes
        // later on the legacy default stream, which non-blocking streams (ours, PyTorch's) do
        // not wait for: a collective could read the old contents. Wait for it here.
        // SAFETY: null is the legacy default stream of the current context.
        cu.check(
            unsafe { (cu.stream_synchronize)(std::ptr::null_mut()) },
            "cuStreamSynchronize",
        )
    }

    /// The whole buffer copied to the host (synchronous; waits for the legacy default stream,
    /// so wait for your operations first).
    pub fn to_host(&self) -> Result<Vec<T>> {
        let cu = cuda::driver()?;
        let mut out = vec![T::zeroed(); self.len];
        if self.len == 0 {
            return Ok(out);
        }
        cu.make_current(self.ctx as CuContext)?;
        let bytes = crate::dtype::as_bytes_mut(&mut out);
        // SAFETY: both ranges hold `bytes.len()` bytes.
        cu.check(
            unsafe { (cu.memcpy_dtoh)(bytes.as_mut_ptr().cast(), self.ptr, bytes.len()) },
            "cuMemcpyDtoH",
        )?;
        Ok(out)
    }

    /// The buffer as an untyped slice for communicator calls.
    pub fn slice(&self) -> DeviceSlice {
        DeviceSlice {
            ptr: self.ptr,
            count: self.len,
            dtype: T::DTYPE,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr != 0 {
            if let Ok(cu) = cuda::driver() {
                let _ = cu.make_current(self.ctx as CuContext);
                // SAFETY: our own allocation, freed once.
                unsafe { (cu.mem_free)(self.ptr) };
            }
        }
    }
}
