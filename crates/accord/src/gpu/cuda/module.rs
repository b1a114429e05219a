//! Loading compiled device code and launching its kernels: the optional `Launch` table
//! (`cuModuleLoadData`, `cuModuleGetFunction`, `cuLaunchKernel`), [`Module`], [`Kernel`], and
//! [`KernelArgs`], which lays parameters out as the kernel's parameter list lies in memory.

use super::{CuContext, CuResult, CuStream, Driver};
use crate::error::{Error, Result};
use std::ffi::{c_uint, c_void, CString};
use std::sync::Arc;

/// `CUmodule` / `CUfunction`.
type Handle = *mut c_void;

super::symbol_table! {
    /// Function pointers for loading modules and launching kernels, host memory kernels map,
    /// and capturing work into CUDA graphs.
    Launch {
        module_load_data: "cuModuleLoadData" => fn(*mut Handle, *const c_void) -> CuResult;
        module_unload: "cuModuleUnload" => fn(Handle) -> CuResult;
        module_get_function: "cuModuleGetFunction" => fn(*mut Handle, Handle, *const i8) -> CuResult;
        device_get_attribute: "cuDeviceGetAttribute" => fn(*mut std::ffi::c_int, std::ffi::c_int, std::ffi::c_int) -> CuResult;
        launch_kernel: "cuLaunchKernel" => fn(Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CuStream, *mut *mut c_void, *mut *mut c_void) -> CuResult;
        mem_host_alloc: "cuMemHostAlloc" => fn(*mut *mut c_void, usize, c_uint) -> CuResult;
        mem_host_get_device_pointer: "cuMemHostGetDevicePointer_v2" => fn(*mut u64, *mut c_void, c_uint) -> CuResult;
        mem_free_host: "cuMemFreeHost" => fn(*mut c_void) -> CuResult;
        stream_is_capturing: "cuStreamIsCapturing" => fn(CuStream, *mut std::ffi::c_int) -> CuResult;
        stream_begin_capture: "cuStreamBeginCapture_v2" => fn(CuStream, std::ffi::c_int) -> CuResult;
        stream_end_capture: "cuStreamEndCapture" => fn(CuStream, *mut Handle) -> CuResult;
        graph_instantiate: "cuGraphInstantiateWithFlags" => fn(*mut Handle, Handle, u64) -> CuResult;
        graph_launch: "cuGraphLaunch" => fn(Handle, CuStream) -> CuResult;
        graph_exec_destroy: "cuGraphExecDestroy" => fn(Handle) -> CuResult;
        graph_destroy: "cuGraphDestroy" => fn(Handle) -> CuResult;
    }
}

/// `CU_LAUNCH_PARAM_BUFFER_POINTER`, `..._SIZE`, `..._END`: `extra` for a packed parameter
/// buffer.
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;
const PARAM_END: usize = 0;

/// Device code loaded into a device's primary context; unloaded when the last [`Kernel`] of it
/// goes.
pub struct Module {
    cu: &'static Driver,
    ctx: usize,
    handle: usize,
}

// SAFETY: a module handle may be used from any thread of the process (with its context
// current, which every use makes so).
unsafe impl Send for Module {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Module {}

impl Module {
    /// Load `image` (a CUBIN, or PTX text ending in NUL) on device `ordinal`.
    pub fn load(cu: &'static Driver, ordinal: usize, image: &[u8]) -> Result<Arc<Module>> {
        let launch = cu.launch()?;
        let ctx = cu.primary_context(ordinal)?;
        cu.make_current(ctx)?;
        let mut m: Handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the image stays alive for the call (the driver copies).
        let rc = unsafe { (launch.module_load_data)(&mut m, image.as_ptr().cast()) };
        cu.check(rc, "cuModuleLoadData")?;
        Ok(Arc::new(Module {
            cu,
            ctx: ctx as usize,
            handle: m as usize,
        }))
    }

