//! Distributed arrays: a global N-d array split into boxes, one per rank; moving it between
//! layouts (redistribute) and a distributed FFT on top, on host and device memory.

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
