//! All-to-all algorithms. Counts are this rank's own; the self block is a local copy.

use super::plan::{Layout, Plan};
use super::{Buf, Schedule, Span};

/// Pairwise exchange: in round `k` send to `r + k` and receive from `r - k`, one peer each way
/// per round, `p - 1` rounds.
pub(crate) fn pairwise(send: &[usize], recv: &[usize], p: usize, r: usize) -> Schedule {
    let (sl, rl) = (
        Layout::from_counts(send.to_vec()),
        Layout::from_counts(recv.to_vec()),
    );
    let mut plan = Plan::new();
    plan.copy(sl.span(Buf::In, r), rl.span(Buf::Out, r));
    plan.next();
    for k in 1..p {
        let (to, from) = ((r + k) % p, (r + p - k) % p);
        plan.send(to, sl.span(Buf::In, to));
        plan.recv(from, rl.span(Buf::Out, from));
        plan.next();
    }
    plan.finish()
}

/// Direct: post every send at once, then receive from every peer.
pub(crate) fn direct(send: &[usize], recv: &[usize], p: usize, r: usize) -> Schedule {
    let (sl, rl) = (
        Layout::from_counts(send.to_vec()),
        Layout::from_counts(recv.to_vec()),
    );
    let mut plan = Plan::new();
    for to in (1..p).map(|k| (r + k) % p) {
        plan.send(to, sl.span(Buf::In, to));
    }
    plan.copy(sl.span(Buf::In, r), rl.span(Buf::Out, r));
    for from in (1..p).map(|k| (r + p - k) % p) {
        plan.recv(from, rl.span(Buf::Out, from));
    }
    plan.finish()
}

/// Whether Bruck applies: every block on every rank has the same size. The counts seen here are
/// one rank's; equal send and receive counts imply the same on every peer only when the call is
/// a regular (non-v) all-to-all, which is how callers must use it.
pub(crate) fn uniform(send: &[usize], recv: &[usize]) -> bool {
    let c = send.first().copied().unwrap_or(0);
    send.iter().chain(recv).all(|&x| x == c)
}

/// Bruck with blocks of `c` elements: rotate so position `i` holds the block for `r + i`; in
/// round `k` pack the positions with bit `k` set, send them to `r + 2^k` and unpack what arrives
/// from `r - 2^k` into the same positions; finally position `i` holds the block from `r - i`.
/// `ceil(log2 p)` rounds of about `p c / 2` elements.
pub(crate) fn bruck(c: usize, p: usize, r: usize) -> Schedule {
    let block = |buf: Buf, base: usize, i: usize| Span::new(buf, base + i * c, c);
    let (rot, pack_out, pack_in) = (0, p * c, p * c + (p / 2) * c);
    let mut plan = Plan::new();
    plan.need_tmp(p * c + 2 * (p / 2) * c);
    plan.copy(
        Span::new(Buf::In, r * c, (p - r) * c),
        Span::new(Buf::Tmp, rot, (p - r) * c),
    );
    plan.copy(
        Span::new(Buf::In, 0, r * c),
        Span::new(Buf::Tmp, rot + (p - r) * c, r * c),
    );
    let mut d = 1;
    while d < p {
        let moving: Vec<usize> = (0..p).filter(|i| i & d != 0).collect();
        for (j, &i) in moving.iter().enumerate() {
            plan.copy(block(Buf::Tmp, rot, i), block(Buf::Tmp, pack_out, j));
        }
        plan.next();
        let n = moving.len() * c;
        plan.send((r + d) % p, Span::new(Buf::Tmp, pack_out, n));
        plan.recv((r + p - d) % p, Span::new(Buf::Tmp, pack_in, n));
        for (j, &i) in moving.iter().enumerate() {
            plan.copy(block(Buf::Tmp, pack_in, j), block(Buf::Tmp, rot, i));
        }
        d *= 2;
    }
    for i in 0..p {
        plan.copy(block(Buf::Tmp, rot, i), block(Buf::Out, 0, (r + p - i) % p));
    }
    plan.finish()
}
