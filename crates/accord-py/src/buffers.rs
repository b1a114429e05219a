//! One call's arrays as the core's buffers.
//!
//! Every array argument is extracted once ([`buf`]) into a [`Buf`]: host memory or CUDA memory,
//! with its element type. An operation then turns its `Buf`s into [`SendBuf`]s and [`RecvBuf`]s
//! ([`Buf::send`], [`Buf::recv`]) and calls the one core method, which runs host buffers on the
//! host engines and device buffers on the GPU engine attached to the communicator. [`Call`]
//! checks what the core cannot say in Python's terms: host and CUDA arrays mixed in one call
//! (`TypeError`), CUDA arrays on two devices (`ValueError`), input and output of different
//! dtypes (`TypeError`).

use crate::array::{self, Array, CudaArray, HostArray};
use crate::errors;
use crate::scalar::{Arg, Output};
use accord::gpu::{DeviceSlice, Stream};
use accord::{DataType, RecvBuf, SendBuf};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// One array argument: host memory, or CUDA memory for the GPU engine.
pub(crate) enum Buf {
    Host(HostArray),
    Cuda(CudaArray),
}

impl Buf {
    pub(crate) fn dtype(&self) -> DataType {
        match self {
            Buf::Host(a) => a.dtype,
            Buf::Cuda(a) => a.dtype,
        }
    }

    pub(crate) fn is_host(&self) -> bool {
        matches!(self, Buf::Host(_))
    }

    /// The numpy dtype this array moves as bytes, if accord has no type for it.
    pub(crate) fn raw(&self) -> Option<&array::Raw> {
        match self {
            Buf::Host(a) => a.raw.as_ref(),
            Buf::Cuda(_) => None,
        }
    }

    /// Per-rank counts in the caller's elements as counts of this array's core elements (bytes,
    /// for a dtype moved as bytes).
    pub(crate) fn counts(&self, counts: &[usize]) -> Vec<usize> {
        let unit = self.raw().map_or(1, |r| r.itemsize);
        counts.iter().map(|c| c * unit).collect()
    }

    /// The dtype as messages name it: numpy's name where it moves as bytes.
    fn dtype_name(&self) -> String {
        match self.raw() {
            Some(r) => r.name.clone(),
            None => self.dtype().to_string(),
        }
    }

    /// The array as the buffer an operation reads.
    ///
    /// # Safety
    /// The array's memory stays valid and unwritten while the operation reads it (host: until
    /// the call returns; CUDA: until the operation has completed on its stream).
    pub(crate) unsafe fn send(&self) -> SendBuf<'_> {
        match self {
            Buf::Host(a) => SendBuf::bytes(a.bytes(), a.dtype),
            Buf::Cuda(a) => SendBuf::device(slice(a), Stream::Raw(a.stream)),
        }
    }

    /// The array as the buffer an operation writes.
    ///
    /// # Safety
    /// As for [`Buf::send`], and the array was extracted writable and no other buffer of the
    /// call aliases it.
    pub(crate) unsafe fn recv(&self) -> RecvBuf<'_> {
        match self {
            Buf::Host(a) => RecvBuf::bytes(a.bytes_mut(), a.dtype),
            Buf::Cuda(a) => RecvBuf::device(slice(a), Stream::Raw(a.stream)),
        }
    }

    /// An empty buffer to read, in the same memory as this array: what a rank passes where the
    /// operation reads nothing from it (scatter's input off the root).
    pub(crate) fn empty_send(&self) -> SendBuf<'static> {
        match self {
            Buf::Host(a) => SendBuf::bytes(&[], a.dtype),
            Buf::Cuda(a) => SendBuf::device(DeviceSlice::empty(a.dtype), Stream::Raw(a.stream)),
        }
    }

    /// An empty buffer to write, in the same memory as this array: what a rank passes where the
    /// operation writes nothing to it (gather's and reduce's output off the root).
    pub(crate) fn empty_recv(&self) -> RecvBuf<'static> {
        match self {
            Buf::Host(a) => RecvBuf::bytes(&mut [], a.dtype),
            Buf::Cuda(a) => RecvBuf::device(DeviceSlice::empty(a.dtype), Stream::Raw(a.stream)),
        }
    }
}

/// # Safety
/// The array's export is live (see [`Buf::send`]).
unsafe fn slice(a: &CudaArray) -> DeviceSlice {
    DeviceSlice::from_raw(a.ptr, a.count, a.dtype)
}

