//! Agreement for rooted collectives: every rank checks every other rank's fingerprint.
//!
//! Data of a broadcast, scatter, gather or reduce flows only from or to the root, so a rank that
//! wrongly believes it is the root hears from nobody (and returns its own data), and ranks that
//! disagree on the root may wait for each other until the deadline. Every frame carries the
//! call's fingerprint (root included), which its receiver compares with its own; a rank finishes
//! only after it has seen, directly or through ranks that checked them, that every rank's call
//! equals its own, so ranks that disagree all fail with a desync. Two ways to get there:
//!
//! - The binomial broadcast and reduce run in dissemination rounds (see
//!   [`super::broadcast::binomial`]): in round `k` each rank sends one frame to `r + 2^k` (or
//!   `r - 2^k`) and receives one, data where the tree moves data and a zero-byte *token*
//!   elsewhere; a rank sends in a round only after its receives of the round before matched, so
//!   after `ceil(log2 p)` rounds everything was checked transitively, at the cost of the tree's
//!   own messages. Who sends to whom does not depend on the root, so ranks that disagree on it
//!   meet on some frame instead of waiting for each other.
//! - The other schedules get tokens added here ([`with_agreement`]). Ring and scatter-allgather
//!   broadcasts, whose ranks send to their data peers only after receiving, and every schedule
//!   beyond [`DIRECT_UP_TO`] ranks start with a dissemination barrier (paired as the binomial
//!   schedule of the same collective is, so ranks whose counts pick either still meet).
//!   Otherwise the tokens travel beside the data: each rank sends one first to every peer it sends
//!   no data to, and receives one at the end from every peer it receives no data from; a data
//!   edge needs no token (its frame is checked the same way). Ranks that agree build the same
//!   schedule and so agree on which pairs carry tokens; ranks that disagree compare
//!   fingerprints on whatever frame comes first between them. The check costs about one
//!   message latency in parallel with the data (the barrier `log2 N` latencies before it,
//!   little beside the large messages of a ring; beyond 16 ranks `N - 1` tokens per rank would
//!   cost more).

use super::{barrier, plan, Algorithm, Collective, Schedule, Step};

/// World size up to which tokens go directly to every peer.
pub(crate) const DIRECT_UP_TO: usize = 16;

/// Whether [`with_agreement`] puts a dissemination barrier before `algo`'s schedule on `p`
/// ranks, rather than tokens beside its messages.
pub(crate) fn starts_with_barrier(algo: Algorithm, p: usize) -> bool {
    // A ring or scatter-allgather rank sends to its data peers only after receiving: ranks
    // that disagree on the root could each wait for the other, sending nothing. These
    // algorithms move large messages, so a barrier first costs little.
    let waits_first = matches!(algo, Algorithm::Ring | Algorithm::ScatterAllgather);
    p > 1 && (p > DIRECT_UP_TO || waits_first)
}

