//! The buffers an operation reads and writes, in host or device memory.
//!
//! Memory kind is a property of the buffer, not of the communicator: every operation of
//! [`crate::Communicator`] takes its send side as anything that is [`AsSend`] and its receive
//! side as anything that is [`AsRecv`]:
//!
//! | argument | memory |
//! |---|---|
//! | `&[T]`, `&Vec<T>`, `&[T; N]` / `&mut` of those | host, typed (`T: Element`) |
//! | [`SendBuf::bytes`] / [`RecvBuf::bytes`] | host, erased (bytes and a [`DataType`]) |
//! | `&DeviceBuffer<T>` / `&mut DeviceBuffer<T>`, [`DeviceSlice`] (on the communicator's stream), [`SendBuf::device`] / [`RecvBuf::device`] (on a stream you name) | GPU |
//! | [`Parts::new`]`(buffer, &counts)` | the same buffer, laid out in per-rank blocks (the `v` variants) |
//!
//! Reducing and broadcasting operations take one [`AsInOut`] argument: a receive buffer alone
//! works in place; a `(send, recv)` pair works out of place.
//!
//! ```
//! use accord::{testing::run_world, Parts, ReduceOp};
//! run_world(2, |comm| {
//!     let mut v = vec![1.0f32; 4];
//!     comm.all_reduce(&mut v, ReduceOp::Sum).unwrap(); // in place
//!     let mut out = vec![0.0f32; 4];
//!     comm.all_reduce((&v, &mut out), ReduceOp::Max).unwrap(); // out of place
//!     // Rank i contributes i + 1 elements; everyone gets all three.
//!     let mine = vec![comm.rank() as u8; comm.rank() + 1];
//!     let mut all = vec![0u8; 3];
//!     comm.all_gather(&mine, Parts::new(&mut all, &[1, 2])).unwrap();
//!     assert_eq!(all, [0, 1, 1]);
//! });
//! ```

use crate::dtype::{as_bytes, as_bytes_mut, DataType, Element};
use crate::gpu::{DeviceBuffer, DeviceSlice, Stream};
use crate::op::Extent;

/// Where a buffer's elements live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Host memory.
    Host,
    /// GPU memory; the operation is enqueued on `stream`.
    Device(Stream),
}

/// A buffer an operation reads: host bytes or a device slice, with its element type and
/// optionally its per-rank layout.
#[derive(Debug, Clone, Copy)]
pub struct SendBuf<'a> {
    pub(crate) data: SendData<'a>,
    pub(crate) dtype: DataType,
    pub(crate) counts: Option<&'a [usize]>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum SendData<'a> {
    Host(&'a [u8]),
    Device(DeviceSlice, Stream),
}

/// A buffer an operation writes: host bytes or a device slice, with its element type and
/// optionally its per-rank layout.
#[derive(Debug)]
pub struct RecvBuf<'a> {
    pub(crate) data: RecvData<'a>,
    pub(crate) dtype: DataType,
    pub(crate) counts: Option<&'a [usize]>,
}

#[derive(Debug)]
pub(crate) enum RecvData<'a> {
    Host(&'a mut [u8]),
    Device(DeviceSlice, Stream),
}

impl<'a> SendBuf<'a> {
    /// Host bytes holding elements of `dtype` (the length must be a whole number of them).
    pub fn bytes(data: &'a [u8], dtype: DataType) -> Self {
        SendBuf {
            data: SendData::Host(data),
            dtype,
            counts: None,
        }
    }

    /// A device slice, enqueued on `stream`.
    pub fn device(slice: DeviceSlice, stream: Stream) -> Self {
        SendBuf {
            data: SendData::Device(slice, stream),
            dtype: slice.dtype(),
            counts: None,
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Where the elements live.
    pub fn memory(&self) -> Memory {
        match self.data {
            SendData::Host(_) => Memory::Host,
            SendData::Device(_, s) => Memory::Device(s),
        }
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        match self.data {
            SendData::Host(b) => b.len(),
            SendData::Device(d, _) => d.bytes(),
        }
    }

    pub(crate) fn extent(&self) -> Extent<'a> {
        Extent {
            // Element sizes are powers of two: a shift, not a division, on every call.
            len: self.byte_len() >> self.dtype.size().trailing_zeros(),
            counts: self.counts,
        }
    }
}

impl<'a> RecvBuf<'a> {
    /// Host bytes to hold elements of `dtype` (the length must be a whole number of them).
    pub fn bytes(data: &'a mut [u8], dtype: DataType) -> Self {
        RecvBuf {
            data: RecvData::Host(data),
            dtype,
            counts: None,
        }
    }

