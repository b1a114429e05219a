//! # Accord
//!
//! Collective communication for distributed CPUs and GPUs.
#![warn(missing_docs)]

pub mod auth;
pub mod dtype;
pub mod error;
pub mod fingerprint;
pub mod rendezvous;
pub mod schedule;
pub mod transport;

pub use dtype::{DataType, Element, ReduceOp};
pub use error::{Error, Result};
pub mod comm;
mod exec;
pub mod testing;

pub use comm::{Communicator, Request};
