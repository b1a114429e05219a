//! From a Python array object to a host memory range plus a [`DataType`].
//!
//! One entry point, [`extract`], looks at an object in this order:
//!
//! 0. A plain `numpy.ndarray`: its buffer, the cheapest way in (what numpy users pass on every
//!    call); if the buffer does not describe it, the steps below.
//! 1. DLPack with a CUDA device (torch, CuPy, JAX...) or `__cuda_array_interface__` (CuPy,
//!    Numba...): a [`CudaArray`], for the GPU backend, with the CUDA stream the operation must run
//!    on (the framework's current stream, see [`CudaArray::stream`]). Other devices (ROCm...)
//!    are [`Array::Device`] and are refused.
//! 2. `__dlpack__` (numpy, torch, jax, cupy on the host...): the zero-copy standard.
//! 3. `__array_interface__` (numpy-likes, including read-only arrays, which DLPack cannot export,
//!    and `ml_dtypes.bfloat16`, which it does not know).
//! 4. The buffer protocol (`memoryview`, `bytearray`, `array.array`).
//!
//! The memory must be C-contiguous; outputs must be writable. Whatever keeps the memory alive
//! (the DLPack capsule, the exporting object and its interface dictionary, the `Py_buffer`)
//! travels with the [`HostArray`]. Immutable scalars never get here as outputs: the caller
//! replaces them first (see `scalar`).

use accord::DataType;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyString, PyTuple};
use std::ffi::c_void;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const KDL_CUDA_HOST: i32 = 3;
const KDL_CUDA_MANAGED: i32 = 13;

/// Keeps an exported array's memory valid.
enum Owner {
    /// The exporting object (and, for DLPack, its capsule: dropping it frees the export).
    Objects(#[allow(dead_code)] Vec<PyObject>),
    /// The exporting object alone.
    Object(#[allow(dead_code)] PyObject),
    /// A buffer-protocol view, released on drop.
    Buffer(Box<ffi::Py_buffer>),
}

impl Drop for Owner {
    fn drop(&mut self) {
        if let Owner::Buffer(b) = self {
            Python::with_gil(|_| unsafe { ffi::PyBuffer_Release(&mut **b) });
        }
    }
}

/// Host memory of one array, valid while this value lives.
pub struct HostArray {
    pub ptr: usize,
    pub len: usize,
    pub dtype: DataType,
    /// A numpy dtype accord has no type for, moved as its bytes (`dtype` is then `u8`).
    pub raw: Option<Raw>,
    _owner: Owner,
}

/// A fixed-size numpy dtype without an accord type (datetime64, longdouble, structured,
/// fixed-width strings...): such arrays move as bytes and cannot be reduced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Raw {
    /// numpy's name of the dtype (`datetime64[ns]`).
    pub name: String,
    /// Bytes per element.
    pub itemsize: usize,
}

// SAFETY: the pointer is plain host memory owned by `_owner`; `Owner` only holds Python
// references (safe to drop anywhere with pyo3's reference pool) or a Py_buffer released under the
// GIL.
unsafe impl Send for HostArray {}
// SAFETY: shared access only reads the plain fields; the memory itself is accessed through
// the unsafe accessors whose callers uphold exclusivity.
unsafe impl Sync for HostArray {}

impl HostArray {
    /// The bytes, for reading.
    ///
    /// # Safety
    /// No one may write the memory concurrently.
    pub unsafe fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        std::slice::from_raw_parts(self.ptr as *const u8, self.len)
    }

    /// The bytes, for writing.
    ///
    /// # Safety
    /// The caller has exclusive access (the array was extracted writable and is not aliased by
    /// another buffer of the same call except where the operation allows it).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len)
    }
}

/// CUDA device memory of one array, valid while this value lives (and, for the operation's
/// sake, until the operation has completed on [`CudaArray::stream`]).
pub struct CudaArray {
    /// Device address of the first element.
    pub ptr: u64,
    /// Number of elements.
    pub count: usize,
    pub dtype: DataType,
    /// Device ordinal in this process.
    pub device: usize,
    /// The `CUstream` to run on: the framework's current stream for `device` (torch:
    /// `torch.cuda.current_stream(device)`, CuPy: `cupy.cuda.get_current_stream()`), else the
    /// `stream` of `__cuda_array_interface__`, else 0 (the legacy default stream, which orders
    /// with every blocking stream).
    pub stream: usize,
    _owner: Owner,
}

