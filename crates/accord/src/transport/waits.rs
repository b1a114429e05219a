//! What this rank's blocked calls wait for, and what its peers said they wait for.
//!
//! When a call times out, the rank it waited for may itself be waiting for a third one; blaming
//! the first would name a healthy rank. Every rank therefore records its blocked waits here
//! (communicator, sequence number, the ranks it waits for), where the transport's own threads
//! can read them while the application thread is blocked: a peer's *status query* is answered
//! from this record by those threads, and the blame chain (`blame`) follows the answers to the rank that
//! makes no progress. A rank that gave up after such a diagnosis keeps saying whom it blamed, so
//! that a peer diagnosing later follows it there rather than to the rank that just gave up.
//!
//! # Status payload
//!
//! ```text
//! nonce u64 | records u16 | per record: comm u64, seq u64, flags u8 (1: gave up), ranks u16,
//!                                       rank u32 * ranks
//! ```
//!
//! All little-endian, at most [`MAX_STATUS_RECORDS`] records of at most [`MAX_STATUS_RANKS`]
//! ranks each, so a status always fits [`MAX_STATUS_BYTES`].

use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// Most records a status carries.
pub const MAX_STATUS_RECORDS: usize = 32;
/// Most ranks one record of a status carries.
pub const MAX_STATUS_RANKS: usize = 256;
/// Largest status payload accepted.
pub const MAX_STATUS_BYTES: usize = 10 + MAX_STATUS_RECORDS * (19 + 4 * MAX_STATUS_RANKS);

/// One blocked wait: the call, and the (transport) ranks it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// Communicator id of the call (0 when unknown).
    pub comm: u64,
    /// Sequence number of the call on that communicator.
    pub seq: u64,
    /// Transport ranks the call waits for.
    pub ranks: Vec<usize>,
    /// The call timed out and the rank gave up, blaming `ranks`.
    pub gave_up: bool,
}

/// What probing a peer found out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// It answered: its calls wait for these (empty: it is in no blocking call).
    Waiting(Vec<Blocked>),
    /// No answer in time: its process does not run (stopped, hung, or its host is gone).
    Silent,
    /// Its process is stopped, seen in `/proc` (same host only).
    Stopped {
        /// Its process id.
        pid: i32,
        /// Its process state (`T` or `t`).
        state: char,
    },
    /// Its connection is gone.
    Lost(String),
    /// It left after this rank heard an abort notice: someone gave up before us.
    Left,
    /// This transport cannot ask.
    Unknown,
}

#[derive(Default)]
struct State {
    next_id: u64,
    blocked: Vec<(u64, Blocked)>,
    gave_up: Option<Blocked>,
    /// Process ids of peers on this host (known when they share memory with this rank).
    pids: HashMap<usize, i32>,
    next_nonce: u64,
    /// Queries sent and not yet answered: (peer, nonce).
    asked: HashSet<(usize, u64)>,
    answers: HashMap<(usize, u64), Vec<Blocked>>,
    /// Nanoseconds spent in recorded waits, per communicator id (foldhash: updated by every
    /// recorded wait).
    blocked_ns: foldhash::HashMap<u64, u64>,
}

thread_local! {
    /// Waits this thread has recorded: a call that sees it unchanged never blocked.
    static ENTERED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// How many waits this thread has recorded so far (see [`Waits::enter`]).
#[inline]
pub fn entered_on_this_thread() -> u32 {
    ENTERED.with(std::cell::Cell::get)
}

/// This rank's blocked waits and its peers' answers to status queries. One per
/// [`super::Mailbox`].
#[derive(Default)]
pub struct Waits {
    state: Mutex<State>,
    answered: Condvar,
}

/// Keeps a wait recorded until dropped.
pub struct WaitGuard<'a> {
    waits: &'a Waits,
    id: u64,
    comm: u64,
    since: Instant,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let waited = self.since.elapsed().as_nanos() as u64;
        let mut st = self.waits.lock();
        st.blocked.retain(|(id, _)| *id != self.id);
        *st.blocked_ns.entry(self.comm).or_default() += waited;
        drop(st);
        crate::observe::trace::wait(self.comm, self.since, waited);
    }
}

