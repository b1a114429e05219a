//! The receive side shared by every transport: frames keyed by (source, communicator, sequence),
//! peer-loss and abort notices, and waiting with a deadline.
//!
//! Frames arrive whether or not a receive is waiting for them (a send never waits for the
//! receiver), so what one peer may leave here untaken is capped ([`max_unmatched_bytes`]): a
//! peer that sends more than that, whether a program bug or a peer that knows the token and
//! floods us, is treated as lost with a cause that says so, its frames are freed, and waits on
//! it fail naming it, instead of this process growing without bound.
//!
//! This file holds the frames, their queues and the waits on them. Posting destinations for
//! frames to be read straight into ([`Mailbox::post`], [`Mailbox::claim`] and the withdrawal)
//! is in [`super::placement`]; its bookkeeping lives in this mailbox's state, under the same
//! lock, since [`Mailbox::deliver`] follows the postings as it queues a frame.

use super::payloads::Payloads;
use super::placement::Posting;
use super::waits::{Blocked, Waits};
use super::{Envelope, P2P_LANE};
use crate::fingerprint::Fingerprint;
use foldhash::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// One frame of a message: a chunk of `total_len` bytes starting at `offset`.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The sender's label.
    pub env: Envelope,
    /// Length of the whole message.
    pub total_len: u64,
    /// Where this chunk starts within the message.
    pub offset: u64,
    /// The chunk's bytes (empty where they were `placed`).
    pub data: Vec<u8>,
    /// How many of the chunk's bytes were read straight into the destination of the receive
    /// that posted it (see [`super::placement`]), which therefore copies nothing.
    pub placed: usize,
    /// Which posting they were placed for (0: none).
    pub posting: u64,
    /// The frame's place among all data frames from its sender, where the transport numbers
    /// them (TCP).
    pub order: Option<u32>,
}

impl Frame {
    /// A frame carrying its bytes.
    pub fn new(env: Envelope, total_len: u64, offset: u64, data: Vec<u8>) -> Self {
        Frame {
            env,
            total_len,
            offset,
            data,
            placed: 0,
            posting: 0,
            order: None,
        }
    }

    /// The chunk's length.
    pub fn len(&self) -> usize {
        self.data.len() + self.placed
    }

    /// Whether the chunk is empty (a message of no bytes).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why [`Mailbox::take`] returned without a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitError {
    /// The deadline passed. `elsewhere` lists sequence numbers the source has sent frames for on
    /// the same communicator, a hint that it is at a different call.
    Timeout {
        /// Sequence numbers with pending frames from the same source and communicator.
        elsewhere: Vec<u64>,
    },
    /// The source's connection is gone.
    Lost {
        /// What the transport observed.
        cause: String,
    },
    /// Another rank sent a frame for the same call with a different fingerprint: the ranks
    /// disagree about what this call is.
    Mismatch {
        /// The sending (transport) rank.
        src: usize,
        /// Its call.
        theirs: Fingerprint,
    },
    /// A peer (or this rank) aborted the world.
    Aborted {
        /// The aborting rank.
        by: usize,
        /// Its reason.
        reason: String,
    },
}

pub(super) type Key = (usize, u64, u64);

pub use crate::config::DEFAULT_MAX_UNMATCHED_BYTES;

/// How many bytes of frames one peer may have waiting in a mailbox that no receive has taken
/// yet: `ACCORD_MAX_UNMATCHED_BYTES` if set, else [`DEFAULT_MAX_UNMATCHED_BYTES`] (1 GiB).
pub fn max_unmatched_bytes() -> usize {
    crate::config::get().max_unmatched_bytes
}

/// The maps every frame and every take touch hash with foldhash: std's SipHash cost about as
/// much as the rest of a small message's bookkeeping. foldhash is seeded per process too, which
/// makes keys that collide harder for a peer to choose (it claims no more than that).
#[derive(Default)]
pub(super) struct State {
    pub(super) queues: HashMap<Key, VecDeque<Frame>>,
    /// Payload bytes waiting per source.
    pub(super) buffered: HashMap<usize, usize>,
    /// Sources that went over the cap: their frames are dropped from then on.
    flooded: std::collections::HashSet<usize>,
    lost: HashMap<usize, String>,
    /// Sources lost by saying goodbye (they closed their communicator), not by failing.
    left: std::collections::HashSet<usize>,
    aborted: Option<(usize, String)>,
    /// Destinations receives posted for frames to be read into (see [`super::placement`]).
    pub(super) posted: HashMap<Key, Posting>,
    /// Waits asleep on `ready`, and withdrawals asleep on `released`: a condition variable's
    /// notify is a system call even with nobody to wake, and polling takers are the rule.
    sleepers: usize,
    pub(super) unposting: usize,
    /// Queues emptied by their last take, kept for the next keys: every call's first frame
    /// from a peer comes under a new key, whose queue would otherwise be allocated, and freed
    /// once taken.
    spare_queues: Vec<VecDeque<Frame>>,
}

