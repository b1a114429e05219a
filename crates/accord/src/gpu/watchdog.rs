//! The per-communicator watchdog thread: retires finished operations, asks the host
//! communicator whether a member is gone, polls the engines' asynchronous errors, enforces the
//! timeout, publishes progress and compares fingerprint hashes. What to do about what it sees is
//! decided in [`super::health`]; the engines are reached only through their trait.

use super::comm::DeviceComm;
use super::health::{self, Look, Memory, Verdict};
use super::outstanding::Head;
use crate::error::Error;
use crate::rendezvous::StoreClient;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How often progress is published and compared when it changed.
const PUBLISH_EVERY: Duration = Duration::from_millis(1000);

pub(super) fn start(comm: &Arc<DeviceComm>) {
    let weak = Arc::downgrade(comm);
    let name = format!("accord-gpu-watchdog-{}", comm.rank);
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

fn run(weak: Weak<DeviceComm>) {
    super::exit::register();
    let mut published = Published::default();
    let mut memory = Memory::default();
    let mut ctx_set = false;
    loop {
        let period = {
            // No CUDA call once the process exits (see `exit`).
            let Some(_running) = super::exit::running() else {
                return;
            };
            let Some(comm) = weak.upgrade() else { return };
            if comm.stop.load(Ordering::Acquire) || comm.aborted.load(Ordering::Acquire) {
                return;
            }
            if !ctx_set {
                let (cu, ctx) = comm.context();
                ctx_set = cu.make_current(ctx as _).is_ok();
            }
            if let Some(e) = tick(&comm, &mut published, &mut memory) {
                comm.fail(e);
                return;
            }
            comm.resolve_timeline();
            // At most 50 ms: a lost peer is acted on well within 2 s whatever the timeout.
            let t = comm.timeout();
            (t / 20).clamp(Duration::from_millis(2), Duration::from_millis(50))
        };
        std::thread::sleep(period);
    }
}

/// One check; `Some(error)` if the communicator must fail.
fn tick(comm: &DeviceComm, published: &mut Published, memory: &mut Memory) -> Option<Error> {
    // What the engines, the host and the operations say; nothing once the communicator is
    // aborted (the engines' state is gone).
    let engine = comm.unless_aborted(|| comm.engines.async_error())?;
    let host = comm.host.members_failure(&comm.watched);
    let head = comm.oldest();
    let timeout = comm.timeout();
    let probe = || desync_now(comm);
    let verdict = health::decide(
        memory,
        Look {
            now: Instant::now(),
            engine,
            host,
            oldest: head.map(|h| h.since),
            timeout,
            probe: &probe,
        },
    );
    // Progress and desync only while not failing already, as a desync explains a hang better.
    let verdict = match verdict {
        v @ (Verdict::Healthy | Verdict::Overdue(_)) => {
            let desync = publish_and_compare(comm, published, head, timeout)?;
            health::with_records(v, desync)
        }
        v => v,
    };
    let during = |h: Option<Head>| {
        h.map(|h| format!(" during {} (op #{})", h.what(), h.seq))
            .unwrap_or_else(|| " while idle".into())
    };
    let name = comm.fallback().name();
    match verdict {
        Verdict::Healthy => None,
        Verdict::Desync(e) => Some(e),
        Verdict::PeerGone { notice, engine } => {
            let reported = engine
                .map(|e| format!("; {name} reported {}", words(&e)))
                .unwrap_or_default();
            let what = format!(
                "; {name} communicator gpu/{} aborted on rank {}{}{reported}",
                comm.id,
                comm.rank,
                during(head)
            );
            Some(match notice {
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
            })
        }
        Verdict::Engine(e) => Some(Error::Aborted {
            reason: format!(
                "{name} reported an error on rank {}{}: {}; a peer probably failed or exited",
                comm.rank,
                head.map(|h| format!(" during {} (op #{})", h.what(), h.seq))
                    .unwrap_or_default(),
                words(&e)
            ),
        }),
        Verdict::Overdue(age) => Some(overdue(comm, head?, age, name)),
    }
}

/// An engine's error in its library's words.
fn words(e: &Error) -> String {
    match e {
        Error::Gpu {
            library,
            code,
            text,
            ..
        } => format!("{text} ({library} error {code})"),
        e => e.to_string(),
    }
}

/// The timeout of the oldest operation, naming the ranks that never entered it.
fn overdue(comm: &DeviceComm, h: Head, age: Duration, name: &str) -> Error {
    let missing = h.cseq.map(|c| never_entered(comm, c)).unwrap_or_default();
    let peers = if h.cseq.is_none() {
        match h.peers.ranks().as_slice() {
            [] => "a point-to-point operation whose peer never matched it".to_string(),
            [one] => format!("a point-to-point operation that rank {one} never matched"),
            many => format!(
                "a point-to-point operation that rank {} or {} never matched",
                many[0], many[1]
            ),
        }
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
    Error::Timeout {
        op: h.what(),
        seq: h.seq,
        comm: format!("gpu/{}", comm.id),
        waiting_for: match h.cseq {
            Some(_) => missing.iter().map(|(r, _)| *r).collect(),
            None => h.peers.ranks(),
        },
        after: age,
        hint: format!("; {peers}; {name} communicator aborted"),
    }
}

/// Publish this rank's progress when it changed and is due (sooner while an operation is
/// suspiciously old), and compare with the neighbours on the cadence: `Some(desync)` if they
/// disagree. `None` (the outer option) if the bookkeeping is unreadable.
fn publish_and_compare(
    comm: &DeviceComm,
    published: &mut Published,
    head: Option<Head>,
    timeout: Duration,
) -> Option<Option<Error>> {
    let (seq_now, hash_now, last_call) = {
        let st = comm.state.lock().ok()?;
        (st.cseq, st.hash, comm.last_call(&st))
    };
    let Some(store) = &comm.store else {
        return Some(None);
    };
    let age = head.map(|h| h.since.elapsed());
    let suspicious = age.is_some_and(|age| age > timeout / 2 || age > PUBLISH_EVERY);
    let due = published.at.is_none_or(|t| t.elapsed() >= PUBLISH_EVERY);
    let mut check = false;
    if seq_now != published.seq
        && (due || suspicious)
        && publish(store, comm.rank, seq_now, hash_now, &last_call)
    {
        published.seq = seq_now;
        published.at = Some(Instant::now());
        check = true;
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
        let n = comm.size;
        let mut neighbours = vec![(comm.rank + 1) % n, (comm.rank + n - 1) % n];
        neighbours.dedup();
        return Some(compare(comm, seq_now, hash_now, &last_call, neighbours));
    }
    Some(None)
}

/// This rank's calls so far: sequence number, rolling hash, and the last call in words.
fn mine(comm: &DeviceComm) -> Option<(u64, u64, String)> {
    let st = comm.state.lock().ok()?;
    Some((st.cseq, st.hash, comm.last_call(&st)))
}

/// A desync between this rank's calls so far and what any peer published, if there is one.
/// Asked only when the communicator is about to fail, so it reads every rank's record: the rank
/// that called something else need not be a ring neighbour of this one.
pub(super) fn desync_now(comm: &DeviceComm) -> Option<Error> {
    let (seq, hash, last) = mine(comm)?;
    compare(comm, seq, hash, &last, others(comm))
}

/// How long an enqueue that failed waits for the peers' records of the call it failed in: a
/// peer publishes within one cadence of entering a call.
const RECORDS_WAIT: Duration = PUBLISH_EVERY.saturating_add(Duration::from_millis(250));

/// [`desync_now`] for an engine that failed while enqueueing: a peer that found a desync first
/// gave up, and NCCL's enqueue fails as soon as that peer's proxy is gone, possibly before the
/// rank that called something else has published. So this rank publishes its own record, then
/// waits (at most [`RECORDS_WAIT`]) until every live peer's record reaches this call. It stops
/// early once this communicator failed otherwise (its watchdog saw a peer die) or the store
/// stops answering.
pub(super) fn desync_soon(comm: &DeviceComm) -> Option<Error> {
    let (seq, hash, last) = mine(comm)?;
    let store = comm.store.as_ref()?;
    publish(store, comm.rank, seq, hash, &last);
    let deadline = Instant::now() + RECORDS_WAIT;
    let over = || Instant::now() >= deadline || comm.poisoned.load(Ordering::Acquire);
    // A peer whose process is gone will not publish: not waited for.
    let gone = |r: usize| {
        comm.host_of
            .as_ref()
            .is_some_and(|m| comm.host.members_failure(&m[r..=r]).is_some())
    };
    loop {
        let mut behind = false;
        for r in others(comm) {
            match read_progress(comm, r).ok()? {
                Some((s, h, theirs)) if s == seq && h != hash => {
                    return Some(desync(comm, seq, &last, r, theirs));
                }
                Some((s, _, _)) if s >= seq => {}
                _ => behind |= !gone(r),
            }
            if over() {
                return None;
            }
        }
        if !behind {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every rank but this one.
fn others(comm: &DeviceComm) -> impl Iterator<Item = usize> + '_ {
    (0..comm.size).filter(|&r| r != comm.rank)
}

/// Write this rank's record (read back by [`read_progress`]); whether the store took it.
fn publish(store: &StoreClient, rank: usize, seq: u64, hash: u64, last: &str) -> bool {
    let value = format!("{seq} {hash:016x} {last}");
    store.set(&format!("progress/{rank}"), value).is_ok()
}

/// `rank`'s published record (sequence number, hash, last call), if any; `Err` when the store
/// did not answer (then nothing more is learnt from it for now).
fn read_progress(comm: &DeviceComm, rank: usize) -> Result<Option<(u64, u64, String)>, ()> {
    let Some(store) = comm.store.as_ref() else {
        return Ok(None);
    };
    let v = store.try_get(&format!("progress/{rank}")).map_err(|_| ())?;
    Ok(v.and_then(|v| {
        let s = String::from_utf8_lossy(&v).into_owned();
        let mut it = s.splitn(3, ' ');
        let seq = it.next()?.parse().ok()?;
        let hash = u64::from_str_radix(it.next()?, 16).ok()?;
        Some((seq, hash, it.next().unwrap_or("").to_string()))
    }))
}

/// Ranks whose last published sequence number is below `seq` (with that number).
fn never_entered(comm: &DeviceComm, seq: u64) -> Vec<(usize, u64)> {
    if comm.store.is_none() {
        return Vec::new();
    }
    others(comm)
        .filter_map(|r| {
            let s = read_progress(comm, r).ok().flatten().map_or(0, |p| p.0);
            (s < seq).then_some((r, s))
        })
        .collect()
}

/// The first of `peers` whose record is at this rank's sequence number with another hash. On
/// the cadence only the two ring neighbours are read (O(1) store reads per rank however large
/// the world; a disagreement anywhere breaks the chain somewhere); when failing, every rank.
fn compare(
    comm: &DeviceComm,
    seq: u64,
    hash: u64,
    last: &str,
    peers: impl IntoIterator<Item = usize>,
) -> Option<Error> {
    comm.store.as_ref()?;
    for r in peers.into_iter().filter(|&r| r != comm.rank) {
        // A store that does not answer ends the comparison: each read may wait seconds.
        if let Some((s, h, theirs)) = read_progress(comm, r).ok()? {
            if s == seq && h != hash {
                return Some(desync(comm, seq, last, r, theirs));
            }
        }
    }
    None
}

fn desync(comm: &DeviceComm, seq: u64, mine: &str, peer: usize, theirs: String) -> Error {
    Error::Desync {
        me: comm.rank,
        mine: mine.to_string(),
        peer,
        theirs,
        comm: format!("gpu/{}", comm.id),
        seq,
    }
}