impl Waits {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record that a call waits for `b.ranks` until the guard is dropped.
    pub fn enter(&self, b: Blocked) -> WaitGuard<'_> {
        ENTERED.with(|n| n.set(n.get().wrapping_add(1)));
        let mut st = self.lock();
        st.next_id += 1;
        let id = st.next_id;
        let comm = b.comm;
        st.blocked.push((id, b));
        WaitGuard {
            waits: self,
            id,
            comm,
            since: Instant::now(),
        }
    }

    /// Nanoseconds the calls of communicator `comm` spent in recorded waits so far.
    pub fn blocked_ns(&self, comm: u64) -> u64 {
        self.lock().blocked_ns.get(&comm).copied().unwrap_or(0)
    }

    /// Record for good that this rank gave up a call, blaming `b.ranks`.
    pub fn give_up(&self, mut b: Blocked) {
        b.gave_up = true;
        self.lock().gave_up.get_or_insert(b);
    }

    /// What this rank waits for now (and whom it blamed when it gave up), as a status tells it.
    pub fn now(&self) -> Vec<Blocked> {
        let st = self.lock();
        st.gave_up
            .iter()
            .chain(st.blocked.iter().map(|(_, b)| b))
            .take(MAX_STATUS_RECORDS)
            .cloned()
            .collect()
    }

    /// Remember the process id of `rank`, a peer on this host.
    pub fn set_pid(&self, rank: usize, pid: i32) {
        if pid > 0 {
            self.lock().pids.insert(rank, pid);
        }
    }

    /// The process id of `rank` if it runs on this host and shares memory with this rank.
    pub fn pid(&self, rank: usize) -> Option<i32> {
        self.lock().pids.get(&rank).copied()
    }

    /// A fresh nonce for a status query to `peer`, whose answer [`Waits::await_answers`] waits
    /// for.
    pub fn ask(&self, peer: usize) -> u64 {
        let mut st = self.lock();
        st.next_nonce += 1;
        let n = st.next_nonce;
        st.asked.insert((peer, n));
        n
    }

    /// `peer` answered query `nonce`; answers nobody asked for are dropped.
    pub fn answer(&self, peer: usize, nonce: u64, waits: Vec<Blocked>) {
        let mut st = self.lock();
        if st.asked.remove(&(peer, nonce)) {
            st.answers.insert((peer, nonce), waits);
            drop(st);
            self.answered.notify_all();
        }
    }

    /// The answers to `queries` (peer, nonce) that arrive until `deadline`, in order; `None`
    /// for each query left unanswered (and forgotten).
    pub fn await_answers(
        &self,
        queries: &[(usize, u64)],
        deadline: Instant,
    ) -> Vec<Option<Vec<Blocked>>> {
        let mut st = self.lock();
        loop {
            let now = Instant::now();
            if now >= deadline || queries.iter().all(|q| st.answers.contains_key(q)) {
                break;
            }
            st = self
                .answered
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        queries
            .iter()
            .map(|q| {
                st.asked.remove(q);
                st.answers.remove(q)
            })
            .collect()
    }
}

/// Encode a status answering query `nonce`.
pub fn encode_status(nonce: u64, waits: &[Blocked]) -> Vec<u8> {
    let waits = &waits[..waits.len().min(MAX_STATUS_RECORDS)];
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&nonce.to_le_bytes());
    b.extend_from_slice(&(waits.len() as u16).to_le_bytes());
    for w in waits {
        let ranks = &w.ranks[..w.ranks.len().min(MAX_STATUS_RANKS)];
        b.extend_from_slice(&w.comm.to_le_bytes());
        b.extend_from_slice(&w.seq.to_le_bytes());
        b.push(u8::from(w.gave_up));
        b.extend_from_slice(&(ranks.len() as u16).to_le_bytes());
        for &r in ranks {
            b.extend_from_slice(&(r as u32).to_le_bytes());
        }
    }
    b
}