/// Most emptied queues kept ([`State::spare_queues`]): more than the keys a rank's calls have
/// open at once in practice (one per peer and call in flight).
const SPARE_QUEUES: usize = 64;
/// The largest capacity (in frames) of a queue kept: a queue that once held many frames goes,
/// so that what is kept stays small (at most 64 x 64 frame slots, about half a megabyte).
const SPARE_QUEUE_CAPACITY: usize = 64;

impl State {
    fn unbuffer(&mut self, src: usize, bytes: usize) {
        if let Some(b) = self.buffered.get_mut(&src) {
            *b = b.saturating_sub(bytes);
        }
    }

    /// The queue of `key`, a kept one where it has none.
    fn queue(&mut self, key: Key) -> &mut VecDeque<Frame> {
        let spare = &mut self.spare_queues;
        self.queues
            .entry(key)
            .or_insert_with(|| spare.pop().unwrap_or_default())
    }

    /// Drop the emptied queue of `key`, keeping it for another key.
    fn retire(&mut self, key: &Key) {
        if let Some(q) = self.queues.remove(key) {
            let keep = self.spare_queues.len() < SPARE_QUEUES
                && q.is_empty()
                && q.capacity() <= SPARE_QUEUE_CAPACITY;
            if keep {
                self.spare_queues.push(q);
            }
        }
    }
}

/// Waits for messages from this size on sleep at once instead of polling: polling beside the
/// receiver thread made a 1 MiB broadcast over TCP 4x slower while small messages gained 2x,
/// and reading the socket in the waiting thread ([`Mailbox::set_pump`]) made 256 KiB - 16 MiB
/// calls over loopback 1.2-3.7x slower on two CPUs (`recv` polled while the kernel fills the
/// socket). Where CPUs are plenty, waits for larger messages poll too
/// ([`Mailbox::set_poll_large`], [`Mailbox::set_pump_below`]).
pub const POLL_MAX_BYTES: usize = 64 << 10;

/// The largest messages whose waits poll where CPUs are plenty ([`Mailbox::set_poll_large`]):
/// on 16 CPUs, 256 KiB calls over TCP gained 5-20 %, 4-16 MiB ones lost up to 2.4x.
pub const LARGE_POLL_MAX_BYTES: usize = 1 << 20;

/// Drains frames that are on their way from a side path (shared-memory rings) into the mailbox;
/// with `false` it may skip the work when another thread is already doing it.
pub type Flush = Box<dyn Fn(&Mailbox, bool) + Send + Sync>;

/// Starts a waiting caller's turn at reading one source's connection itself (see
/// [`Mailbox::set_pump`]); `None` where that source's data does not come that way.
pub type Pump = Box<dyn Fn(usize) -> Option<PollTurn> + Send + Sync>;

/// A source's connection that waiting callers can read themselves ([`PollTurn`]).
pub trait PollSource: Send + Sync {
    /// Read what has arrived into the mailbox, without blocking (nothing if another thread is
    /// reading already); whether any bytes came.
    fn read_available(&self) -> bool;
    /// A turn counted in when it was made has ended; `sleeping`: because the caller is going
    /// to sleep or leaves the reading to others, so whoever reads for them must (a reader
    /// thread parked behind the turn goes back to it).
    fn leave(&self, sleeping: bool);
}

/// A waiting caller's turn at reading a source's connection; dropping it ends the turn. It
/// holds the source by reference count, so taking a turn allocates nothing. (The source is
/// `None` only once the turn has ended.)
pub struct PollTurn(Option<std::sync::Arc<dyn PollSource>>);

impl PollTurn {
    /// A turn at `source`, which must have counted it in: the turn's end counts it out
    /// ([`PollSource::leave`]).
    pub(crate) fn new(source: std::sync::Arc<dyn PollSource>) -> PollTurn {
        PollTurn(Some(source))
    }

