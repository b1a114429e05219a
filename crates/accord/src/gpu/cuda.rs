//! The few CUDA driver API entry points Accord needs, loaded from `libcuda.so.1` at run time.
//!
//! Nothing here links against CUDA: the library is opened on first use, so the crate builds and
//! its tests run on machines without a driver (they get [`Error::Unsupported`] naming what is
//! missing). We use the driver API rather than the runtime because the driver is the one library
//! every CUDA machine has, and the primary context it hands out is the same one PyTorch, CuPy and
//! JAX use, so device pointers and streams from those frameworks are valid here unchanged.

use crate::error::{Error, Result};
use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

/// A CUDA driver result code (`CUresult`); 0 is success.
pub type CuResult = c_int;
/// A device pointer (`CUdeviceptr`).
pub type CuDevicePtr = u64;
/// A context handle (`CUcontext`).
pub type CuContext = *mut c_void;
/// A stream handle (`CUstream`); null is the legacy default stream.
pub type CuStream = *mut c_void;
/// An event handle (`CUevent`).
pub type CuEvent = *mut c_void;

const CUDA_ERROR_NOT_READY: CuResult = 600;
/// `CU_STREAM_NON_BLOCKING`: the stream does not synchronise with the legacy default stream.
const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_EVENT_DISABLE_TIMING`: the cheapest kind of event.
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;
/// `CU_EVENT_DEFAULT`: an event that can be timed.
pub const CU_EVENT_DEFAULT: c_uint = 0;

macro_rules! driver_api {
    ($( $field:ident : $sym:literal => fn($($arg:ty),*) -> $ret:ty; )*) => {
        /// Function pointers into the CUDA driver library.
        #[allow(non_snake_case)]
        pub struct Driver {
            _lib: Library,
            $( #[allow(missing_docs)] pub $field: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        impl Driver {
            fn load(lib: Library) -> std::result::Result<Driver, String> {
                // SAFETY: each symbol is declared with the signature of the CUDA driver API
                // (cuda.h); the library stays alive in `_lib` as long as the pointers.
                unsafe {
                    $( let $field = *lib
                        .get::<unsafe extern "C" fn($($arg),*) -> $ret>(concat!($sym, "\0").as_bytes())
                        .map_err(|e| format!("libcuda.so.1 lacks {}: {e}", $sym))?; )*
                    Ok(Driver { _lib: lib, $( $field, )* })
                }
            }
        }
    };
}

driver_api! {
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
    get_error_string: "cuGetErrorString" => fn(CuResult, *mut *const c_char) -> CuResult;
    pointer_get_attribute: "cuPointerGetAttribute" => fn(*mut c_void, c_int, CuDevicePtr) -> CuResult;
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
    /// The driver's name for a result code, e.g. `CUDA_ERROR_OUT_OF_MEMORY (2): out of memory`.
    pub fn describe(&self, rc: CuResult) -> String {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a pointer to a static string or leaves it null.
        unsafe { (self.get_error_string)(rc, &mut s) };
        if s.is_null() {
            format!("CUDA error {rc}")
        } else {
            // SAFETY: non-null strings from the driver are static and NUL-terminated.
            format!(
                "{} (CUDA error {rc})",
                unsafe { CStr::from_ptr(s) }.to_string_lossy()
            )
        }
    }

    /// `Ok` for success, else an error naming `what`.
    pub fn check(&self, rc: CuResult, what: &str) -> Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            Err(Error::Aborted {
                reason: format!("{what}: {}", self.describe(rc)),
            })
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
