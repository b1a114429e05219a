//! Distributed arrays: a global N-d array split into boxes, one per rank; moving it between
//! layouts (redistribute) and a distributed FFT on top, on host and device memory.
//!
//! - [`Region`]: one rank's box (`lower..upper` per axis, possibly empty); [`Distribution`]
//!   hands them out (slabs, process grids). [`Layout`] is every rank's box together, checked
//!   to tile the global array (gaps and overlaps name the ranks).
//! - [`Redistribute`]: a plan moving an array from one layout to another: the intersections of
//!   this rank's input box with every output box, packed where they are strided
//!   (block copies: whole axes merge into one contiguous run), one alltoallv, unpacked.
//! - [`DistributedFft`]: stages of local 1-D transforms ([`LineTransform`], rustfft on the host,
//!   cuFFT on the GPU) along the axes a rank holds whole, and redistributions making the next
//!   axes whole ([`fft`] explains the choice). Real-to-complex and complex-to-real, both
//!   precisions, numpy's normalisations ([`Norm`]).
//!
//! Device buffers run on the caller's stream: packing with 3-D copies, the device engine's
//! alltoallv, cuFFT; the returned [`crate::Completion`] covers the whole operation. The guide
//! is `docs/distributed.md`.

pub mod device;
pub mod fft;
mod fft_device;
mod host_lines;
pub mod layout;
pub mod lines;
pub mod redistribute;
mod redistribute_device;
mod subarray;
pub mod tiling;

pub use fft::{Direction, DistributedFft, FftKind, Norm};
pub use layout::{Distribution, Region};
pub use lines::{LineKind, LineTransform, Precision};
pub use redistribute::Redistribute;
pub use tiling::Layout;
