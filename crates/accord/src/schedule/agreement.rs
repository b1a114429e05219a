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
//! - Up to [`DIRECT_UP_TO`] ranks the tokens travel beside the data: each rank sends one to
//!   every peer first and receives each peer's just before its first data from that peer (or
//!   at the end). Pairs match messages in FIFO order, so a token never meets a data frame, and
//!   the check costs about one message latency in parallel with the data.
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
    let mut heard = vec![false; p];
    heard[r] = true;
    let mut rounds = vec![peers
        .clone()
        .map(|peer| Step::Send { peer, src: token })
        .collect::<Vec<_>>()];
    for round in sched.rounds {
        let mut out = Vec::with_capacity(round.len() + 1);
        for step in round {
            if let Step::Recv { peer, .. } | Step::RecvReduce { peer, .. } = step {
                if !std::mem::replace(&mut heard[peer], true) {
                    out.push(Step::Recv { peer, dst: token });
                }
            }
            out.push(step);
        }
        rounds.push(out);
    }
    let rest: Vec<Step> = peers
        .filter(|&q| !heard[q])
        .map(|peer| Step::Recv { peer, dst: token })
        .collect();
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

    /// Every rank receives a token from every other rank (directly), before any data from it.
    #[test]
    fn every_rank_hears_every_peer_before_its_data() {
        for p in 2..=DIRECT_UP_TO {
            for r in 0..p {
                let coll = Collective::Broadcast { count: 10, root: 0 };
                let s = build(&coll, p, r, Algorithm::BinomialTree).unwrap();
                let mut heard = vec![false; p];
                for step in s.steps() {
                    if let Step::Recv { peer, dst } | Step::RecvReduce { peer, dst } = *step {
                        if dst.len == 0 {
                            heard[peer] = true;
                        } else {
                            assert!(
                                heard[peer],
                                "p={p} r={r}: data from {peer} before its token"
                            );
                        }
                    }
                }
                assert_eq!(heard.iter().filter(|&&h| h).count(), p - 1, "p={p} r={r}");
            }
        }
    }
}