// SAFETY: as for HostArray: a plain address plus Python references.
unsafe impl Send for CudaArray {}
// SAFETY: as above.
unsafe impl Sync for CudaArray {}

/// What [`extract`] found.
pub enum Array {
    Host(HostArray),
    Cuda(CudaArray),
    /// Memory on an accelerator accord cannot use: (device kind, device id).
    Device(&'static str, i32),
}

fn dtype_from_dlpack(t: DLDataType) -> Option<DataType> {
    if t.lanes != 1 {
        return None;
    }
    Some(match (t.code, t.bits) {
        (0, 8) => DataType::I8,
        (0, 32) => DataType::I32,
        (0, 64) => DataType::I64,
        (1, 8) => DataType::U8,
        (1, 32) => DataType::U32,
        (1, 64) => DataType::U64,
        (2, 16) => DataType::F16,
        (2, 32) => DataType::F32,
        (2, 64) => DataType::F64,
        (4, 16) => DataType::BF16,
        (0, 16) => DataType::I16,
        (1, 16) => DataType::U16,
        (5, 64) => DataType::C64,
        (5, 128) => DataType::C128,
        (6, 8) => DataType::Bool,
        _ => return None,
    })
}

fn dtype_from_typestr(s: &str, name: Option<&str>) -> Option<DataType> {
    let s = s.trim_start_matches(['<', '=', '|', '@']);
    if s.starts_with('>') {
        return None;
    }
    Some(match s {
        "i1" | "b" => DataType::I8,
        "i4" | "i" => DataType::I32,
        "i8" | "q" => DataType::I64,
        "u1" | "B" => DataType::U8,
        "u4" | "I" => DataType::U32,
        "u8" | "Q" => DataType::U64,
        "f2" | "e" => DataType::F16,
        "f4" | "f" => DataType::F32,
        "f8" | "d" => DataType::F64,
        "l" if std::mem::size_of::<std::ffi::c_long>() == 8 => DataType::I64,
        "L" if std::mem::size_of::<std::ffi::c_long>() == 8 => DataType::U64,
        "V2" if name == Some("bfloat16") => DataType::BF16,
        "b1" | "?" => DataType::Bool,
        "i2" | "h" => DataType::I16,
        "u2" | "H" => DataType::U16,
        // Array interfaces say `c8`; buffer formats `Zf` (PEP 3118).
        "c8" | "Zf" => DataType::C64,
        "c16" | "Zd" => DataType::C128,
        _ => return None,
    })
}

/// A DLPack dtype in words, for messages (`bool`, `complex64`, `int16`...).
fn dlpack_dtype_name(t: DLDataType) -> String {
    let base = match t.code {
        0 => format!("int{}", t.bits),
        1 => format!("uint{}", t.bits),
        2 => format!("float{}", t.bits),
        4 => format!("bfloat{}", t.bits),
        5 => format!("complex{}", t.bits),
        6 => "bool".to_string(),
        c => format!("(DLPack code {c}, {} bits)", t.bits),
    };
    if t.lanes == 1 {
        base
    } else {
        format!("{base} x {} lanes", t.lanes)
    }
}

pub(crate) const DTYPES: &str =
    "bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, \
     bfloat16, float32, float64, complex64, complex128";

/// The numpy name of an element type.
pub(crate) fn numpy_name(d: DataType) -> &'static str {
    match d {
        DataType::F16 => "float16",
        DataType::BF16 => "bfloat16",
        DataType::F32 => "float32",
        DataType::F64 => "float64",
        DataType::I8 => "int8",
        DataType::I32 => "int32",
        DataType::I64 => "int64",
        DataType::U8 => "uint8",
        DataType::U32 => "uint32",
        DataType::U64 => "uint64",
        DataType::Bool => "bool",
        DataType::I16 => "int16",
        DataType::U16 => "uint16",
        DataType::C64 => "complex64",
        DataType::C128 => "complex128",
    }
}

fn unsupported_dtype(what: &str, desc: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "{what} has dtype {desc}, which accord cannot communicate; supported: {DTYPES} (and, \
         moved as bytes, any other fixed-size numpy dtype of a numpy array)"
    ))
}

