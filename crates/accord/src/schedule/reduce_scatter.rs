//! Reduce-scatter algorithms (uneven block sizes allowed). Only the final block is finalized.

use super::plan::{all, Fold, Layout, Plan, Role};
use super::recursive::{halving, segs, with_buddy};
use super::{Buf, Schedule, Span};

/// Ring: the partial sum of block `b` travels `b + 1, b + 2, ...` around the ring, each rank
/// adding its input, and arrives complete at rank `b`. Partial sums live in two alternating
/// scratch slots (one being sent while the other is received), so scratch is two blocks.
pub(crate) fn ring(counts: &[usize], p: usize, r: usize) -> Schedule {
    let blocks = Layout::from_counts(counts.iter().copied());
    let out = all(Buf::Out, counts[r]);
    let mut plan = Plan::new();
    if p == 1 {
        plan.copy(blocks.span(Buf::In, 0), out);
        plan.finalize(out);
        return plan.finish();
    }
    let width = blocks.max_len();
    let slot = |s: usize, len: usize| Span::new(Buf::Tmp, (s % 2) * width, len);
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    plan.need_tmp(if p > 2 { 2 * width } else { 0 });
    for s in 0..p - 1 {
        let sent = (r + 2 * p - s - 1) % p;
        let src = if s == 0 {
            blocks.span(Buf::In, sent)
        } else {
            slot(s - 1, counts[sent])
        };
        plan.send(next, src);
        let got = (r + 2 * p - s - 2) % p;
        let dst = if s == p - 2 {
            out
        } else {
            slot(s, counts[got])
        };
        plan.recv_reduce_from(prev, blocks.span(Buf::In, got), dst);
        plan.next();
    }
    plan.finalize(out);
    plan.finish()
}

/// Rabenseifner: fold onto a power of two, recursive halving into scratch (its first round
/// reads the input), then each member finalizes its segment and hands the folded rank its
/// block.
pub(crate) fn rabenseifner(counts: &[usize], p: usize, r: usize) -> Schedule {
    let (fold, blocks) = (Fold::new(p), Layout::from_counts(counts.iter().copied()));
    let (input, out) = (all(Buf::In, blocks.total()), all(Buf::Out, counts[r]));
    let mut plan = Plan::new();
    match fold.role(r) {
        Role::Dropped { keeper } => {
            plan.send(keeper, input);
            plan.next();
            plan.recv(keeper, out);
        }
        Role::Active { id, buddy } => {
            let work = all(Buf::Tmp, blocks.total());
            plan.need_tmp(work.len);
            let own = with_buddy(&mut plan, buddy, input, work);
            plan.next();
            halving(&mut plan, &fold, &blocks, own, Buf::Tmp, id, |m| {
                fold.member(m)
            });
            plan.finalize(segs(&fold, &blocks, Buf::Tmp, id, id + 1));
            plan.copy(blocks.span(Buf::Tmp, r), out);
            plan.next();
            if let Some(b) = buddy {
                plan.send(b, blocks.span(Buf::Tmp, b));
            }
        }
    }
    plan.finish()
}

/// Direct: every rank sends block `q` of its input to rank `q` and reduces what it receives.
pub(crate) fn direct(counts: &[usize], p: usize, r: usize) -> Schedule {
    let blocks = Layout::from_counts(counts.iter().copied());
    let out = all(Buf::Out, counts[r]);
    let mut plan = Plan::new();
    for q in (1..p).map(|k| (r + k) % p) {
        plan.send(q, blocks.span(Buf::In, q));
    }
    plan.copy(blocks.span(Buf::In, r), out);
    plan.next();
    for q in (1..p).map(|k| (r + p - k) % p) {
        plan.recv_reduce(q, out);
    }
    plan.finalize(out);
    plan.finish()
}
