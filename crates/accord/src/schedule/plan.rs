//! Small building blocks shared by the algorithms: a round-by-round schedule builder, block
//! layouts, rank arithmetic and the folding of a world onto a power of two.

use super::{Buf, Schedule, Span, Step};

/// A zero-length message (barriers, agreement tokens).
pub(crate) const TOKEN: Span = Span::new(Buf::Tmp, 0, 0);

/// Builds a [`Schedule`] one round at a time.
///
/// Steps are appended to the current round; [`Plan::next`] closes it. A send placed after a
/// receive in the *same* round would read the buffers as they were before the receive (sends read
/// the round-start state), so algorithms call `next` between "receive x" and "forward x".
#[derive(Debug, Default)]
pub(crate) struct Plan {
    rounds: Vec<Vec<Step>>,
    cur: Vec<Step>,
    tmp_len: usize,
}

impl Plan {
    /// An empty plan.
    pub fn new() -> Self {
        Self::default()
    }

    /// Make sure the scratch buffer holds at least `len` elements.
    pub fn need_tmp(&mut self, len: usize) {
        self.tmp_len = self.tmp_len.max(len);
    }

    /// Close the current round (no-op if it is empty).
    pub fn next(&mut self) {
        if !self.cur.is_empty() {
            self.rounds.push(std::mem::take(&mut self.cur));
        }
    }

    /// Send `src` to `peer`.
    pub fn send(&mut self, peer: usize, src: Span) {
        self.cur.push(Step::Send { peer, src });
    }

    /// Receive from `peer` into `dst`.
    pub fn recv(&mut self, peer: usize, dst: Span) {
        self.cur.push(Step::Recv { peer, dst });
    }

    /// Receive from `peer` and reduce into `dst`.
    pub fn recv_reduce(&mut self, peer: usize, dst: Span) {
        self.recv_reduce_from(peer, dst, dst);
    }

    /// Receive from `peer` and reduce with `src` into `dst` (`dst = src op msg`): a copy of
    /// `src` to `dst` and a [`Plan::recv_reduce`] in one pass over the memory.
    pub fn recv_reduce_from(&mut self, peer: usize, src: Span, dst: Span) {
        debug_assert_eq!(src.len, dst.len);
        self.cur.push(Step::RecvReduce { peer, src, dst });
    }

    /// Local copy; empty and identity copies are dropped (they cannot matter).
    pub fn copy(&mut self, src: Span, dst: Span) {
        debug_assert_eq!(src.len, dst.len);
        if src.len > 0 && src != dst {
            self.cur.push(Step::Copy { src, dst });
        }
    }

    /// Local reduction `dst = dst op src`; empty ones are dropped.
    pub fn reduce(&mut self, src: Span, dst: Span) {
        debug_assert_eq!(src.len, dst.len);
        if src.len > 0 {
            self.cur.push(Step::Reduce { src, dst });
        }
    }

    /// Finalize `dst`; empty ranges are dropped.
    pub fn finalize(&mut self, dst: Span) {
        if dst.len > 0 {
            self.cur.push(Step::Finalize { dst });
        }
    }

    /// The finished schedule. Empty rounds never reach it: rounds only order a rank's own steps,
    /// so dropping an empty one changes nothing.
    pub fn finish(mut self) -> Schedule {
        self.next();
        Schedule {
            rounds: self.rounds,
            tmp_len: self.tmp_len,
        }
    }
}

/// Contiguous blocks laid out back to back: block `i` spans `off[i]..off[i + 1]`.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    off: Vec<usize>,
}

impl Layout {
    /// Blocks of the given sizes.
    pub fn from_counts(counts: impl IntoIterator<Item = usize>) -> Self {
        let mut off = vec![0];
        let mut at = 0;
        for c in counts {
            at += c;
            off.push(at);
        }
        Layout { off }
    }

    /// `count` elements split into `parts` blocks whose sizes differ by at most one (the first
    /// `count % parts` blocks get the extra element).
    pub fn even(count: usize, parts: usize) -> Self {
        let (q, r) = (count / parts, count % parts);
        Self::from_counts((0..parts).map(|i| q + usize::from(i < r)))
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.off.len() - 1
    }

    /// Start of block `i`.
    pub fn off(&self, i: usize) -> usize {
        self.off[i]
    }

