//! Moving a distributed array from one layout to another (nvmath's `redistribute`, cuFFTMp's
//! reshape): one alltoallv, with the blocks packed before and unpacked after where they do not
//! already lie back to back in the local arrays.

use super::layout::Region;
use super::subarray::{is_contiguous, offset, BlockCopy};
use super::tiling::Layout;
use crate::buffer::{AsRecv, AsSend, Parts, RecvBuf, RecvData, SendBuf, SendData};
use crate::comm::{Communicator, Completion};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use std::sync::Mutex;

/// A plan moving a distributed array from the `input` layout to the `output` layout: made once
/// from the boxes, executed on any number of arrays of that shape and element type, on the host
/// or (once a GPU is attached to the communicator) on device memory.
///
/// ```
/// use accord::distributed::{Distribution, Redistribute};
/// use accord::testing::run_world;
/// use accord::DataType;
/// // A 4 x 3 matrix split by rows over 2 ranks, redistributed by columns.
/// let cols = run_world(2, |comm| {
///     let (shape, (r, p)) = ([4, 3], (comm.rank(), comm.size()));
///     let rows = Distribution::Slab(0).region(&shape, r, p).unwrap();
///     let cols = Distribution::Slab(1).region(&shape, r, p).unwrap();
///     let plan = Redistribute::new(&comm, &rows, &cols, DataType::I32).unwrap();
///     // Element (i, j) of the global matrix is 10 i + j.
///     let mine: Vec<i32> = (rows.lower[0]..rows.upper[0])
///         .flat_map(|i| (0..3).map(move |j| 10 * i as i32 + j))
///         .collect();
///     let mut out = vec![0i32; cols.volume()];
///     plan.execute(&comm, &mine, &mut out).unwrap();
///     out
/// });
/// assert_eq!(cols[0], [0, 1, 10, 11, 20, 21, 30, 31]); // columns 0 and 1
/// assert_eq!(cols[1], [2, 12, 22, 32]);
/// ```
#[derive(Debug)]
pub struct Redistribute {
    input: Layout,
    output: Layout,
    pub(super) rank: usize,
    pub(super) dtype: DataType,
    pub(super) element: usize,
    pub(super) send: Side,
    pub(super) recv: Side,
    /// Host packing buffers, kept between executions.
    scratch: Mutex<(Vec<u8>, Vec<u8>)>,
}

/// One direction of the exchange: what goes to (or comes from) each peer.
#[derive(Debug)]
pub(crate) struct Side {
    /// Per peer: the copy between the local array and the packed buffer, if any element moves.
    pub(crate) copies: Vec<Option<BlockCopy>>,
    /// Per peer, in units of the plan's dtype.
    pub(crate) counts: Vec<usize>,
    /// The blocks already lie in the local array in rank order, back to back: no packing.
    pub(crate) direct: bool,
    /// Bytes of the packed buffer.
    pub(crate) packed: usize,
}

impl Side {
    /// `mine` is this rank's box, `theirs[j]` peer `j`'s box on the other side; `to_packed`
    /// says whether blocks copy from the local array to the packed buffer (sending) or back.
    fn new(mine: &Region, theirs: &[Region], element: usize, unit: usize, to_packed: bool) -> Side {
        let local = mine.shape();
        let (mut copies, mut counts) = (Vec::new(), Vec::new());
        let (mut packed, mut direct) = (0usize, true);
        for other in theirs {
            let Some(block) = mine.intersect(other) else {
                copies.push(None);
                counts.push(0);
                continue;
            };
            let extent = block.shape();
            let at: Vec<usize> = block
                .lower
                .iter()
                .zip(&mine.lower)
                .map(|(b, m)| b - m)
                .collect();
            direct &= is_contiguous(&local, &extent) && offset(&local, &at) * element == packed;
            let zero = vec![0; extent.len()];
            let mut copy = if to_packed {
                BlockCopy::new(element, &extent, &local, &at, &extent, &zero)
            } else {
                BlockCopy::new(element, &extent, &extent, &zero, &local, &at)
            };
            match to_packed {
                true => copy.dst_offset += packed,
                false => copy.src_offset += packed,
            }
            packed += copy.bytes();
            counts.push(copy.bytes() / unit);
            copies.push(Some(copy));
        }
        Side {
            copies,
            counts,
            direct,
            packed,
        }
    }
}

impl Redistribute {
    /// Plan the move of this rank's `input` box to its `output` box, in elements of `dtype`
    /// (collective: every rank tells its boxes, and every rank checks that each layout tiles
    /// the global array and that all ranks pass the same dtype).
    pub fn new(
        comm: &Communicator,
        input: &Region,
        output: &Region,
        dtype: DataType,
    ) -> Result<Redistribute> {
        Self::with_element(comm, input, output, dtype, dtype.size())
    }