/// `sched`, rank `r`'s part of `coll` on `p` ranks with `algo`, with the tokens that make every
/// rank check every fingerprint.
pub(crate) fn with_agreement(
    coll: &Collective,
    algo: Algorithm,
    p: usize,
    r: usize,
    sched: Schedule,
) -> Schedule {
    if p <= 1 {
        return sched;
    }
    if starts_with_barrier(algo, p) {
        // The barrier's rounds pair ranks as the binomial schedule of the same collective does
        // (a reduce's towards lower ranks), so ranks whose counts pick either still meet.
        let mut rounds = match coll {
            Collective::Reduce { .. } => barrier::dissemination_down(p, r),
            _ => barrier::dissemination(p, r),
        }
        .rounds;
        rounds.extend(sched.rounds);
        return Schedule { rounds, ..sched };
    }
    let token = plan::TOKEN;
    let peers = (1..p).map(|k| (r + k) % p);
    let (mut sends_to, mut hears_from) = (vec![false; p], vec![false; p]);
    for step in sched.steps() {
        match *step {
            Step::Send { peer, .. } => sends_to[peer] = true,
            Step::Recv { peer, .. } | Step::RecvReduce { peer, .. } => hears_from[peer] = true,
            _ => {}
        }
    }
    let first: Vec<Step> = peers
        .clone()
        .filter(|&q| !sends_to[q])
        .map(|peer| Step::Send { peer, src: token })
        .collect();
    let rest: Vec<Step> = peers
        .filter(|&q| !hears_from[q])
        .map(|peer| Step::Recv { peer, dst: token })
        .collect();
    let mut rounds = Vec::with_capacity(sched.rounds.len() + 2);
    if !first.is_empty() {
        rounds.push(first);
    }
    rounds.extend(sched.rounds);
    if !rest.is_empty() {
        rounds.push(rest);
    }
    Schedule { rounds, ..sched }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::algorithms::build;
    use crate::schedule::{Algorithm, Collective};

    /// Every rank hears directly from every other rank, once by token exactly where no data
    /// comes from it, and every token sent is one its peer expects (the schedules given tokens
    /// here).
    #[test]
    fn every_rank_hears_every_peer_once_by_token_or_data() {
        for p in 2..=DIRECT_UP_TO {
            let cases = [
                (
                    Collective::Broadcast { count: 10, root: 0 },
                    Algorithm::Direct,
                ),
                (
                    Collective::Scatter {
                        counts: vec![3; p],
                        root: p - 1,
                    },
                    Algorithm::BinomialTree,
                ),
                (
                    Collective::Reduce {
                        count: 10,
                        root: p / 2,
                    },
                    Algorithm::Direct,
                ),
            ];
            for (coll, algo) in &cases {
                let scheds: Vec<_> = (0..p)
                    .map(|r| build(coll, p, r, *algo))
                    .collect::<Result<_, _>>()
                    .unwrap();
                let tokens = |r: usize, sending: bool| -> Vec<usize> {
                    scheds[r]
                        .steps()
                        .filter_map(|s| match *s {
                            Step::Send { peer, src } if sending && src.len == 0 => Some(peer),
                            Step::Recv { peer, dst } if !sending && dst.len == 0 => Some(peer),
                            _ => None,
                        })
                        .collect()
                };
                for (r, sched) in scheds.iter().enumerate() {
                    let mut heard = vec![0; p];
                    for step in sched.steps() {
                        if let Step::Recv { peer, .. } | Step::RecvReduce { peer, .. } = *step {
                            heard[peer] += 1;
                        }
                    }
                    let data = |q: usize| heard[q] > usize::from(tokens(r, false).contains(&q));
                    for q in (0..p).filter(|&q| q != r) {
                        let token = tokens(r, false).contains(&q);
                        assert!(data(q) != token, "{coll:?} p={p} r={r} q={q}");
                        assert_eq!(token, tokens(q, true).contains(&r), "p={p} r={r} q={q}");
                    }
                }
            }
        }
    }

    /// What running every rank's schedule together ended in.
    #[derive(Debug, PartialEq)]
    enum Outcome {
        /// Every rank finished; `heard[r]` is the set of ranks `r` heard from, transitively.
        Finished { heard: Vec<u64> },
        /// Ranks that disagree: some received a frame of another call (a desync), none finished.
        Detected,
        /// Some rank finished although the ranks disagree, or none could move and none had
        /// found the disagreement: a silent wrong result or a wait until the deadline.
        Failed(String),
    }

    /// Run rank `r`'s schedule of `calls[r]` (collective, algorithm) with the executor's
    /// semantics: a round's sends leave at its start, receives take the pair's frames in order.
    /// A frame carries its sender's call and the ranks it has heard from; a rank that receives a
    /// frame of another call stops there, as its desync would stop it, and the others go on
    /// (stricter than the executor, whose waits also fail on a mismatched frame queued from any
    /// peer, and whose failing rank aborts the others).
    fn run_together(calls: &[(Collective, Algorithm)]) -> Outcome {
        let p = calls.len();
        let scheds: Vec<Schedule> = (0..p)
            .map(|r| build(&calls[r].0, p, r, calls[r].1).unwrap())
            .collect();
        let mut queues = vec![std::collections::VecDeque::<(usize, u64)>::new(); p * p];
        let (mut round, mut step, mut entered) = (vec![0; p], vec![0; p], vec![false; p]);
        let mut stopped = vec![false; p];
        let mut heard: Vec<u64> = (0..p).map(|r| 1 << r).collect();
        let mut moved = true;
        while moved {
            moved = false;
            for r in 0..p {
                if stopped[r] {
                    continue;
                }
                while round[r] < scheds[r].rounds.len() {
                    let steps = &scheds[r].rounds[round[r]];
                    if !entered[r] {
                        for s in steps {
                            if let Step::Send { peer, .. } = *s {
                                queues[r * p + peer].push_back((r, heard[r]));
                            }
                        }
                        entered[r] = true;
                        moved = true;
                    }
                    let waiting = steps[step[r]..].iter().find_map(|s| match *s {
                        Step::Recv { peer, .. } | Step::RecvReduce { peer, .. } => Some(peer),
                        _ => None,
                    });
                    let Some(peer) = waiting else {
                        (round[r], step[r], entered[r]) = (round[r] + 1, 0, false);
                        moved = true;
                        continue;
                    };
                    let Some((from, knows)) = queues[peer * p + r].pop_front() else {
                        break;
                    };
                    moved = true;
                    if calls[from].0 != calls[r].0 {
                        stopped[r] = true;
                        break;
                    }
                    heard[r] |= knows;
                    let at = steps[step[r]..]
                        .iter()
                        .position(|s| matches!(*s, Step::Recv { .. } | Step::RecvReduce { .. }));
                    step[r] += at.unwrap() + 1;
                }
            }
        }
        let done = (0..p)
            .filter(|&r| round[r] == scheds[r].rounds.len())
            .count();
        match (
            calls.iter().all(|c| c.0 == calls[0].0),
            stopped.contains(&true),
        ) {
            (true, _) if done == p => Outcome::Finished { heard },
            (false, true) if done == 0 => Outcome::Detected,
            _ => Outcome::Failed(format!(
                "{done} rank(s) finished, {} stopped on a desync: {calls:?}",
                stopped.iter().filter(|&&s| s).count()
            )),
        }
    }

    /// The rooted schedules of `p` ranks about `count` elements from `root`, per algorithm.
    fn rooted(p: usize, count: usize, root: usize) -> Vec<(Collective, Algorithm)> {
        let b = Collective::Broadcast { count, root };
        let r = Collective::Reduce { count, root };
        let c = vec![count; p];
        let g = Collective::Gather {
            counts: c.clone(),
            root,
        };
        let s = Collective::Scatter { counts: c, root };
        [b, r, g, s]
            .into_iter()
            .flat_map(|coll| {
                let algos = crate::schedule::algorithms::applicable(&coll);
                algos.iter().map(move |&a| (coll.clone(), a))
            })
            .collect()
    }

    /// Agreeing ranks of every rooted schedule finish having heard from every rank.
    #[test]
    fn agreeing_ranks_hear_from_everyone_before_finishing() {
        for p in (1..=20).chain([32, 33]) {
            for root in [0, p / 2, p - 1] {
                for call in rooted(p, 5, root) {
                    let outcome = run_together(&vec![call.clone(); p]);
                    let all = if p == 64 { u64::MAX } else { (1 << p) - 1 };
                    assert_eq!(
                        outcome,
                        Outcome::Finished {
                            heard: vec![all; p]
                        },
                        "{call:?} p={p}"
                    );
                }
            }
        }
    }

    /// Ranks that disagree on the root, or whose counts pick other algorithms, always meet on
    /// a frame of the other call: no rank finishes and none waits for the deadline. Every split
    /// of up to 4 ranks between two calls, random splits beyond.
    #[test]
    fn disagreeing_ranks_always_meet() {
        let alternatives = |p: usize, base: &(Collective, Algorithm), root: usize, other| {
            // The same kind of call with another root or count (which may pick another
            // algorithm); the algorithm follows from the call, so the calls differ.
            (rooted(p, 5, other).into_iter())
                .chain(rooted(p, 7, root))
                .filter(|c| c.0.kind() == base.0.kind() && c.0 != base.0)
                .collect::<Vec<_>>()
        };
        let check = |calls: &[(Collective, Algorithm)]| {
            assert_eq!(run_together(calls), Outcome::Detected, "{calls:?}");
        };
        for p in 2..=4 {
            for root in 0..p {
                for other in 0..p {
                    for base in rooted(p, 5, root) {
                        for alt in alternatives(p, &base, root, other) {
                            for split in 1..(1u32 << p) - 1 {
                                let calls: Vec<_> = (0..p)
                                    .map(|r| match split >> r & 1 {
                                        1 => alt.clone(),
                                        _ => base.clone(),
                                    })
                                    .collect();
                                check(&calls);
                            }
                        }
                    }
                }
            }
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        for p in (5..=17).chain([32, 33]) {
            for _ in 0..200 {
                let (root, other) = (next(p), next(p));
                let kinds = rooted(p, 5, root);
                let base = kinds[next(kinds.len())].clone();
                let alts = alternatives(p, &base, root, other);
                let alt = alts[next(alts.len())].clone();
                let mut calls = vec![base.clone(); p];
                for _ in 0..1 + next(p) {
                    calls[next(p)] = alt.clone();
                }
                if calls.iter().any(|c| c.0 != calls[0].0) {
                    check(&calls);
                }
            }
        }
    }
}
