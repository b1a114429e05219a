//! Allgather algorithms (uneven block sizes allowed, so these also cover allgatherv).

use super::plan::{all, Fold, Layout, Plan, Role};
use super::recursive::doubling;
use super::{Buf, Schedule};

/// Ring: in round `s` every rank forwards the block it got in round `s - 1` (its own first).
pub(crate) fn ring(counts: &[usize], p: usize, r: usize) -> Schedule {
    let blocks = Layout::from_counts(counts.iter().copied());
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    let mut plan = Plan::new();
    plan.copy(all(Buf::In, counts[r]), blocks.span(Buf::Out, r));
    plan.next();
    for s in 0..p - 1 {
        plan.send(next, blocks.span(Buf::Out, (r + p - s) % p));
        plan.recv(prev, blocks.span(Buf::Out, (r + 2 * p - s - 1) % p));
        plan.next();
    }
    plan.finish()
}

/// Recursive doubling on any world: fold onto a power of two (the dropped rank's block goes to
/// its neighbour first), double the held range each round, then hand the whole result back.
pub(crate) fn recursive_doubling(counts: &[usize], p: usize, r: usize) -> Schedule {
    let (fold, blocks) = (Fold::new(p), Layout::from_counts(counts.iter().copied()));
    let out = all(Buf::Out, blocks.total());
    let mut plan = Plan::new();
    match fold.role(r) {
        Role::Dropped { keeper } => {
            plan.send(keeper, all(Buf::In, counts[r]));
            plan.next();
            plan.recv(keeper, out);
        }
        Role::Active { id, buddy } => {
            plan.copy(all(Buf::In, counts[r]), blocks.span(Buf::Out, r));
            if let Some(b) = buddy {
                plan.recv(b, blocks.span(Buf::Out, b));
            }
            plan.next();
            doubling(&mut plan, &fold, &blocks, Buf::Out, id, |m| fold.member(m));
            if let Some(b) = buddy {
                plan.send(b, out);
            }
        }
    }
    plan.finish()
}

/// Bruck: gather into scratch in rotated order (position `i` holds rank `r + i`'s block), where
/// round `k` appends the `min(2^k, p - 2^k)` blocks held by rank `r + 2^k`; then rotate back.
/// `ceil(log2 p)` rounds for any world.
pub(crate) fn bruck(counts: &[usize], p: usize, r: usize) -> Schedule {
    let out = Layout::from_counts(counts.iter().copied());
    let rot = Layout::from_counts((0..p).map(|i| counts[(r + i) % p]));
    let mut plan = Plan::new();
    plan.need_tmp(rot.total());
    plan.copy(all(Buf::In, counts[r]), rot.span(Buf::Tmp, 0));
    plan.next();
    let mut d = 1;
    while d < p {
        let n = d.min(p - d);
        plan.send((r + p - d) % p, rot.range(Buf::Tmp, 0, n));
        plan.recv((r + d) % p, rot.range(Buf::Tmp, d, d + n));
        plan.next();
        d *= 2;
    }
    plan.copy(rot.range(Buf::Tmp, 0, p - r), out.range(Buf::Out, r, p));
    plan.copy(rot.range(Buf::Tmp, p - r, p), out.range(Buf::Out, 0, r));
    plan.finish()
}

/// Direct: everyone sends its block to everyone.
pub(crate) fn direct(counts: &[usize], p: usize, r: usize) -> Schedule {
    let blocks = Layout::from_counts(counts.iter().copied());
    let mut plan = Plan::new();
    for q in (1..p).map(|k| (r + k) % p) {
        plan.send(q, all(Buf::In, counts[r]));
    }
    plan.copy(all(Buf::In, counts[r]), blocks.span(Buf::Out, r));
    for q in (1..p).map(|k| (r + p - k) % p) {
        plan.recv(q, blocks.span(Buf::Out, q));
    }
    plan.finish()
}
