//! Distributed arrays: a global N-d array split into boxes, one per rank; moving it between
//! layouts (redistribute) and a distributed FFT on top, on host and device memory.

pub mod device;
pub mod lines;