    /// Size of block `i`.
    pub fn len(&self, i: usize) -> usize {
        self.off[i + 1] - self.off[i]
    }

    /// Sum of all blocks.
    pub fn total(&self) -> usize {
        self.off[self.blocks()]
    }

    /// The largest block.
    pub fn max_len(&self) -> usize {
        (0..self.blocks()).map(|i| self.len(i)).max().unwrap_or(0)
    }

    /// Block `i` of `buf`.
    pub fn span(&self, buf: Buf, i: usize) -> Span {
        self.range(buf, i, i + 1)
    }

    /// Blocks `a..b` of `buf` (contiguous by construction).
    pub fn range(&self, buf: Buf, a: usize, b: usize) -> Span {
        Span::new(buf, self.off[a], self.off[b] - self.off[a])
    }
}

/// The whole of `buf` up to `len` elements.
pub(crate) fn all(buf: Buf, len: usize) -> Span {
    Span::new(buf, 0, len)
}

/// Rank `r` seen from `root` (the root is 0).
pub(crate) fn rel(r: usize, root: usize, p: usize) -> usize {
    (r + p - root) % p
}

/// The rank whose relative number (from `root`) is `v`.
pub(crate) fn abs(v: usize, root: usize, p: usize) -> usize {
    (v + root) % p
}

/// What a rank does while a world of `p` is folded onto `pow`, the largest power of two `<= p`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Takes part in the power-of-two algorithm as member `id`; `buddy` is the rank it absorbed.
    Active { id: usize, buddy: Option<usize> },
    /// Hands its data to `keeper` first and gets the result back at the end.
    Dropped { keeper: usize },
}

/// Folding `p` ranks onto a power of two, the classic way to run recursive halving/doubling on
/// any world: of the first `2 * rem` ranks, each odd one merges into its even neighbour.
///
/// Member `id` then stands for the blocks of the ranks merged into it, which are adjacent, so a
/// range of members is always a contiguous range of blocks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fold {
    /// Number of members (a power of two).
    pub pow: usize,
    /// Ranks that drop out.
    pub rem: usize,
}

impl Fold {
    /// The fold of a world of `p >= 1` ranks.
    pub fn new(p: usize) -> Self {
        let pow = if p.is_power_of_two() {
            p
        } else {
            p.next_power_of_two() / 2
        };
        Fold { pow, rem: p - pow }
    }

    /// The role of (relative) rank `v`.
    pub fn role(&self, v: usize) -> Role {
        if v < 2 * self.rem {
            if v & 1 == 0 {
                Role::Active {
                    id: v / 2,
                    buddy: Some(v + 1),
                }
            } else {
                Role::Dropped { keeper: v - 1 }
            }
        } else {
            Role::Active {
                id: v - self.rem,
                buddy: None,
            }
        }
    }

    /// The (relative) rank of member `id`.
    pub fn member(&self, id: usize) -> usize {
        if id < self.rem {
            2 * id
        } else {
            id + self.rem
        }
    }

    /// The blocks (one per rank) that members `a..b` stand for.
    pub fn blocks(&self, a: usize, b: usize) -> (usize, usize) {
        let edge = |m: usize| if m <= self.rem { 2 * m } else { m + self.rem };
        (edge(a), edge(b))
    }
}

/// `ceil(log2(p))`, the number of rounds of a doubling algorithm.
pub(crate) fn ceil_log2(p: usize) -> usize {
    p.next_power_of_two().trailing_zeros() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_covers_every_block_once() {
        for p in 1..40 {
            let f = Fold::new(p);
            assert!(f.pow.is_power_of_two() && f.pow + f.rem == p && f.rem < f.pow);
            assert_eq!(f.blocks(0, f.pow), (0, p));
            for id in 0..f.pow {
                assert_eq!(f.role(f.member(id)), {
                    let v = f.member(id);
                    Role::Active {
                        id,
                        buddy: (v < 2 * f.rem).then_some(v + 1),
                    }
                });
            }
        }
    }

    #[test]
    fn even_layout_is_balanced() {
        let l = Layout::even(10, 4);
        assert_eq!((0..4).map(|i| l.len(i)).collect::<Vec<_>>(), [3, 3, 2, 2]);
        assert_eq!(l.total(), 10);
        assert_eq!(Layout::even(0, 3).max_len(), 0);
    }
}