/// Whether (shape, strides in elements) describe a C-contiguous layout. An empty array is, whatever
/// its strides (CuPy gives an empty array zero strides).
fn c_contiguous(shape: &[i64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expect = 1i64;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != expect {
            return false;
        }
        expect *= n;
    }
    true
}

fn not_contiguous(what: &str) -> PyErr {
    PyValueError::new_err(format!(
        "{what} is not contiguous; pass a C-contiguous array (numpy.ascontiguousarray(x) or \
         tensor.contiguous()), so that the result can be written in place"
    ))
}

fn read_only(what: &str) -> PyErr {
    PyValueError::new_err(format!(
        "{what} is read-only but this operation writes into it; pass a writable array \
         (e.g. arr.copy())"
    ))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Find the memory of `obj`. `what` names the argument in messages; `writable` demands write
/// access (outputs and in-place buffers).
pub fn extract(obj: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<Array> {
    // 0. numpy arrays, the common case: their buffer, without DLPack's two method calls and
    //    capsule per call. Anything the buffer does not describe (bfloat16, an unsupported or
    //    big-endian dtype, a read-only output) takes the general path below and its messages.
    if is_ndarray(obj) {
        if let Ok(a) = from_buffer(obj, what, writable, Hold::Object) {
            return Ok(Array::Host(a));
        }
    }
    // 0b. CPU torch tensors, the other common case (a tensor is always writable).
    if let Some(a) = from_torch_cpu(obj) {
        return Ok(Array::Host(a));
    }
    // 0c. A tensor negated or conjugated in name only: as input, its values resolved into a
    //     copy (which the result holds); as output it cannot be written.
    if let Some(lazy) = torch_lazy_view(obj)? {
        if writable {
            return Err(PyValueError::new_err(format!(
                "{what} is a lazily {lazy} tensor view (is_neg() or is_conj(): its memory does \
                 not hold its values); pass tensor.resolve_neg().resolve_conj() or \
                 tensor.clone() and use the result"
            )));
        }
        let resolved = obj
            .call_method0("resolve_neg")?
            .call_method0("resolve_conj")?;
        return extract(&resolved, what, false);
    }
    // 1. Device arrays.
    let mut dl_device = None;
    if obj.hasattr("__dlpack_device__")? {
        if let Ok(dev) = obj.call_method0("__dlpack_device__") {
            if let Ok((kind, id)) = dev.extract::<(i32, i32)>() {
                dl_device = Some((kind, id));
            }
        }
    }
    match dl_device {
        Some((KDL_CUDA | KDL_CUDA_MANAGED, id)) => {
            return extract_cuda(obj, what, writable, Some(id.max(0) as usize)).map(Array::Cuda)
        }
        Some((kind, id)) if kind != KDL_CPU && kind != KDL_CUDA_HOST => {
            let name = if kind == 10 { "rocm" } else { "device" };
            return Ok(Array::Device(name, id));
        }
        _ => {}
    }
    if dl_device.is_none() && obj.hasattr("__cuda_array_interface__")? {
        return extract_cuda(obj, what, writable, None).map(Array::Cuda);
    }
    // 2. DLPack.
    if obj.hasattr("__dlpack__")? {
        match obj.call_method0("__dlpack__") {
            Ok(cap) => {
                if let Some(a) = from_dlpack(obj, &cap, what)? {
                    return Ok(Array::Host(a));
                }
            }
            Err(e) => {
                // numpy refuses read-only arrays and unknown dtypes (bfloat16): try the
                // interfaces below; anything else is the object's own complaint.
                let py = obj.py();
                if !e.is_instance_of::<pyo3::exceptions::PyBufferError>(py)
                    && !e.is_instance_of::<PyTypeError>(py)
                    && !e.is_instance_of::<PyValueError>(py)
                    && !e.is_instance_of::<pyo3::exceptions::PyRuntimeError>(py)
                {
                    return Err(e);
                }
                if !obj.hasattr("__array_interface__")?
                    && unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 0
                {
                    return Err(PyTypeError::new_err(format!(
                        "{what} ({}) could not be exported through DLPack: {e}",
                        type_name(obj)
                    )));
                }
            }
        }
    }
    // 3. __array_interface__.
    if let Ok(ai) = obj.getattr("__array_interface__") {
        if let Ok(ai) = ai.downcast::<PyDict>() {
            return from_array_interface(obj, ai, what, writable).map(Array::Host);
        }
    }
    // 4. Buffer protocol.
    if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } != 0 {
        return from_buffer(obj, what, writable, Hold::View).map(Array::Host);
    }
    Err(PyTypeError::new_err(format!(
        "{what} must be an array (numpy, torch, or any object with __dlpack__, \
         __array_interface__ or the buffer protocol), not {}",
        type_name(obj)
    )))
}

/// `numpy.<name>`, kept in `cell` once found: `None` until numpy is loaded, which is never
/// imported from here (a module entry of None, which blocks the import, counts as no numpy).
pub(crate) fn numpy_attr<'a>(
    py: Python<'_>,
    cell: &'a pyo3::sync::GILOnceCell<Py<PyAny>>,
    name: &str,
) -> Option<&'a Py<PyAny>> {
    loaded_attr(py, cell, "numpy", name)
}

