//! The required table, the process's driver, and the helpers every GPU path uses.

use super::{CuContext, CuDevicePtr, CuEvent, CuResult, CuStream, Launch, Resolve, Strided, Vmm};
use crate::error::{Error, Result};
use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

const CUDA_ERROR_NOT_READY: CuResult = 600;
/// `CU_STREAM_NON_BLOCKING`: the stream does not synchronise with the legacy default stream.
const CU_STREAM_NON_BLOCKING: c_uint = 1;

super::symbol_table! {
    /// Function pointers into the CUDA driver that every GPU operation needs.
    Calls {
        init: "cuInit" => fn(c_uint) -> CuResult;
        device_get_count: "cuDeviceGetCount" => fn(*mut c_int) -> CuResult;
        device_get: "cuDeviceGet" => fn(*mut c_int, c_int) -> CuResult;
        primary_ctx_retain: "cuDevicePrimaryCtxRetain" => fn(*mut CuContext, c_int) -> CuResult;
        ctx_get_current: "cuCtxGetCurrent" => fn(*mut CuContext) -> CuResult;
        ctx_set_current: "cuCtxSetCurrent" => fn(CuContext) -> CuResult;
        stream_create: "cuStreamCreate" => fn(*mut CuStream, c_uint) -> CuResult;
        stream_destroy: "cuStreamDestroy_v2" => fn(CuStream) -> CuResult;
        stream_synchronize: "cuStreamSynchronize" => fn(CuStream) -> CuResult;
        stream_wait_event: "cuStreamWaitEvent" => fn(CuStream, CuEvent, c_uint) -> CuResult;
        event_create: "cuEventCreate" => fn(*mut CuEvent, c_uint) -> CuResult;
        event_destroy: "cuEventDestroy_v2" => fn(CuEvent) -> CuResult;
        event_record: "cuEventRecord" => fn(CuEvent, CuStream) -> CuResult;
        event_query: "cuEventQuery" => fn(CuEvent) -> CuResult;
        event_synchronize: "cuEventSynchronize" => fn(CuEvent) -> CuResult;
        event_elapsed: "cuEventElapsedTime" => fn(*mut f32, CuEvent, CuEvent) -> CuResult;
        mem_alloc: "cuMemAlloc_v2" => fn(*mut CuDevicePtr, usize) -> CuResult;
        mem_free: "cuMemFree_v2" => fn(CuDevicePtr) -> CuResult;
        memcpy_htod: "cuMemcpyHtoD_v2" => fn(CuDevicePtr, *const c_void, usize) -> CuResult;
        memcpy_dtoh: "cuMemcpyDtoH_v2" => fn(*mut c_void, CuDevicePtr, usize) -> CuResult;
        memcpy_dtod_async: "cuMemcpyDtoDAsync_v2" => fn(CuDevicePtr, CuDevicePtr, usize, CuStream) -> CuResult;
        memset_d8: "cuMemsetD8_v2" => fn(CuDevicePtr, u8, usize) -> CuResult;
        memset_d8_async: "cuMemsetD8Async" => fn(CuDevicePtr, u8, usize, CuStream) -> CuResult;
        memset_d16_async: "cuMemsetD16Async" => fn(CuDevicePtr, u16, usize, CuStream) -> CuResult;
        memset_d32_async: "cuMemsetD32Async" => fn(CuDevicePtr, u32, usize, CuStream) -> CuResult;
        memset_d2d32_async: "cuMemsetD2D32Async" => fn(CuDevicePtr, usize, u32, usize, usize, CuStream) -> CuResult;
        mem_alloc_async: "cuMemAllocAsync" => fn(*mut CuDevicePtr, usize, CuStream) -> CuResult;
        mem_free_async: "cuMemFreeAsync" => fn(CuDevicePtr, CuStream) -> CuResult;
        ctx_synchronize: "cuCtxSynchronize" => fn() -> CuResult;
        mem_get_info: "cuMemGetInfo_v2" => fn(*mut usize, *mut usize) -> CuResult;
        get_error_string: "cuGetErrorString" => fn(CuResult, *mut *const c_char) -> CuResult;
        pointer_get_attribute: "cuPointerGetAttribute" => fn(*mut c_void, c_int, CuDevicePtr) -> CuResult;
    }
}

/// The loaded CUDA driver: the required table (through `Deref`) and, where the driver has it,
/// the optional one.
pub struct Driver {
    calls: Calls,
    /// The optional table, or the names of the symbols it lacks.
    vmm: std::result::Result<Vmm, Vec<&'static str>>,
    /// The module and launch table, or the names of the symbols it lacks.
    launch: std::result::Result<Launch, Vec<&'static str>>,
    /// The strided-copy table, or the names of the symbols it lacks.
    strided: std::result::Result<Strided, Vec<&'static str>>,
    /// Keeps the symbols valid (`None` for tables resolved without a library, in tests).
    _lib: Option<Library>,
}

impl std::ops::Deref for Driver {
    type Target = Calls;
    fn deref(&self) -> &Calls {
        &self.calls
    }
}