    /// A device slice, enqueued on `stream`.
    pub fn device(slice: DeviceSlice, stream: Stream) -> Self {
        RecvBuf {
            data: RecvData::Device(slice, stream),
            dtype: slice.dtype(),
            counts: None,
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Where the elements live.
    pub fn memory(&self) -> Memory {
        match self.data {
            RecvData::Host(_) => Memory::Host,
            RecvData::Device(_, s) => Memory::Device(s),
        }
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        match &self.data {
            RecvData::Host(b) => b.len(),
            RecvData::Device(d, _) => d.bytes(),
        }
    }

    pub(crate) fn extent(&self) -> Extent<'a> {
        Extent {
            // Element sizes are powers of two: a shift, not a division, on every call.
            len: self.byte_len() >> self.dtype.size().trailing_zeros(),
            counts: self.counts,
        }
    }
}

/// Anything an operation can read from.
pub trait AsSend<'a> {
    /// The erased buffer.
    fn into_send(self) -> SendBuf<'a>;
}

/// Anything an operation can write into.
pub trait AsRecv<'a> {
    /// The erased buffer.
    fn into_recv(self) -> RecvBuf<'a>;
}

/// The buffer argument of operations that can work in place: a receive buffer alone (in place:
/// it holds this rank's input and receives the result) or a `(send, recv)` pair.
pub trait AsInOut<'a> {
    /// The send buffer (`None` in place) and the receive buffer.
    fn into_in_out(self) -> (Option<SendBuf<'a>>, RecvBuf<'a>);
}

impl<'a> AsSend<'a> for SendBuf<'a> {
    fn into_send(self) -> SendBuf<'a> {
        self
    }
}

impl<'a> AsRecv<'a> for RecvBuf<'a> {
    fn into_recv(self) -> RecvBuf<'a> {
        self
    }
}

impl<'a, T: Element> AsSend<'a> for &'a [T] {
    fn into_send(self) -> SendBuf<'a> {
        SendBuf::bytes(as_bytes(self), T::DTYPE)
    }
}

impl<'a, T: Element> AsSend<'a> for &'a Vec<T> {
    fn into_send(self) -> SendBuf<'a> {
        self.as_slice().into_send()
    }
}

impl<'a, T: Element, const N: usize> AsSend<'a> for &'a [T; N] {
    fn into_send(self) -> SendBuf<'a> {
        self.as_slice().into_send()
    }
}

impl<'a, T: Element> AsRecv<'a> for &'a mut [T] {
    fn into_recv(self) -> RecvBuf<'a> {
        RecvBuf::bytes(as_bytes_mut(self), T::DTYPE)
    }
}

impl<'a, T: Element> AsRecv<'a> for &'a mut Vec<T> {
    fn into_recv(self) -> RecvBuf<'a> {
        self.as_mut_slice().into_recv()
    }
}

impl<'a, T: Element, const N: usize> AsRecv<'a> for &'a mut [T; N] {
    fn into_recv(self) -> RecvBuf<'a> {
        self.as_mut_slice().into_recv()
    }
}

/// A device slice on the communicator's own stream.
impl<'a> AsSend<'a> for DeviceSlice {
    fn into_send(self) -> SendBuf<'a> {
        SendBuf::device(self, Stream::Comm)
    }
}

/// A device slice on the communicator's own stream.
impl<'a> AsRecv<'a> for DeviceSlice {
    fn into_recv(self) -> RecvBuf<'a> {
        RecvBuf::device(self, Stream::Comm)
    }
}

/// A device allocation on the communicator's own stream.
impl<'a, T: Element> AsSend<'a> for &'a DeviceBuffer<T> {
    fn into_send(self) -> SendBuf<'a> {
        self.slice().into_send()
    }
}

/// A device allocation on the communicator's own stream.
impl<'a, T: Element> AsRecv<'a> for &'a mut DeviceBuffer<T> {
    fn into_recv(self) -> RecvBuf<'a> {
        self.slice().into_recv()
    }
}

impl<'a, R: AsRecv<'a>> AsInOut<'a> for R {
    fn into_in_out(self) -> (Option<SendBuf<'a>>, RecvBuf<'a>) {
        (None, self.into_recv())
    }
}

impl<'a, S: AsSend<'a>, R: AsRecv<'a>> AsInOut<'a> for (S, R) {
    fn into_in_out(self) -> (Option<SendBuf<'a>>, RecvBuf<'a>) {
        (Some(self.0.into_send()), self.1.into_recv())
    }
}

/// A buffer laid out in per-rank blocks: block `i` holds `counts[i]` elements, blocks back to
/// back in rank order. Passing one makes the call its variable-size (`v`) variant.
#[derive(Debug)]
pub struct Parts<'a, B> {
    buf: B,
    counts: &'a [usize],
}

impl<'a, B> Parts<'a, B> {
    /// `buf` in blocks of `counts` (one entry per rank).
    pub fn new(buf: B, counts: &'a [usize]) -> Self {
        Parts { buf, counts }
    }
}

impl<'a, B: AsSend<'a>> AsSend<'a> for Parts<'a, B> {
    fn into_send(self) -> SendBuf<'a> {
        SendBuf {
            counts: Some(self.counts),
            ..self.buf.into_send()
        }
    }
}

impl<'a, B: AsRecv<'a>> AsRecv<'a> for Parts<'a, B> {
    fn into_recv(self) -> RecvBuf<'a> {
        let mut r = self.buf.into_recv();
        r.counts = Some(self.counts);
        r
    }
}