/// `<module>.<name>` as [`numpy_attr`] finds it: only once the program has loaded `module`.
fn loaded_attr<'a>(
    py: Python<'_>,
    cell: &'a pyo3::sync::GILOnceCell<Py<PyAny>>,
    module: &str,
    name: &str,
) -> Option<&'a Py<PyAny>> {
    if cell.get(py).is_none() {
        let found = py
            .import("sys")
            .and_then(|sys| sys.getattr("modules"))
            .and_then(|m| m.get_item(module))
            .and_then(|m| m.getattr(name))
            .ok()?;
        let _ = cell.set(py, found.unbind());
    }
    cell.get(py)
}

/// Whether `obj` is a `torch.Tensor` (or a subclass); torch is never imported from here.
fn is_torch_tensor(obj: &Bound<'_, PyAny>) -> bool {
    static TENSOR: pyo3::sync::GILOnceCell<Py<PyAny>> = pyo3::sync::GILOnceCell::new();
    let py = obj.py();
    loaded_attr(py, &TENSOR, "torch", "Tensor")
        .is_some_and(|t| obj.is_instance(t.bind(py)).unwrap_or(false))
}

/// For a torch tensor whose values are negated or conjugated only in name (`is_neg()`,
/// `is_conj()`: the imaginary part of a conjugate, say), what its memory lacks: the memory
/// holds the values before that, and torch's DLPack export hands them over as they are.
fn torch_lazy_view(obj: &Bound<'_, PyAny>) -> PyResult<Option<&'static str>> {
    if !is_torch_tensor(obj) {
        return Ok(None);
    }
    for (method, what) in [("is_neg", "negated"), ("is_conj", "conjugated")] {
        if obj.call_method0(method)?.is_truthy()? {
            return Ok(Some(what));
        }
    }
    Ok(None)
}

/// A plain CPU `torch.Tensor` (or a subclass such as `nn.Parameter`), read through torch's
/// C-level accessors: a DLPack export per call costs torch several Python-level calls (about
/// 10 us). `None` for anything else, and for any tensor this path does not fully understand
/// (another device, a sparse layout, not contiguous, a lazy negation, another dtype): the general
/// path takes those, with its messages.
fn from_torch_cpu(obj: &Bound<'_, PyAny>) -> Option<HostArray> {
    static DTYPES: pyo3::sync::GILOnceCell<Vec<(Py<PyAny>, DataType)>> =
        pyo3::sync::GILOnceCell::new();
    static STRIDED: pyo3::sync::GILOnceCell<Py<PyAny>> = pyo3::sync::GILOnceCell::new();
    let py = obj.py();
    if !is_torch_tensor(obj) {
        return None;
    }
    let dtypes = match DTYPES.get(py) {
        Some(d) => d,
        None => {
            // Loaded already: `torch.Tensor` was found.
            let torch = py.import("torch").ok()?;
            // torch names its dtypes as numpy does.
            let found = DataType::ALL
                .iter()
                .filter_map(|&d| Some((torch.getattr(numpy_name(d)).ok()?.unbind(), d)))
                .collect();
            let _ = DTYPES.set(py, found);
            DTYPES.get(py)?
        }
    };
    let truthy = |name: &Bound<'_, PyString>, call: bool| -> Option<bool> {
        let v = if call {
            obj.call_method0(name).ok()?
        } else {
            obj.getattr(name).ok()?
        };
        v.is_truthy().ok()
    };
    let strided = loaded_attr(py, &STRIDED, "torch", "strided")?;
    // A tensor that requires grad goes to the general path, which refuses it (DLPack does):
    // written in place behind autograd's back, its gradients would be wrong.
    if !truthy(intern!(py, "is_cpu"), false)?
        || !obj
            .getattr(intern!(py, "layout"))
            .ok()?
            .is(strided.bind(py))
        || truthy(intern!(py, "requires_grad"), false)?
        || !truthy(intern!(py, "is_contiguous"), true)?
        || truthy(intern!(py, "is_neg"), true)?
    {
        return None;
    }
    let dt = obj.getattr(intern!(py, "dtype")).ok()?;
    let dtype = dtypes.iter().find(|(t, _)| t.bind(py).is(&dt))?.1;
    // Only complex tensors can be conjugated in name: real ones skip the call.
    if dtype.is_complex() && truthy(intern!(py, "is_conj"), true)? {
        return None;
    }
    let ptr: usize = obj
        .call_method0(intern!(py, "data_ptr"))
        .ok()?
        .extract()
        .ok()?;
    let count: usize = obj
        .call_method0(intern!(py, "numel"))
        .ok()?
        .extract()
        .ok()?;
    if ptr == 0 && count > 0 {
        return None;
    }
    // The storage too: `t.data = other` or `t.set_(...)` during the call would free it.
    let storage = obj.call_method0(intern!(py, "untyped_storage")).ok()?;
    Some(HostArray {
        ptr,
        len: count * dtype.size(),
        dtype,
        raw: None,
        _owner: Owner::Objects(vec![obj.clone().unbind(), storage.unbind()]),
    })
}

