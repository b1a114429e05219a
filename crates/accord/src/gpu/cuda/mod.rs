//! The CUDA driver API entry points Accord needs, loaded from `libcuda.so.1` at run time.
//!
//! Nothing here links against CUDA: the library is opened on first use, so the crate builds and
//! its tests run on machines without a driver (they get
//! [`Error::Unsupported`](crate::Error::Unsupported) naming what is missing). We use the driver API rather than the runtime because the driver is the one library
//! every CUDA machine has, and the primary context it hands out is the same one PyTorch, CuPy and
//! JAX use, so device pointers and streams from those frameworks are valid here unchanged.
//!
//! The symbols come in tables. The required one ([`Calls`], reached through [`Driver`]'s
//! `Deref`) is what every GPU operation needs: without any of it the driver is unusable. The
//! optional ones are each reached through an accessor that names what the driver lacks:
//! [`Vmm`] ([`Driver::vmm`]) is virtual memory management and IPC, which only engines that
//! share memory between processes use; [`Launch`] ([`Driver::launch`]) loads and launches
//! compiled kernels; [`Strided`] ([`Driver::strided`]) is the 3-D pitched copy. A driver
//! without one of them (old, or a restricted environment) still runs everything else.
//!
//! Libraries beside the driver are opened the same way, each on first use and only by the code
//! that needs it: [`nvrtc`] compiles kernels, [`cufft`] computes FFTs (the distributed FFT's
//! local transforms).
//!
//! - `driver`: the required table, the process's [`driver()`] and its helpers;
//! - `vmm`, `module`, `strided`: the optional tables;
//! - [`nvrtc`], [`cufft`]: the libraries beside the driver.

mod channel_handle;
pub mod cufft;
mod disk_cache;
mod driver;
mod module;
pub mod nvrtc;
mod search;
mod strided;
mod vmm;

pub use channel_handle::MemoryChannelHandle;
pub use driver::{driver, Calls, Driver};
pub use module::{Kernel, KernelArgs, Launch, Module};
pub use strided::{CudaMemcpy3d, Strided, CU_MEMORYTYPE_DEVICE};
pub use vmm::{CuIpcMemHandle, Vmm};

use std::ffi::{c_int, c_uint, c_void, CStr};

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

/// `CU_EVENT_DISABLE_TIMING`: the cheapest kind of event.
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;
/// `CU_EVENT_DEFAULT`: an event that can be timed.
pub const CU_EVENT_DEFAULT: c_uint = 0;

/// Looks a symbol up by name: the loaded library's, or a fake one in tests.
pub(crate) type Resolve<'a> = &'a dyn Fn(&CStr) -> Option<*mut c_void>;

/// A table of function pointers resolved by name. Every symbol is looked up, so a failure names
/// all the missing ones at once.
macro_rules! symbol_table {
    ($(#[$meta:meta])* $name:ident {
        $( $field:ident : $sym:literal => fn($($arg:ty),*) -> $ret:ty; )*
    }) => {
        $(#[$meta])*
        pub struct $name {
            $( #[allow(missing_docs)] pub $field: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        impl $name {
            /// Every symbol through `resolve`, or the names of those it lacks.
            pub(crate) fn resolve(
                resolve: $crate::gpu::cuda::Resolve<'_>,
            ) -> std::result::Result<Self, Vec<&'static str>> {
                let mut missing = Vec::new();
                let mut get = |name: &'static str| {
                    let c = std::ffi::CStr::from_bytes_with_nul(name.as_bytes())
                        .expect("symbol names end in NUL");
                    let p = resolve(c).filter(|p| !p.is_null());
                    if p.is_none() {
                        missing.push(name.trim_end_matches('\0'));
                    }
                    p
                };
                $( let $field = get(concat!($sym, "\0")); )*
                if !missing.is_empty() {
                    return Err(missing);
                }
                // SAFETY: each symbol is declared with its signature from cuda.h; the caller
                // keeps the library that holds them loaded as long as the table.
                unsafe {
                    Ok($name {
                        $( $field: std::mem::transmute::<
                            *mut std::ffi::c_void,
                            unsafe extern "C" fn($($arg),*) -> $ret,
                        >($field.expect("checked above")), )*
                    })
                }
            }
        }
    };
}
pub(crate) use symbol_table;

#[cfg(test)]
mod tests;
