//! From a Python array object to a host memory range plus a [`DataType`].
//!
//! One entry point, [`extract`], looks at an object in this order:
//!
//! 1. `__cuda_array_interface__`, or DLPack with a non-CPU device: a device array. Device memory
//!    is the GPU backend's business; [`Array::Device`] is the single place where such arrays will
//!    be routed to it. Until then they are refused with `accord.UnsupportedError`.
//! 2. `__dlpack__` (numpy, torch, jax, cupy on the host...): the zero-copy standard.
//! 3. `__array_interface__` (numpy-likes, including read-only arrays, which DLPack cannot export,
//!    and `ml_dtypes.bfloat16`, which it does not know).
//! 4. The buffer protocol (`memoryview`, `bytearray`, `array.array`).
//!
//! The memory must be C-contiguous; outputs must be writable. Whatever keeps the memory alive
//! (the DLPack capsule, the exporting object, the `Py_buffer`) travels with the [`HostArray`].

use accord::DataType;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
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
const KDL_CUDA_HOST: i32 = 3;

/// Keeps an exported array's memory valid.
enum Owner {
    /// The exporting object (and, for DLPack, its capsule: dropping it frees the export).
    Objects(#[allow(dead_code)] Vec<PyObject>),
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
    _owner: Owner,
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

/// What [`extract`] found.
pub enum Array {
    Host(HostArray),
    /// Memory on an accelerator: (device kind, device id). Routed to the GPU backend once it
    /// exists.
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
        _ => return None,
    })
}

const DTYPES: &str =
    "float16, bfloat16, float32, float64, int8, int32, int64, uint8, uint32, uint64";

fn unsupported_dtype(what: &str, desc: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "{what} has dtype {desc}, which accord cannot communicate; supported: {DTYPES}"
    ))
}

/// Whether (shape, strides in elements) describe a C-contiguous layout.
fn c_contiguous(shape: &[i64], strides: &[i64]) -> bool {
    let mut expect = 1i64;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n == 0 {
            return true;
        }
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
    // 1. Device arrays.
    if obj.hasattr("__cuda_array_interface__")? {
        return Ok(Array::Device("cuda", 0));
    }
    if obj.hasattr("__dlpack_device__")? {
        if let Ok(dev) = obj.call_method0("__dlpack_device__") {
            if let Ok((kind, id)) = dev.extract::<(i32, i32)>() {
                if kind != KDL_CPU && kind != KDL_CUDA_HOST {
                    let name = match kind {
                        2 => "cuda",
                        10 => "rocm",
                        _ => "device",
                    };
                    return Ok(Array::Device(name, id));
                }
            }
        }
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
        return from_buffer(obj, what, writable).map(Array::Host);
    }
    Err(PyTypeError::new_err(format!(
        "{what} must be an array (numpy, torch, or any object with __dlpack__, \
         __array_interface__ or the buffer protocol), not {}",
        type_name(obj)
    )))
}

fn from_dlpack(
    obj: &Bound<'_, PyAny>,
    cap: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<Option<HostArray>> {
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
    if t.device.device_type != KDL_CPU && t.device.device_type != KDL_CUDA_HOST {
        return Err(PyErr::from_value_bound(
            crate::errors::unsupported_device(obj.py(), what, "device", t.device.device_id)?
                .into_any(),
        ));
    }
    let dtype = dtype_from_dlpack(t.dtype).ok_or_else(|| {
        let d = t.dtype;
        unsupported_dtype(
            what,
            &format!(
                "(DLPack code {}, {} bits, {} lanes)",
                d.code, d.bits, d.lanes
            ),
        )
    })?;
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
    let base = t.data as usize + t.byte_offset as usize;
    Ok(Some(HostArray {
        ptr: base,
        len: count.max(0) as usize * dtype.size(),
        dtype,
        _owner: Owner::Objects(vec![obj.clone().unbind(), cap.clone().unbind()]),
    }))
}

fn from_array_interface(
    obj: &Bound<'_, PyAny>,
    ai: &Bound<'_, PyDict>,
    what: &str,
    writable: bool,
) -> PyResult<HostArray> {
    let bad = || PyTypeError::new_err(format!("{what}: malformed __array_interface__"));
    let typestr: String = ai.get_item("typestr")?.ok_or_else(bad)?.extract()?;
    let name: Option<String> = obj
        .getattr("dtype")
        .and_then(|d| d.getattr("name"))
        .and_then(|n| n.extract())
        .ok();
    let dtype = dtype_from_typestr(&typestr, name.as_deref())
        .ok_or_else(|| unsupported_dtype(what, name.as_deref().unwrap_or(&typestr)))?;
    let shape: Vec<i64> = ai.get_item("shape")?.ok_or_else(bad)?.extract()?;
    if let Some(strides) = ai.get_item("strides")? {
        if !strides.is_none() {
            let strides: Vec<i64> = strides.extract()?;
            let el = dtype.size() as i64;
            let in_elems: Vec<i64> = strides.iter().map(|s| s / el).collect();
            if strides.iter().any(|s| s % el != 0) || !c_contiguous(&shape, &in_elems) {
                return Err(not_contiguous(what));
            }
        }
    }
    let data = ai.get_item("data")?.ok_or_else(bad)?;
    let data = data.downcast::<PyTuple>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what}: __array_interface__ without a data pointer is not supported"
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
    Ok(HostArray {
        ptr: ptr + offset,
        len: count.max(0) as usize * dtype.size(),
        dtype,
        _owner: Owner::Objects(vec![obj.clone().unbind()]),
    })
}

fn from_buffer(obj: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<HostArray> {
    let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
    let flags = ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_FORMAT;
    if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } != 0 {
        let err = PyErr::fetch(obj.py());
        return Err(
            if err.is_instance_of::<pyo3::exceptions::PyBufferError>(obj.py()) {
                not_contiguous(what)
            } else {
                err
            },
        );
    }
    let owner = Owner::Buffer(view);
    let Owner::Buffer(view) = &owner else {
        unreachable!()
    };
    if writable && view.readonly != 0 {
        return Err(read_only(what));
    }
    let format = if view.format.is_null() {
        "B".to_string()
    } else {
        unsafe { std::ffi::CStr::from_ptr(view.format) }
            .to_string_lossy()
            .into_owned()
    };
    let dtype = dtype_from_typestr(&format, None)
        .filter(|d| d.size() as isize == view.itemsize)
        .ok_or_else(|| unsupported_dtype(what, &format!("(buffer format {format:?})")))?;
    Ok(HostArray {
        ptr: view.buf as usize,
        len: view.len.max(0) as usize,
        dtype,
        _owner: owner,
    })
}
