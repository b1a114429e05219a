//! The per-communicator watchdog thread: retires finished operations, enforces the timeout,
//! polls NCCL's asynchronous error, publishes progress and compares fingerprint hashes.

use super::Inner;
use crate::error::Error;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How often progress is published and compared when it changed.
const PUBLISH_EVERY: Duration = Duration::from_millis(1000);

pub(super) fn start(inner: &Arc<Inner>) {
    let weak = Arc::downgrade(inner);
    let name = format!("accord-gpu-watchdog-{}", inner.rank);
    let _ = std::thread::Builder::new()
        .name(name)
        .spawn(move || run(weak));
}

/// What this rank last told the store.
#[derive(Default)]
struct Published {
    seq: u64,
    at: Option<Instant>,
    checked: Option<Instant>,
}

fn run(weak: Weak<Inner>) {
    let mut published = Published::default();
    let mut ctx_set = false;
    loop {
        let period = {
            let Some(inner) = weak.upgrade() else { return };
            if inner.stop.load(Ordering::Acquire) || inner.aborted.load(Ordering::Acquire) {
                return;
            }
            if !ctx_set {
                ctx_set = inner.cu.make_current(inner.ctx as _).is_ok();
            }
            if let Some(e) = tick(&inner, &mut published) {
                inner.fail(e);
                return;
            }
            let t = inner.timeout.get();
            (t / 20).clamp(Duration::from_millis(2), Duration::from_millis(50))
        };
        std::thread::sleep(period);
    }
}

