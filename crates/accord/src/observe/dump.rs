//! Writing flight records to files.
//!
//! One file per rank and job, `accord-flight-<job>-rank<R>.json` in [`flight_dir`], rewritten
//! whole (through a temporary file and a rename) at every dump, so that it always holds the
//! latest complete record:
//!
//! ```text
//! { "format": "accord-flight/1", "job": "...", "world_rank": 2, "world_size": 4,
//!   "host": "...", "pid": 1234, "reason": "...", "reasons": ["...", ...],
//!   "dumped_at_us": 1.7e15,
//!   "communicators": [ { "name": "world", "id": 1, "rank": 2, "size": 4,
//!       "world_ranks": [0, 1, 2, 3], "transport": "shm", "error": null | "...",
//!       "metrics": { "host_ops", "device_ops", "p2p_ops", "bytes", "errors", "blocked_ns" },
//!       "waiting": [ { "seq": 7, "ranks": [3], "gave_up": false } ],
//!       "records": [ { "lane": "host" | "device" | "p2p", "seq": 7, "op": "allreduce",
//!           "dtype": "f32", "count": 1024, "reduce": "sum" | null, "root": null | 0,
//!           "counts_hash": 0, "peer": null | 1, "tag": null | 0,
//!           "state": "started" | "completed" | "failed" | "enqueued",
//!           "engine": "...", "algorithm": null | "ring", "device_seq": 0,
//!           "start_us": 1.7e15, "end_us": null | 1.7e15, "fingerprint": "allreduce(f32 x 1024, sum)" } ] } ] }
//! ```
//!
//! `reason` is why this dump was made, `reasons` every reason this process dumped for so far.
//! `waiting` lists the calls of this communicator blocked on peers at the time (world ranks);
//! times are microseconds since the Unix epoch at the coarse clock's resolution.

use super::{clock, live};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// The `format` field of a dump.
pub const DUMP_FORMAT: &str = "accord-flight/1";

/// Where dumps go: `ACCORD_FLIGHT_DIR`, else `accord-flight` in the temporary directory.
pub fn flight_dir() -> PathBuf {
    match std::env::var_os("ACCORD_FLIGHT_DIR").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => std::env::temp_dir().join("accord-flight"),
    }
}

/// What names this job in dump files, the same on every rank: `ACCORD_JOB_ID` (the launcher
/// sets it), else the store address (`ACCORD_STORE` and its prefix, or torch's `MASTER_ADDR`
/// and `MASTER_PORT`), else this process's id. Only letters, digits, `-` and `_` are kept.
pub fn job_id() -> String {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let raw = var("ACCORD_JOB_ID")
        .or_else(|| {
            var("ACCORD_STORE").map(|s| s + &var("ACCORD_STORE_PREFIX").unwrap_or_default())
        })
        .or_else(|| Some(format!("{}-{}", var("MASTER_ADDR")?, var("MASTER_PORT")?)))
        .unwrap_or_else(|| format!("pid{}", std::process::id()));
    job_id_of(&raw)
}

/// `raw` as a job's name in file names: letters, digits, `-` and `_` kept, the rest `-`.
pub fn job_id_of(raw: &str) -> String {
    raw.chars()
        .map(
            |c| match c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                true => c,
                false => '-',
            },
        )
        .collect()
}

/// Write every live communicator's record, one file per (job, world rank) of this process,
/// saying `reason`; the files written. Failures to write are reported on stderr, not raised:
/// a dump must never make things worse.
pub fn dump_all(reason: &str) -> Vec<PathBuf> {
    // Every reason so far: a later dump (a signal) must not hide why the first one was made.
    static REASONS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let reasons = {
        let mut r = REASONS.lock().unwrap_or_else(|e| e.into_inner());
        if r.len() < 64 && !r.iter().any(|x| x == reason) {
            r.push(reason.to_string());
        }
        r.clone()
    };
    let mut files: BTreeMap<(String, usize), (usize, Vec<serde_json::Value>)> = BTreeMap::new();
    for c in live() {
        let (job, rank, size) = c.file_key();
        files
            .entry((job, rank))
            .or_insert_with(|| (size, Vec::new()))
            .1
            .push(c.snapshot());
    }
    let dir = flight_dir();
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!(
            "accord: cannot write flight records to {}: {e}",
            dir.display()
        );
        return vec![];
    }
    let host = hostname();
    let mut written = Vec::new();
    for ((job, rank), (size, comms)) in files {
        let doc = serde_json::json!({
            "format": DUMP_FORMAT,
            "job": job,
            "world_rank": rank,
            "world_size": size,
            "host": host,
            "pid": std::process::id(),
            "reason": reason,
            "reasons": reasons,
            "dumped_at_us": clock::epoch_us(clock::precise_ns()),
            "communicators": comms,
        });
        let path = dir.join(format!("accord-flight-{job}-rank{rank}.json"));
        let tmp = dir.join(format!(
            ".accord-flight-{job}-rank{rank}.{}.{:?}.tmp",
            std::process::id(),
            std::thread::current().id()
        ));
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        match std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, &path)) {
            Ok(()) => written.push(path),
            Err(e) => eprintln!("accord: cannot write {}: {e}", path.display()),
        }
    }
    static SAID: AtomicBool = AtomicBool::new(false);
    if !written.is_empty() && !SAID.swap(true, Ordering::Relaxed) && reason != "request" {
        eprintln!(
            "accord: flight record written to {} ({reason}); `accord analyze {}` explains it",
            written[0].display(),
            dir.display()
        );
    }
    written
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer outlives the call and its length is passed.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match rc {
        0 => String::from_utf8_lossy(&buf[..end]).into_owned(),
        _ => String::new(),
    }
}

/// On `SIGUSR1`, dump (unless `ACCORD_FLIGHT_SIGNAL=0`). Installed once, when the first
/// communicator is created; a thread waits for the signal, so the handler itself only wakes it.
pub(super) fn install_signal_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var("ACCORD_FLIGHT_SIGNAL").is_ok_and(|v| v.trim() == "0") {
            return;
        }
        let mut signals = match signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR1])
        {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accord: no SIGUSR1 flight-record dumps: {e}");
                return;
            }
        };
        let _ = std::thread::Builder::new()
            .name("accord-sigusr1".into())
            .spawn(move || {
                for _ in signals.forever() {
                    let files = dump_all("SIGUSR1");
                    for f in files {
                        eprintln!("accord: SIGUSR1: flight record written to {}", f.display());
                    }
                }
            });
    });
}