    /// Read what has arrived into the mailbox (see [`PollSource::read_available`]).
    pub fn pump(&self) -> bool {
        self.0.as_ref().is_some_and(|s| s.read_available())
    }

    /// End the turn because the caller is going to sleep or leaves the reading to others.
    pub fn sleep(mut self) {
        if let Some(s) = self.0.take() {
            s.leave(true);
        }
    }
}

impl Drop for PollTurn {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.leave(false);
        }
    }
}

/// Incoming frames of one rank.
pub struct Mailbox {
    pub(super) state: Mutex<State>,
    ready: Condvar,
    /// Bytes one source may leave untaken (see the module docs).
    cap: usize,
    /// Run before reporting a source lost: a peer's frames may still sit in shared memory when
    /// its connection's end is noticed, and must be delivered first.
    flush: std::sync::OnceLock<(Flush, std::time::Duration)>,
    /// What this rank's blocked calls wait for, and peers' answers to status queries.
    waits: Waits,
    /// How long a wait with no flush hook checks for its frame, yielding the CPU in between,
    /// before it sleeps (nanoseconds): a frame a receiver thread delivers meanwhile is taken
    /// without the sleep and wake-up, which cost more than a small message's whole trip.
    poll_ns: AtomicU64,
    /// Whether waits for large messages poll too (see [`Mailbox::set_poll_large`]).
    poll_large: std::sync::atomic::AtomicBool,
    /// Run by polling waits for small messages: reads the source's connection in the waiting
    /// thread. Also taken, and ended at once, to send a parked reader thread back to a
    /// connection whose message a wait leaves to it, and by a probe ([`Mailbox::pump_once`]).
    pump: std::sync::OnceLock<Pump>,
    /// Waits for messages below this size call `pump` (from [`POLL_MAX_BYTES`] only where
    /// large messages poll too: see [`Mailbox::set_pump_below`]).
    pump_below: std::sync::atomic::AtomicUsize,
    /// Payload buffers that receives gave back, for the next frames.
    payloads: Payloads,
    /// Signalled when a reader stops writing into a posted destination.
    pub(super) released: Condvar,
    /// Payload bytes delivered read straight into posted destinations ([`Mailbox::placed_bytes`]).
    placed: AtomicU64,
}

impl Default for Mailbox {
    fn default() -> Self {
        Self::with_cap(max_unmatched_bytes())
    }
}

impl Mailbox {
    /// An empty mailbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty mailbox where one source may leave at most `cap` bytes untaken.
    pub fn with_cap(cap: usize) -> Self {
        Mailbox {
            state: Mutex::default(),
            ready: Condvar::new(),
            cap,
            flush: std::sync::OnceLock::new(),
            waits: Waits::default(),
            poll_ns: AtomicU64::new(0),
            poll_large: std::sync::atomic::AtomicBool::new(false),
            placed: AtomicU64::new(0),
            pump: std::sync::OnceLock::new(),
            pump_below: std::sync::atomic::AtomicUsize::new(POLL_MAX_BYTES),
            payloads: Payloads::default(),
            released: Condvar::new(),
        }
    }

    /// Install the hook that delivers frames still in transit on another path (once; later
    /// calls are ignored). A waiting [`Mailbox::take`] also polls it for up to `poll` before
    /// sleeping, which spares the hand-over from a receiver thread on short waits.
    pub fn set_flush(&self, f: Flush, poll: std::time::Duration) {
        let _ = self.flush.set((f, poll));
    }

    /// Let waits check for their frame for up to `poll`, yielding the CPU in between, before
    /// sleeping (when no flush hook polls instead).
    pub fn set_poll(&self, poll: std::time::Duration) {
        let ns = u64::try_from(poll.as_nanos()).unwrap_or(u64::MAX);
        self.poll_ns.store(ns, Ordering::Relaxed);
    }

    /// Let waits for messages from [`POLL_MAX_BYTES`] up to [`LARGE_POLL_MAX_BYTES`] poll too
    /// (yielding, while the receiver thread reads), for as long as the message takes to arrive
    /// at 1 GB/s on top of the polling period: where every waiting thread and its receiver
    /// thread can have a CPU of their own, this spares the waiter's wake-up.
    pub fn set_poll_large(&self, on: bool) {
        self.poll_large.store(on, Ordering::Relaxed);
    }

