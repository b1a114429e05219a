//! [`group`]: operations of several communicators (one per GPU of this process) launched as one
//! library group, so that a single thread can drive all of them without deadlock.
//!
//! Inside a group the libraries defer the launch to the group's end, so the event behind each
//! operation is recorded only then: until it is, the operation is not armed (CUDA reports an
//! event never recorded as complete).

use super::comm::DeviceComm;
use super::cuda::CuStream;
use super::device::Event;
use super::engine::LaunchGroup;
use super::select;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// Issue operations on several communicators (one per GPU of this process) as one group.
///
/// Requests returned inside `f` are armed when the group ends. Scan and exscan are refused
/// inside a group (their scratch array is freed in stream order behind a kernel the group would
/// launch only at its end).
pub fn group<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    let groups = select::launch_groups()?;
    start(&groups)?;
    let r = f();
    let end = end(&groups);
    let r = r?;
    end?;
    Ok(r)
}

/// Open a group without a closure (for C-style callers): every device operation issued on this
/// thread until the matching [`group_end`] is launched together, as inside [`group`]. Groups
/// nest; each start needs its end on the same thread. Before any device engine exists in the
/// process (none can be created inside a group) it only counts the depth, so host-only
/// programs can use it without a GPU library.
pub fn group_start() -> Result<()> {
    let groups = match super::nccl::loaded() {
        true => select::launch_groups()?,
        false => Vec::new(),
    };
    start(&groups)?;
    OPENED.with(|o| o.borrow_mut().push(groups));
    Ok(())
}

/// End the group the last [`group_start`] of this thread opened, launching its operations
/// when it was the outermost.
pub fn group_end() -> Result<()> {
    let Some(groups) = OPENED.with(|o| o.borrow_mut().pop()) else {
        return Err(Error::invalid(
            "group_end without a group_start on this thread",
        ));
    };
    end(&groups)
}

/// How many launch groups are open on this thread ([`group`] and [`group_start`] alike): a
/// device operation issued while any is open is launched only when the outermost ends.
pub fn group_depth() -> usize {
    GROUP.with(|g| g.borrow().0)
}

thread_local! {
    /// The library groups each open [`group_start`] of this thread started.
    static OPENED: RefCell<Vec<Vec<&'static dyn LaunchGroup>>> = const { RefCell::new(Vec::new()) };
}

/// Open [`group`] depth, and the events to record (on their streams, of their communicators)
/// once the outermost ends.
type GroupState = (usize, Vec<(Arc<Event>, usize, Arc<DeviceComm>)>);

thread_local! {
    static GROUP: RefCell<GroupState> = const { RefCell::new((0, Vec::new())) };
}

/// Inside a [`group`], keep `event` to record on `stream` when the group ends (`true`);
/// outside, `false`: the caller records it now.
pub(crate) fn defer_record(event: &Arc<Event>, stream: CuStream, comm: &Arc<DeviceComm>) -> bool {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 > 0 {
            g.1.push((event.clone(), stream as usize, comm.clone()));
            true
        } else {
            false
        }
    })
}

/// Communicators are created and split outside [`group`]: inside one, the library defers the
/// work to the group's end, after this call would have had to return the new communicator.
pub(crate) fn not_in_group(what: &str) -> Result<()> {
    if GROUP.with(|g| g.borrow().0) > 0 {
        return Err(Error::invalid(format!(
            "{what} inside gpu::group is not possible; do it before or after the group"
        )));
    }
    Ok(())
}

fn start(groups: &[&'static dyn LaunchGroup]) -> Result<()> {
    for g in groups {
        g.start()?;
    }
    GROUP.with(|g| g.borrow_mut().0 += 1);
    Ok(())
}

fn end(groups: &[&'static dyn LaunchGroup]) -> Result<()> {
    let mut result = Ok(());
    let mut in_progress = None;
    for g in groups.iter().rev() {
        match g.end() {
            Ok(true) => in_progress = Some(g.end_name()),
            Ok(false) => {}
            Err(e) => result = result.and(Err(e)),
        }
    }
    let pending = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.0 = g.0.saturating_sub(1);
        if g.0 == 0 {
            std::mem::take(&mut g.1)
        } else {
            Vec::new()
        }
    });
    if let Some(what) = in_progress {
        // The group is launched from the library's thread: every communicator in it must be
        // ready before its events are recorded behind the work.
        let mut seen: Vec<*const DeviceComm> = Vec::new();
        for (_, _, comm) in &pending {
            if !seen.contains(&Arc::as_ptr(comm)) {
                seen.push(Arc::as_ptr(comm));
                result = result.and(comm.finish_enqueue(what));
            }
        }
    }
    for (ev, stream, _) in pending {
        ev.record(stream as CuStream);
    }
    result
}