    /// The kernel `name` (an `extern "C" __global__` function) of this module.
    pub fn kernel(self: &Arc<Self>, name: &str) -> Result<Kernel> {
        let launch = self.cu.launch()?;
        let c = CString::new(name)
            .map_err(|_| Error::invalid(format!("kernel name {name:?} contains a NUL byte")))?;
        self.cu.make_current(self.ctx as CuContext)?;
        let mut f: Handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; a loaded module; a NUL-terminated name.
        let rc = unsafe { (launch.module_get_function)(&mut f, self.handle as Handle, c.as_ptr()) };
        self.cu
            .check(rc, &format!("cuModuleGetFunction({name})"))
            .map_err(|e| {
                Error::invalid(format!(
                    "{e}: is `{name}` declared extern \"C\" __global__ in the source?"
                ))
            })?;
        Ok(Kernel {
            module: self.clone(),
            function: f as usize,
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if let (Ok(launch), Ok(())) = (
            self.cu.launch(),
            self.cu.make_current(self.ctx as CuContext),
        ) {
            // SAFETY: loaded in `load`, unloaded once, with no kernel of it left.
            unsafe { (launch.module_unload)(self.handle as Handle) };
        }
    }
}

/// A kernel of a loaded [`Module`] (which it keeps loaded). Cheap to clone.
#[derive(Clone)]
pub struct Kernel {
    module: Arc<Module>,
    function: usize,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({:#x})", self.function)
    }
}

impl Kernel {
    /// Launch on `stream` with `grid` x `block` threads, `shared_mem` bytes of dynamic shared
    /// memory and `params`: the kernel's parameters packed as its parameter list lies in memory
    /// ([`KernelArgs`]).
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list, every pointer in it must be valid for
    /// what the kernel does with it, and `stream` must be a live stream of the kernel's device
    /// (or null): the kernel runs with whatever it is given.
    pub unsafe fn launch(
        &self,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        stream: CuStream,
        params: &[u8],
    ) -> Result<()> {
        let cu = self.module.cu;
        let launch = cu.launch()?;
        cu.make_current(self.module.ctx as CuContext)?;
        let mut size = params.len();
        // An empty parameter buffer still needs a valid pointer.
        let mut storage = params.to_vec();
        storage.push(0);
        let mut extra: [*mut c_void; 5] = [
            PARAM_BUFFER_POINTER as *mut c_void,
            storage.as_mut_ptr().cast(),
            PARAM_BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast(),
            PARAM_END as *mut c_void,
        ];
        // SAFETY: a function of a loaded module; `extra` describes a buffer that outlives the
        // call (the driver copies the parameters at launch).
        let rc = unsafe {
            (launch.launch_kernel)(
                self.function as Handle,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_mem,
                stream,
                std::ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        };
        cu.check(rc, "cuLaunchKernel")
    }
}

/// Kernel parameters laid out as a C struct of them would be: each at the next multiple of its
/// alignment.
#[derive(Debug, Default, Clone)]
pub struct KernelArgs {
    bytes: Vec<u8>,
}

impl KernelArgs {
    /// No parameters yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append `raw`, aligned to `align` bytes.
    pub fn bytes(mut self, raw: &[u8], align: usize) -> Self {
        let pad = self.bytes.len().next_multiple_of(align.max(1)) - self.bytes.len();
        self.bytes.extend(std::iter::repeat_n(0, pad));
        self.bytes.extend_from_slice(raw);
        self
    }

    /// A device pointer.
    pub fn ptr(self, p: u64) -> Self {
        self.bytes(&p.to_le_bytes(), 8)
    }

    /// An `int`.
    pub fn i32(self, v: i32) -> Self {
        self.bytes(&v.to_le_bytes(), 4)
    }

    /// An `unsigned int`.
    pub fn u32(self, v: u32) -> Self {
        self.bytes(&v.to_le_bytes(), 4)
    }

    /// A `long long`.
    pub fn i64(self, v: i64) -> Self {
        self.bytes(&v.to_le_bytes(), 8)
    }

    /// An `unsigned long long` (or `size_t`).
    pub fn u64(self, v: u64) -> Self {
        self.bytes(&v.to_le_bytes(), 8)
    }

    /// A `float`.
    pub fn f32(self, v: f32) -> Self {
        self.bytes(&v.to_le_bytes(), 4)
    }

    /// A `double`.
    pub fn f64(self, v: f64) -> Self {
        self.bytes(&v.to_le_bytes(), 8)
    }

    /// The packed parameters.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_aligned_as_c_lays_them_out() {
        let a = KernelArgs::new().i32(1).ptr(0x10).u32(2).f64(0.5).f32(1.5);
        let b = a.as_bytes();
        // int at 0, pointer at 8, unsigned at 16, double at 24, float at 32.
        assert_eq!(b.len(), 36);
        assert_eq!(&b[0..4], &1i32.to_le_bytes());
        assert_eq!(&b[4..8], &[0; 4]);
        assert_eq!(&b[8..16], &0x10u64.to_le_bytes());
        assert_eq!(&b[16..20], &2u32.to_le_bytes());
        assert_eq!(&b[24..32], &0.5f64.to_le_bytes());
        assert_eq!(&b[32..36], &1.5f32.to_le_bytes());
        assert_eq!(KernelArgs::new().bytes(&[7], 1).u64(1).as_bytes().len(), 16);
    }
}
