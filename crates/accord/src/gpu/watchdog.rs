//! The per-communicator watchdog thread: retires finished operations, asks the host
//! communicator whether a member is gone, polls NCCL's asynchronous error, enforces the timeout,
//! publishes progress and compares fingerprint hashes. What to do about what it sees is decided
//! in [`super::health`].

use super::health::{self, Look, Memory, Verdict};
use super::Inner;
use crate::error::Error;
use crate::fingerprint::Fingerprint;
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
    let mut memory = Memory::default();
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
            if let Some(e) = tick(&inner, &mut published, &mut memory) {
                inner.fail(e);
                return;
            }
            // At most 50 ms: a lost peer is acted on well within 2 s whatever the timeout.
            let t = inner.timeout.get();
            (t / 20).clamp(Duration::from_millis(2), Duration::from_millis(50))
        };
        std::thread::sleep(period);
    }
}

/// One check; `Some(error)` if the communicator must fail.
fn tick(inner: &Inner, published: &mut Published, memory: &mut Memory) -> Option<Error> {
    // What NCCL, the host and the operations say; `None` once the communicator is aborted.
    let mut async_rc = 0;
    // SAFETY: a communicator that no abort can free while the query runs.
    let queried =
        inner.unless_aborted(|c| unsafe { (inner.nccl.comm_get_async_error)(c, &mut async_rc) });
    queried?;
    let engine = (async_rc != 0 && async_rc != super::nccl::NCCL_IN_PROGRESS).then_some(async_rc);
    let host = inner.host.members_failure(&inner.watched);
    let head = inner.oldest();
    let timeout = inner.timeout.get();
    let verdict = health::decide(
        memory,
        Look {
            now: Instant::now(),
            engine,
            host,
            oldest: head.map(|h| h.since),
            timeout,
        },
    );
    let during = |h: Option<Head>| {
        h.map(|h| format!(" during {} (op #{})", h.fp, h.seq))
            .unwrap_or_else(|| " while idle".into())
    };
    let overdue = match verdict {
        Verdict::Healthy => None,
        Verdict::Overdue(age) => Some(age),
        Verdict::PeerGone { notice, engine } => {
            // A peer that found a desync fails and often exits at once; its departure is not
            // the cause. The progress records name the desync when there is one.
            if let Some(e) = desync_now(inner) {
                return Some(e);
            }
            let nccl = engine
                .map(|rc| format!("; NCCL reported {}", inner.describe(rc)))
                .unwrap_or_default();
            let what = format!(
                "; NCCL communicator gpu/{} aborted on rank {}{}{nccl}",
                inner.id,
                inner.rank,
                during(head)
            );
            return Some(match notice {
                Error::PeerLost { rank, cause } => Error::PeerLost {
                    rank,
                    cause: format!("{cause}{what}"),
                },
                Error::Aborted { reason } => Error::Aborted {
                    reason: format!("{reason}{what}"),
                },
                other => Error::Aborted {
                    reason: format!("{other}{what}"),
                },
            });
        }
        Verdict::Engine(rc) => {
            // A peer that detected a desync aborts, which shows up here as a remote error:
            // prefer the desync, which names the culprit, when the progress records show one.
            if let Some(e) = desync_now(inner) {
                return Some(e);
            }
            return Some(Error::Aborted {
                reason: format!(
                    "NCCL reported an error on rank {}{}: {}; a peer probably failed or exited",
                    inner.rank,
                    head.map(|h| format!(" during {} (op #{})", h.fp, h.seq))
                        .unwrap_or_default(),
                    inner.describe(rc)
                ),
            });
        }
    };

    // Progress and desync, before the timeout: a desync explains a hang better.
    let (seq_now, hash_now, last_fp) = {
        let st = inner.state.lock().ok()?;
        (st.cseq, st.hash, st.last)
    };
    let age = head.map(|h| h.since.elapsed());
    let suspicious = age.is_some_and(|age| age > timeout / 2 || age > PUBLISH_EVERY);
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
        if check {
            published.checked = Some(Instant::now());
            if let Some(e) = compare(inner, seq_now, hash_now, &last()) {
                return Some(e);
            }
        }
    }

    // The timeout of the oldest operation.
    let (age, h) = (overdue?, head?);
    let missing = h.cseq.map(|c| never_entered(inner, c)).unwrap_or_default();
    let peers = if h.cseq.is_none() {
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
    Some(Error::Timeout {
        op: h.fp.to_string(),
        seq: h.seq,
        comm: format!("gpu/{}", inner.id),
        waiting_for: missing.iter().map(|(r, _)| *r).collect(),
        after: age,
        hint: format!("; {peers}; NCCL communicator aborted"),
    })
}

/// A desync between this rank's calls so far and what the peers published, if there is one.
fn desync_now(inner: &Inner) -> Option<Error> {
    let st = inner.state.lock().ok()?;
    let (seq, hash) = (st.cseq, st.hash);
    let last = st.last.map(|f| f.to_string()).unwrap_or_default();
    drop(st);
    compare(inner, seq, hash, &last)
}

/// The oldest unfinished operation.
#[derive(Clone, Copy)]
pub(super) struct Head {
    pub seq: u64,
    /// Its collective count (None for point-to-point).
    pub cseq: Option<u64>,
    pub fp: Fingerprint,
    pub since: Instant,
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
