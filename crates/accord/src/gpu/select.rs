//! Which engine runs an operation: an ordered list per communicator, the first that supports
//! the operation wins, and the engine the communicator was created with (NCCL) comes last, as
//! the fallback that runs everything a device communicator offers.
//!
//! A new engine (say, copies through memory mapped between the processes of one host) joins by
//! implementing [`DeviceEngine`] and being built in [`preferred`]; nothing else changes.

use super::engine::{DeviceEngine, LaunchGroup};
use super::link::HostLink;
use super::nccl;
use crate::error::{Error, Result};
use crate::op::Op;
use std::sync::Arc;

/// A communicator's engines, in the order they are tried. Never empty: the last is the
/// fallback, which also runs point-to-point operations and splits.
pub(crate) struct Engines {
    list: Vec<Box<dyn DeviceEngine>>,
}

impl Engines {
    /// `preferred` engines in order, then `fallback`.
    pub fn new(mut preferred: Vec<Box<dyn DeviceEngine>>, fallback: Box<dyn DeviceEngine>) -> Self {
        preferred.push(fallback);
        Engines { list: preferred }
    }

    /// The first engine that supports `op` of `bytes` per rank; the fallback's reason when none
    /// does.
    pub fn pick(&self, op: &Op, bytes: usize) -> Result<&dyn DeviceEngine> {
        let mut why = String::new();
        for e in &self.list {
            match e.supports(op, bytes) {
                Ok(()) => return Ok(e.as_ref()),
                Err(reason) => why = reason,
            }
        }
        Err(Error::Unsupported(why))
    }

    /// The engine the communicator was created with.
    pub fn fallback(&self) -> &dyn DeviceEngine {
        self.list
            .last()
            .expect("a communicator has an engine")
            .as_ref()
    }

    /// Every engine, in order.
    pub fn iter(&self) -> impl Iterator<Item = &dyn DeviceEngine> {
        self.list.iter().map(|e| e.as_ref())
    }

    /// The first asynchronous error any engine reports.
    pub fn async_error(&self) -> Option<Error> {
        self.iter().find_map(|e| e.async_error())
    }
}

/// What an engine's creation hands the neutral layer: the engine and where it sits.
pub(crate) struct Joined {
    pub engine: Box<dyn DeviceEngine>,
    /// The device's primary context (`CUcontext`).
    pub ctx: usize,
    /// Device ordinal in this process.
    pub device: usize,
    pub rank: usize,
    pub size: usize,
    /// Shared by every rank; names the communicator's keys in the store.
    pub id: String,
    /// Whether this process drives several devices of the communicator.
    pub multi: bool,
    /// Host rank of every rank, where known.
    pub host_of: Option<Vec<usize>>,
}

/// How a communicator's ranks find each other.
#[derive(Clone, Copy)]
pub(crate) enum Bootstrap<'a> {
    /// Over the host communicator (collective over it).
    OverHost,
    /// Through an NCCL unique id the caller distributed itself.
    NcclId(&'a nccl::NcclUniqueId),
}

/// Create the fallback engine's communicators over `devices` (one per device; every process
/// passes the same number) for every rank of `host`.
pub(crate) fn open(
    host: &dyn HostLink,
    devices: &[usize],
    how: Bootstrap<'_>,
) -> Result<Vec<Joined>> {
    match how {
        Bootstrap::OverHost => nccl::create(host, devices),
        Bootstrap::NcclId(uid) => nccl::join_with_id(host, uid, devices),
    }
}

/// The engines tried before the fallback on a communicator: none yet.
pub(crate) fn preferred(_host: &Arc<dyn HostLink>, _joined: &Joined) -> Vec<Box<dyn DeviceEngine>> {
    Vec::new()
}

/// The launch groups of the engines' libraries, for [`super::group()`].
pub(crate) fn launch_groups() -> Result<Vec<&'static dyn LaunchGroup>> {
    Ok(vec![nccl::launch_group()?])
}

#[cfg(test)]
mod tests;
