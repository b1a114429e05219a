//! Barrier algorithms: zero-length messages only.

use super::plan::Plan;
use super::Schedule;

use super::plan::TOKEN;

/// Dissemination: in round `k` every rank signals `rank + 2^k` and waits for `rank - 2^k`;
/// after `ceil(log2 p)` rounds everyone has heard (transitively) from everyone.
pub(crate) fn dissemination(p: usize, r: usize) -> Schedule {
    let mut plan = Plan::new();
    let mut d = 1;
    while d < p {
        plan.send((r + d) % p, TOKEN);
        plan.recv((r + p - d) % p, TOKEN);
        plan.next();
        d *= 2;
    }
    plan.finish()
}

/// Dissemination the other way round: in round `k` every rank signals `rank - 2^k` and waits
/// for `rank + 2^k` (the pairs of a binomial reduce, see [`super::reduce::binomial`]).
pub(crate) fn dissemination_down(p: usize, r: usize) -> Schedule {
    let mut plan = Plan::new();
    let mut d = 1;
    while d < p {
        plan.send((r + p - d) % p, TOKEN);
        plan.recv((r + d) % p, TOKEN);
        plan.next();
        d *= 2;
    }
    plan.finish()
}

/// Direct: everyone signals everyone in one round.
pub(crate) fn direct(p: usize, r: usize) -> Schedule {
    let mut plan = Plan::new();
    let peers = (1..p).map(|k| (r + k) % p);
    for q in peers.clone() {
        plan.send(q, TOKEN);
    }
    for q in peers {
        plan.recv(q, TOKEN);
    }
    plan.finish()
}
