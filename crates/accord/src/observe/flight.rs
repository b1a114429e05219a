//! The flight recorder: the last operations of a communicator, always on.
//!
//! Every operation writes one slot of a ring when it starts and updates it when it ends: what
//! it was (its fingerprint: kind, type, count, root, reduce operator), its place in the
//! communicator's order, where it ran, its state and when. Writing is a handful of plain
//! atomic stores and one coarse clock read (1-4 ms resolution, about 6 ns), so the recorder
//! stays on in production; reading (a dump) happens only on failures, signals and requests,
//! and checks each slot's version so that a slot rewritten meanwhile is skipped, not torn.
//!
//! Host collectives are indexed by their sequence number (the one ranks agree on); device
//! operations and point-to-point messages share a second ring in issue order, each with its
//! own count (device collectives are issued in the same order on every rank, so their counts
//! agree too; point-to-point counts do not).

use super::clock;
use crate::dtype::{DataType, ReduceOp};
use crate::fingerprint::{Fingerprint, OpKind};
use crate::schedule::Algorithm;
use std::sync::atomic::{AtomicU64, Ordering};

/// Entries kept per ring by default (`ACCORD_FLIGHT_RECORDER`).
pub const DEFAULT_ENTRIES: usize = 2048;

/// Host calls of at least this many bytes read the clock when they end; smaller ones only if
/// they blocked on a peer (a recorded wait: after 20 ms on shared memory, after the poll over
/// TCP) or failed, and otherwise end at their start's time: they took less than that.
pub const TIMED_BYTES: u64 = 64 << 10;

/// Which of a communicator's orders an operation belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Lane {
    /// A collective on host memory; `seq` is the communicator's sequence number.
    Host = 1,
    /// A collective on device memory; `seq` counts this communicator's device collectives.
    Device = 2,
    /// A send, receive or device point-to-point call; `seq` counts them on this rank.
    P2p = 3,
}

impl Lane {
    /// Name in dumps.
    pub fn name(self) -> &'static str {
        match self {
            Lane::Host => "host",
            Lane::Device => "device",
            Lane::P2p => "p2p",
        }
    }

    fn from_u8(v: u8) -> Option<Lane> {
        [Lane::Host, Lane::Device, Lane::P2p]
            .into_iter()
            .find(|l| *l as u8 == v)
    }
}

/// How far an operation got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    /// Entered and not returned (host), or being enqueued (device).
    Started = 1,
    /// Returned successfully (host), or finished on the GPU (device).
    Completed = 2,
    /// Returned an error.
    Failed = 3,
    /// Enqueued on a stream; not yet seen finished.
    Enqueued = 4,
}

impl State {
    /// Name in dumps.
    pub fn name(self) -> &'static str {
        match self {
            State::Started => "started",
            State::Completed => "completed",
            State::Failed => "failed",
            State::Enqueued => "enqueued",
        }
    }

    fn from_u8(v: u8) -> Option<State> {
        [
            State::Started,
            State::Completed,
            State::Failed,
            State::Enqueued,
        ]
        .into_iter()
        .find(|s| *s as u8 == v)
    }
}

/// Where an operation ran: a host engine of the communicator (its place in the list), a
/// schedule over the transport, or a device engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Not decided (yet), or not applicable.
    Unknown,
    /// A schedule over the transport, with its algorithm once chosen.
    Schedule(Option<Algorithm>),
    /// The communicator's host engine at this place.
    Engine(u8),
    /// The device engine.
    Device,
}

impl Route {
    fn pack(self) -> u64 {
        let (kind, arg) = match self {
            Route::Unknown => (0, 0),
            Route::Schedule(a) => (1, a.map_or(0, |a| 1 + algo_index(a))),
            Route::Engine(i) => (2, i as u64),
            Route::Device => (3, 0),
        };
        kind | arg << 8
    }

    fn unpack(v: u64) -> Route {
        let arg = (v >> 8) & 0xff;
        match v & 0xff {
            1 => Route::Schedule(
                arg.checked_sub(1)
                    .and_then(|i| Algorithm::ALL.get(i as usize).copied()),
            ),
            2 => Route::Engine(arg as u8),
            3 => Route::Device,
            _ => Route::Unknown,
        }
    }
}

