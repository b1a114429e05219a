//! Seeing what the ranks are doing: a flight recorder per communicator, dumps of it, counters,
//! and a timeline.
//!
//! - `flight`: every communicator keeps its last operations in a ring ([`FlightRecorder`]),
//!   always on (`ACCORD_FLIGHT_RECORDER=N` entries, default 2048; `0` turns it off). Read it
//!   with [`crate::Communicator::flight_record`]; counters with
//!   [`crate::Communicator::metrics`].
//! - dumps: when a communicator fails (timeout, desync, a peer lost), when an abort notice
//!   arrives from a peer, on `SIGUSR1`, and on request ([`dump_all`]), every live communicator
//!   of the process is written as JSON, one file per rank, into `ACCORD_FLIGHT_DIR` (default
//!   `$TMPDIR/accord-flight`). `accord analyze DIR` merges the ranks' files and says which
//!   rank is behind, on which operation, and who waited for whom. The format is in `dump`.
//! - `trace`: `ACCORD_TRACE=path` writes a Chrome-trace (Perfetto) timeline per rank.
//! - `clock`: the timestamps.

pub(crate) mod clock;
mod dump;
pub mod flight;
pub mod trace;

pub use dump::{dump_all, flight_dir, job_id, job_id_of, DUMP_FORMAT};

pub use flight::{Entry, FlightRecorder, Lane, Metrics, Record, Route, State};

use std::sync::{Mutex, OnceLock, Weak};

/// Entries per ring from `ACCORD_FLIGHT_RECORDER` (0: no recorder), read once per process.
pub fn entries() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("ACCORD_FLIGHT_RECORDER")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(flight::DEFAULT_ENTRIES)
    })
}

/// A recorder for a new communicator, unless recording is off.
pub(crate) fn new_recorder() -> Option<FlightRecorder> {
    match entries() {
        0 => None,
        n => Some(FlightRecorder::new(n)),
    }
}

/// A communicator as a dump sees it.
pub(crate) trait Recorded: Send + Sync {
    /// The job and this process's world rank in it: which file the snapshot goes to.
    fn file_key(&self) -> (String, usize, usize);
    /// Everything the dump says about this communicator (see `dump`).
    fn snapshot(&self) -> serde_json::Value;
}

fn registry() -> &'static Mutex<Vec<Weak<dyn Recorded>>> {
    static R: OnceLock<Mutex<Vec<Weak<dyn Recorded>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Make a communicator visible to dumps for as long as it lives.
pub(crate) fn register(c: Weak<dyn Recorded>) {
    let mut r = registry().lock().unwrap_or_else(|e| e.into_inner());
    r.retain(|w| w.strong_count() > 0);
    r.push(c);
    drop(r);
    dump::install_signal_handler();
}

/// The communicators alive now.
fn live() -> Vec<std::sync::Arc<dyn Recorded>> {
    let r = registry().lock().unwrap_or_else(|e| e.into_inner());
    r.iter().filter_map(Weak::upgrade).collect()
}

/// A failure this process saw: dump every communicator, on a thread of its own (the caller
/// may be a transport thread that must go on delivering).
pub(crate) fn on_failure(reason: String) {
    let _ = std::thread::Builder::new()
        .name("accord-flight-dump".into())
        .spawn(move || {
            dump_all(&reason);
        });
}
