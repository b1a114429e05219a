//! MPI's non-overtaking rule for point-to-point messages: two messages from one rank to another
//! with the same tag are received in the order they were sent, and two receives posted for the
//! same source and tag take them in the order they were posted.
//!
//! Messages with the same (peer, tag) share one lane of the mailbox, and a large message travels
//! as several frames. Two sends on different threads could interleave their frames, and two
//! receives could each take part of one message. So each send and each receive takes a numbered
//! [`Turn`] when it is posted (on the caller's thread, also for a request that runs elsewhere)
//! and moves data only when its turn has come: a sender hands over all frames of one message
//! before the next message with that key starts, a receiver takes all frames of one message.
//!
//! Lines exist only while a turn is outstanding, so a program that uses a million tags keeps no
//! state for them.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Which side of a message a turn orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Side {
    Send,
    Recv,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    side: Side,
    peer: usize,
    tag: u32,
}

/// The queue of turns for one key.
#[derive(Default)]
struct Line {
    /// The number the next posted operation gets.
    next: u64,
    /// The number whose operation may run now.
    serving: u64,
    /// Numbers given up before their turn came (a request dropped unfinished, a call that
    /// failed before it moved data): skipped when reached.
    abandoned: BTreeSet<u64>,
}

/// Every line of one communicator.
#[derive(Default)]
pub(crate) struct Turns {
    lines: Mutex<Lines>,
    moved: Condvar,
}

#[derive(Default)]
struct Lines {
    by_key: HashMap<Key, Line>,
    /// Turns blocked in [`Turn::wait`]: a turn that ends wakes them only if there are any (a
    /// wake-up is a system call, and most messages never wait).
    waiting: usize,
}

impl Turns {
    /// A place in the line for (`side`, `peer`, `tag`), behind every operation posted before.
    pub fn take(self: &Arc<Self>, side: Side, peer: usize, tag: u32) -> Turn {
        let key = Key { side, peer, tag };
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let line = lines.by_key.entry(key).or_default();
        let n = line.next;
        line.next += 1;
        Turn {
            turns: self.clone(),
            key,
            n,
        }
    }
}

/// One posted send or receive's place in its line. Dropping it ends the turn (or, if it has not
/// come yet, gives it up), letting the next one run.
#[must_use = "a turn must be waited for before moving data"]
pub struct Turn {
    turns: Arc<Turns>,
    key: Key,
    n: u64,
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Turn({:?} peer {} tag {} #{})",
            self.key.side, self.key.peer, self.key.tag, self.n
        )
    }
}

impl Turn {
    /// The peer this turn's message goes to or comes from.
    pub fn peer(&self) -> usize {
        self.key.peer
    }

    /// The tag of this turn's message.
    pub fn tag(&self) -> u32 {
        self.key.tag
    }

    pub(crate) fn side(&self) -> Side {
        self.key.side
    }

    /// Whether this turn was taken from `turns` (one communicator's lines).
    pub(crate) fn belongs_to(&self, turns: &Arc<Turns>) -> bool {
        Arc::ptr_eq(&self.turns, turns)
    }

    /// Wait until every operation posted before this one on its line has finished; `false` if
    /// `deadline` passed first.
    pub(crate) fn wait(&self, deadline: Instant) -> bool {
        let mut lines = self.turns.lines.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let serving = lines.by_key.get(&self.key).map_or(self.n, |l| l.serving);
            if serving >= self.n {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            lines.waiting += 1;
            lines = self
                .turns
                .moved
                .wait_timeout(lines, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            lines.waiting -= 1;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut lines = self.turns.lines.lock().unwrap_or_else(|e| e.into_inner());
        let Some(line) = lines.by_key.get_mut(&self.key) else {
            return;
        };
        if line.serving == self.n {
            line.serving += 1;
            while line.abandoned.remove(&line.serving) {
                line.serving += 1;
            }
        } else {
            line.abandoned.insert(self.n);
        }
        if line.serving == line.next {
            lines.by_key.remove(&self.key);
        }
        let wake = lines.waiting > 0;
        drop(lines);
        if wake {
            self.turns.moved.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(50)
    }

    #[test]
    fn turns_run_in_the_order_they_were_taken() {
        let t = Arc::new(Turns::default());
        let a = t.take(Side::Send, 1, 7);
        let b = t.take(Side::Send, 1, 7);
        assert!(a.wait(soon()));
        assert!(!b.wait(soon()), "the second must wait for the first");
        drop(a);
        assert!(b.wait(soon()));
        drop(b);
        assert!(
            t.lines.lock().unwrap().by_key.is_empty(),
            "no state left behind"
        );
    }

    #[test]
    fn other_keys_do_not_wait() {
        let t = Arc::new(Turns::default());
        let _a = t.take(Side::Send, 1, 7);
        assert!(t.take(Side::Send, 1, 8).wait(soon()));
        assert!(t.take(Side::Send, 2, 7).wait(soon()));
        assert!(t.take(Side::Recv, 1, 7).wait(soon()));
    }

    #[test]
    fn a_turn_given_up_early_is_skipped() {
        let t = Arc::new(Turns::default());
        let a = t.take(Side::Recv, 0, 1);
        let b = t.take(Side::Recv, 0, 1);
        let c = t.take(Side::Recv, 0, 1);
        drop(b);
        assert!(!c.wait(soon()));
        drop(a);
        assert!(c.wait(soon()));
        drop(c);
        assert!(t.lines.lock().unwrap().by_key.is_empty());
    }

    #[test]
    fn a_waiter_wakes_when_the_turn_before_it_ends() {
        let t = Arc::new(Turns::default());
        let a = t.take(Side::Send, 3, 0);
        let b = t.take(Side::Send, 3, 0);
        let h = std::thread::spawn(move || b.wait(Instant::now() + Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        drop(a);
        assert!(h.join().unwrap());
    }
}