impl Driver {
    /// Every table through `resolve`: a load failure only for a required symbol.
    pub(crate) fn from_resolver(
        lib: Option<Library>,
        resolve: Resolve<'_>,
    ) -> std::result::Result<Driver, String> {
        let calls = Calls::resolve(resolve)
            .map_err(|missing| format!("libcuda.so.1 lacks {}", missing.join(", ")))?;
        Ok(Driver {
            calls,
            vmm: Vmm::resolve(resolve),
            launch: Launch::resolve(resolve),
            strided: Strided::resolve(resolve),
            _lib: lib,
        })
    }

    fn load(lib: Library) -> std::result::Result<Driver, String> {
        let resolve = |name: &CStr| {
            // SAFETY: only the symbol's address is read; `from_resolver` gives it its type.
            unsafe { lib.get::<*mut c_void>(name.to_bytes_with_nul()) }
                .ok()
                .map(|s| *s)
        };
        let tables = Self::from_resolver(None, &resolve)?;
        Ok(Driver {
            _lib: Some(lib),
            ..tables
        })
    }

    /// The module loading and kernel launch calls, or [`Error::Unsupported`] naming the ones
    /// this driver lacks.
    pub fn launch(&self) -> Result<&Launch> {
        self.launch.as_ref().map_err(|missing| {
            Error::Unsupported(format!(
                "this CUDA driver lacks {}, which launching Accord's kernels needs",
                missing.join(", ")
            ))
        })
    }

    /// The compute capability `(major, minor)` of device `ordinal`.
    pub fn compute_capability(&self, ordinal: usize) -> Result<(i32, i32)> {
        let launch = self.launch()?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: out-pointers to locals; attributes 75/76 are the capability's major/minor.
        unsafe {
            self.check(
                (launch.device_get_attribute)(&mut major, 75, ordinal as c_int),
                "cuDeviceGetAttribute",
            )?;
            self.check(
                (launch.device_get_attribute)(&mut minor, 76, ordinal as c_int),
                "cuDeviceGetAttribute",
            )?;
        }
        Ok((major, minor))
    }

    /// The strided (3-D) copy call, or [`Error::Unsupported`] naming what this driver lacks.
    pub fn strided(&self) -> Result<&Strided> {
        self.strided.as_ref().map_err(|missing| {
            Error::Unsupported(format!(
                "this CUDA driver lacks {}, which strided device copies need",
                missing.join(", ")
            ))
        })
    }

    /// The virtual memory management and IPC calls, or [`Error::Unsupported`] naming the ones
    /// this driver lacks.
    pub fn vmm(&self) -> Result<&Vmm> {
        self.vmm.as_ref().map_err(|missing| {
            Error::Unsupported(format!(
                "this CUDA driver lacks {}, which virtual memory management and IPC need \
                 (a newer driver has them)",
                missing.join(", ")
            ))
        })
    }
}

static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();

/// The loaded driver, initialised (`cuInit`) once per process.
pub fn driver() -> Result<&'static Driver> {
    DRIVER
        .get_or_init(|| {
            let name =
                std::env::var("ACCORD_CUDA_LIBRARY").unwrap_or_else(|_| "libcuda.so.1".into());
            // SAFETY: opening the CUDA driver runs its initialisers, which have no preconditions.
            let lib = unsafe { Library::new(&name) }.map_err(|e| {
                format!("{name} not found (no NVIDIA driver on this machine?): {e}")
            })?;
            let d = Driver::load(lib)?;
            // SAFETY: cuInit takes flags that must be 0.
            let rc = unsafe { (d.init)(0) };
            if rc != 0 {
                return Err(format!("cuInit failed: {}", d.describe(rc)));
            }
            Ok(d)
        })
        .as_ref()
        .map_err(|e| Error::Unsupported(format!("CUDA is unavailable: {e}")))
}

impl Driver {
    /// The driver's name for a result code, e.g. `out of memory (CUDA error 2)`.
    pub fn describe(&self, rc: CuResult) -> String {
        format!("{} (CUDA error {rc})", self.text(rc))
    }