/// The memory of `obj` (`what` names the argument in messages). Devices other than CUDA are
/// refused.
pub(crate) fn buf(obj: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<Buf> {
    match array::extract(obj, what, writable)? {
        Array::Host(a) => Ok(Buf::Host(a)),
        Array::Cuda(a) => Ok(Buf::Cuda(a)),
        Array::Device(kind, id) => Err(PyErr::from_value(
            errors::unsupported_device(obj.py(), what, kind, id)?.into_any(),
        )),
    }
}

pub(crate) fn same_dtype(a: &Buf, b: &Buf, what: &str) -> PyResult<()> {
    if a.dtype() != b.dtype() || a.raw() != b.raw() {
        return Err(PyTypeError::new_err(format!(
            "{what}: input has dtype {} but output has dtype {}; they must match",
            a.dtype_name(),
            b.dtype_name()
        )));
    }
    Ok(())
}

/// Input (read) and output (written) of one call, with matching dtypes.
pub(crate) fn pair(arr: &Arg<'_>, out: &Arg<'_>, what: &str) -> PyResult<(Buf, Buf)> {
    let a = buf(&arr.obj, "arr", false)?;
    let o = buf(&out.obj, "out", true)?;
    same_dtype(&a, &o, what)?;
    Ok((a, o))
}

/// CUDA arrays carry no message tags (NCCL matches sends and receives in call order).
pub(crate) fn no_gpu_tag(bufs: &[&Buf], tag: u32, what: &str) -> PyResult<()> {
    if tag != 0 && bufs.iter().any(|b| matches!(b, Buf::Cuda(_))) {
        return Err(PyValueError::new_err(format!(
            "{what}: tags are not supported for CUDA arrays (NCCL matches sends and receives \
             in call order); pass tag=0"
        )));
    }
    Ok(())
}

pub(crate) fn obj(o: &Bound<'_, PyAny>) -> PyObject {
    o.clone().unbind()
}

/// What a call keeps alive: for a nonblocking call its arrays, until it completes; a blocking
/// one needs nothing, its caller's references outlive it.
pub(crate) fn kept<const N: usize>(async_op: bool, objs: [&Bound<'_, PyAny>; N]) -> Vec<PyObject> {
    if async_op {
        objs.iter().map(|o| obj(o)).collect()
    } else {
        Vec::new()
    }
}

/// One call: its name, mode and arrays (named as in messages), what it returns and keeps alive.
pub(crate) struct Call {
    pub op: &'static str,
    pub async_op: bool,
    /// A collective: a nonblocking one takes its place in the communicator's order at call
    /// time. Point-to-point calls take theirs among the messages instead (`post_send`).
    pub ordered: bool,
    pub bufs: Vec<(&'static str, Buf)>,
    pub output: Option<Output>,
    pub keep: Vec<PyObject>,
}

/// The operations that reduce: arrays moved as bytes cannot take part.
const REDUCING: [&str; 6] = [
    "allreduce",
    "reduce",
    "reduce_scatter",
    "reduce_scatterv",
    "scan",
    "exscan",
];

impl Call {
    /// TypeError if the call reduces arrays of a dtype accord only moves as bytes.
    pub(crate) fn check_reducible(&self) -> PyResult<()> {
        // Raw arrays first: rare, and cheaper to rule out than the name on every call.
        let Some((w, r)) = self.bufs.iter().find_map(|(w, b)| Some((w, b.raw()?))) else {
            return Ok(());
        };
        match REDUCING.contains(&self.op) {
            true => Err(PyTypeError::new_err(format!(
                "{}: `{w}` has dtype {}, which accord moves as bytes but cannot reduce; \
                 supported for reductions: {}",
                self.op,
                r.name,
                array::DTYPES
            ))),
            false => Ok(()),
        }
    }

    /// A collective on one array, in place.
    pub(crate) fn one(op: &'static str, async_op: bool, a: Buf, arr: &Arg<'_>) -> Call {
        Call {
            op,
            async_op,
            ordered: true,
            bufs: vec![("arr", a)],
            output: Some(arr.output()),
            keep: kept(async_op, [&arr.obj]),
        }
    }

    /// A collective of one input and one output.
    pub(crate) fn two(
        op: &'static str,
        async_op: bool,
        bufs: (Buf, Buf),
        args: [&Arg<'_>; 2],
    ) -> Call {
        Call {
            op,
            async_op,
            ordered: true,
            bufs: vec![("arr", bufs.0), ("out", bufs.1)],
            output: Some(args[1].output()),
            keep: kept(async_op, [&args[0].obj, &args[1].obj]),
        }
    }

    /// The CUDA device the call runs on (`None`: host memory). Host and CUDA arrays in one call
    /// are a TypeError, CUDA arrays on two devices a ValueError. Every array of a CUDA call is
    /// put on the first one's stream, the framework's current stream.
    pub(crate) fn device(&mut self) -> PyResult<Option<usize>> {
        let host = self.bufs.iter().find(|(_, b)| matches!(b, Buf::Host(_)));
        let cuda = self.bufs.iter().find_map(|(w, b)| match b {
            Buf::Cuda(a) => Some((*w, a)),
            Buf::Host(_) => None,
        });
        let (first, a0) = match (host, cuda) {
            (_, None) => return Ok(None),
            (Some((h, _)), Some((c, ca))) => {
                return Err(PyTypeError::new_err(format!(
                    "{}: `{c}` is in CUDA memory (device {}) but `{h}` is in host memory; pass \
                     all arrays of one call on the same device (e.g. tensor.cuda() or \
                     tensor.cpu())",
                    self.op, ca.device
                )))
            }
            (None, Some(c)) => c,
        };
        let (device, stream) = (a0.device, a0.stream);
        for (w, b) in &mut self.bufs {
            let Buf::Cuda(a) = b else { continue };
            if a.device != device {
                return Err(PyValueError::new_err(format!(
                    "{}: `{first}` is on CUDA device {device} but `{w}` on device {}; pass all \
                     arrays of one call on the same device",
                    self.op, a.device
                )));
            }
            a.stream = stream;
        }
        Ok(Some(device))
    }
}
