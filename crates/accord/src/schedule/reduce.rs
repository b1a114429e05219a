//! Reduce algorithms: every rank's `In` is reduced into `root`'s `Out`. Non-root ranks use
//! their `Out` as scratch, which the collective allows.

use super::plan::{abs, all, rel, Fold, Layout, Plan, Role};
use super::recursive::{gather_to_first, halving};
use super::{Buf, Schedule};

/// Binomial tree: relative rank `v` reduces its children `v + 1, v + 2, v + 4, ...` (below its
/// lowest set bit) into its `Out`, then sends the partial result to its parent.
pub(crate) fn binomial(count: usize, root: usize, p: usize, r: usize) -> Schedule {
    let (v, acc) = (rel(r, root, p), all(Buf::Out, count));
    let mut plan = Plan::new();
    plan.copy(all(Buf::In, count), acc);
    let mut mask = 1;
    while mask < p {
        if v & mask != 0 {
            plan.next();
            plan.send(abs(v - mask, root, p), acc);
            return plan.finish();
        }
        if v + mask < p {
            plan.recv_reduce(abs(v + mask, root, p), acc);
        }
        mask *= 2;
    }
    plan.finalize(acc);
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
            plan.copy(all(Buf::In, count), acc);
            if let Some(b) = buddy {
                plan.recv_reduce(abs(b, root, p), acc);
            }
            plan.next();
            halving(&mut plan, &fold, &blocks, Buf::Out, id, peer);
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
