//! GPU work on the timeline (`ACCORD_TRACE`, see [`crate::observe::trace`]): each operation
//! is bracketed by two timed CUDA events on its stream; once both have passed, their times
//! relative to a reference event give the work's place on the host's clock.
//!
//! The reference is recorded on the first traced operation's stream and waited for, and the
//! host clock read right after: GPU times are then the host time of that moment plus the
//! events' elapsed time from it (off by the wait's wake-up, microseconds).

use super::cuda::{CuEvent, CuStream, Driver, CU_EVENT_DEFAULT};
use crate::observe::{clock, trace};
use std::sync::Mutex;

/// Events not yet resolved, at most this many (older ones are dropped from the timeline).
const MAX_PENDING: usize = 65_536;

struct Pending {
    name: String,
    args: serde_json::Value,
    stream: usize,
    start: CuEvent,
    end: CuEvent,
}

// SAFETY: CUDA event handles may be used from any thread.
unsafe impl Send for Pending {}

/// One device communicator's traced work.
#[derive(Default)]
pub(crate) struct Timeline {
    /// The reference event and the host time (precise monotonic nanoseconds) it passed at.
    reference: Mutex<Option<(usize, u64)>>,
    pending: Mutex<Vec<Pending>>,
}

impl Timeline {
    /// Record the start event of an operation on `s` (before its work is enqueued); `None`
    /// when the timeline is off or an event cannot be made.
    pub(crate) fn before(&self, cu: &Driver, s: CuStream) -> Option<CuEvent> {
        if !trace::enabled() {
            return None;
        }
        let mut reference = self.reference.lock().unwrap_or_else(|e| e.into_inner());
        if reference.is_none() {
            let r = cu.new_event(CU_EVENT_DEFAULT).ok()?;
            // SAFETY: a live event and stream of the current context.
            unsafe {
                (cu.event_record)(r, s);
                (cu.event_synchronize)(r);
            }
            *reference = Some((r as usize, clock::precise_ns()));
        }
        let e = cu.new_event(CU_EVENT_DEFAULT).ok()?;
        // SAFETY: as above.
        unsafe { (cu.event_record)(e, s) };
        Some(e)
    }

    /// Record the end event of the operation `start` began, named `name`.
    pub(crate) fn after(
        &self,
        cu: &Driver,
        s: CuStream,
        start: CuEvent,
        name: String,
        args: serde_json::Value,
    ) {
        let Ok(end) = cu.new_event(CU_EVENT_DEFAULT) else {
            // SAFETY: the event is ours and no longer used.
            unsafe { (cu.event_destroy)(start) };
            return;
        };
        // SAFETY: a live event and stream.
        unsafe { (cu.event_record)(end, s) };
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if p.len() >= MAX_PENDING {
            let old = p.remove(0);
            // SAFETY: ours, no longer used.
            unsafe {
                (cu.event_destroy)(old.start);
                (cu.event_destroy)(old.end);
            }
        }
        p.push(Pending {
            name,
            args,
            stream: s as usize,
            start,
            end,
        });
    }

    /// Put every operation whose end event has passed on the timeline as world rank `rank`'s
    /// work on GPU `device`.
    pub(crate) fn resolve(&self, cu: &Driver, rank: usize, device: usize) {
        let Some((reference, at_ns)) = *self.reference.lock().unwrap_or_else(|e| e.into_inner())
        else {
            return;
        };
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let since = |e: CuEvent| {
            let mut ms = 0f32;
            // SAFETY: both events live and recorded; the out-pointer is a local.
            let rc = unsafe { (cu.event_elapsed)(&mut ms, reference as CuEvent, e) };
            (rc == 0).then_some(ms as f64 * 1e6)
        };
        p.retain(|w| {
            if !cu.event_done(w.end).unwrap_or(true) {
                return true;
            }
            if let (Some(a), Some(b)) = (since(w.start), since(w.end)) {
                let (start, dur_us) = (at_ns + a.max(0.0) as u64, (b - a) / 1e3);
                let (name, args) = (w.name.clone(), w.args.clone());
                trace::gpu(rank, device, w.stream, name, start, dur_us, args);
            }
            // SAFETY: ours, passed, no longer used.
            unsafe {
                (cu.event_destroy)(w.start);
                (cu.event_destroy)(w.end);
            }
            false
        });
    }
}
