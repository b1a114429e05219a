//! `accord.cuda`'s native half: the symmetric heap and its channels (and, with NVRTC,
//! kernels compiled at run time). The Python module `accord/cuda.py` wraps these into arrays of
//! the user's framework.

use crate::errors::to_py;
use accord::gpu::symm;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::Mutex;

/// A buffer of the symmetric heap (see `accord.cuda.empty_symmetric`).
#[pyclass(module = "accord._native")]
pub struct SymmetricBuffer {
    inner: Mutex<Option<symm::SymmetricBuffer>>,
    ptr: u64,
    nbytes: usize,
    device: usize,
}

impl SymmetricBuffer {
    pub(crate) fn wrap(b: symm::SymmetricBuffer) -> Self {
        SymmetricBuffer {
            ptr: b.ptr(),
            nbytes: b.len(),
            device: b.device(),
            inner: Mutex::new(Some(b)),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&symm::SymmetricBuffer) -> R) -> PyResult<R> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref()
            .map(f)
            .ok_or_else(|| PyValueError::new_err("this symmetric buffer was freed"))
    }
}

#[pymethods]
impl SymmetricBuffer {
    /// This rank's buffer, a device pointer.
    #[getter]
    fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes (the size asked for, rounded up to the allocation granularity).
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The GPU ordinal it lives on.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// The ranks whose buffers are mapped here (this host's, this rank included).
    #[getter]
    fn peers(&self) -> PyResult<Vec<usize>> {
        self.with(|b| b.peers().to_vec())
    }

    /// `vmm` or `ipc`: how the memory crossed processes.
    #[getter]
    fn sharing(&self) -> PyResult<&'static str> {
        self.with(|b| b.sharing())
    }

    /// Rank `rank`'s buffer as mapped in this process.
    fn peer_ptr(&self, rank: usize) -> PyResult<u64> {
        self.with(|b| b.peer_ptr(rank))?.ok_or_else(|| {
            PyValueError::new_err(format!(
                "rank {rank} is not mapped here (not a rank of this host)"
            ))
        })
    }

    /// Channels from this buffer to every local peer's (collective).
    fn memory_channels(&self, py: Python<'_>) -> PyResult<MemoryChannels> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let b = g
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("this symmetric buffer was freed"))?;
        let ch = py
            .allow_threads(|| symm::MemoryChannels::new(b))
            .map_err(to_py)?;
        Ok(MemoryChannels {
            ptr: ch.device_ptr(),
            peers: ch.peers().to_vec(),
            inner: Mutex::new(Some(ch)),
        })
    }

    /// Free on every rank (collective).
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        let b = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        match b {
            Some(b) => py.allow_threads(move || b.free()).map_err(to_py),
            None => Err(PyValueError::new_err(
                "this symmetric buffer was already freed",
            )),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<accord.SymmetricBuffer 0x{:x}, {} bytes on GPU {}>",
            self.ptr, self.nbytes, self.device
        )
    }
}

/// Channels from a symmetric buffer to every local peer (see `accord.cuda.memory_channels`).
#[pyclass(module = "accord._native")]
pub struct MemoryChannels {
    inner: Mutex<Option<symm::MemoryChannels>>,
    ptr: u64,
    peers: Vec<usize>,
}

#[pymethods]
impl MemoryChannels {
    /// Device array of channel handles, indexed by rank.
    #[getter]
    fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Ranks that have a channel.
    #[getter]
    fn peers(&self) -> Vec<usize> {
        self.peers.clone()
    }

    /// Raise the error of a wait that timed out in a kernel, naming the silent rank.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            Some(c) => py.allow_threads(|| c.check()).map_err(to_py),
            None => Err(PyValueError::new_err("these channels were freed")),
        }
    }

    /// Free on every rank (collective).
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        match c {
            Some(c) => py.allow_threads(move || c.free()).map_err(to_py),
            None => Err(PyValueError::new_err("these channels were already freed")),
        }
    }
}

/// A kernel compiled at run time (see `accord.cuda.KernelBuilder`).
#[pyclass(module = "accord._native")]
pub struct Kernel {
    inner: accord::gpu::cuda::Kernel,
    name: String,
}

#[pymethods]
impl Kernel {
    /// The kernel's name.
    #[getter]
    fn name(&self) -> String {
        self.name.clone()
    }

    /// Launch on `stream` (a raw `CUstream`; 0 is the legacy default stream) with `params`,
    /// the parameters packed as the kernel's parameter list lies in memory.
    fn launch(
        &self,
        py: Python<'_>,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        params: Vec<u8>,
        shared_mem: u32,
        stream: usize,
    ) -> PyResult<()> {
        let k = &self.inner;
        // SAFETY: as with CuPy's RawKernel, the caller vouches for the arguments it packed
        // and the stream it named (documented on accord.cuda.Kernel.launch).
        py.allow_threads(|| unsafe {
            k.launch(
                [grid.0, grid.1, grid.2],
                [block.0, block.1, block.2],
                shared_mem,
                stream as accord::gpu::cuda::CuStream,
                &params,
            )
        })
        .map_err(to_py)
    }
}

/// Compile `source` with NVRTC for GPU `device` and return kernel `name` (cached).
#[pyfunction]
pub fn compile_kernel(
    py: Python<'_>,
    source: String,
    name: String,
    options: Vec<String>,
    device: usize,
) -> PyResult<Kernel> {
    let k = py
        .allow_threads(|| accord::gpu::cuda::nvrtc::load_kernel(&source, &name, &options, device))
        .map_err(to_py)?;
    Ok(Kernel { inner: k, name })
}

/// The directory holding Accord's CUDA headers.
#[pyfunction]
pub fn cuda_include_dir() -> PyResult<String> {
    let d = accord::gpu::cuda::nvrtc::include_dir().map_err(to_py)?;
    Ok(d.to_string_lossy().into_owned())
}