/// Whether `obj` is exactly a `numpy.ndarray` (not a subclass, whose buffer may differ from
/// what it presents).
pub(crate) fn is_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    static NDARRAY: pyo3::sync::GILOnceCell<Py<PyAny>> = pyo3::sync::GILOnceCell::new();
    let py = obj.py();
    numpy_attr(py, &NDARRAY, "ndarray").is_some_and(|t| obj.get_type().is(t.bind(py)))
}

/// A parsed DLPack export: device, address of the first element, element count, dtype.
struct DlView {
    device: DLDevice,
    ptr: usize,
    count: usize,
    dtype: DataType,
}

fn parse_dlpack(cap: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<DlView>> {
    let Ok(capsule) = cap.downcast::<PyCapsule>() else {
        return Ok(None);
    };
    let ptr = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dltensor".as_ptr()) };
    if ptr.is_null() {
        // A versioned or already consumed capsule: use the other interfaces.
        unsafe { ffi::PyErr_Clear() };
        return Ok(None);
    }
    // SAFETY: a "dltensor" capsule holds a DLManagedTensor that lives as long as the capsule
    // (we never rename it, so the capsule's destructor frees the export when we drop it).
    let t = unsafe { &(*(ptr as *const DLManagedTensor)).dl_tensor };
    let dtype = dtype_from_dlpack(t.dtype)
        .ok_or_else(|| unsupported_dtype(what, &dlpack_dtype_name(t.dtype)))?;
    let ndim = t.ndim.max(0) as usize;
    let shape: &[i64] = if ndim == 0 || t.shape.is_null() {
        &[]
    } else {
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    if !t.strides.is_null() && ndim > 0 {
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        if !c_contiguous(shape, strides) {
            return Err(not_contiguous(what));
        }
    }
    let count: i64 = shape.iter().product();
    Ok(Some(DlView {
        device: t.device,
        ptr: t.data as usize + t.byte_offset as usize,
        count: count.max(0) as usize,
        dtype,
    }))
}

fn from_dlpack(
    obj: &Bound<'_, PyAny>,
    cap: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<Option<HostArray>> {
    let Some(v) = parse_dlpack(cap, what)? else {
        return Ok(None);
    };
    if v.device.device_type != KDL_CPU && v.device.device_type != KDL_CUDA_HOST {
        return Err(PyErr::from_value(
            crate::errors::unsupported_device(obj.py(), what, "device", v.device.device_id)?
                .into_any(),
        ));
    }
    Ok(Some(HostArray {
        ptr: v.ptr,
        len: v.count * v.dtype.size(),
        dtype: v.dtype,
        raw: None,
        _owner: Owner::Objects(vec![obj.clone().unbind(), cap.clone().unbind()]),
    }))
}

fn module_of(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .getattr("__module__")
        .and_then(|m| m.extract::<String>())
        .unwrap_or_default()
}

/// The stream an operation on `obj` (on CUDA device `device`, when known) runs on; see
/// [`CudaArray::stream`].
fn current_stream(obj: &Bound<'_, PyAny>, device: Option<usize>) -> PyResult<Option<usize>> {
    let py = obj.py();
    let module = module_of(obj);
    if module.starts_with("torch") {
        let cuda = py.import("torch")?.getattr("cuda")?;
        let s = match device {
            Some(d) => cuda.call_method1("current_stream", (d,))?,
            None => cuda.call_method0("current_stream")?,
        };
        return Ok(Some(s.getattr("cuda_stream")?.extract()?));
    }
    if module.starts_with("cupy") {
        let cuda = py.import("cupy")?.getattr("cuda")?;
        // CuPy keeps a current stream per device; the one-argument form is recent.
        let s = match device {
            Some(d) => cuda
                .call_method1("get_current_stream", (d,))
                .or_else(|_| cuda.call_method0("get_current_stream"))?,
            None => cuda.call_method0("get_current_stream")?,
        };
        return Ok(Some(s.getattr("ptr")?.extract()?));
    }
    Ok(None)
}

/// A CUDA array: DLPack first (it knows bfloat16 and the device), else
/// `__cuda_array_interface__`. `device` is the DLPack device id, when there is one.
fn extract_cuda(
    obj: &Bound<'_, PyAny>,
    what: &str,
    writable: bool,
    device: Option<usize>,
) -> PyResult<CudaArray> {
    let stream = current_stream(obj, device)?;
    if device.is_some() && obj.hasattr("__dlpack__")? {
        // The DLPack `stream` argument: the producer makes its pending work on the array visible
        // to this stream (0 is not allowed for CUDA; 1 means the legacy default stream).
        let s = match stream {
            Some(0) | None => 1,
            Some(s) => s,
        };
        let kwargs = PyDict::new(obj.py());
        kwargs.set_item("stream", s)?;
        let cap = obj
            .call_method("__dlpack__", (), Some(&kwargs))
            .or_else(|_| obj.call_method0("__dlpack__"));
        if let Ok(cap) = cap {
            if let Some(v) = parse_dlpack(&cap, what)? {
                if v.device.device_type == KDL_CUDA || v.device.device_type == KDL_CUDA_MANAGED {
                    return Ok(CudaArray {
                        ptr: v.ptr as u64,
                        count: v.count,
                        dtype: v.dtype,
                        device: v.device.device_id.max(0) as usize,
                        stream: stream.unwrap_or(0),
                        _owner: Owner::Objects(vec![obj.clone().unbind(), cap.unbind()]),
                    });
                }
            }
        }
    }
    let ai = obj.getattr("__cuda_array_interface__").map_err(|e| {
        PyTypeError::new_err(format!(
            "{what} ({}) is a CUDA array that exports neither a usable DLPack capsule nor \
             __cuda_array_interface__: {e}",
            type_name(obj)
        ))
    })?;
    let ai = ai
        .downcast::<PyDict>()
        .map_err(|_| PyTypeError::new_err(format!("{what}: malformed __cuda_array_interface__")))?;
    let (ptr, len, dtype, _) = interface_parts(obj, ai, what, writable, false)?;
    let count = len / dtype.size();
    let device = match device {
        Some(d) => d,
        None if count == 0 => 0,
        None => accord::gpu::cuda::driver()
            .and_then(|cu| cu.pointer_device(ptr as u64))
            .map_err(|e| {
                crate::errors::to_py(accord::Error::Unsupported(format!(
                    "{what} exports __cuda_array_interface__, but its address {ptr:#x} is not \
                     CUDA memory this process can use, so the GPU backend cannot take it: {e}"
                )))
            })?,
    };
    // CAI `stream`: absent or None: nothing to wait for; 1: the legacy default stream (CUstream
    // 0 in the driver API); 2: the per-thread default stream; else a stream handle.
    let cai_stream = match ai.get_item("stream")? {
        Some(s) if !s.is_none() => match s.extract::<usize>()? {
            1 => 0,
            s => s,
        },
        _ => 0,
    };
    Ok(CudaArray {
        ptr: ptr as u64,
        count,
        dtype,
        device,
        stream: stream.unwrap_or(cai_stream),
        _owner: Owner::Objects(vec![obj.clone().unbind(), ai.clone().into_any().unbind()]),
    })
}

fn from_array_interface(
    obj: &Bound<'_, PyAny>,
    ai: &Bound<'_, PyDict>,
    what: &str,
    writable: bool,
) -> PyResult<HostArray> {
    let (ptr, len, dtype, raw) = interface_parts(obj, ai, what, writable, true)?;
    Ok(HostArray {
        ptr,
        len,
        dtype,
        raw,
        // The dictionary too: an exporter may hand out a temporary that only it keeps alive
        // (numpy's scalars do, under "__ref").
        _owner: Owner::Objects(vec![obj.clone().unbind(), ai.clone().into_any().unbind()]),
    })
}

/// (address, length in bytes, dtype, raw dtype) from an `__array_interface__` or
/// `__cuda_array_interface__` dictionary (same layout). With `raw_ok`, a numpy dtype accord has
/// no type for, but of fixed size and without Python objects, comes back as bytes.
fn interface_parts(
    obj: &Bound<'_, PyAny>,
    ai: &Bound<'_, PyDict>,
    what: &str,
    writable: bool,
    raw_ok: bool,
) -> PyResult<(usize, usize, DataType, Option<Raw>)> {
    let bad = || PyTypeError::new_err(format!("{what}: malformed array interface"));
    let typestr: String = ai.get_item("typestr")?.ok_or_else(bad)?.extract()?;
    let name: Option<String> = obj
        .getattr("dtype")
        .and_then(|d| d.getattr("name"))
        .and_then(|n| n.extract())
        .ok();
    let mut raw = None;
    let dtype = match dtype_from_typestr(&typestr, name.as_deref()) {
        Some(d) => d,
        // A type accord has, in the other byte order: say so, and how to convert.
        None if typestr.starts_with('>')
            && dtype_from_typestr(&typestr[1..], name.as_deref()).is_some() =>
        {
            return Err(PyTypeError::new_err(format!(
                "{what} has dtype {typestr} ({}, big-endian): accord communicates native \
                 (little-endian) byte order only; convert with \
                 {what}.astype({what}.dtype.newbyteorder('='))",
                name.as_deref().unwrap_or("?")
            )))
        }
        None => match raw_ok.then(|| raw_dtype(obj)).flatten() {
            Some(r) => {
                raw = Some(r);
                DataType::U8
            }
            None if typestr.contains('O') => {
                return Err(PyTypeError::new_err(format!(
                    "{what} has dtype object (Python objects, whose addresses mean nothing in \
                     another process): send them with the object calls (broadcast_object, \
                     all_gather_object, send_object, ...)"
                )))
            }
            None => return Err(unsupported_dtype(what, name.as_deref().unwrap_or(&typestr))),
        },
    };
    let esz = raw.as_ref().map_or(dtype.size(), |r| r.itemsize);
    let shape: Vec<i64> = ai.get_item("shape")?.ok_or_else(bad)?.extract()?;
    if let Some(strides) = ai.get_item("strides")? {
        if !strides.is_none() {
            let strides: Vec<i64> = strides.extract()?;
            let el = esz as i64;
            let in_elems: Vec<i64> = strides.iter().map(|s| s / el).collect();
            if strides.iter().any(|s| s % el != 0) || !c_contiguous(&shape, &in_elems) {
                return Err(not_contiguous(what));
            }
        }
    }
    let data = ai.get_item("data")?.ok_or_else(bad)?;
    let data = data.downcast::<PyTuple>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what}: an array interface without a data pointer is not supported"
        ))
    })?;
    let (ptr, ro): (usize, bool) = data.extract()?;
    if writable && ro {
        return Err(read_only(what));
    }
    let offset: usize = match ai.get_item("offset")? {
        Some(o) if !o.is_none() => o.extract()?,
        _ => 0,
    };
    let count: i64 = shape.iter().product();
    Ok((ptr + offset, count.max(0) as usize * esz, dtype, raw))
}