    /// Install the hook that polling waits call with the source they wait for (once; later
    /// calls are ignored): TCP reads that peer's socket in the waiting thread, which spares
    /// the hand-over from its reader thread (a wake-up that can cost more than the trip).
    pub fn set_pump(&self, p: Pump) {
        let _ = self.pump.set(p);
    }

    /// Make sure whoever reads `src`'s connection for waits that do not read it themselves
    /// (its reader thread) is reading: a turn taken and ended at once does that.
    fn rouse(&self, src: usize) {
        if let Some(turn) = self.pump.get().and_then(|p| p(src)) {
            turn.sleep();
        }
    }

    /// Bring in what has arrived from `src` for a look that does not wait (a probe): the side
    /// path's frames (shared-memory rings), and what its connection holds, read here where
    /// waits read it themselves (else its reader thread is sent back to it), so that a message
    /// that has arrived is seen, not only one a reader thread happened to take in.
    pub fn pump_once(&self, src: usize) {
        if let Some((f, _)) = self.flush.get() {
            f(self, false);
        }
        let Some(turn) = self.pump.get().and_then(|p| p(src)) else {
            return;
        };
        if self.poll_ns.load(Ordering::Relaxed) > 0 {
            turn.pump();
        }
        // Ending the turn as a sleeping wait does lets a reader thread that parked meanwhile
        // go back to the socket.
        turn.sleep();
    }

    /// Let waits for messages below `bytes` read the source's connection themselves
    /// ([`Mailbox::set_pump`]; [`POLL_MAX_BYTES`] unless set). From [`POLL_MAX_BYTES`] only
    /// where [`Mailbox::set_poll_large`] allows polling, and they poll then for as long as bytes
    /// keep coming.
    pub fn set_pump_below(&self, bytes: usize) {
        self.pump_below.store(bytes, Ordering::Relaxed);
    }

    /// What this rank's blocked calls wait for (see [`super::waits`]).
    pub fn waits(&self) -> &Waits {
        &self.waits
    }

    /// Whether frames from `src` for (`comm`, `seq`) are waiting to be taken.
    pub fn has_frames(&self, src: usize, comm: u64, seq: u64) -> bool {
        let st = self.state.lock().unwrap();
        st.queues
            .get(&(src, comm, seq))
            .is_some_and(|q| !q.is_empty())
    }

    /// Release the state and wake the waits asleep on it, if any (they went to sleep holding
    /// the lock, so none can be missed).
    fn wake(&self, st: std::sync::MutexGuard<'_, State>) {
        let asleep = st.sleepers > 0;
        drop(st);
        if asleep {
            self.ready.notify_all();
        }
    }

    /// A frame from `src` arrived.
    pub fn deliver(&self, src: usize, frame: Frame) {
        let mut st = self.state.lock().unwrap();
        if st.flooded.contains(&src) {
            return;
        }
        match st.posted.get_mut(&(src, frame.env.comm, frame.env.seq)) {
            Some(p) if frame.placed == 0 || p.id == frame.posting => {
                p.delivered(&frame);
                self.placed
                    .fetch_add(frame.placed as u64, Ordering::Relaxed);
            }
            // Its receive gave up before it came: the bytes went where nothing reads them.
            _ if frame.placed > 0 => return,
            _ => {}
        }
        let held = st.buffered.entry(src).or_default();
        *held += frame.data.len();
        if *held > self.cap {
            let held = *held;
            self.flooded(&mut st, src, held);
        } else {
            st.queue((src, frame.env.comm, frame.env.seq))
                .push_back(frame);
        }
        self.wake(st);
    }

    /// `src` sent more than the cap: free what it left and report it lost, saying why.
    fn flooded(&self, st: &mut State, src: usize, held: usize) {
        st.flooded.insert(src);
        st.queues.retain(|k, _| k.0 != src);
        st.buffered.remove(&src);
        let cause = format!(
            "it sent {held} bytes that no receive here has taken, more than the {} bytes \
             allowed (ACCORD_MAX_UNMATCHED_BYTES); its messages were dropped",
            self.cap
        );
        tracing::warn!(src, "{cause}");
        // A loss recorded earlier keeps its cause; this one replaces only its absence.
        st.lost.entry(src).or_insert(cause);
    }

    /// The payload buffers that receives give back, for the frames that come next.
    pub fn payloads(&self) -> &Payloads {
        &self.payloads
    }

