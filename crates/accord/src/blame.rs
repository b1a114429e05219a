//! Which rank to blame when a call times out.
//!
//! A call that waited in vain for rank P need not have been let down by P: when one rank stops,
//! every rank times out at about the same time, and P may be a healthy rank that waits for the
//! stopped one. So before a timed-out call names P, this rank asks P what it is blocked on (see
//! [`crate::transport::waits`]), then asks whoever P waits for, and so on, a few hops at most,
//! and blames the first rank that
//!
//! - does not answer within the probe time (a stopped or hung process: its transport threads do
//!   not run either), or whose process is seen stopped in `/proc` (ranks of this host),
//! - has lost its connection, or
//! - answers that it is in no blocking call (it is busy elsewhere, or never made the call).
//!
//! A chain that leads back to a rank already asked is a cycle: the ranks wait for each other,
//! and the error says so. A rank that gave up earlier answers with whom it blamed, and the chain
//! goes on there. [`follow`] is the decision, a pure function of the answers; `diagnose` asks
//! the questions through the transport.

use crate::transport::waits::{Answer, Blocked};
use crate::transport::Transport;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Most hops a chain is followed.
pub(crate) const MAX_HOPS: usize = 8;

/// How the chain to a culprit ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// It did not answer in time.
    Silent,
    /// Its process is stopped.
    Stopped {
        /// Process id.
        pid: i32,
        /// Process state from `/proc`.
        state: char,
    },
    /// Its connection is gone, for this reason.
    Lost(String),
    /// It answered that it is in no blocking call.
    Idle,
}

/// The ranks from one this rank waited for to a culprit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// Transport ranks, each waiting for the next; the last is the culprit.
    pub ranks: Vec<usize>,
    /// Per link (`ranks.len() - 1` of them): whether that rank had given up waiting.
    pub gave_up: Vec<bool>,
    /// Why the last rank is to blame.
    pub ending: Ending,
}

/// What following the chain found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// These chains end at ranks that make no progress.
    Culprits(Vec<Chain>),
    /// The ranks wait for each other: `ranks[i]` waits for `ranks[i + 1]`, and the last waits
    /// for `back_to` (`None`: for this rank).
    Cycle {
        /// The ranks in waiting order.
        ranks: Vec<usize>,
        /// Where the last one's wait leads back to.
        back_to: Option<usize>,
    },
    /// A rank on the way left after giving up: the abort notice this rank heard tells more.
    Aborted,
    /// Nothing certain: the transport cannot ask, or the chain is longer than allowed.
    Unknown,
}