    /// The driver's own words for a result code, e.g. `out of memory`.
    pub fn text(&self, rc: CuResult) -> String {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a pointer to a static string or leaves it null.
        unsafe { (self.get_error_string)(rc, &mut s) };
        if s.is_null() {
            format!("CUDA error {rc}")
        } else {
            // SAFETY: non-null strings from the driver are static and NUL-terminated.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        }
    }

    /// [`Error::Gpu`] for a failed call `what`.
    pub fn error(&self, rc: CuResult, what: &str) -> Error {
        Error::Gpu {
            library: "cuda",
            call: what.to_string(),
            code: rc,
            text: self.text(rc),
            rank: None,
        }
    }

    /// `Ok` for success, else [`Error::Gpu`] naming `what`.
    pub fn check(&self, rc: CuResult, what: &str) -> Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            Err(self.error(rc, what))
        }
    }

    /// Number of visible devices.
    pub fn device_count(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: writes one int.
        self.check(
            unsafe { (self.device_get_count)(&mut n) },
            "cuDeviceGetCount",
        )?;
        Ok(n as usize)
    }

    /// The primary context of `ordinal` (shared with the CUDA runtime, PyTorch, CuPy...).
    pub fn primary_context(&self, ordinal: usize) -> Result<CuContext> {
        let count = self.device_count()?;
        if ordinal >= count {
            return Err(Error::invalid(format!(
                "CUDA device {ordinal} does not exist: this process sees {count} device(s) \
                 (check CUDA_VISIBLE_DEVICES)"
            )));
        }
        let mut dev = 0;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: out-pointers to locals; the ordinal was range-checked.
        unsafe {
            self.check((self.device_get)(&mut dev, ordinal as c_int), "cuDeviceGet")?;
            self.check(
                (self.primary_ctx_retain)(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            )?;
        }
        Ok(ctx)
    }

    /// Make `ctx` current on the calling thread if it is not already.
    pub(crate) fn make_current(&self, ctx: CuContext) -> Result<()> {
        let mut cur = std::ptr::null_mut();
        // SAFETY: reads/sets the thread's current context.
        unsafe {
            (self.ctx_get_current)(&mut cur);
            if cur != ctx {
                self.check((self.ctx_set_current)(ctx), "cuCtxSetCurrent")?;
            }
        }
        Ok(())
    }

    /// A new non-blocking stream in the current context.
    pub fn new_stream(&self) -> Result<CuStream> {
        let mut s = std::ptr::null_mut();
        // SAFETY: writes one handle.
        self.check(
            unsafe { (self.stream_create)(&mut s, CU_STREAM_NON_BLOCKING) },
            "cuStreamCreate",
        )?;
        Ok(s)
    }

    /// A new event in the current context.
    pub fn new_event(&self, flags: c_uint) -> Result<CuEvent> {
        let mut e = std::ptr::null_mut();
        // SAFETY: writes one handle.
        self.check(
            unsafe { (self.event_create)(&mut e, flags) },
            "cuEventCreate",
        )?;
        Ok(e)
    }

    /// The ordinal of the device that owns device address `ptr` (for array interfaces that do
    /// not name their device).
    pub fn pointer_device(&self, ptr: CuDevicePtr) -> Result<usize> {
        const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
        let mut ordinal: c_int = 0;
        // SAFETY: the attribute is an int, written to a local.
        self.check(
            unsafe {
                (self.pointer_get_attribute)(
                    &mut ordinal as *mut c_int as *mut c_void,
                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                    ptr,
                )
            },
            "cuPointerGetAttribute",
        )?;
        Ok(ordinal.max(0) as usize)
    }

    /// Where address `ptr` lives: `Some(ordinal)` for device (or managed) memory, `None` for
    /// host memory (pageable or pinned) and addresses CUDA does not know.
    pub fn device_of(&self, ptr: CuDevicePtr) -> Option<usize> {
        const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
        const CU_MEMORYTYPE_DEVICE: c_uint = 2;
        const CU_MEMORYTYPE_UNIFIED: c_uint = 4;
        let mut kind: c_uint = 0;
        // SAFETY: the attribute is an unsigned int, written to a local.
        let rc = unsafe {
            (self.pointer_get_attribute)(
                &mut kind as *mut c_uint as *mut c_void,
                CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                ptr,
            )
        };
        match (rc, kind) {
            (0, CU_MEMORYTYPE_DEVICE | CU_MEMORYTYPE_UNIFIED) => self.pointer_device(ptr).ok(),
            _ => None,
        }
    }

    /// Block until the work enqueued on `stream` (a `CUstream` as an integer, of the calling
    /// thread's current context) so far has finished, polling an event: `Ok(false)` if
    /// `timeout` passed first.
    pub fn wait_stream(&self, stream: usize, timeout: std::time::Duration) -> Result<bool> {
        const CU_EVENT_DISABLE_TIMING: c_uint = 2;
        let e = self.new_event(CU_EVENT_DISABLE_TIMING)?;
        let start = std::time::Instant::now();
        // SAFETY: a live event of the current context and the caller's stream.
        let waited = self
            .check(
                unsafe { (self.event_record)(e, stream as CuStream) },
                "cuEventRecord",
            )
            .and_then(|()| loop {
                if self.event_done(e)? {
                    return Ok(true);
                }
                if start.elapsed() > timeout {
                    return Ok(false);
                }
                std::thread::sleep(std::time::Duration::from_micros(50));
            });
        // SAFETY: created above, no longer used.
        unsafe { (self.event_destroy)(e) };
        waited
    }

    /// `Ok(true)` if all work before the event's record has finished.
    pub(crate) fn event_done(&self, e: CuEvent) -> Result<bool> {
        // SAFETY: `e` is a live event.
        match unsafe { (self.event_query)(e) } {
            0 => Ok(true),
            CUDA_ERROR_NOT_READY => Ok(false),
            rc => self.check(rc, "cuEventQuery").map(|_| false),
        }
    }
}
