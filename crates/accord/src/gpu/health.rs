//! The watchdog's verdict, a pure function of what it has seen: the engine's asynchronous error,
//! the host communicator's notice that a member is gone, the oldest unfinished operation, the
//! peers' progress records (a desync) and the clock. Keeping the policy free of CUDA, engines and
//! threads lets it be tested with virtual time.
//!
//! The host communicator's connections see a peer process end (a closed socket) within
//! milliseconds, while an engine may never notice a peer that died inside a kernel spinning on
//! its memory, and the timeout can be minutes. So a host notice decides:
//!
//! - with nothing in flight, at once: no later operation can complete;
//! - with an operation in flight that was issued after the notice was first seen, at once;
//! - with an older operation in flight, once the engine also reports an error, or after
//!   [`PEER_GRACE`]: a peer that finished its part of the last operation and exited cleanly
//!   leaves this rank's part to finish on its own, and that result must not turn into an error.
//!
//! An engine error without a host notice waits [`NAMING_WAIT`] for one, so that the failure
//! names the rank whose process ended instead of only the library's words.
//!
//! A desync explains everything else: a peer that found one gives up (its abort notice, its
//! process ending, the engine's error all follow), and mismatched calls hang until the timeout.
//! So before a lost peer, an engine error or a timeout fails the communicator, every peer's
//! progress record is read (the rank that called something else need not be a neighbour of this
//! one, and the neighbours that found it have given up, which is all this rank saw), and a desync
//! they show is the verdict instead; otherwise the records are compared
//! on their cadence ([`with_records`]), where a desync outranks a healthy look and a timeout.

use crate::error::Error;
use std::time::{Duration, Instant};

/// How long an operation issued before a peer was seen gone may still finish. Short, because
/// the abort that follows can take about a second more (an idle communicator's failure showed
/// 1.05 s after a world abort on an H100; the notice takes milliseconds and the watchdog looks
/// every 50 ms, so the rest is `ncclCommAbort`) and a dead peer must be named within 2 s.
pub(super) const PEER_GRACE: Duration = Duration::from_millis(250);

/// The longest an engine's abort (`ncclCommAbort`) is allowed for in that budget.
#[cfg(test)]
const ABORT_ALLOWANCE: Duration = Duration::from_millis(1200);

/// How long an engine error waits for the host to name the peer that caused it.
pub(super) const NAMING_WAIT: Duration = Duration::from_millis(200);

/// What one look found.
pub(super) struct Look<'a> {
    pub now: Instant,
    /// The engine's asynchronous error.
    pub engine: Option<Error>,
    /// The host communicator's notice: a member's connection lost, or the world aborted.
    pub host: Option<Error>,
    /// When the oldest unfinished operation was issued.
    pub oldest: Option<Instant>,
    pub timeout: Duration,
    /// Compare every peer's progress record now (store reads): asked only when a lost peer,
    /// an engine error or a timeout is about to fail the communicator.
    pub probe: &'a dyn Fn() -> Option<Error>,
}

/// When the watchdog first saw each kind of trouble (what the verdict remembers between looks).
#[derive(Default)]
pub(super) struct Memory {
    host_since: Option<Instant>,
    engine_since: Option<Instant>,
}

/// What the communicator must do.
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    Healthy,
    /// A member is gone (the host's notice), with the engine's error if it had one too.
    PeerGone {
        notice: Error,
        engine: Option<Error>,
    },
    /// The engine failed and the host knows of no lost member.
    Engine(Error),
    /// Ranks called different operations.
    Desync(Error),
    /// The oldest operation has been unfinished this long, past the timeout.
    Overdue(Duration),
}