impl Finding {
    /// The culprits' transport ranks, if any were found.
    pub fn culprits(&self) -> Vec<usize> {
        match self {
            Finding::Culprits(chains) => chains
                .iter()
                .filter_map(|c| c.ranks.last())
                .copied()
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Follow the waits from `start` (the transport ranks a call of rank `me` waited for) for at
/// most `max_hops` rounds of questions. `probe` asks a batch of ranks at once and returns one
/// answer per rank, in order.
pub fn follow(
    me: usize,
    start: &[usize],
    max_hops: usize,
    mut probe: impl FnMut(&[usize]) -> Vec<Answer>,
) -> Finding {
    // Rank -> (the rank that waits for it, whether that one had given up): the chains.
    let mut parent: HashMap<usize, (usize, bool)> = HashMap::new();
    let mut answers: HashMap<usize, Answer> = HashMap::new();
    let mut order: Vec<usize> = Vec::new();
    let mut frontier: Vec<usize> = Vec::new();
    for &r in start {
        if r != me && !frontier.contains(&r) {
            frontier.push(r);
        }
    }
    let seen = |r: usize, parent: &HashMap<usize, (usize, bool)>, frontier: &[usize]| {
        r == me || parent.contains_key(&r) || start.contains(&r) || frontier.contains(&r)
    };
    let mut hops = 0;
    while !frontier.is_empty() && hops < max_hops {
        hops += 1;
        let got = probe(&frontier);
        let mut next = Vec::new();
        for (i, &p) in frontier.iter().enumerate() {
            let a = got.get(i).cloned().unwrap_or(Answer::Unknown);
            if let Answer::Waiting(waits) = &a {
                for w in waits {
                    for &q in &w.ranks {
                        if !seen(q, &parent, &next) {
                            parent.insert(q, (p, w.gave_up));
                            next.push(q);
                        }
                    }
                }
            }
            order.push(p);
            answers.insert(p, a);
        }
        frontier = next;
    }
    let chain = |end: usize, ending: Ending| {
        let mut ranks = vec![end];
        let mut gave_up = Vec::new();
        while let Some(&(p, g)) = parent.get(ranks.last().unwrap()) {
            ranks.push(p);
            gave_up.push(g);
        }
        ranks.reverse();
        gave_up.reverse();
        Chain {
            ranks,
            gave_up,
            ending,
        }
    };
    let mut stalled = Vec::new();
    let mut idle = Vec::new();
    let mut left = false;
    let mut unknown = !frontier.is_empty();
    for &p in &order {
        match &answers[&p] {
            Answer::Silent => stalled.push(chain(p, Ending::Silent)),
            Answer::Stopped { pid, state } => stalled.push(chain(
                p,
                Ending::Stopped {
                    pid: *pid,
                    state: *state,
                },
            )),
            Answer::Lost(cause) => stalled.push(chain(p, Ending::Lost(cause.clone()))),
            Answer::Waiting(w) if w.is_empty() => idle.push(chain(p, Ending::Idle)),
            Answer::Waiting(_) => {}
            Answer::Left => left = true,
            Answer::Unknown => unknown = true,
        }
    }
    if !stalled.is_empty() {
        return Finding::Culprits(stalled);
    }
    if left {
        return Finding::Aborted;
    }
    if !idle.is_empty() {
        return Finding::Culprits(idle);
    }
    if unknown || order.is_empty() {
        return Finding::Unknown;
    }
    // Everyone reached waits for someone reached: walk the first waits from the first rank
    // until one repeats.
    let first_wait = |r: usize| match &answers.get(&r) {
        Some(Answer::Waiting(w)) => w.iter().flat_map(|b| b.ranks.iter()).copied().next(),
        _ => None,
    };
    let mut ranks = vec![order[0]];
    loop {
        match first_wait(*ranks.last().unwrap()) {
            Some(q) if q == me => {
                return Finding::Cycle {
                    ranks,
                    back_to: None,
                }
            }
            Some(q) if ranks.contains(&q) || !answers.contains_key(&q) => {
                return Finding::Cycle {
                    ranks,
                    back_to: Some(q),
                }
            }
            Some(q) => ranks.push(q),
            None => return Finding::Unknown,
        }
    }
}

/// The finding as the end of a timeout's hint (starting with `; `, empty when nothing was
/// learned); `name` names a transport rank (`rank 3`).
pub fn describe(f: &Finding, name: &dyn Fn(usize) -> String) -> String {
    match f {
        Finding::Culprits(chains) => chains
            .iter()
            .map(|c| {
                let mut s = name(c.ranks[0]);
                for (i, r) in c.ranks.iter().enumerate().skip(1) {
                    let verb = if c.gave_up[i - 1] {
                        "gave up waiting for"
                    } else {
                        "waits for"
                    };
                    let which = if i > 1 { ", which" } else { "" };
                    s.push_str(&format!("{which} {verb} {}", name(*r)));
                }
                let which = if c.ranks.len() > 1 { ", which" } else { "" };
                let what = match &c.ending {
                    Ending::Silent => "does not answer (stopped or hung?)".to_string(),
                    Ending::Stopped { pid, state } => {
                        format!("is stopped (process {pid} in state {state})")
                    }
                    Ending::Lost(cause) => format!("is lost ({cause})"),
                    Ending::Idle => {
                        "is in no blocking call (busy elsewhere, or it skipped this call?)"
                            .to_string()
                    }
                };
                format!("; {s}{which} {what}")
            })
            .collect(),
        Finding::Cycle { ranks, back_to } => {
            let mut s = name(ranks[0]);
            for r in &ranks[1..] {
                s.push_str(&format!(", which waits for {}", name(*r)));
            }
            let back = back_to.map_or("this rank".to_string(), &name);
            format!(
                "; {s}{} waits for {back}: the ranks wait for each other (did they make \
                 different calls?)",
                if ranks.len() > 1 { ", which" } else { "" }
            )
        }
        Finding::Aborted | Finding::Unknown => String::new(),
    }
}

/// How long one round of questions waits for answers: half the call's timeout, within
/// 100 ms and 1 s.
pub fn probe_time(timeout: Duration) -> Duration {
    (timeout / 2).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// Follow the waits of a call of communicator `comm`, op `seq`, that timed out waiting for
/// transport ranks `waiting_for`, asking through `t`. While it asks, this rank still reports
/// that it waits for them; afterwards it reports for good that it gave up, blaming the culprits
/// found (or `waiting_for`), so that peers that diagnose later follow it there.
pub(crate) fn diagnose(
    t: &dyn Transport,
    comm: u64,
    seq: u64,
    waiting_for: &[usize],
    timeout: Duration,
) -> Finding {
    let waits = t.mailbox().waits();
    let blocked = Blocked {
        comm,
        seq,
        ranks: waiting_for.to_vec(),
        gave_up: false,
    };
    let _still = waits.enter(blocked.clone());
    let per = probe_time(timeout);
    let end = Instant::now() + per * 4;
    let finding = follow(t.rank(), waiting_for, MAX_HOPS, |peers| {
        if Instant::now() >= end {
            return vec![Answer::Unknown; peers.len()];
        }
        let mut got = t.probe(peers, per);
        // A healthy rank between two blocking calls says it waits for nothing; ask again.
        for _ in 0..2 {
            let idle: Vec<usize> = (0..got.len())
                .filter(|&i| matches!(&got[i], Answer::Waiting(w) if w.is_empty()))
                .collect();
            let pause = per / 10;
            if idle.is_empty() || Instant::now() + pause >= end {
                break;
            }
            std::thread::sleep(pause);
            let again = t.probe(&idle.iter().map(|&i| peers[i]).collect::<Vec<_>>(), per);
            for (i, a) in idle.into_iter().zip(again) {
                got[i] = a;
            }
        }
        // A rank that is gone or idle after an abort notice reached us gave up before us.
        if t.mailbox().aborted().is_some() {
            for a in &mut got {
                if matches!(a, Answer::Lost(_)) || matches!(a, Answer::Waiting(w) if w.is_empty()) {
                    *a = Answer::Left;
                }
            }
        }
        got
    });
    let culprits = finding.culprits();
    waits.give_up(Blocked {
        ranks: if culprits.is_empty() {
            waiting_for.to_vec()
        } else {
            culprits
        },
        ..blocked
    });
    finding
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(ranks: &[usize]) -> Answer {
        Answer::Waiting(vec![Blocked {
            comm: 1,
            seq: 0,
            ranks: ranks.to_vec(),
            gave_up: false,
        }])
    }

    /// `follow` over a fixed table of answers (ranks missing from it are asked in vain).
    fn run(me: usize, start: &[usize], table: &[(usize, Answer)]) -> (Finding, Vec<usize>) {
        let mut asked = Vec::new();
        let f = follow(me, start, MAX_HOPS, |peers| {
            asked.extend_from_slice(peers);
            peers
                .iter()
                .map(|p| {
                    table
                        .iter()
                        .find(|(r, _)| r == p)
                        .map_or(Answer::Unknown, |(_, a)| a.clone())
                })
                .collect()
        });
        (f, asked)
    }

    fn name(r: usize) -> String {
        format!("rank {r}")
    }

    #[test]
    fn a_healthy_neighbour_is_passed_through_to_the_stopped_rank() {
        // Rank 2 waits for 1, which waits for 0, which waits for 3; 3 does not answer.
        let table = [(1, waits(&[0])), (0, waits(&[3])), (3, Answer::Silent)];
        let (f, asked) = run(2, &[1], &table);
        assert_eq!(f.culprits(), vec![3]);
        assert_eq!(asked, vec![1, 0, 3]);
        assert_eq!(
            describe(&f, &name),
            "; rank 1 waits for rank 0, which waits for rank 3, which does not answer \
             (stopped or hung?)"
        );
    }

    #[test]
    fn the_direct_peer_is_blamed_when_it_is_the_one() {
        let stopped = Answer::Stopped {
            pid: 77,
            state: 'T',
        };
        let (f, _) = run(0, &[3], &[(3, stopped)]);
        assert_eq!(f.culprits(), vec![3]);
        assert_eq!(
            describe(&f, &name),
            "; rank 3 is stopped (process 77 in state T)"
        );
    }

    #[test]
    fn a_rank_in_no_call_is_blamed_and_said_so() {
        let (f, _) = run(0, &[1], &[(1, waits(&[2])), (2, Answer::Waiting(vec![]))]);
        assert_eq!(f.culprits(), vec![2]);
        assert_eq!(
            describe(&f, &name),
            "; rank 1 waits for rank 2, which is in no blocking call (busy elsewhere, or it \
             skipped this call?)"
        );
    }

    #[test]
    fn a_stalled_rank_outranks_an_idle_one() {
        // Rank 0 waits for 1 and 2: 1 is idle (it finished), 2 waits for the silent 3.
        let table = [
            (1, Answer::Waiting(vec![])),
            (2, waits(&[3])),
            (3, Answer::Silent),
        ];
        let (f, _) = run(0, &[1, 2], &table);
        assert_eq!(f.culprits(), vec![3]);
    }

    #[test]
    fn a_rank_that_gave_up_passes_the_blame_on() {
        let gave_up = Answer::Waiting(vec![Blocked {
            comm: 1,
            seq: 0,
            ranks: vec![3],
            gave_up: true,
        }]);
        let (f, _) = run(2, &[1], &[(1, gave_up), (3, Answer::Silent)]);
        assert_eq!(f.culprits(), vec![3]);
        assert!(describe(&f, &name).starts_with("; rank 1 gave up waiting for rank 3, which"));
    }

    #[test]
    fn ranks_waiting_for_each_other_are_a_cycle() {
        // This rank (0) waits for 1, which waits for 2, which waits for 1.
        let (f, _) = run(0, &[1], &[(1, waits(&[2])), (2, waits(&[1]))]);
        assert_eq!(
            f,
            Finding::Cycle {
                ranks: vec![1, 2],
                back_to: Some(1)
            }
        );
        assert!(f.culprits().is_empty());
        // ... or back to this rank.
        let (f, _) = run(0, &[1], &[(1, waits(&[0]))]);
        assert_eq!(
            describe(&f, &name),
            "; rank 1 waits for this rank: the ranks wait for each other (did they make \
             different calls?)"
        );
    }

    #[test]
    fn leaving_after_an_abort_defers_to_the_notice() {
        let (f, _) = run(2, &[1], &[(1, Answer::Left)]);
        assert_eq!(f, Finding::Aborted);
        // But a stalled rank found on another branch is still the culprit.
        let (f, _) = run(2, &[1, 0], &[(1, Answer::Left), (0, Answer::Silent)]);
        assert_eq!(f.culprits(), vec![0]);
    }

    #[test]
    fn nothing_is_claimed_without_answers_and_chains_are_bounded() {
        let (f, _) = run(0, &[1], &[]);
        assert_eq!(f, Finding::Unknown);
        assert_eq!(describe(&f, &name), "");
        // A chain 1 -> 2 -> ... longer than the hop limit.
        let table: Vec<(usize, Answer)> = (1..30).map(|r| (r, waits(&[r + 1]))).collect();
        let (f, asked) = run(0, &[1], &table);
        assert_eq!(f, Finding::Unknown);
        assert_eq!(asked.len(), MAX_HOPS);
    }

    #[test]
    fn this_rank_is_never_asked() {
        let (f, asked) = run(0, &[0, 1], &[(1, Answer::Silent)]);
        assert_eq!(asked, vec![1]);
        assert_eq!(f.culprits(), vec![1]);
    }
}