fn algo_index(a: Algorithm) -> u64 {
    Algorithm::ALL.iter().position(|x| *x == a).unwrap_or(0) as u64
}

/// One operation as read back from the ring.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Which order it belongs to.
    pub lane: Lane,
    /// Its place in that order (see [`Lane`]).
    pub seq: u64,
    /// What it was.
    pub fp: Fingerprint,
    /// How far it got.
    pub state: State,
    /// Where it ran.
    pub route: Route,
    /// Point-to-point: the peer (communicator rank) and tag; `sendrecv` names the destination.
    pub peer: Option<(u32, u32)>,
    /// Point-to-point: a receive (else a send or sendrecv).
    pub recv: bool,
    /// Device operations: the device engine's own count, to tell when it finished.
    pub device_seq: u64,
    /// Coarse monotonic nanoseconds at entry.
    pub start_ns: u64,
    /// Coarse monotonic nanoseconds at return (host; device operations: at enqueue). Small
    /// host calls that did not block return within their start's tick or so and say so: their
    /// end is their start (see [`TIMED_BYTES`]).
    pub end_ns: Option<u64>,
}

/// A slot: `version` is `2 i + 1` while entry `i` is written into it, `2 i + 2` once written.
#[derive(Default)]
struct Slot {
    version: AtomicU64,
    /// Fingerprint: kind | dtype << 8 | op << 16 | has root << 24 | root << 32.
    head: AtomicU64,
    count: AtomicU64,
    counts_hash: AtomicU64,
    seq: AtomicU64,
    /// lane | state << 8 | route << 16 (16 bits).
    meta: AtomicU64,
    /// Point-to-point: 1 | receive << 1 | peer << 2 (30 bits) | tag << 32; 0 without.
    peer: AtomicU64,
    device_seq: AtomicU64,
    start: AtomicU64,
    end: AtomicU64,
}

/// An operation being recorded: ends with [`FlightRecorder::end`].
#[derive(Debug, Clone, Copy)]
#[must_use]
pub struct Entry {
    ring: u8,
    slot: u32,
    version: u64,
    start: u64,
    /// Whether the end must read the clock whatever happens (a large or side-ring call).
    timed: bool,
    /// Waits this thread had recorded when the call started.
    waits: u32,
}

/// Counters of a communicator since it was created (see [`crate::Communicator::metrics`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Collectives on host memory started.
    pub host_ops: u64,
    /// Collectives on device memory enqueued.
    pub device_ops: u64,
    /// Point-to-point calls (host and device).
    pub p2p_ops: u64,
    /// Bytes of this rank's buffers those calls passed (a collective's per-rank count times
    /// the element size; a message's length).
    pub bytes: u64,
    /// Calls that returned an error.
    pub errors: u64,
    /// Nanoseconds host calls spent blocked waiting for peers (after their brief spin or poll;
    /// see [`crate::transport::waits`]).
    pub blocked_ns: u64,
}

impl Metrics {
    /// As JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "host_ops": self.host_ops,
            "device_ops": self.device_ops,
            "p2p_ops": self.p2p_ops,
            "bytes": self.bytes,
            "errors": self.errors,
            "blocked_ns": self.blocked_ns,
        })
    }
}

/// The rings of one communicator (each communicator makes its own; public for benchmarks and
/// tools that want the same record of their own calls).
pub struct FlightRecorder {
    host: Box<[Slot]>,
    side: Box<[Slot]>,
    mask: u64,
    /// Entries of the side ring so far.
    side_next: AtomicU64,
    device_ops: AtomicU64,
    p2p_ops: AtomicU64,
    host_ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
}