/// Decode a status from a world of `size` ranks: `None` if it is malformed or names a rank
/// outside the world.
pub fn decode_status(b: &[u8], size: usize) -> Option<(u64, Vec<Blocked>)> {
    let mut r = Reader(b);
    let nonce = r.u64()?;
    let n = r.u16()? as usize;
    if n > MAX_STATUS_RECORDS {
        return None;
    }
    let mut waits = Vec::with_capacity(n);
    for _ in 0..n {
        let comm = r.u64()?;
        let seq = r.u64()?;
        let gave_up = match r.take::<1>()?[0] {
            0 => false,
            1 => true,
            _ => return None,
        };
        let k = r.u16()? as usize;
        if k > MAX_STATUS_RANKS {
            return None;
        }
        let ranks = (0..k)
            .map(|_| r.u32().map(|x| x as usize).filter(|&x| x < size))
            .collect::<Option<Vec<usize>>>()?;
        waits.push(Blocked {
            comm,
            seq,
            ranks,
            gave_up,
        });
    }
    r.0.is_empty().then_some((nonce, waits))
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
}

/// The scheduling state of process `pid` (the third field of `/proc/<pid>/stat`: `R`, `S`,
/// `T` for stopped, `t` for stopped by a tracer...), if it can be read.
pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name in parentheses may itself contain spaces and parentheses.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().next()?.chars().next()
}

/// Whether a process state says the process is stopped (by a signal or a tracer).
pub fn is_stopped(state: char) -> bool {
    matches!(state, 'T' | 't')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rec(ranks: &[usize]) -> Blocked {
        Blocked {
            comm: 7,
            seq: 3,
            ranks: ranks.to_vec(),
            gave_up: false,
        }
    }

    #[test]
    fn status_round_trip_and_bounds() {
        let w = vec![
            rec(&[1, 2]),
            Blocked {
                gave_up: true,
                ..rec(&[3])
            },
        ];
        let b = encode_status(42, &w);
        assert!(b.len() <= MAX_STATUS_BYTES);
        assert_eq!(decode_status(&b, 4), Some((42, w.clone())));
        // A rank outside the world, a truncated or padded payload: refused.
        assert_eq!(decode_status(&b, 3), None);
        assert_eq!(decode_status(&b[..b.len() - 1], 4), None);
        let mut long = b.clone();
        long.push(0);
        assert_eq!(decode_status(&long, 4), None);
        let big = vec![rec(&(0..1000).collect::<Vec<_>>()); 100];
        assert!(encode_status(1, &big).len() <= MAX_STATUS_BYTES);
    }

    proptest::proptest! {
        #[test]
        fn decoding_garbage_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = decode_status(&bytes, 8);
        }
    }

    #[test]
    fn waits_are_recorded_while_guarded_and_giving_up_sticks() {
        let w = Waits::default();
        assert!(w.now().is_empty());
        {
            let _g = w.enter(rec(&[2]));
            assert_eq!(w.now(), vec![rec(&[2])]);
        }
        assert!(w.now().is_empty());
        w.give_up(rec(&[3]));
        w.give_up(rec(&[1]));
        assert_eq!(w.now()[0].ranks, vec![3]);
        assert!(w.now()[0].gave_up);
    }

    #[test]
    fn only_asked_questions_are_answered() {
        let w = Waits::default();
        let n = w.ask(1);
        w.answer(1, n + 5, vec![rec(&[0])]);
        w.answer(2, n, vec![rec(&[0])]);
        w.answer(1, n, vec![rec(&[2])]);
        let m = w.ask(2);
        let got = w.await_answers(
            &[(1, n), (2, m)],
            Instant::now() + Duration::from_millis(20),
        );
        assert_eq!(got, vec![Some(vec![rec(&[2])]), None]);
        // Forgotten: a late answer is dropped.
        w.answer(2, m, vec![]);
        assert!(w.lock().answers.is_empty());
    }

    #[test]
    fn this_process_is_running() {
        let pid = std::process::id() as i32;
        let s = process_state(pid).expect("own /proc stat");
        assert!(!is_stopped(s), "{s}");
    }
}