/// The numpy dtype of `obj` as bytes to move, if it has a fixed size and holds no Python
/// objects (whose pointers would mean nothing in another process).
fn raw_dtype(obj: &Bound<'_, PyAny>) -> Option<Raw> {
    let dt = obj.getattr("dtype").ok()?;
    if dt.getattr("hasobject").ok()?.is_truthy().ok()? {
        return None;
    }
    let itemsize: usize = dt.getattr("itemsize").ok()?.extract().ok()?;
    let name: String = dt.getattr("name").ok()?.extract().ok()?;
    (itemsize > 0).then_some(Raw { name, itemsize })
}

/// What keeps a buffer-protocol array's memory valid.
#[derive(Clone, Copy, PartialEq)]
enum Hold {
    /// The view, released on drop under the GIL: exporters such as `bytearray` may move their
    /// memory once no view is held.
    View,
    /// The exporting object only, the view released at once: for `numpy.ndarray`, whose memory
    /// stays put while a reference is held (`resize` refuses then). Dropping needs no GIL, which
    /// matters when the last reference goes on another thread while Python shuts down (taking
    /// the GIL there ends the thread, and unwinding it through Rust aborted the process).
    Object,
}

fn from_buffer(
    obj: &Bound<'_, PyAny>,
    what: &str,
    writable: bool,
    hold: Hold,
) -> PyResult<HostArray> {
    match hold {
        // The view lives as long as the array: on the heap, where its address stays put.
        Hold::View => {
            let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
            get_buffer(obj, &mut view, what)?;
            let owner = Owner::Buffer(view);
            let Owner::Buffer(view) = &owner else {
                unreachable!()
            };
            let (ptr, len, dtype) = describe(view, what, writable)?;
            Ok(HostArray {
                ptr,
                len,
                dtype,
                raw: None,
                _owner: owner,
            })
        }
        // Read and released at once: nothing allocated on the per-call path.
        Hold::Object => {
            let mut view: ffi::Py_buffer = unsafe { std::mem::zeroed() };
            get_buffer(obj, &mut view, what)?;
            let described = describe(&view, what, writable);
            // SAFETY: the view was exported above and is released once.
            unsafe { ffi::PyBuffer_Release(&mut view) };
            let (ptr, len, dtype) = described?;
            Ok(HostArray {
                ptr,
                len,
                dtype,
                raw: None,
                _owner: Owner::Object(obj.clone().unbind()),
            })
        }
    }
}

