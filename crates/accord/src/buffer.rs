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
//! | [`Parts::new`]`(buffer, &counts)` | the same buffer, laid out in per-rank blocks back to back (the `v` variants) |
//! | [`Parts::with_displs`]`(buffer, &counts, &displs)` | the same buffer, block `i` at element `displs[i]`: in any order, with gaps (MPI's displacements) |
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
//!     // With displacements: rank 1's block first, rank 0's last, gaps left as they were.
//!     let mut spread = vec![9u8; 5];
//!     comm.all_gather(&mine, Parts::with_displs(&mut spread, &[1, 2], &[4, 0])).unwrap();
//!     assert_eq!(spread, [1, 1, 9, 9, 0]);
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
    /// Where each block starts (elements), when not back to back.
    pub(crate) displs: Option<&'a [usize]>,
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
    /// Where each block starts (elements), when not back to back.
    pub(crate) displs: Option<&'a [usize]>,
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
            displs: None,
        }
    }

    /// A device slice, enqueued on `stream`.
    pub fn device(slice: DeviceSlice, stream: Stream) -> Self {
        SendBuf {
            data: SendData::Device(slice, stream),
            dtype: slice.dtype(),
            counts: None,
            displs: None,
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
            displs: None,
        }
    }

    /// A device slice, enqueued on `stream`.
    pub fn device(slice: DeviceSlice, stream: Stream) -> Self {
        RecvBuf {
            data: RecvData::Device(slice, stream),
            dtype: slice.dtype(),
            counts: None,
            displs: None,
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

/// A buffer laid out in per-rank blocks: block `i` holds `counts[i]` elements. Passing one makes
/// the call its variable-size (`v`) variant.
///
/// [`Parts::new`] puts the blocks back to back in rank order; [`Parts::with_displs`] puts block
/// `i` at element `displs[i]` (MPI's displacements): blocks in any order, with gaps, in a buffer
/// that may be longer than the blocks need.
#[derive(Debug)]
pub struct Parts<'a, B> {
    buf: B,
    counts: &'a [usize],
    displs: Option<&'a [usize]>,
}

impl<'a, B> Parts<'a, B> {
    /// `buf` in blocks of `counts` (one entry per rank), back to back in rank order.
    pub fn new(buf: B, counts: &'a [usize]) -> Self {
        Parts::placed(buf, counts, None)
    }

    /// `buf` in blocks of `counts` (one entry per rank), block `i` starting at element
    /// `displs[i]` (one entry per rank): `MPI_Allgatherv`'s `recvcounts` and `displs`.
    ///
    /// Every non-empty block must lie inside the buffer; receive blocks must not overlap (send
    /// blocks may: the same elements can go to several ranks). What lies outside the blocks of
    /// a receive buffer is left as it was. Displacements equal to the running sum of the
    /// counts cost nothing over [`Parts::new`]; others go through a packed copy (on a GPU, a
    /// temporary allocated, filled and freed in the operation's stream order).
    ///
    /// ```
    /// use accord::{testing::run_world, Parts};
    /// run_world(3, |comm| {
    ///     // Rank r sends r + 1 values; they land in reverse rank order with a gap after each.
    ///     let me = comm.rank();
    ///     let mine = vec![me as i32; me + 1];
    ///     let mut out = vec![-1i32; 9];
    ///     let recv = Parts::with_displs(&mut out, &[1, 2, 3], &[7, 4, 0]);
    ///     comm.all_gather(&mine, recv).unwrap();
    ///     assert_eq!(out, [2, 2, 2, -1, 1, 1, -1, 0, -1]);
    /// });
    /// ```
    pub fn with_displs(buf: B, counts: &'a [usize], displs: &'a [usize]) -> Self {
        Parts::placed(buf, counts, Some(displs))
    }

    /// [`Parts::with_displs`] where `displs` is given, [`Parts::new`] where it is `None` (for
    /// bindings whose callers may pass displacements or not).
    pub fn placed(buf: B, counts: &'a [usize], displs: Option<&'a [usize]>) -> Self {
        Parts {
            buf,
            counts,
            displs,
        }
    }
}

impl<'a, B: AsSend<'a>> AsSend<'a> for Parts<'a, B> {
    fn into_send(self) -> SendBuf<'a> {
        SendBuf {
            counts: Some(self.counts),
            displs: self.displs,
            ..self.buf.into_send()
        }
    }
}

impl<'a, B: AsRecv<'a>> AsRecv<'a> for Parts<'a, B> {
    fn into_recv(self) -> RecvBuf<'a> {
        let mut r = self.buf.into_recv();
        r.counts = Some(self.counts);
        r.displs = self.displs;
        r
    }
}

/// Per-rank blocks of a buffer that do not lie back to back (checked against it): block `i` is
/// `counts[i]` elements from element `displs[i]`. An operation runs on a packed copy, block `i`
/// at the sum of the counts before it; these are the copies between the two.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Blocks<'a> {
    pub counts: &'a [usize],
    pub displs: &'a [usize],
}

impl Blocks<'_> {
    /// Elements of the packed copy.
    pub fn total(&self) -> usize {
        self.counts.iter().sum()
    }

    /// The copies between the packed layout and the buffer, in bytes of elements of `esz`:
    /// `(packed offset, buffer offset, length)`, blocks that follow each other in both merged,
    /// empty blocks left out.
    pub fn copies(&self, esz: usize) -> Vec<(usize, usize, usize)> {
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        let mut packed = 0;
        for (&c, &d) in self.counts.iter().zip(self.displs) {
            if c == 0 {
                continue;
            }
            let (p, b, n) = (packed * esz, d * esz, c * esz);
            match runs.last_mut() {
                Some(last) if last.0 + last.2 == p && last.1 + last.2 == b => last.2 += n,
                _ => runs.push((p, b, n)),
            }
            packed += c;
        }
        runs
    }

    /// The blocks of `buf` (elements of `esz` bytes), packed.
    pub fn pack(&self, esz: usize, buf: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; self.total() * esz];
        for (p, b, n) in self.copies(esz) {
            out[p..p + n].copy_from_slice(&buf[b..b + n]);
        }
        out
    }

    /// `packed` into the blocks of `buf`; the rest of `buf` is left as it was.
    pub fn unpack(&self, esz: usize, packed: &[u8], buf: &mut [u8]) {
        for (p, b, n) in self.copies(esz) {
            buf[b..b + n].copy_from_slice(&packed[p..p + n]);
        }
    }
}

/// The sides of a call whose blocks go through a packed copy (see [`Blocks`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Staging<'a> {
    /// The send buffer's blocks, packed before the operation.
    pub send: Option<Blocks<'a>>,
    /// The receive buffer's blocks, filled from a packed copy after it.
    pub recv: Option<Blocks<'a>>,
}

impl Staging<'_> {
    /// Whether either side needs a copy.
    pub fn any(&self) -> bool {
        self.send.is_some() || self.recv.is_some()
    }
}