    /// Return a frame taken from `src` to the front of its queue (a receive that does not
    /// match it leaves it for one that does).
    pub fn put_back(&self, src: usize, frame: Frame) {
        let mut st = self.state.lock().unwrap();
        if st.flooded.contains(&src) {
            return;
        }
        *st.buffered.entry(src).or_default() += frame.data.len();
        st.queue((src, frame.env.comm, frame.env.seq))
            .push_front(frame);
        self.wake(st);
    }

    /// `src` is unreachable from now on; waits on it fail with `cause`.
    pub fn peer_lost(&self, src: usize, cause: impl Into<String>) {
        let mut st = self.state.lock().unwrap();
        st.lost.entry(src).or_insert_with(|| cause.into());
        self.wake(st);
    }

    /// `src` said goodbye: it closed its communicator (after its last call, if it was right
    /// to). Waits on it fail as for [`Mailbox::peer_lost`]; [`Mailbox::left`] tells it apart
    /// from a failure.
    pub fn peer_left(&self, src: usize) {
        let mut st = self.state.lock().unwrap();
        // One step: a failure reported meanwhile must not be taken for the goodbye.
        if let std::collections::hash_map::Entry::Vacant(e) = st.lost.entry(src) {
            e.insert(format!("rank {src} closed its communicator"));
            st.left.insert(src);
        }
        self.wake(st);
    }

    /// Whether `src` was lost by saying goodbye ([`Mailbox::peer_left`]) rather than failing.
    pub fn left(&self, src: usize) -> bool {
        self.state.lock().unwrap().left.contains(&src)
    }

    /// `by` aborted the world; every wait fails from now on. The first abort wins.
    pub fn abort(&self, by: usize, reason: impl Into<String>) {
        let mut st = self.state.lock().unwrap();
        let reason = reason.into();
        let first = st.aborted.is_none();
        if first {
            st.aborted = Some((by, reason.clone()));
        }
        self.wake(st);
        if first {
            // Every rank's record is wanted, also of ranks busy elsewhere when the world ends.
            crate::observe::on_failure(format!("rank {by} aborted the job: {reason}"));
        }
    }

    /// The abort notice, if any.
    pub fn aborted(&self) -> Option<(usize, String)> {
        self.state.lock().unwrap().aborted.clone()
    }

    /// Whether `src` was reported lost, and why.
    pub fn lost(&self, src: usize) -> Option<String> {
        self.state.lock().unwrap().lost.get(&src).cloned()
    }