/// Export `obj`'s buffer, C-contiguous and with its element format, into `view`.
fn get_buffer(obj: &Bound<'_, PyAny>, view: &mut ffi::Py_buffer, what: &str) -> PyResult<()> {
    let flags = ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_FORMAT;
    // SAFETY: `view` is a zeroed Py_buffer the exporter fills.
    if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view, flags) } == 0 {
        return Ok(());
    }
    let err = PyErr::fetch(obj.py());
    Err(
        if err.is_instance_of::<pyo3::exceptions::PyBufferError>(obj.py()) {
            not_contiguous(what)
        } else {
            err
        },
    )
}

/// Address, length in bytes and element type of an exported view.
fn describe(
    view: &ffi::Py_buffer,
    what: &str,
    writable: bool,
) -> PyResult<(usize, usize, DataType)> {
    if writable && view.readonly != 0 {
        return Err(read_only(what));
    }
    let format = if view.format.is_null() {
        std::borrow::Cow::Borrowed("B")
    } else {
        // SAFETY: the exporter's format is a NUL-terminated string that lives with the view.
        unsafe { std::ffi::CStr::from_ptr(view.format) }.to_string_lossy()
    };
    let dtype = dtype_from_typestr(&format, None)
        .filter(|d| d.size() as isize == view.itemsize)
        .ok_or_else(|| unsupported_dtype(what, &format!("(buffer format {format:?})")))?;
    Ok((view.buf as usize, view.len.max(0) as usize, dtype))
}

#[cfg(test)]
mod tests {
    use super::c_contiguous;

    #[test]
    fn contiguity_ignores_unit_axes_and_empty_arrays() {
        assert!(c_contiguous(&[2, 3], &[3, 1]));
        assert!(!c_contiguous(&[2, 3], &[1, 2]));
        assert!(c_contiguous(&[3, 1, 2], &[2, 99, 1]));
        // CuPy's empty arrays have zero strides.
        assert!(c_contiguous(&[0, 8, 2], &[0, 0, 0]));
    }
}
