//! Which engine runs an operation: an ordered list per communicator, the first that supports
//! the operation wins, and the engine the communicator was created with (NCCL) comes last, as
//! the fallback that runs everything a device communicator offers.
//!
//! A new engine (say, copies through memory mapped between the processes of one host) joins by
//! implementing [`DeviceEngine`] and being built in [`preferred`]; nothing else changes.

use super::device::DeviceSlice;
use super::engine::{DeviceEngine, LaunchGroup};
use super::link::HostLink;
use super::nccl;
use super::own;
use crate::config::GpuEngine;
use crate::error::{Error, Result};
use crate::op::Op;
use std::sync::Arc;

/// A communicator's engines, in the order they are tried. Never empty: the last is the
/// fallback, which also runs point-to-point operations and splits.
pub(crate) struct Engines {
    list: Vec<Box<dyn DeviceEngine>>,
    /// What `ACCORD_EXPLAIN` has already printed.
    explained: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Engines {
    /// `preferred` engines in order, then `fallback`.
    pub fn new(mut preferred: Vec<Box<dyn DeviceEngine>>, fallback: Box<dyn DeviceEngine>) -> Self {
        preferred.push(fallback);
        Engines {
            list: preferred,
            explained: Default::default(),
        }
    }

    /// Whether some engine takes this call's arrays zero-copy
    /// ([`DeviceEngine::heap_arrays`]).
    pub fn heap_arrays(&self, op: &Op, send: Option<DeviceSlice>, recv: DeviceSlice) -> bool {
        self.list.len() > 1 && self.list.iter().any(|e| e.heap_arrays(op, send, recv))
    }

    /// The first engine that supports `op` (`heap`: on symmetric-heap arrays), with its place
    /// in the list; the fallback's reason when none does. With `ACCORD_EXPLAIN=1`, rank 0
    /// prints each choice (once per kind of call and engine) and why the engines before it
    /// declined.
    pub fn pick(&self, op: &Op, heap: bool, rank: usize) -> Result<(usize, &dyn DeviceEngine)> {
        // The common path asks yes or no; reasons are built only to be shown.
        let Some(i) = self.list.iter().position(|e| e.accepts(op, heap)) else {
            let why = self.fallback().supports(op, heap).err().unwrap_or_default();
            return Err(Error::Unsupported(why));
        };
        let engine = self.list[i].as_ref();
        if rank == 0 && crate::config::get().explain {
            let declined: Vec<String> = self.list[..i]
                .iter()
                .map(|e| {
                    format!(
                        "{}: {}",
                        e.name(),
                        e.supports(op, heap).err().unwrap_or_default()
                    )
                })
                .collect();
            self.explain(op, heap, engine, &declined);
        }
        Ok((i, engine))
    }

    fn explain(&self, op: &Op, heap: bool, engine: &dyn DeviceEngine, declined: &[String]) {
        let how = match heap {
            true => format!("{} (on symmetric-heap arrays)", engine.explain(op)),
            false => engine.explain(op),
        };
        let key = format!("{}/{}/{how}", op.kind(), op.dtype);
        let mut seen = self.explained.lock().unwrap_or_else(|e| e.into_inner());
        if seen.insert(key) {
            let not = match declined.is_empty() {
                true => String::new(),
                false => format!(" (not {})", declined.join("; ")),
            };
            eprintln!(
                "accord explain: gpu {} of {} B: {how}{not}",
                op.fp,
                op.bytes()
            );
        }
    }

    /// A failure some engine's kernels recorded on the device.
    pub fn device_fault(&self) -> Option<Error> {
        self.iter().find_map(|e| e.device_fault())
    }

    /// The engine the communicator was created with.
    /// How many engines there are.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// The name of the engine at `at` in the list.
    pub fn name_at(&self, at: usize) -> &'static str {
        self.list.get(at).map_or("?", |e| e.name())
    }

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
    /// Engines tried before `engine`, in order.
    pub preferred: Vec<Box<dyn DeviceEngine>>,
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

/// Create the communicators over `devices` (one per device; every process passes the same
/// number) for every rank of `host`, each with its engines: NCCL as the fallback and, with one
/// device per process on one host, Accord's kernels before it (see [`own`]). Where NCCL cannot
/// run (not installed, or ranks sharing a GPU) but Accord's kernels can, they are the only
/// engine.
pub(crate) fn open(
    host: &Arc<dyn HostLink>,
    devices: &[usize],
    how: Bootstrap<'_>,
) -> Result<Vec<Joined>> {
    match how {
        Bootstrap::NcclId(uid) => nccl::join_with_id(host.as_ref(), uid, devices),
        Bootstrap::OverHost if devices.len() != 1 => nccl::create(host.as_ref(), devices),
        Bootstrap::OverHost => {
            let survey = own::survey(host.as_ref(), devices[0])?;
            if survey.mode != GpuEngine::Nccl && survey.no_nccl.is_some() && survey.one_host {
                return Ok(vec![own::alone(host, devices[0], &survey)?]);
            }
            let mut joined = nccl::create(host.as_ref(), devices)?;
            joined[0].preferred = own::beside(host, &joined[0], &survey)?;
            Ok(joined)
        }
    }
}

/// The launch groups of the engines' libraries, for [`super::group()`].
pub(crate) fn launch_groups() -> Result<Vec<&'static dyn LaunchGroup>> {
    Ok(vec![nccl::launch_group()?])
}

#[cfg(test)]
mod tests;