pub(super) fn decide(memory: &mut Memory, look: Look<'_>) -> Verdict {
    let Look {
        now,
        engine,
        host,
        oldest,
        timeout,
        probe,
    } = look;
    // Failing: a desync, if the records show one, is the cause.
    let failing = |v: Verdict| match probe() {
        Some(d) => Verdict::Desync(d),
        None => v,
    };
    let age = oldest.map(|t| now.saturating_duration_since(t));
    let overdue = age.filter(|a| *a > timeout);
    if let Some(notice) = host {
        let since = *memory.host_since.get_or_insert(now);
        let settled = match oldest {
            None => true,
            Some(issued) if issued >= since => true,
            Some(_) => {
                engine.is_some()
                    || overdue.is_some()
                    || now.saturating_duration_since(since) >= PEER_GRACE
            }
        };
        return if settled {
            failing(Verdict::PeerGone { notice, engine })
        } else {
            Verdict::Healthy
        };
    }
    if let Some(e) = engine {
        let since = *memory.engine_since.get_or_insert(now);
        if overdue.is_some() || now.saturating_duration_since(since) >= NAMING_WAIT {
            return failing(Verdict::Engine(e));
        }
        return Verdict::Healthy;
    }
    match overdue {
        Some(age) => failing(Verdict::Overdue(age)),
        None => Verdict::Healthy,
    }
}

