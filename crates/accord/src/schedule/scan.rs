//! Prefix reductions (scan and exscan) by recursive doubling, as MPICH computes them.
//!
//! Rank `r` keeps two values: `partial`, the reduction over the ranks of its aligned block of
//! `2^k` ranks (those that exist), and its prefix in `Out`. In round `k` it swaps `partial` with
//! `r ^ 2^k`; what it gets joins `partial`, and joins the prefix too when it comes from the lower
//! block. After `ceil(log2 p)` rounds of `count` elements every prefix is complete; worlds that
//! are not powers of two simply skip partners that do not exist (a block's missing upper half
//! contributes nothing to anyone's prefix).

use super::plan::{all, Plan};
use super::{Buf, Schedule, Span};

/// Rank `r`'s part of a scan of `count` elements over `p` ranks; `exclusive` leaves its own
/// input out (rank 0's `Out` is then never written).
pub(crate) fn recursive_doubling(count: usize, exclusive: bool, p: usize, r: usize) -> Schedule {
    let partial = Span::new(Buf::Tmp, 0, count);
    let got = Span::new(Buf::Tmp, count, count);
    let out = all(Buf::Out, count);
    let mut plan = Plan::new();
    plan.need_tmp(2 * count);
    // In place, `In` is `Out`: read it into `partial` first.
    plan.copy(all(Buf::In, count), partial);
    if !exclusive {
        plan.copy(all(Buf::In, count), out);
    }
    plan.next();
    let mut prefix_started = !exclusive;
    let mut mask = 1;
    while mask < p {
        let partner = r ^ mask;
        if partner < p {
            plan.send(partner, partial);
            plan.recv(partner, got);
            plan.next();
            if partner < r {
                if prefix_started {
                    plan.reduce(got, out);
                } else {
                    plan.copy(got, out);
                    prefix_started = true;
                }
            }
            plan.reduce(got, partial);
            plan.next();
        }
        mask <<= 1;
    }
    if prefix_started {
        plan.finalize(out);
    }
    plan.finish()
}