    /// Like [`Redistribute::new`] for elements of `element` bytes moved as `dtype` (a whole
    /// number of them each): a numpy dtype Accord has no type for moves as bytes this way.
    pub fn with_element(
        comm: &Communicator,
        input: &Region,
        output: &Region,
        dtype: DataType,
        element: usize,
    ) -> Result<Redistribute> {
        if input.ndim() != output.ndim() {
            return Err(Error::invalid(format!(
                "redistribute: the input box {input} has {} axes but the output box {output} has {}",
                input.ndim(),
                output.ndim()
            )));
        }
        if element == 0 || !element.is_multiple_of(dtype.size()) {
            return Err(Error::invalid(format!(
                "redistribute: elements of {element} bytes are not a whole number of {dtype}"
            )));
        }
        let from = Layout::gather(comm, input, dtype, element, "redistribute (input boxes)")?;
        let to = Layout::gather(comm, output, dtype, element, "redistribute (output boxes)")?;
        if from.shape() != to.shape() {
            return Err(Error::invalid(format!(
                "redistribute: the input boxes cover a global shape of {:?} but the output \
                 boxes one of {:?}",
                from.shape(),
                to.shape()
            )));
        }
        Ok(Self::from_layouts(comm.rank(), from, to, dtype, element))
    }

    /// The plan for rank `rank` between two layouts every rank already holds (no
    /// communication): how the distributed FFT chains its transposes.
    pub fn from_layouts(
        rank: usize,
        input: Layout,
        output: Layout,
        dtype: DataType,
        element: usize,
    ) -> Redistribute {
        let unit = dtype.size();
        let send = Side::new(input.region(rank), output.regions(), element, unit, true);
        let recv = Side::new(output.region(rank), input.regions(), element, unit, false);
        Redistribute {
            input,
            output,
            rank,
            dtype,
            element,
            send,
            recv,
            scratch: Mutex::new((Vec::new(), Vec::new())),
        }
    }

    /// The input layout.
    pub fn input(&self) -> &Layout {
        &self.input
    }

    /// The output layout.
    pub fn output(&self) -> &Layout {
        &self.output
    }

    /// Shape of this rank's input array.
    pub fn input_shape(&self) -> Vec<usize> {
        self.input.region(self.rank).shape()
    }

    /// Shape of this rank's output array.
    pub fn output_shape(&self) -> Vec<usize> {
        self.output.region(self.rank).shape()
    }

    /// Bytes each side of the exchange moves through this rank, excluding its own block:
    /// (sent, received).
    pub fn bytes_moved(&self) -> (usize, usize) {
        let peers = |s: &Side| {
            s.counts
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != self.rank)
                .map(|(_, c)| c * self.dtype.size())
                .sum()
        };
        (peers(&self.send), peers(&self.recv))
    }

    /// Move `input` (this rank's part of the input layout, C order) into `output` (its part of
    /// the output layout). Host buffers are done when this returns; device buffers (on one
    /// stream) complete on it, like every device operation.
    pub fn execute<'s, 'r>(
        &self,
        comm: &Communicator,
        input: impl AsSend<'s>,
        output: impl AsRecv<'r>,
    ) -> Result<Completion> {
        let (input, output) = (input.into_send(), output.into_recv());
        self.check(&input, &output)?;
        match (input.data, output.data) {
            (SendData::Host(src), RecvData::Host(dst)) => self.host(comm, src, dst),
            (SendData::Device(src, s), RecvData::Device(dst, _)) => self.device(comm, src, dst, s),
            _ => Err(Error::invalid(
                "redistribute: the input and the output must both be in host memory or both in \
                 device memory",
            )),
        }
    }

    fn check(&self, input: &SendBuf<'_>, output: &RecvBuf<'_>) -> Result<()> {
        for (what, dtype, bytes, shape) in [
            ("input", input.dtype, input.byte_len(), self.input_shape()),
            (
                "output",
                output.dtype,
                output.byte_len(),
                self.output_shape(),
            ),
        ] {
            if dtype != self.dtype {
                return Err(Error::invalid(format!(
                    "redistribute: the {what} holds {dtype} but the plan was made for {}",
                    self.dtype
                )));
            }
            let want = shape.iter().product::<usize>() * self.element;
            if bytes != want {
                return Err(Error::invalid(format!(
                    "redistribute: rank {}'s {what} has {bytes} bytes but its box {shape:?} of \
                     {}-byte elements needs {want}",
                    self.rank, self.element
                )));
            }
        }
        Ok(())
    }

    fn host(&self, comm: &Communicator, src: &[u8], dst: &mut [u8]) -> Result<Completion> {
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let (packed_send, packed_recv) = &mut *scratch;
        let send: &[u8] = if self.send.direct {
            src
        } else {
            packed_send.resize(self.send.packed, 0);
            for c in self.send.copies.iter().flatten() {
                c.host(src, packed_send);
            }
            packed_send
        };
        let direct_recv = self.recv.direct;
        if !direct_recv {
            packed_recv.resize(self.recv.packed, 0);
        }
        let recv: &mut [u8] = if direct_recv {
            &mut *dst
        } else {
            &mut packed_recv[..]
        };
        comm.all_to_all(
            Parts::new(SendBuf::bytes(send, self.dtype), &self.send.counts),
            Parts::new(RecvBuf::bytes(recv, self.dtype), &self.recv.counts),
        )?;
        if !direct_recv {
            for c in self.recv.copies.iter().flatten() {
                c.host(packed_recv, dst);
            }
        }
        Ok(Completion::done())
    }
}
