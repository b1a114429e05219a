//! Recursive halving and doubling among the members of a [`Fold`], shared by the reduce,
//! allreduce, allgather and reduce-scatter algorithms.
//!
//! Member `id` owns segment `id`: the blocks of the ranks merged into it. Segment ranges are
//! contiguous element ranges, so every exchange is a single message.

use super::plan::{Fold, Layout, Plan};
use super::{Buf, Span};

/// Segments `a..b` of `buf`.
pub(crate) fn segs(fold: &Fold, blocks: &Layout, buf: Buf, a: usize, b: usize) -> Span {
    let (lo, hi) = fold.blocks(a, b);
    blocks.range(buf, lo, hi)
}

/// Where an active member's contribution is when its exchanges start: its folded buddy's data
/// (from rank `buddy`) reduced with `input` into `acc`, whose buffer is returned, or, without a
/// buddy, still `input`'s, which the first exchange reads instead of a copy.
pub(crate) fn with_buddy(plan: &mut Plan, buddy: Option<usize>, input: Span, acc: Span) -> Buf {
    match buddy {
        Some(b) => {
            plan.recv_reduce_from(b, input, acc);
            acc.buf
        }
        None => input.buf,
    }
}

/// Recursive halving reduce-scatter: in each round a member swaps the half of its current
/// segment range it will not keep for the partner's copy of the half it keeps, halving the
/// range, until member `id` holds segment `id` reduced over every member, in `buf`. The first
/// round reads the member's contribution from `first` (`buf` itself, or the input, which spares
/// a copy of it to `buf`; a lone member copies it). `peer(id)` maps a member to its rank.
pub(crate) fn halving(
    plan: &mut Plan,
    fold: &Fold,
    blocks: &Layout,
    first: Buf,
    buf: Buf,
    id: usize,
    peer: impl Fn(usize) -> usize,
) {
    if fold.pow == 1 {
        plan.copy(
            segs(fold, blocks, first, 0, 1),
            segs(fold, blocks, buf, 0, 1),
        );
    }
    let (mut lo, mut size, mut from) = (0, fold.pow, first);
    while size > 1 {
        let half = size / 2;
        let (keep, give) = if id < lo + half {
            (lo, lo + half)
        } else {
            (lo + half, lo)
        };
        let kept = |b| segs(fold, blocks, b, keep, keep + half);
        plan.send(peer(id ^ half), segs(fold, blocks, from, give, give + half));
        plan.recv_reduce_from(peer(id ^ half), kept(from), kept(buf));
        plan.next();
        (lo, size, from) = (keep, half, buf);
    }
}

/// Recursive doubling allgather: member `id` starts with segment `id` and doubles the range it
/// holds each round by swapping with the member whose range is adjacent, until it holds all.
pub(crate) fn doubling(
    plan: &mut Plan,
    fold: &Fold,
    blocks: &Layout,
    buf: Buf,
    id: usize,
    peer: impl Fn(usize) -> usize,
) {
    let (mut lo, mut size) = (id, 1);
    while size < fold.pow {
        let other = lo ^ size;
        plan.send(peer(id ^ size), segs(fold, blocks, buf, lo, lo + size));
        plan.recv(
            peer(id ^ size),
            segs(fold, blocks, buf, other, other + size),
        );
        plan.next();
        lo = lo.min(other);
        size *= 2;
    }
}

/// Binomial gather of the segments to member 0 (member `id` starts with segment `id`).
pub(crate) fn gather_to_first(
    plan: &mut Plan,
    fold: &Fold,
    blocks: &Layout,
    buf: Buf,
    id: usize,
    peer: impl Fn(usize) -> usize,
) {
    let mut d = 1;
    while d < fold.pow {
        if id & d != 0 {
            plan.send(peer(id - d), segs(fold, blocks, buf, id, id + d));
            plan.next();
            return;
        }
        plan.recv(peer(id + d), segs(fold, blocks, buf, id + d, id + 2 * d));
        plan.next();
        d *= 2;
    }
}
