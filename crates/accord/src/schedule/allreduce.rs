//! Allreduce algorithms. Each element is finalized exactly once, after all contributions are in,
//! and every rank ends with bitwise the same result (each element is reduced in one place and
//! copied, or by commutative pairwise swaps).

use super::plan::{all, Fold, Layout, Plan, Role};
use super::recursive::{doubling, halving, segs, with_buddy};
use super::{Buf, Schedule, Span};

/// Ring: a reduce-scatter around the ring (block `b` ends complete on rank `b`) followed by a
/// ring allgather; `2 (p - 1)` rounds moving `count / p` elements each. The reduce-scatter
/// reads this rank's contribution from `In` as it adds it: no copy of the input first.
pub(crate) fn ring(count: usize, p: usize, r: usize) -> Schedule {
    let blocks = Layout::even(count, p);
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    let block_of = |buf: Buf, k: usize| blocks.span(buf, (r + 2 * p - k) % p);
    let block = |k: usize| block_of(Buf::Out, k);
    let mut plan = Plan::new();
    if p == 1 {
        plan.copy(all(Buf::In, count), all(Buf::Out, count));
    }
    for s in 0..p - 1 {
        // Block `s + 1` reached its last reduction here in the round before (or is the input).
        plan.send(
            next,
            block_of(if s == 0 { Buf::In } else { Buf::Out }, s + 1),
        );
        plan.recv_reduce_from(prev, block_of(Buf::In, s + 2), block(s + 2));
        plan.next();
    }
    plan.finalize(blocks.span(Buf::Out, r));
    plan.next();
    for s in 0..p - 1 {
        plan.send(next, block(s));
        plan.recv(prev, block(s + 1));
        plan.next();
    }
    plan.finish()
}

/// Where a folded rank's data goes, and where the result comes back from. An active rank
/// learns its member id, its buddy, and which buffer holds its contribution (its buddy's added
/// in): `Out` after a buddy's data, else still `In`, which its first exchange reads instead of
/// a copy.
fn fold_in(plan: &mut Plan, role: Role, count: usize) -> Option<(usize, Option<usize>, Buf)> {
    let acc = all(Buf::Out, count);
    match role {
        Role::Dropped { keeper } => {
            plan.send(keeper, all(Buf::In, count));
            plan.next();
            plan.recv(keeper, acc);
            None
        }
        Role::Active { id, buddy } => {
            let own = with_buddy(plan, buddy, all(Buf::In, count), acc);
            plan.next();
            Some((id, buddy, own))
        }
    }
}

/// Hand the result back to the rank folded into this one.
fn fold_out(plan: &mut Plan, buddy: Option<usize>, count: usize) {
    plan.next();
    if let Some(b) = buddy {
        plan.send(b, all(Buf::Out, count));
    }
}

/// Recursive doubling: fold onto a power of two, swap and reduce the whole vector with the
/// partner at distance 1, 2, 4, ..., unfold; `log2 p` (+2) rounds of full-size messages.
pub(crate) fn recursive_doubling(count: usize, p: usize, r: usize) -> Schedule {
    let fold = Fold::new(p);
    let acc = all(Buf::Out, count);
    let mut plan = Plan::new();
    let Some((id, buddy, mut own)) = fold_in(&mut plan, fold.role(r), count) else {
        return plan.finish();
    };
    let mut d = 1;
    while d < fold.pow {
        let peer = fold.member(id ^ d);
        plan.send(peer, all(own, count));
        plan.recv_reduce_from(peer, all(own, count), acc);
        plan.next();
        own = Buf::Out;
        d *= 2;
    }
    plan.copy(all(own, count), acc);
    plan.finalize(acc);
    fold_out(&mut plan, buddy, count);
    plan.finish()
}

/// Rabenseifner: fold, reduce-scatter by recursive halving, finalize the owned segment,
/// allgather by recursive doubling, unfold. Log rounds and about `2 count` elements moved.
pub(crate) fn rabenseifner(count: usize, p: usize, r: usize) -> Schedule {
    let (fold, blocks) = (Fold::new(p), Layout::even(count, p));
    let peer = |id| fold.member(id);
    let mut plan = Plan::new();
    let Some((id, buddy, own)) = fold_in(&mut plan, fold.role(r), count) else {
        return plan.finish();
    };
    halving(&mut plan, &fold, &blocks, own, Buf::Out, id, peer);
    plan.finalize(segs(&fold, &blocks, Buf::Out, id, id + 1));
    plan.next();
    doubling(&mut plan, &fold, &blocks, Buf::Out, id, peer);
    fold_out(&mut plan, buddy, count);
    plan.finish()
}

/// Direct: everyone sends its input to everyone; each rank then reduces all inputs in rank
/// order (from scratch copies), so every rank computes bitwise the same result.
pub(crate) fn direct(count: usize, p: usize, r: usize) -> Schedule {
    let slot = |q: usize| Span::new(Buf::Tmp, q * count, count);
    let acc = all(Buf::Out, count);
    let mut plan = Plan::new();
    plan.need_tmp(p * count);
    for q in (1..p).map(|k| (r + k) % p) {
        plan.send(q, all(Buf::In, count));
    }
    plan.copy(all(Buf::In, count), slot(r));
    plan.next();
    for q in (1..p).map(|k| (r + k) % p) {
        plan.recv(q, slot(q));
    }
    plan.copy(slot(0), acc);
    for q in 1..p {
        plan.reduce(slot(q), acc);
    }
    plan.finalize(acc);
    plan.finish()
}
