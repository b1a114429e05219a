//! The timeline: `ACCORD_TRACE=path` records every operation, its algorithm's rounds, the
//! waits for peers and (on GPUs) the stream work with CUDA-event times, and writes them as
//! Chrome-trace JSON (`chrome://tracing`, <https://ui.perfetto.dev>), one file per rank:
//! `path` ending in `.json` becomes `<stem>.rank<R>.json`, any other `path` is a directory
//! that gets `accord-trace-<job>-rank<R>.json`. Each rank is a process of the trace (its `pid`
//! is the world rank), each communicator a track, each GPU stream another. Files are
//! rewritten whole when a world communicator closes or fails and when the process exits;
//! `accord trace merge` joins the ranks' files into one.
//!
//! Off (the variable unset), every hook is one relaxed load of a flag.

use super::clock;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Events kept per process; later ones are counted, not kept.
const MAX_EVENTS: usize = 2_000_000;
/// Track numbers of GPU streams start here (communicators' tracks count from 1).
const GPU_TRACKS: u64 = 1_000;

static ON: AtomicBool = AtomicBool::new(false);

/// Whether the timeline is being recorded.
#[inline(always)]
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

struct Event {
    rank: usize,
    track: u64,
    name: String,
    /// Precise monotonic nanoseconds (converted to the epoch when written, with one offset).
    start_ns: u64,
    dur_us: f64,
    args: serde_json::Value,
}

struct Tracer {
    path: String,
    job: String,
    events: Mutex<Vec<Event>>,
    dropped: AtomicU64,
    /// (rank, track) -> its name, for the trace's metadata.
    tracks: Mutex<BTreeMap<(usize, u64), String>>,
    /// Communicator id -> track number.
    comm_tracks: Mutex<HashMap<u64, u64>>,
}

fn tracer() -> Option<&'static Tracer> {
    static T: OnceLock<Option<Tracer>> = OnceLock::new();
    T.get_or_init(|| {
        let path = std::env::var("ACCORD_TRACE")
            .ok()
            .filter(|p| !p.trim().is_empty())?;
        // SAFETY: registering a plain `extern "C" fn` with no captured state.
        unsafe { libc::atexit(flush_at_exit) };
        ON.store(true, Ordering::Relaxed);
        Some(Tracer {
            path,
            job: super::job_id(),
            events: Mutex::new(Vec::new()),
            dropped: AtomicU64::new(0),
            tracks: Default::default(),
            comm_tracks: Default::default(),
        })
    })
    .as_ref()
}

/// Read `ACCORD_TRACE` (called when a world communicator is created).
pub(crate) fn init() {
    let _ = tracer();
}

extern "C" fn flush_at_exit() {
    let _ = flush();
}

thread_local! {
    /// The traced call running on this thread: (world rank, track).
    static CURRENT: Cell<Option<(usize, u64)>> = const { Cell::new(None) };
}

/// A traced call in progress: recorded when [`Span::end`] is called; dropping it (with or
/// without `end`) makes the enclosing call current again.
#[must_use]
pub(crate) struct Span {
    rank: usize,
    track: u64,
    start_ns: u64,
    outer: Option<(usize, u64)>,
}

impl Tracer {
    fn comm_track(&self, rank: usize, comm: u64, name: &str) -> u64 {
        let mut t = self.comm_tracks.lock().unwrap_or_else(|e| e.into_inner());
        let next = t.len() as u64 + 1;
        let track = *t.entry(comm).or_insert(next);
        drop(t);
        self.name_track(rank, track, || format!("communicator {name}"));
        track
    }

    fn name_track(&self, rank: usize, track: u64, name: impl FnOnce() -> String) {
        let mut t = self.tracks.lock().unwrap_or_else(|e| e.into_inner());
        t.entry((rank, track)).or_insert_with(name);
    }

    fn push(&self, e: Event) {
        let mut ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if ev.len() >= MAX_EVENTS {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        ev.push(e);
    }
}

/// Start tracing a call of communicator `comm` (`name`) on world rank `rank`; `None` when
/// the timeline is off.
#[inline]
pub(crate) fn begin(rank: usize, comm: u64, name: &str) -> Option<Span> {
    if !enabled() {
        return None;
    }
    let t = tracer()?;
    let track = t.comm_track(rank, comm, name);
    let outer = CURRENT.with(|c| c.replace(Some((rank, track))));
    Some(Span {
        rank,
        track,
        start_ns: clock::precise_ns(),
        outer,
    })
}

impl Span {
    /// Record the call as `name` with `args`.
    pub(crate) fn end(self, name: impl Into<String>, args: serde_json::Value) {
        let end = clock::precise_ns();
        if let Some(t) = tracer() {
            t.push(Event {
                rank: self.rank,
                track: self.track,
                name: name.into(),
                start_ns: self.start_ns,
                dur_us: (end - self.start_ns) as f64 / 1e3,
                args,
            });
        }
    }
}

impl Drop for Span {
    /// The enclosing call is current again, also when a call returned early without `end`.
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.outer));
    }
}