/// One check; `Some(error)` if the communicator must fail.
fn tick(inner: &Inner, published: &mut Published) -> Option<Error> {
    // 1. NCCL's own view: a peer's connection lost, a remote error...
    let mut async_rc = 0;
    // SAFETY: a communicator that no abort can free while the query runs.
    let queried =
        inner.unless_aborted(|c| unsafe { (inner.nccl.comm_get_async_error)(c, &mut async_rc) });
    queried?;
    if async_rc != 0 && async_rc != super::nccl::NCCL_IN_PROGRESS {
        // A peer that detected a desync aborts, which shows up here as a remote error: prefer
        // the desync, which names the culprit, when the progress records show one.
        if let Ok(st) = inner.state.lock() {
            let (seq, hash) = (st.cseq, st.hash);
            let last = st.last.map(|f| f.to_string()).unwrap_or_default();
            drop(st);
            if let Some(e) = compare(inner, seq, hash, &last) {
                return Some(e);
            }
        }
        let head = oldest(inner);
        let what = head
            .map(|(seq, fp, _)| format!(" during {fp} (op #{seq})"))
            .unwrap_or_default();
        return Some(Error::Aborted {
            reason: format!(
                "NCCL reported an error on rank {}{what}: {}; a peer probably failed or exited",
                inner.rank,
                inner.describe(async_rc)
            ),
        });
    }

    // 2. Retire finished operations; look at the oldest unfinished one.
    let full = oldest_full(inner);
    let head = full.map(|(s, _, fp, age)| (s, fp, age));
    let timeout = inner.timeout.get();
    let (seq_now, hash_now, last_fp) = {
        let st = inner.state.lock().ok()?;
        (st.cseq, st.hash, st.last)
    };
    let suspicious = head.is_some_and(|(_, _, age)| age > timeout / 2 || age > PUBLISH_EVERY);
    let due = published.at.is_none_or(|t| t.elapsed() >= PUBLISH_EVERY);
    if let Some(store) = &inner.store {
        let last = || last_fp.map(|f| f.to_string()).unwrap_or_default();
        let mut check = false;
        if seq_now != published.seq && (due || suspicious) {
            let value = format!("{seq_now} {hash_now:016x} {}", last());
            if store
                .set(&format!("progress/{}", inner.rank), value)
                .is_ok()
            {
                published.seq = seq_now;
                published.at = Some(Instant::now());
                check = true;
            }
        }
        // Peers publish on their own cadence: compare again every period (faster while an
        // operation is overdue), so whichever side publishes last is still caught.
        let every = if suspicious {
            PUBLISH_EVERY / 4
        } else {
            PUBLISH_EVERY
        };
        if published.checked.is_none_or(|t| t.elapsed() >= every) {
            check = true;
        }
        // 3. Desync: a rank that entered as many operations with another hash.
        if check {
            published.checked = Some(Instant::now());
            if let Some(e) = compare(inner, seq_now, hash_now, &last()) {
                return Some(e);
            }
        }
    }

    // 4. Timeout of the oldest operation.
    if let Some((seq, cseq, fp, age)) = full {
        if age > timeout {
            let missing = cseq.map(|c| never_entered(inner, c)).unwrap_or_default();
            let peers = if cseq.is_none() {
                "a point-to-point operation whose peer never matched it".to_string()
            } else if missing.is_empty() {
                "every rank entered it; the GPU work itself did not finish".to_string()
            } else {
                format!(
                    "rank(s) {} never entered it",
                    missing
                        .iter()
                        .map(|(r, s)| format!("{r} (had entered {s} collectives)"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            return Some(Error::Timeout {
                op: fp.to_string(),
                seq,
                comm: format!("gpu/{}", inner.id),
                waiting_for: missing.iter().map(|(r, _)| *r).collect(),
                after: age,
                hint: format!("; {peers}; NCCL communicator aborted"),
            });
        }
    }
    None
}

/// Pop finished operations; (seq, fingerprint, age) of the oldest unfinished one.
fn oldest(inner: &Inner) -> Option<(u64, crate::fingerprint::Fingerprint, Duration)> {
    oldest_full(inner).map(|(s, _, fp, age)| (s, fp, age))
}

/// Like [`oldest`], also with the collective count of the operation (None for point-to-point).
fn oldest_full(
    inner: &Inner,
) -> Option<(u64, Option<u64>, crate::fingerprint::Fingerprint, Duration)> {
    let mut st = inner.state.lock().ok()?;
    while let Some(front) = st.outstanding.front() {
        if front.event.done().unwrap_or(false) {
            st.outstanding.pop_front();
        } else {
            return Some((front.seq, front.cseq, front.fp, front.since.elapsed()));
        }
    }
    None
}

fn read_progress(inner: &Inner, rank: usize) -> Option<(u64, u64, String)> {
    let store = inner.store.as_ref()?;
    let v = store.try_get(&format!("progress/{rank}")).ok()??;
    let s = String::from_utf8_lossy(&v).into_owned();
    let mut it = s.splitn(3, ' ');
    let seq = it.next()?.parse().ok()?;
    let hash = u64::from_str_radix(it.next()?, 16).ok()?;
    Some((seq, hash, it.next().unwrap_or("").to_string()))
}

/// Ranks whose last published sequence number is below `seq` (with that number).
fn never_entered(inner: &Inner, seq: u64) -> Vec<(usize, u64)> {
    if inner.store.is_none() {
        return Vec::new();
    }
    (0..inner.size)
        .filter(|&r| r != inner.rank)
        .filter_map(|r| {
            let s = read_progress(inner, r).map_or(0, |p| p.0);
            (s < seq).then_some((r, s))
        })
        .collect()
}

/// Compare with the two ring neighbours only: O(1) store reads per rank however large the
/// world, and a disagreement anywhere breaks the chain somewhere.
fn compare(inner: &Inner, seq: u64, hash: u64, last: &str) -> Option<Error> {
    let n = inner.size;
    if n < 2 {
        return None;
    }
    let mut peers = vec![(inner.rank + 1) % n, (inner.rank + n - 1) % n];
    peers.dedup();
    for r in peers {
        if let Some((s, h, theirs)) = read_progress(inner, r) {
            if s == seq && h != hash {
                return Some(Error::Desync {
                    me: inner.rank,
                    mine: last.to_string(),
                    peer: r,
                    theirs,
                    comm: format!("gpu/{}", inner.id),
                    seq,
                });
            }
        }
    }
    None
}
