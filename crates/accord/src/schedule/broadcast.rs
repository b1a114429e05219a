//! Broadcast algorithms: `root`'s `Out` reaches every rank's `Out`.

use super::plan::{abs, rel, Layout, Plan, TOKEN};
use super::{Buf, Schedule, Span};

/// Binomial tree in dissemination rounds: in round `k` every rank sends one frame to `r + 2^k`
/// and receives one from `r - 2^k`. Relative rank `v` in `[2^k, 2^(k+1))` receives the data from
/// `v - 2^k` (as down a binomial tree, `ceil(log2 p)` rounds); every other frame is a zero-byte
/// token. Each frame carries the call's fingerprint and is sent only after the round before was
/// received, so the last round leaves every rank having checked every other rank's call
/// transitively: the agreement of [`super::agreement`] at one message a rank and round. Who
/// sends to whom does not depend on the root, so ranks that disagree on it still exchange frames
/// and fail instead of waiting for each other.
pub(crate) fn binomial(count: usize, root: usize, p: usize, r: usize) -> Schedule {
    let data = Span::new(Buf::Out, 0, count);
    let v = rel(r, root, p);
    let mut plan = Plan::new();
    let mut d = 1;
    while d < p {
        // `v + d` lacks the data exactly when `v` has it (`v < d`) and it exists.
        let to_data = v < d && v + d < p;
        plan.send((r + d) % p, if to_data { data } else { TOKEN });
        let from_data = (d..2 * d).contains(&v);
        plan.recv((r + p - d) % p, if from_data { data } else { TOKEN });
        plan.next();
        d *= 2;
    }
    plan.finish()
}

/// The largest power of two below `p` (0 when `p == 1`): the first distance of a binomial tree.
pub(crate) fn top_mask(p: usize) -> usize {
    if p <= 1 {
        0
    } else {
        1 << (usize::BITS - 1 - (p - 1).leading_zeros())
    }
}

/// Direct: the root sends everything to every other rank.
pub(crate) fn direct(count: usize, root: usize, p: usize, r: usize) -> Schedule {
    let data = Span::new(Buf::Out, 0, count);
    let mut plan = Plan::new();
    if r == root {
        for v in 1..p {
            plan.send(abs(v, root, p), data);
        }
    } else {
        plan.recv(root, data);
    }
    plan.finish()
}

/// How many pieces the pipelined chain cuts `count` elements into: pieces of at least 128 Ki
/// elements (512 KiB of f32, one frame of the default `ACCORD_CHUNK_BYTES`), at most 64 of
/// them, so small messages go in one piece and large ones overlap. Each piece costs a message's
/// overhead at every hop and the chain fills in `p - 2` pieces' time; against pieces of at
/// least 8 Ki elements, 4 ranks over TCP on 16 CPUs took 0.62-0.68x the time at 4 MiB and
/// 0.57-0.85x at 16 MiB (two jobs, 5 rounds each), 4 x 2 namespaces 0.82-0.83x at 4 MiB and
/// 1.04x at 16 MiB. Measured at 4 ranks (and 4 leaders) only: the tuner prices the chain with
/// these pieces, so where it prefers scatter-allgather moved with them at other sizes (with
/// its built-in TCP costs, 8 ranks from about 2.75 to 4.5 MiB, 3 ranks from 5.75 to 2 MiB).
pub(crate) fn ring_segments(count: usize) -> usize {
    (count / (128 << 10)).clamp(1, 64)
}

/// Pipelined chain `root -> root+1 -> ...`: piece `s` moves one hop per round, so the last rank
/// has everything after `p - 2 + segments` rounds.
pub(crate) fn ring(count: usize, root: usize, p: usize, r: usize) -> Schedule {
    let segs = Layout::even(count, ring_segments(count));
    let n = segs.blocks();
    let v = rel(r, root, p);
    let next = (v + 1 < p).then(|| abs(v + 1, root, p));
    let mut plan = Plan::new();
    if v == 0 {
        for s in 0..n {
            if let Some(next) = next {
                plan.send(next, segs.span(Buf::Out, s));
            }
            plan.next();
        }
        return plan.finish();
    }
    let prev = abs(v - 1, root, p);
    for s in 0..=n {
        if let (Some(next), true) = (next, s > 0) {
            plan.send(next, segs.span(Buf::Out, s - 1));
        }
        if s < n {
            plan.recv(prev, segs.span(Buf::Out, s));
        }
        plan.next();
    }
    plan.finish()
}

/// Van de Geijn: scatter `p` blocks down a binomial tree (block `v` belongs to relative rank `v`,
/// and a subtree's blocks are contiguous), then a ring allgather of the blocks. Moves about
/// `2 * count` elements per rank instead of `count * log2 p`.
pub(crate) fn scatter_allgather(count: usize, root: usize, p: usize, r: usize) -> Schedule {
    let blocks = Layout::even(count, p);
    let v = rel(r, root, p);
    let mut plan = Plan::new();
    let mut mask = top_mask(p);
    while mask > 0 {
        if v & (2 * mask - 1) == 0 && v + mask < p {
            let end = (v + 2 * mask).min(p);
            plan.send(
                abs(v + mask, root, p),
                blocks.range(Buf::Out, v + mask, end),
            );
        } else if v & (2 * mask - 1) == mask {
            let end = (v + mask).min(p);
            plan.recv(abs(v - mask, root, p), blocks.range(Buf::Out, v, end));
        }
        plan.next();
        mask /= 2;
    }
    let (next, prev) = (abs(v + 1, root, p), abs(v + p - 1, root, p));
    for s in 0..p.saturating_sub(1) {
        plan.send(next, blocks.span(Buf::Out, (v + p - s) % p));
        plan.recv(prev, blocks.span(Buf::Out, (v + 2 * p - s - 1) % p));
        plan.next();
    }
    plan.finish()
}