/// A step inside the current call (an algorithm's round): from `start_ns` (precise clock) to
/// now.
pub(crate) fn step(name: impl FnOnce() -> String, start_ns: u64, args: serde_json::Value) {
    let Some((rank, track)) = CURRENT.with(Cell::get) else {
        return;
    };
    if let Some(t) = tracer() {
        let end = clock::precise_ns();
        t.push(Event {
            rank,
            track,
            name: name(),
            start_ns,
            dur_us: end.saturating_sub(start_ns) as f64 / 1e3,
            args,
        });
    }
}

/// A wait for peers of communicator `comm` that began at `since` and lasted `waited_ns`
/// (recorded inside the current call, if one is traced on this thread).
pub(crate) fn wait(comm: u64, since: std::time::Instant, waited_ns: u64) {
    if !enabled() {
        return;
    }
    let start = clock::precise_ns().saturating_sub(since.elapsed().as_nanos() as u64);
    step(
        || "wait for peers".to_string(),
        start,
        serde_json::json!({"comm": comm, "waited_us": waited_ns as f64 / 1e3}),
    );
}

/// Work a GPU stream ran, timed by CUDA events: from `start_ns` (precise monotonic clock) for
/// `dur_us`.
pub(crate) fn gpu(
    rank: usize,
    device: usize,
    stream: usize,
    name: String,
    start_ns: u64,
    dur_us: f64,
    args: serde_json::Value,
) {
    let Some(t) = tracer() else { return };
    let track = GPU_TRACKS + device as u64;
    t.name_track(rank, track, || format!("GPU {device} stream {stream:#x}"));
    t.push(Event {
        rank,
        track,
        name,
        start_ns,
        dur_us,
        args,
    });
}

/// The file of world rank `rank`.
fn file_of(path: &str, job: &str, rank: usize) -> PathBuf {
    match path.strip_suffix(".json") {
        Some(stem) => PathBuf::from(format!("{stem}.rank{rank}.json")),
        None => PathBuf::from(path).join(format!("accord-trace-{job}-rank{rank}.json")),
    }
}

/// Write every rank's timeline recorded in this process so far; the files written.
pub fn flush() -> std::io::Result<Vec<PathBuf>> {
    let Some(t) = tracer() else { return Ok(vec![]) };
    let mut per_rank: BTreeMap<usize, Vec<serde_json::Value>> = BTreeMap::new();
    let epoch = clock::Epoch::now();
    {
        let ev = t.events.lock().unwrap_or_else(|e| e.into_inner());
        for e in ev.iter() {
            per_rank.entry(e.rank).or_default().push(serde_json::json!({
                "name": e.name, "ph": "X", "pid": e.rank, "tid": e.track,
                "ts": epoch.us(e.start_ns), "dur": e.dur_us, "args": e.args,
            }));
        }
    }
    let tracks = t.tracks.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (&(rank, track), name) in &tracks {
        let list = per_rank.entry(rank).or_default();
        list.push(serde_json::json!({
            "name": "thread_name", "ph": "M", "pid": rank, "tid": track, "args": {"name": name},
        }));
    }
    let mut written = Vec::new();
    for (rank, mut events) in per_rank {
        events.push(serde_json::json!({
            "name": "process_name", "ph": "M", "pid": rank, "tid": 0,
            "args": {"name": format!("rank {rank}")},
        }));
        events.push(serde_json::json!({
            "name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
            "args": {"sort_index": rank},
        }));
        let doc = serde_json::json!({
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": {
                "producer": "accord",
                "job": t.job,
                "rank": rank,
                "dropped_events": t.dropped.load(Ordering::Relaxed),
            },
        });
        let path = file_of(&t.path, &t.job, rank);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec(&doc).unwrap_or_default())?;
        std::fs::rename(&tmp, &path)?;
        written.push(path);
    }
    Ok(written)
}

/// Join per-rank trace files into one trace (their events side by side: each rank is already
/// its own process of the trace).
pub fn merge(files: &[PathBuf]) -> std::io::Result<serde_json::Value> {
    let mut events = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f)?;
        let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: not a Chrome-trace JSON file: {e}", f.display()),
            )
        })?;
        match doc.get("traceEvents").and_then(|e| e.as_array()) {
            Some(list) => events.extend(list.iter().cloned()),
            None => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: no traceEvents array", f.display()),
                ))
            }
        }
    }
    Ok(serde_json::json!({"traceEvents": events, "displayTimeUnit": "ns"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_named_per_rank() {
        assert_eq!(
            file_of("/x/t.json", "j", 3),
            PathBuf::from("/x/t.rank3.json")
        );
        assert_eq!(
            file_of("/x/dir", "job-1", 0),
            PathBuf::from("/x/dir/accord-trace-job-1-rank0.json")
        );
    }
}