    /// Wait until a frame from `src` for (`comm`, `seq`) is available, then take it.
    ///
    /// Frames already delivered are returned even if the source was lost afterwards: a peer that
    /// sent its last message and exited is not an error. While waiting, a collective frame from
    /// *any* rank for the same call whose fingerprint differs from `expect` ends the wait with
    /// [`WaitError::Mismatch`]: ranks that disagree about a call may never send to each other
    /// directly (a broadcast with different roots), and must not wait for the timeout.
    ///
    /// `bytes` is the size of the message the frame belongs to (0 if unknown): waits for
    /// messages of [`POLL_MAX_BYTES`] or more poll only where [`Mailbox::set_poll_large`]
    /// allows, up to [`LARGE_POLL_MAX_BYTES`] (see [`Mailbox::set_poll`]). Waits that read the
    /// source's connection themselves ([`Mailbox::set_pump`], small messages) poll as long as
    /// bytes keep coming, and sleep after a polling period without any; the others first send
    /// the source's reader thread back to its connection, in case it parked behind an earlier
    /// wait's polling.
    pub fn take(
        &self,
        src: usize,
        comm: u64,
        seq: u64,
        expect: &Fingerprint,
        deadline: Instant,
        bytes: usize,
    ) -> Result<Frame, WaitError> {
        let small = bytes < POLL_MAX_BYTES;
        let large_poll = self.poll_large.load(Ordering::Relaxed);
        let pumped = bytes < self.pump_below.load(Ordering::Relaxed) && (small || large_poll);
        let key = (src, comm, seq);
        let mut flushed = false;
        let mut polling: Option<Instant> = None;
        // This wait's turn at reading the source's connection, once it polls.
        let mut turn: Option<Option<PollTurn>> = None;
        let pump = self.pump.get().filter(|_| pumped);
        // Recorded once the wait sleeps, for peers that ask what this rank is blocked on.
        let mut blocked = None;
        let mut roused = pumped;
        let mut st = self.state.lock().unwrap();
        loop {
            if let Some(q) = st.queues.get_mut(&key) {
                if let Some(f) = q.pop_front() {
                    if q.is_empty() {
                        st.retire(&key);
                    }
                    st.unbuffer(src, f.data.len());
                    return Ok(f);
                }
            }
            if !roused {
                // The source's reader thread reads this message; it may be keeping out of the
                // way of an earlier wait's polling (parked for up to a millisecond): send it
                // back to the socket now.
                roused = true;
                drop(st);
                self.rouse(src);
                st = self.state.lock().unwrap();
                continue;
            }
            if seq & P2P_LANE == 0 {
                let odd = st.queues.iter().find_map(|(&(s, c, q), frames)| {
                    let f = frames.front()?;
                    (c == comm && q == seq && f.env.fp != *expect).then_some((s, f.env.fp))
                });
                if let Some((src, theirs)) = odd {
                    return Err(WaitError::Mismatch { src, theirs });
                }
            }
            if let Some((by, reason)) = &st.aborted {
                return Err(WaitError::Aborted {
                    by: *by,
                    reason: reason.clone(),
                });
            }
            if st.lost.contains_key(&src) && !flushed {
                if let Some((f, _)) = self.flush.get() {
                    flushed = true;
                    drop(st);
                    f(self, true);
                    st = self.state.lock().unwrap();
                    continue;
                }
            }
            if let Some(cause) = st.lost.get(&src) {
                return Err(WaitError::Lost {
                    cause: cause.clone(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                let mut elsewhere: Vec<u64> = st
                    .queues
                    .keys()
                    .filter(|(s, c, q)| *s == src && *c == comm && *q != seq)
                    .map(|k| k.2)
                    .collect();
                elsewhere.sort_unstable();
                return Err(WaitError::Timeout { elsewhere });
            }
            if let Some((f, poll)) = self.flush.get() {
                let since = *polling.get_or_insert(now);
                if now - since < *poll {
                    drop(st);
                    f(self, false);
                    if let Some(t) = turn.get_or_insert_with(|| pump.and_then(|p| p(src))) {
                        if t.pump() {
                            polling = Some(Instant::now());
                        }
                    }
                    std::hint::spin_loop();
                    st = self.state.lock().unwrap();
                    continue;
                }
            } else {
                let mut poll = self.poll_ns.load(Ordering::Relaxed);
                let roomy = small || pumped || (bytes <= LARGE_POLL_MAX_BYTES && large_poll);
                if !small && roomy && poll > 0 {
                    poll += bytes as u64; // 1 ns a byte
                }
                let since = *polling.get_or_insert(now);
                if poll > 0 && roomy && ((now - since).as_nanos() as u64) < poll {
                    drop(st);
                    match turn.get_or_insert_with(|| pump.and_then(|p| p(src))) {
                        Some(t) if t.pump() => polling = Some(Instant::now()),
                        Some(_) => {}
                        // The receiver thread may share this CPU: let it run.
                        None => std::thread::yield_now(),
                    }
                    st = self.state.lock().unwrap();
                    continue;
                }
            }
            if let Some(t) = turn.take().flatten() {
                t.sleep();
            }
            blocked.get_or_insert_with(|| {
                self.waits.enter(Blocked {
                    comm,
                    seq,
                    ranks: vec![src],
                    gave_up: false,
                })
            });
            st.sleepers += 1;
            st = self.ready.wait_timeout(st, deadline - now).unwrap().0;
            st.sleepers -= 1;
        }
    }

    /// Drop every frame of communicator `comm` (used when a communicator is destroyed).
    pub fn forget_comm(&self, comm: u64) {
        let mut st = self.state.lock().unwrap();
        let mut freed = Vec::new();
        st.queues.retain(|k, q| {
            let keep = k.1 != comm;
            if !keep {
                freed.push((k.0, q.iter().map(|f| f.data.len()).sum::<usize>()));
            }
            keep
        });
        for (src, bytes) in freed {
            st.unbuffer(src, bytes);
        }
    }

    /// Whether `src` was cut off for sending more than the cap (it is still connected).
    pub fn cut_off(&self, src: usize) -> bool {
        self.state.lock().unwrap().flooded.contains(&src)
    }

    /// A frame this rank sent to itself: not counted against the cap (a blocking send to
    /// oneself always arrives before its receive is posted, and cannot flood anyone else).
    pub fn deliver_own(&self, me: usize, frame: Frame) {
        let mut st = self.state.lock().unwrap();
        st.queue((me, frame.env.comm, frame.env.seq))
            .push_back(frame);
        self.wake(st);
    }

    /// Payload bytes that readers have delivered read straight into the destinations receives
    /// posted, since this mailbox was made (the rest went to buffers of their own).
    pub fn placed_bytes(&self) -> u64 {
        self.placed.load(Ordering::Relaxed)
    }

    /// Payload bytes from `src` waiting untaken.
    pub fn buffered(&self, src: usize) -> usize {
        let st = self.state.lock().unwrap();
        st.buffered.get(&src).copied().unwrap_or(0)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::dtype::DataType;
    use crate::fingerprint::OpKind;
    use std::sync::Arc;
    use std::time::Duration;

    pub(in crate::transport) fn frame(bytes: usize) -> Frame {
        Frame::new(
            Envelope {
                comm: 1,
                seq: 5,
                fp: Fingerprint::new(OpKind::AllReduce, DataType::U8, bytes),
            },
            bytes as u64,
            0,
            vec![7; bytes],
        )
    }

    /// A key's queue emptied by its last take is kept, empty, and serves the next key, so that
    /// a call's first frame allocates no queue; frames of the next key still come in order.
    #[test]
    fn an_emptied_queue_serves_the_next_key() {
        let m = Mailbox::new();
        let fp = frame(4).env.fp;
        let soon = || Instant::now() + Duration::from_secs(5);
        for seq in [5, 6] {
            let mut f = frame(4);
            f.env.seq = seq;
            m.deliver(0, f);
            m.take(0, 1, seq, &fp, soon(), 4).unwrap();
            let st = m.state.lock().unwrap();
            assert!(st.queues.is_empty());
            assert_eq!(
                st.spare_queues.len(),
                1,
                "kept, and taken again for seq {seq}"
            );
            assert!(st.spare_queues.iter().all(VecDeque::is_empty));
        }
        for (i, len) in [1usize, 2, 3].into_iter().enumerate() {
            let mut f = frame(len);
            (f.env.seq, f.env.fp, f.offset) = (7, fp, i as u64);
            m.deliver(0, f);
        }
        assert!(
            m.state.lock().unwrap().spare_queues.is_empty(),
            "in use by seq 7"
        );
        let got: Vec<usize> = (0..3)
            .map(|_| m.take(0, 1, 7, &fp, soon(), 6).unwrap().data.len())
            .collect();
        assert_eq!(got, [1, 2, 3]);
    }

    /// Whether the wait for a message of `bytes` was recorded as blocked (that is, slept)
    /// before its frame came 100 ms later, with waits polling for up to 2 s.
    fn slept_for(bytes: usize) -> bool {
        let m = Arc::new(Mailbox::new());
        m.set_poll(Duration::from_secs(2));
        let fp = frame(bytes).env.fp;
        let deliver = {
            let m = m.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                let slept = !m.waits().now().is_empty();
                std::thread::sleep(Duration::from_millis(50));
                m.deliver(0, frame(bytes));
                slept
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let f = m.take(0, 1, 5, &fp, deadline, bytes).expect("the frame");
        assert_eq!(f.data.len(), bytes);
        deliver.join().unwrap()
    }

    /// A pump that counts turns taken, reads and ends, delivering `frames` (each once) when
    /// read.
    #[derive(Default)]
    struct Counts {
        entered: std::sync::atomic::AtomicUsize,
        pumped: std::sync::atomic::AtomicUsize,
        slept: std::sync::atomic::AtomicUsize,
    }

    struct Source(Arc<Counts>, Arc<Mailbox>, Arc<Mutex<Vec<Frame>>>);

    impl PollSource for Source {
        fn read_available(&self) -> bool {
            self.0.pumped.fetch_add(1, Ordering::SeqCst);
            let frames = std::mem::take(&mut *self.2.lock().unwrap());
            let any = !frames.is_empty();
            for f in frames {
                self.1.deliver(0, f);
            }
            any
        }
        fn leave(&self, sleeping: bool) {
            if sleeping {
                self.0.slept.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    fn counted(m: &Arc<Mailbox>, frames: Vec<Frame>) -> Arc<Counts> {
        let counts = Arc::new(Counts::default());
        let (c, weak, frames) = (
            counts.clone(),
            Arc::downgrade(m),
            Arc::new(Mutex::new(frames)),
        );
        m.set_pump(Box::new(move |_| {
            c.entered.fetch_add(1, Ordering::SeqCst);
            let source = Source(c.clone(), weak.upgrade()?, frames.clone());
            Some(PollTurn::new(Arc::new(source)))
        }));
        counts
    }

    fn seen(c: &Counts) -> (usize, usize, usize) {
        let n = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::SeqCst);
        (n(&c.entered), n(&c.pumped), n(&c.slept))
    }

    #[test]
    fn waits_read_small_messages_and_send_the_reader_back_for_large_ones() {
        let deadline = Instant::now() + Duration::from_secs(10);
        // A small message: read by the waiting thread itself, its turn not ended as a sleep.
        let m = Arc::new(Mailbox::new());
        m.set_poll(Duration::from_secs(2));
        let small = frame(16);
        let counts = counted(&m, vec![frame(16)]);
        assert!(m.take(0, 1, 5, &small.env.fp, deadline, 16).is_ok());
        let (entered, pumped, slept) = seen(&counts);
        assert_eq!((entered, slept), (1, 0));
        assert!(pumped >= 1);
        // A large one: one turn, ended at once (the reader thread reads it), no reading here.
        let m = Arc::new(Mailbox::new());
        m.set_poll(Duration::from_secs(2));
        let counts = counted(&m, vec![]);
        let big = frame(4 << 20);
        let late = {
            let m = m.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                m.deliver(0, frame(4 << 20));
            })
        };
        assert!(m.take(0, 1, 5, &big.env.fp, deadline, 4 << 20).is_ok());
        late.join().unwrap();
        assert_eq!(seen(&counts), (1, 0, 1));
        // A probe: reads once where waits poll, and ends its turn as a sleep; only sends the
        // reader back where they do not (crowded hosts).
        let m = Arc::new(Mailbox::new());
        m.set_poll(Duration::from_secs(2));
        let counts = counted(&m, vec![frame(16)]);
        m.pump_once(0);
        assert_eq!(seen(&counts), (1, 1, 1));
        assert!(m.has_frames(0, 1, 5));
        let m = Arc::new(Mailbox::new());
        let counts = counted(&m, vec![frame(16)]);
        m.pump_once(0);
        assert_eq!(seen(&counts), (1, 0, 1));
    }

    #[test]
    fn a_sleeping_wait_wakes_for_a_frame_a_lost_source_and_an_abort() {
        type Event = fn(&Mailbox);
        type Expected = fn(&Result<Frame, WaitError>) -> bool;
        let events: [(Event, Expected); 3] = [
            (|m| m.deliver(0, frame(16)), |r| r.is_ok()),
            (
                |m| m.peer_lost(0, "gone"),
                |r| matches!(r, Err(WaitError::Lost { .. })),
            ),
            (
                |m| m.abort(2, "stop"),
                |r| matches!(r, Err(WaitError::Aborted { .. })),
            ),
        ];
        for (event, expected) in events {
            // No polling: the wait sleeps at once, and only a notification ends it early.
            let m = Arc::new(Mailbox::new());
            let fp = frame(16).env.fp;
            let later = {
                let m = m.clone();
                std::thread::spawn(move || {
                    while m.waits().now().is_empty() {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    event(&m);
                })
            };
            let start = Instant::now();
            let r = m.take(0, 1, 5, &fp, start + Duration::from_secs(30), 16);
            later.join().unwrap();
            assert!(expected(&r), "{:?}", r.as_ref().map(|f| f.len()));
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "woken, not timed out"
            );
        }
    }

    #[test]
    fn small_messages_poll_before_sleeping_and_large_ones_sleep_at_once() {
        assert!(!slept_for(16));
        assert!(slept_for(POLL_MAX_BYTES));
    }

    #[test]
    fn a_polling_wait_still_ends_at_its_deadline() {
        let m = Mailbox::new();
        m.set_poll(Duration::from_secs(5));
        let fp = frame(4).env.fp;
        let start = Instant::now();
        let e = m.take(0, 1, 5, &fp, start + Duration::from_millis(100), 4);
        assert!(matches!(e, Err(WaitError::Timeout { .. })), "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}
