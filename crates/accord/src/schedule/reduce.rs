//! Reduce algorithms: every rank's `In` is reduced into `root`'s `Out`. Non-root ranks use
//! their `Out` as scratch, which the collective allows.

use super::plan::{abs, all, rel, Fold, Layout, Plan, Role, TOKEN};
use super::recursive::{gather_to_first, halving, with_buddy};
use super::{Buf, Schedule};

/// Binomial tree in dissemination rounds, the mirror of [`super::broadcast::binomial`]: in round
/// `k` every rank sends one frame to `r - 2^k` and receives one from `r + 2^k`. Relative rank `v`
/// with lowest set bit `2^k` sends its partial result (its children `v + 1, v + 2, ...` below
/// that bit reduced in) to `v - 2^k`, which reduces it into its `Out`; every other frame is a
/// zero-byte token, so every rank checks every other rank's call transitively in `ceil(log2 p)`
/// rounds, whatever root each believes in.
pub(crate) fn binomial(count: usize, root: usize, p: usize, r: usize) -> Schedule {
    let (v, acc) = (rel(r, root, p), all(Buf::Out, count));
    let mut plan = Plan::new();
    // A round's sends leave at its start: the own contribution is in place one round before.
    plan.copy(all(Buf::In, count), acc);
    plan.next();
    let mut d = 1;
    while d < p {
        let to_parent = v % (2 * d) == d;
        plan.send((r + p - d) % p, if to_parent { acc } else { TOKEN });
        let from_child = (r + d) % p;
        match v % (2 * d) == 0 && v + d < p {
            true => plan.recv_reduce(from_child, acc),
            false => plan.recv(from_child, TOKEN),
        }
        plan.next();
        d *= 2;
    }
    if r == root {
        plan.finalize(acc);
    }
    plan.finish()
}

/// Rabenseifner: fold onto a power of two, reduce-scatter by recursive halving, then gather the
/// reduced segments to the root along a binomial tree. Relative ranks keep the root a member
/// (member 0), so the result needs no extra hop.
pub(crate) fn rabenseifner(count: usize, root: usize, p: usize, r: usize) -> Schedule {
    let (fold, blocks) = (Fold::new(p), Layout::even(count, p));
    let acc = all(Buf::Out, count);
    let peer = |id| abs(fold.member(id), root, p);
    let mut plan = Plan::new();
    match fold.role(rel(r, root, p)) {
        Role::Dropped { keeper } => plan.send(abs(keeper, root, p), all(Buf::In, count)),
        Role::Active { id, buddy } => {
            let own = with_buddy(
                &mut plan,
                buddy.map(|b| abs(b, root, p)),
                all(Buf::In, count),
                acc,
            );
            plan.next();
            halving(&mut plan, &fold, &blocks, own, Buf::Out, id, peer);
            gather_to_first(&mut plan, &fold, &blocks, Buf::Out, id, peer);
            if r == root {
                plan.finalize(acc);
            }
        }
    }
    plan.finish()
}

/// Direct: everyone sends to the root, which reduces in arrival order.
pub(crate) fn direct(count: usize, root: usize, p: usize, r: usize) -> Schedule {
    let mut plan = Plan::new();
    if r != root {
        plan.send(root, all(Buf::In, count));
        return plan.finish();
    }
    let acc = all(Buf::Out, count);
    plan.copy(all(Buf::In, count), acc);
    for v in 1..p {
        plan.recv_reduce(abs(v, root, p), acc);
    }
    plan.finalize(acc);
    plan.finish()
}