impl FlightRecorder {
    /// Rings of `entries` each (rounded up to a power of two).
    pub fn new(entries: usize) -> FlightRecorder {
        let n = entries.max(2).next_power_of_two();
        let ring = || (0..n).map(|_| Slot::default()).collect::<Box<[Slot]>>();
        FlightRecorder {
            host: ring(),
            side: ring(),
            mask: n as u64 - 1,
            side_next: AtomicU64::new(0),
            device_ops: AtomicU64::new(0),
            p2p_ops: AtomicU64::new(0),
            host_ops: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    /// Record a host collective with sequence number `seq` entering. `ordered`: the caller
    /// runs in the communicator's program order (not a reserved call that may run beside
    /// others), so the counters need no atomic read-modify-write.
    #[inline]
    pub fn begin_host(&self, seq: u64, fp: &Fingerprint, route: Route, ordered: bool) -> Entry {
        let bytes = fp.count.saturating_mul(fp.dtype.size() as u64);
        if ordered {
            bump_owned(&self.host_ops, 1);
            bump_owned(&self.bytes, bytes);
        } else {
            self.host_ops.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        let mut e = self.write(seq, Lane::Host, seq, fp, route, 0);
        e.timed = bytes >= TIMED_BYTES;
        e
    }

    /// Record a device collective being enqueued.
    pub fn begin_device(&self, fp: &Fingerprint) -> Entry {
        let n = self.device_ops.fetch_add(1, Ordering::Relaxed) + 1;
        let bytes = fp.count.saturating_mul(fp.dtype.size() as u64);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        let i = self.side_next.fetch_add(1, Ordering::Relaxed);
        self.write(i, Lane::Device, n, fp, Route::Device, 0)
    }

    /// Record a point-to-point call with `peer` (communicator rank) and `tag` entering: a
    /// receive (`recv`), else a send (`OpKind::P2p`) or sendrecv (`OpKind::SendRecv`).
    pub fn begin_p2p(
        &self,
        kind: OpKind,
        dtype: DataType,
        bytes: usize,
        (peer, tag, recv): (usize, u32, bool),
    ) -> Entry {
        let n = self.p2p_ops.fetch_add(1, Ordering::Relaxed) + 1;
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        let fp = Fingerprint::new(kind, dtype, bytes / dtype.size().max(1));
        let i = self.side_next.fetch_add(1, Ordering::Relaxed);
        let peer = 1 | (recv as u64) << 1 | ((peer as u64 & 0x3fff_ffff) << 2) | (tag as u64) << 32;
        self.write(i, Lane::P2p, n, &fp, Route::Unknown, peer)
    }

    #[inline]
    /// Write entry `index` of `lane`'s ring (host calls have a ring of their own; device and
    /// point-to-point calls share the other).
    fn write(
        &self,
        index: u64,
        lane: Lane,
        seq: u64,
        fp: &Fingerprint,
        route: Route,
        peer: u64,
    ) -> Entry {
        let ring = (lane != Lane::Host) as u8;
        let slots = if ring == 0 { &self.host } else { &self.side };
        let at = (index & self.mask) as usize;
        let s = &slots[at];
        let version = 2 * index + 2;
        let r = Ordering::Relaxed;
        s.version.store(version - 1, r);
        std::sync::atomic::fence(Ordering::Release);
        let head = fp.kind as u64
            | (fp.dtype as u64) << 8
            | (fp.op.map_or(0, |o| o as u64)) << 16
            | (fp.root.is_some() as u64) << 24
            | (fp.root.unwrap_or(0) as u64) << 32;
        s.head.store(head, r);
        s.count.store(fp.count, r);
        s.counts_hash.store(fp.counts_hash, r);
        s.seq.store(seq, r);
        s.meta.store(
            lane as u64 | (State::Started as u64) << 8 | route.pack() << 16,
            r,
        );
        s.peer.store(peer, r);
        s.device_seq.store(0, r);
        let start = clock::coarse_ns();
        s.start.store(start, r);
        s.end.store(0, r);
        s.version.store(version, Ordering::Release);
        Entry {
            ring,
            slot: at as u32,
            version,
            start,
            timed: ring != 0,
            waits: crate::transport::waits::entered_on_this_thread(),
        }
    }

    fn slot(&self, e: Entry) -> Option<&Slot> {
        let slots = if e.ring == 0 { &self.host } else { &self.side };
        let s = &slots[e.slot as usize];
        (s.version.load(Ordering::Relaxed) == e.version).then_some(s)
    }

    /// The schedule's algorithm, once chosen.
    pub fn set_route(&self, e: Entry, route: Route) {
        if let Some(s) = self.slot(e) {
            let m = s.meta.load(Ordering::Relaxed);
            s.meta
                .store((m & 0xffff) | route.pack() << 16, Ordering::Relaxed);
        }
    }

    /// A device operation's own count in its engine, once enqueued.
    pub fn set_device_seq(&self, e: Entry, device_seq: u64) {
        if let Some(s) = self.slot(e) {
            s.device_seq.store(device_seq, Ordering::Relaxed);
        }
    }

    /// The operation returned (`ok`: without error); device operations: were enqueued.
    #[inline]
    pub fn end(&self, e: Entry, ok: bool) {
        let state = match (ok, e.ring) {
            (false, _) => State::Failed,
            (true, 0) => State::Completed,
            (true, _) => State::Enqueued,
        };
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        // A ring that wrapped around meanwhile holds a newer entry there: nothing to update.
        let Some(s) = self.slot(e) else { return };
        // A small call that never blocked (see `TIMED_BYTES`) ends within its start's tick or
        // the next: its end is not worth a second clock read on every small call.
        let blocked = crate::transport::waits::entered_on_this_thread() != e.waits;
        let end = match e.timed || blocked || !ok {
            true => clock::coarse_ns(),
            false => e.start,
        };
        s.end.store(end, Ordering::Relaxed);
        let m = s.meta.load(Ordering::Relaxed);
        s.meta
            .store((m & !0xff00) | (state as u64) << 8, Ordering::Release);
    }

    /// The counters (without `blocked_ns`, which the transport keeps).
    pub fn metrics(&self) -> Metrics {
        let r = Ordering::Relaxed;
        Metrics {
            host_ops: self.host_ops.load(r),
            device_ops: self.device_ops.load(r),
            p2p_ops: self.p2p_ops.load(r),
            bytes: self.bytes.load(r),
            errors: self.errors.load(r),
            blocked_ns: 0,
        }
    }

    /// Every entry still in the rings, oldest first within each lane (host, then the others in
    /// issue order).
    pub fn records(&self) -> Vec<Record> {
        let mut out: Vec<(u64, Record)> = Vec::new();
        for (ring, slots) in [(0u8, &self.host), (1, &self.side)] {
            let mut got: Vec<(u64, Record)> = slots.iter().filter_map(read).collect();
            got.sort_by_key(|(v, _)| *v);
            out.extend(got.into_iter().map(|(v, r)| (v | (ring as u64) << 62, r)));
        }
        out.into_iter().map(|(_, r)| r).collect()
    }
}

/// Add to a counter only its owner writes.
#[inline]
fn bump_owned(c: &AtomicU64, by: u64) {
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

/// A slot's entry with its version, unless it is empty or being rewritten.
fn read(s: &Slot) -> Option<(u64, Record)> {
    let r = Ordering::Relaxed;
    let v1 = s.version.load(Ordering::Acquire);
    if v1 == 0 || v1 % 2 == 1 {
        return None;
    }
    let (head, count, hash) = (s.head.load(r), s.count.load(r), s.counts_hash.load(r));
    let (seq, meta, peer) = (
        s.seq.load(r),
        s.meta.load(Ordering::Acquire),
        s.peer.load(r),
    );
    let (dseq, start, end) = (s.device_seq.load(r), s.start.load(r), s.end.load(r));
    std::sync::atomic::fence(Ordering::Acquire);
    if s.version.load(r) != v1 {
        return None;
    }
    let fp = Fingerprint {
        kind: OpKind::from_u8(head as u8)?,
        dtype: DataType::from_u8((head >> 8) as u8)?,
        op: match (head >> 16) as u8 {
            0 => None,
            v => Some(ReduceOp::from_u8(v)?),
        },
        root: ((head >> 24) & 1 == 1).then_some((head >> 32) as u32),
        count,
        counts_hash: hash,
        // Records keep the caller's call; its route names the algorithm.
        algo: None,
    };
    let record = Record {
        lane: Lane::from_u8(meta as u8)?,
        seq,
        fp,
        state: State::from_u8((meta >> 8) as u8)?,
        route: Route::unpack(meta >> 16),
        peer: (peer & 1 == 1).then_some((((peer >> 2) & 0x3fff_ffff) as u32, (peer >> 32) as u32)),
        recv: peer & 3 == 3,
        device_seq: dseq,
        start_ns: start,
        end_ns: (end != 0).then_some(end),
    };
    Some((v1, record))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(count: usize) -> Fingerprint {
        Fingerprint::new(OpKind::AllReduce, DataType::F32, count).with_op(ReduceOp::Sum)
    }

    #[test]
    fn records_read_back_in_order_and_the_ring_keeps_the_newest() {
        let f = FlightRecorder::new(4);
        for seq in 1..=6u64 {
            let e = f.begin_host(seq, &fp(seq as usize), Route::Engine(0), true);
            f.end(e, seq != 5);
        }
        let rs = f.records();
        assert_eq!(rs.iter().map(|r| r.seq).collect::<Vec<_>>(), [3, 4, 5, 6]);
        assert_eq!(rs[2].state, State::Failed);
        assert_eq!(rs[3].state, State::Completed);
        assert_eq!(rs[3].fp, fp(6));
        assert_eq!(rs[3].route, Route::Engine(0));
        let m = f.metrics();
        assert_eq!((m.host_ops, m.bytes, m.errors), (6, 4 * 21, 1));
    }

    #[test]
    fn an_entry_overwritten_before_it_ends_is_left_alone() {
        let f = FlightRecorder::new(2);
        let old = f.begin_host(1, &fp(1), Route::Unknown, true);
        let newer = f.begin_host(3, &fp(3), Route::Unknown, true);
        f.end(old, true);
        let rs = f.records();
        assert_eq!(rs.len(), 1);
        assert_eq!((rs[0].seq, rs[0].state), (3, State::Started));
        f.set_route(newer, Route::Schedule(Some(Algorithm::Ring)));
        assert_eq!(f.records()[0].route, Route::Schedule(Some(Algorithm::Ring)));
    }

    #[test]
    fn side_lane_counts_device_and_p2p_separately() {
        let f = FlightRecorder::new(8);
        let d = f.begin_device(&fp(8));
        f.set_device_seq(d, 41);
        f.end(d, true);
        let p = f.begin_p2p(OpKind::P2p, DataType::F64, 64, (3, 7, true));
        let rs = f.records();
        assert_eq!(rs.len(), 2);
        assert_eq!(
            (rs[0].lane, rs[0].seq, rs[0].device_seq),
            (Lane::Device, 1, 41)
        );
        assert_eq!(rs[0].state, State::Enqueued);
        assert_eq!(
            (rs[1].lane, rs[1].peer, rs[1].fp.count),
            (Lane::P2p, Some((3, 7)), 8)
        );
        assert!(rs[1].recv && !rs[0].recv);
        assert_eq!(rs[1].state, State::Started);
        f.end(p, true);
        let m = f.metrics();
        assert_eq!((m.device_ops, m.p2p_ops, m.bytes), (1, 1, 32 + 64));
    }

    #[test]
    fn concurrent_writers_and_a_reader_never_see_torn_entries() {
        let f = std::sync::Arc::new(FlightRecorder::new(16));
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let f = f.clone();
                s.spawn(move || {
                    for i in 0..20_000u64 {
                        let seq = i * 2 + t;
                        let e = f.begin_host(seq, &fp(seq as usize), Route::Unknown, false);
                        f.end(e, true);
                    }
                });
            }
            for _ in 0..200 {
                for r in f.records() {
                    assert_eq!(r.fp.count, r.seq, "torn entry {r:?}");
                }
            }
        });
        assert_eq!(f.metrics().host_ops, 40_000);
    }
}
