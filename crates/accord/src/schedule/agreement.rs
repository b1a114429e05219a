//! Agreement for rooted collectives: every rank checks every other rank's fingerprint.
//!
//! Data of a broadcast, scatter, gather or reduce flows only from or to the root, so a rank that
//! wrongly believes it is the root hears from nobody (and returns its own data), and ranks that
//! disagree on the root may wait for each other until the deadline. Their schedules therefore
//! carry zero-byte *tokens*: frames with the call's fingerprint (root included), which every
//! receiver compares with its own. A rank finishes only after it has seen, directly or through
//! ranks that checked them, that every rank's call equals its own; ranks that disagree all fail
//! with a desync.
//!
//! - Up to [`DIRECT_UP_TO`] ranks the tokens travel beside the data: each rank sends one first
//!   to every peer it sends no data to, and receives one at the end from every peer it receives
//!   no data from; data frames carry the same fingerprint, which the receiver checks the same
//!   way, so a data edge needs no token (a two-rank broadcast's root sends its data at once).
//!   Ranks that agree build the same schedule and so agree on which pairs carry tokens; ranks
//!   that disagree compare fingerprints on whatever frame comes first between them. The check
//!   costs about one message latency in parallel with the data.
//! - Beyond, `N - 1` tokens per rank would cost more than they save: a dissemination barrier
//!   (`log2 N` rounds) runs first. A rank sends in a round only after its receives of the round
//!   before matched, so finishing it means every fingerprint was checked transitively.

use super::{barrier, plan, Schedule, Step};

/// World size up to which tokens go directly to every peer.
pub(crate) const DIRECT_UP_TO: usize = 16;

/// `sched` (rank `r` of `p`) with the tokens that make every rank check every fingerprint.
pub(crate) fn with_agreement(p: usize, r: usize, sched: Schedule) -> Schedule {
    if p <= 1 {
        return sched;
    }
    if p > DIRECT_UP_TO {
        let mut rounds = barrier::dissemination(p, r).rounds;
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
    /// comes from it, and every token sent is one its peer expects.
    #[test]
    fn every_rank_hears_every_peer_once_by_token_or_data() {
        for p in 2..=DIRECT_UP_TO {
            let colls = [
                Collective::Broadcast { count: 10, root: 0 },
                Collective::Broadcast {
                    count: 10,
                    root: p - 1,
                },
                Collective::Reduce {
                    count: 10,
                    root: p / 2,
                },
            ];
            for coll in &colls {
                let scheds: Vec<_> = (0..p)
                    .map(|r| build(coll, p, r, Algorithm::BinomialTree))
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
}