/// The verdict once the progress records were compared on their cadence (the watchdog does so
/// only while the communicator is not failing already: the store may have gone with the peer):
/// a desync they show explains a hang better than the timeout does.
pub(super) fn with_records(verdict: Verdict, desync: Option<Error>) -> Verdict {
    match (verdict, desync) {
        (Verdict::Healthy | Verdict::Overdue(_), Some(d)) => Verdict::Desync(d),
        (v, _) => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn lost(rank: usize) -> Error {
        Error::PeerLost {
            rank,
            cause: "connection closed (process exited or was killed)".into(),
        }
    }

    fn no_desync() -> Option<Error> {
        None
    }

    /// A look at `t0 + at` with the oldest operation issued at `t0 + issued`.
    fn look(t0: Instant, at: u64, host: Option<Error>, issued: Option<u64>) -> Look<'static> {
        Look {
            now: t0 + ms(at),
            engine: None,
            host,
            oldest: issued.map(|i| t0 + ms(i)),
            timeout: Duration::from_secs(300),
            probe: &no_desync,
        }
    }

    /// An engine's asynchronous error.
    fn async_err(code: i32) -> Error {
        Error::Gpu {
            library: "nccl",
            call: "ncclCommGetAsyncError".into(),
            code,
            text: "remote process exited or there was a network error".into(),
            rank: Some(0),
        }
    }

    fn desync() -> Error {
        Error::Desync {
            me: 0,
            mine: "allreduce(f32 x 4, sum)".into(),
            peer: 1,
            theirs: "broadcast(f32 x 4, root 0)".into(),
            comm: "gpu/0".into(),
            seq: 3,
        }
    }

    fn gone(rank: usize) -> Verdict {
        Verdict::PeerGone {
            notice: lost(rank),
            engine: None,
        }
    }

    #[test]
    fn an_idle_communicator_fails_at_the_first_notice() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        assert_eq!(decide(&mut m, look(t0, 0, None, None)), Verdict::Healthy);
        assert_eq!(decide(&mut m, look(t0, 10, Some(lost(1)), None)), gone(1));
    }

    #[test]
    fn an_operation_in_flight_gets_a_grace_then_fails_naming_the_rank() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        // Issued at 0, the peer is seen gone at 100: healthy until 100 + PEER_GRACE.
        let grace = PEER_GRACE.as_millis() as u64;
        for at in [100, 101, 100 + grace / 2, 100 + grace - 1] {
            let v = decide(&mut m, look(t0, at, Some(lost(3)), Some(0)));
            assert_eq!(v, Verdict::Healthy, "at {at} ms");
        }
        let v = decide(&mut m, look(t0, 100 + grace, Some(lost(3)), Some(0)));
        assert_eq!(v, gone(3));
    }

    #[test]
    fn the_bound_holds_whatever_the_timeout() {
        // A long timeout never delays a host notice; the whole decision fits well within 2 s.
        for timeout in [ms(1), Duration::from_secs(5), Duration::from_secs(86_400)] {
            let t0 = Instant::now();
            let mut m = Memory::default();
            let mut at = 200;
            let decided = loop {
                let mut l = look(t0, at, Some(lost(1)), Some(150));
                l.timeout = timeout;
                if decide(&mut m, l) != Verdict::Healthy {
                    break at;
                }
                at += 50; // the watchdog's longest period
                assert!(at < 5_000, "never decided with a {timeout:?} timeout");
            };
            assert!(
                decided - 200 <= PEER_GRACE.as_millis() as u64,
                "{timeout:?}"
            );
            // The decision, the watchdog's longest period and the abort fit in 2 s.
            assert!(PEER_GRACE + ms(50) + ABORT_ALLOWANCE < Duration::from_secs(2));
        }
    }

    #[test]
    fn an_operation_issued_after_the_notice_fails_at_once() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        // Seen at 10 with an operation of 5 in flight; it finished and one issued at 20 (before
        // the next look) is now the oldest: it needs the lost peer and gets no grace.
        assert_eq!(
            decide(&mut m, look(t0, 10, Some(lost(2)), Some(5))),
            Verdict::Healthy
        );
        assert_eq!(
            decide(&mut m, look(t0, 30, Some(lost(2)), Some(20))),
            gone(2)
        );
    }

    #[test]
    fn an_operation_that_finishes_in_the_grace_leaves_the_rest_to_the_idle_rule() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        assert_eq!(
            decide(&mut m, look(t0, 100, Some(lost(1)), Some(90))),
            Verdict::Healthy
        );
        // The operation completed (the peer had done its part): nothing in flight any more, and
        // no later operation can complete.
        assert_eq!(decide(&mut m, look(t0, 120, Some(lost(1)), None)), gone(1));
    }

    #[test]
    fn the_engine_confirming_the_loss_ends_the_grace_and_is_reported_with_it() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        assert_eq!(
            decide(&mut m, look(t0, 100, Some(lost(1)), Some(0))),
            Verdict::Healthy
        );
        let mut l = look(t0, 110, Some(lost(1)), Some(0));
        l.engine = Some(async_err(6));
        assert_eq!(
            decide(&mut m, l),
            Verdict::PeerGone {
                notice: lost(1),
                engine: Some(async_err(6))
            }
        );
    }

    #[test]
    fn a_world_abort_notice_decides_like_a_lost_peer() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        let abort = Error::Aborted {
            reason: "rank 2 gave up: desync".into(),
        };
        assert_eq!(
            decide(&mut m, look(t0, 0, Some(abort.clone()), None)),
            Verdict::PeerGone {
                notice: abort,
                engine: None
            }
        );
    }

    #[test]
    fn an_engine_error_waits_briefly_for_the_host_to_name_the_rank() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        let mut l = look(t0, 0, None, Some(0));
        l.engine = Some(async_err(6));
        assert_eq!(decide(&mut m, l), Verdict::Healthy);
        // The host's notice arrives within the wait: the failure names the rank.
        let mut l = look(t0, 20, Some(lost(4)), Some(0));
        l.engine = Some(async_err(6));
        assert_eq!(
            decide(&mut m, l),
            Verdict::PeerGone {
                notice: lost(4),
                engine: Some(async_err(6))
            }
        );
    }

    #[test]
    fn an_engine_error_alone_fails_after_the_naming_wait() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        let wait = NAMING_WAIT.as_millis() as u64;
        for at in [0, wait - 1] {
            let mut l = look(t0, at, None, None);
            l.engine = Some(async_err(3));
            assert_eq!(decide(&mut m, l), Verdict::Healthy, "at {at} ms");
        }
        let mut l = look(t0, wait, None, None);
        l.engine = Some(async_err(3));
        assert_eq!(decide(&mut m, l), Verdict::Engine(async_err(3)));
    }

    #[test]
    fn the_timeout_applies_when_every_peer_is_alive() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        let mut l = look(t0, 1_000, None, Some(0));
        l.timeout = Duration::from_secs(1);
        assert_eq!(decide(&mut m, l), Verdict::Healthy);
        let mut l = look(t0, 1_001, None, Some(0));
        l.timeout = Duration::from_secs(1);
        assert_eq!(decide(&mut m, l), Verdict::Overdue(ms(1_001)));
        // Idle and healthy: nothing to decide.
        assert_eq!(
            decide(&mut m, look(t0, 9_999, None, None)),
            Verdict::Healthy
        );
    }

    #[test]
    fn a_short_timeout_cuts_the_grace_but_still_names_the_rank() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        let mut l = look(t0, 120, Some(lost(1)), Some(0));
        l.timeout = ms(100);
        assert_eq!(decide(&mut m, l), gone(1));
    }

    #[test]
    fn a_desync_in_the_records_outranks_a_lost_peer() {
        // The peer that found the desync gave up and exited: its departure is not the cause.
        let t0 = Instant::now();
        let mut m = Memory::default();
        let probe = || Some(desync());
        let mut l = look(t0, 10, Some(lost(1)), None);
        l.probe = &probe;
        assert_eq!(decide(&mut m, l), Verdict::Desync(desync()));
    }

    #[test]
    fn a_desync_outranks_the_engine_error_it_causes() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        let probe = || Some(desync());
        let mut l = look(t0, NAMING_WAIT.as_millis() as u64, None, Some(0));
        l.engine = Some(async_err(6));
        l.probe = &probe;
        // Seen first at the naming wait's end: the wait starts now, nothing decided yet...
        assert_eq!(decide(&mut m, l), Verdict::Healthy);
        let mut l = look(t0, 2 * NAMING_WAIT.as_millis() as u64, None, Some(0));
        l.engine = Some(async_err(6));
        l.probe = &probe;
        // ...and once it fails, the records name the desync.
        assert_eq!(decide(&mut m, l), Verdict::Desync(desync()));
    }

    #[test]
    fn a_desync_found_on_the_cadence_outranks_health_and_the_timeout() {
        assert_eq!(
            with_records(Verdict::Healthy, Some(desync())),
            Verdict::Desync(desync())
        );
        assert_eq!(
            with_records(Verdict::Overdue(ms(5)), Some(desync())),
            Verdict::Desync(desync())
        );
        assert_eq!(
            with_records(Verdict::Overdue(ms(5)), None),
            Verdict::Overdue(ms(5))
        );
        assert_eq!(with_records(Verdict::Healthy, None), Verdict::Healthy);
        // A failure already decided keeps its cause (it read the records itself).
        assert_eq!(with_records(gone(1), Some(desync())), gone(1));
    }

    #[test]
    fn the_records_are_read_only_when_failing() {
        let t0 = Instant::now();
        let reads = std::cell::Cell::new(0);
        let probe = || {
            reads.set(reads.get() + 1);
            None
        };
        let mut m = Memory::default();
        // Healthy, in the grace: no reads.
        let mut l = look(t0, 0, None, Some(0));
        l.probe = &probe;
        assert_eq!(decide(&mut m, l), Verdict::Healthy);
        let mut l = look(t0, 10, Some(lost(1)), Some(0));
        l.probe = &probe;
        assert_eq!(decide(&mut m, l), Verdict::Healthy);
        assert_eq!(reads.get(), 0);
        // Overdue is failing too: one read.
        let mut l = look(t0, 400_000, None, Some(0));
        l.probe = &probe;
        assert_eq!(
            decide(&mut Memory::default(), l),
            Verdict::Overdue(ms(400_000))
        );
        assert_eq!(reads.get(), 1);
        reads.set(0);
        // A timeout the records explain is a desync.
        let found = || Some(desync());
        let mut l = look(t0, 400_000, None, Some(0));
        l.probe = &found;
        assert_eq!(decide(&mut Memory::default(), l), Verdict::Desync(desync()));
        // Failing on a lost peer: one read, and no desync there.
        let mut l = look(
            t0,
            10 + PEER_GRACE.as_millis() as u64,
            Some(lost(1)),
            Some(0),
        );
        l.probe = &probe;
        assert_eq!(decide(&mut m, l), gone(1));
        assert_eq!(reads.get(), 1);
    }
}
