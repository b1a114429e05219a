//! Gather and scatter (uneven block sizes allowed: these also cover gatherv/scatterv).
//!
//! The binomial versions number ranks relative to the root; the subtree of relative rank `v` is
//! `v .. v + lowbit(v)`, whose blocks are contiguous in relative order, so staging happens in
//! scratch laid out in relative order and the root rotates it into place.

use super::broadcast::top_mask;
use super::plan::{abs, all, rel, Layout, Plan};
use super::{Buf, Schedule, Span};

/// Relative rank `v`'s subtree in a binomial tree of `p`: `v .. end`.
fn subtree_end(v: usize, p: usize) -> usize {
    if v == 0 {
        p
    } else {
        (v + (v & v.wrapping_neg())).min(p)
    }
}

/// Blocks in relative order, and a way to address blocks `a..b` of `v`'s scratch.
struct Staging {
    rel: Layout,
    base: usize,
}

impl Staging {
    fn new(counts: &[usize], root: usize, v: usize) -> Self {
        let p = counts.len();
        let rel = Layout::from_counts((0..p).map(|i| counts[abs(i, root, p)]));
        let base = rel.off(v);
        Staging { rel, base }
    }

    /// Blocks `a..b` (relative numbering) in this rank's scratch.
    fn tmp(&self, a: usize, b: usize) -> Span {
        let s = self.rel.range(Buf::Tmp, a, b);
        Span::new(Buf::Tmp, s.off - self.base, s.len)
    }
}

/// Binomial gather: each rank collects its subtree in scratch and sends it to its parent in one
/// message; leaves send their input directly.
pub(crate) fn gather_binomial(counts: &[usize], root: usize, p: usize, r: usize) -> Schedule {
    let v = rel(r, root, p);
    let (end, own) = (subtree_end(v, p), all(Buf::In, counts[r]));
    let mut plan = Plan::new();
    let out = Layout::from_counts(counts.iter().copied());
    if p == 1 {
        plan.copy(own, out.span(Buf::Out, 0));
        return plan.finish();
    }
    if end == v + 1 {
        let low = v & v.wrapping_neg();
        plan.send(abs(v - low, root, p), own);
        return plan.finish();
    }
    let st = Staging::new(counts, root, v);
    plan.need_tmp(st.tmp(v, end).len);
    plan.copy(own, st.tmp(v, v + 1));
    let mut mask = 1;
    while mask < p {
        if v & mask != 0 {
            plan.next();
            plan.send(abs(v - mask, root, p), st.tmp(v, end));
            return plan.finish();
        }
        if v + mask < p {
            plan.recv(
                abs(v + mask, root, p),
                st.tmp(v + mask, (v + 2 * mask).min(p)),
            );
        }
        mask *= 2;
    }
    // Root: relative blocks 0..p-root are ranks root..p, the rest are ranks 0..root.
    plan.copy(st.tmp(0, p - root), out.range(Buf::Out, root, p));
    plan.copy(st.tmp(p - root, p), out.range(Buf::Out, 0, root));
    plan.finish()
}

/// Binomial scatter: the root rotates its input into relative order, then each rank receives
/// its subtree's blocks from its parent and passes the children's parts on.
pub(crate) fn scatter_binomial(counts: &[usize], root: usize, p: usize, r: usize) -> Schedule {
    let v = rel(r, root, p);
    let end = subtree_end(v, p);
    let leaf = end == v + 1;
    let mine = all(Buf::Out, counts[r]);
    let inp = Layout::from_counts(counts.iter().copied());
    let st = Staging::new(counts, root, v);
    let mut plan = Plan::new();
    if p == 1 {
        plan.copy(inp.span(Buf::In, 0), mine);
        return plan.finish();
    }
    if !leaf {
        plan.need_tmp(st.tmp(v, end).len);
    }
    if v == 0 {
        plan.copy(inp.range(Buf::In, root, p), st.tmp(0, p - root));
        plan.copy(inp.range(Buf::In, 0, root), st.tmp(p - root, p));
        plan.next();
    }
    let mut mask = top_mask(p);
    while mask > 0 {
        if v & (2 * mask - 1) == 0 && v + mask < p {
            let kid = st.tmp(v + mask, (v + 2 * mask).min(p));
            plan.send(abs(v + mask, root, p), kid);
        } else if v & (2 * mask - 1) == mask {
            let dst = if leaf { mine } else { st.tmp(v, end) };
            plan.recv(abs(v - mask, root, p), dst);
        }
        plan.next();
        mask /= 2;
    }
    if !leaf {
        plan.copy(st.tmp(v, v + 1), mine);
    }
    plan.finish()
}

/// Direct gather: everyone sends its block to the root.
pub(crate) fn gather_direct(counts: &[usize], root: usize, p: usize, r: usize) -> Schedule {
    let mut plan = Plan::new();
    let own = all(Buf::In, counts[r]);
    if r != root {
        plan.send(root, own);
        return plan.finish();
    }
    let out = Layout::from_counts(counts.iter().copied());
    plan.copy(own, out.span(Buf::Out, root));
    for v in 1..p {
        let q = abs(v, root, p);
        plan.recv(q, out.span(Buf::Out, q));
    }
    plan.finish()
}

/// Direct scatter: the root sends each rank its block.
pub(crate) fn scatter_direct(counts: &[usize], root: usize, p: usize, r: usize) -> Schedule {
    let mut plan = Plan::new();
    let mine = all(Buf::Out, counts[r]);
    if r != root {
        plan.recv(root, mine);
        return plan.finish();
    }
    let inp = Layout::from_counts(counts.iter().copied());
    for v in 1..p {
        let q = abs(v, root, p);
        plan.send(q, inp.span(Buf::In, q));
    }
    plan.copy(inp.span(Buf::In, root), mine);
    plan.finish()
}
