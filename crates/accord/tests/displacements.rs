//! Displacements of the `v` collectives ([`Parts::with_displs`]): blocks anywhere in the buffer,
//! in any order, with gaps that receive buffers must leave as they were. Every result is checked
//! element by element against a sequential reference, gaps included (they hold a sentinel),
//! over world sizes 1 to 9 in process and a few over TCP, counts with zeros and ones, several
//! element types; then each argument error.

use accord::testing::{run_tcp_world, run_world};
use accord::{Communicator, Element, Parts, ReduceOp};
use std::fmt::Debug;
use std::time::Duration;

/// An element type of the tests: values made from a number, and their sum (wrapping).
trait Val: Element + Copy + PartialEq + Debug + Send + Sync {
    /// What gaps hold: no value of [`Val::of`] equals it.
    const SENTINEL: Self;
    fn of(x: u64) -> Self;
    fn add(self, other: Self) -> Self;
}

impl Val for u8 {
    const SENTINEL: Self = 0xff;
    fn of(x: u64) -> Self {
        (x % 200) as u8
    }
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
}

impl Val for i32 {
    const SENTINEL: Self = -1;
    fn of(x: u64) -> Self {
        (x % 100_000) as i32
    }
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
}

impl Val for f64 {
    const SENTINEL: Self = -0.5;
    fn of(x: u64) -> Self {
        (x % 1000) as f64
    }
    fn add(self, o: Self) -> Self {
        self + o
    }
}

impl Val for u16 {
    const SENTINEL: Self = 0xffff;
    fn of(x: u64) -> Self {
        (x % 60_000) as u16
    }
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
}

/// A value that names where it came from: (sender, destination block, element).
fn value<T: Val>(from: usize, to: usize, i: usize) -> T {
    T::of((from as u64 * 7919 + to as u64 * 104_729 + i as u64 * 31) ^ 0x5a)
}

/// A small deterministic generator (every rank computes the same layouts).
struct Rng(u64);

impl Rng {
    fn next(&mut self, below: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % below.max(1)
    }
}

/// How blocks lie in a buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    /// Back to back from the start (the running sum of the counts): the zero-cost path.
    Packed,
    /// Back to back, in a longer buffer.
    PackedLonger,
    /// In shuffled order, with gaps before, between and after.
    Shuffled,
    /// Send side only: every block from the same element, or overlapping its neighbour.
    Overlapping,
}

const RECV_SHAPES: [Shape; 3] = [Shape::Packed, Shape::PackedLonger, Shape::Shuffled];
const SEND_SHAPES: [Shape; 4] = [
    Shape::Packed,
    Shape::PackedLonger,
    Shape::Shuffled,
    Shape::Overlapping,
];

/// Displacements of `counts` in `shape`, and the buffer length they need.
fn layout(counts: &[usize], shape: Shape, seed: u64) -> (Vec<usize>, usize) {
    let n = counts.len();
    let total: usize = counts.iter().sum();
    let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
    match shape {
        Shape::Packed | Shape::PackedLonger => {
            let mut at = 0;
            let displs = counts
                .iter()
                .map(|c| {
                    let d = at;
                    at += c;
                    d
                })
                .collect();
            (displs, total + if shape == Shape::Packed { 0 } else { 3 })
        }
        Shape::Shuffled => {
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                order.swap(i, rng.next(i + 1));
            }
            if n > 1 && order.iter().enumerate().all(|(i, &o)| i == o) {
                order.reverse();
            }
            let mut displs = vec![0; n];
            let mut at = 1 + rng.next(3);
            for &b in &order {
                displs[b] = at;
                at += counts[b] + rng.next(3);
            }
            (displs, at + rng.next(3))
        }
        Shape::Overlapping => {
            let max = counts.iter().copied().max().unwrap_or(0);
            let displs = (0..n).map(|i| (i % 2) * (max / 2 + 1)).collect();
            (displs, max + max / 2 + 1)
        }
    }
}

/// Per-rank counts of world `n` with zeros and ones, rotating by `k`.
fn count_vectors(n: usize) -> Vec<Vec<usize>> {
    const C: [usize; 7] = [0, 1, 3, 1, 0, 2, 5];
    let mut v: Vec<Vec<usize>> = (0..3)
        .map(|k| (0..n).map(|r| C[(r + k * 2) % C.len()]).collect())
        .collect();
    v.push(vec![0; n]);
    v.push(vec![1; n]);
    v
}

/// A buffer of `len` sentinels with block `b` (of `counts`, at `displs`) holding
/// `fill(b, element)`.
fn spread<T: Val>(
    len: usize,
    counts: &[usize],
    displs: &[usize],
    fill: impl Fn(usize, usize) -> T,
) -> Vec<T> {
    let mut buf = vec![T::SENTINEL; len];
    for (b, (&c, &d)) in counts.iter().zip(displs).enumerate() {
        for i in 0..c {
            buf[d + i] = fill(b, i);
        }
    }
    buf
}

fn check<T: Val>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g, w,
            "{what}: element {i} (whole buffer {got:?}, wanted {want:?})"
        );
    }
}

fn all_gather<T: Val>(comm: &Communicator, case: u64) {
    let (n, me) = (comm.size(), comm.rank());
    for counts in count_vectors(n) {
        for shape in RECV_SHAPES {
            let (displs, len) = layout(&counts, shape, case ^ n as u64);
            let mine: Vec<T> = (0..counts[me]).map(|i| value(me, 0, i)).collect();
            let mut out = vec![T::SENTINEL; len];
            let recv = Parts::with_displs(&mut out, &counts, &displs);
            comm.all_gather(&mine, recv).unwrap();
            let want = spread(len, &counts, &displs, |b, i| value(b, 0, i));
            let what = format!("allgatherv n={n} rank={me} counts={counts:?} displs={displs:?}");
            check(&what, &out, &want);
        }
    }
}

fn gather<T: Val>(comm: &Communicator, case: u64) {
    let (n, me) = (comm.size(), comm.rank());
    for counts in count_vectors(n) {
        for root in [0, n - 1, n / 2] {
            for shape in RECV_SHAPES {
                let (displs, len) = layout(&counts, shape, case ^ (root * 13 + n) as u64);
                let mine: Vec<T> = (0..counts[me]).map(|i| value(me, root, i)).collect();
                let mut out = vec![T::SENTINEL; len];
                let recv = Parts::with_displs(&mut out, &counts, &displs);
                comm.gather(&mine, recv, root).unwrap();
                let want = match me == root {
                    true => spread(len, &counts, &displs, |b, i| value(b, root, i)),
                    false => vec![T::SENTINEL; len],
                };
                let what = format!(
                    "gatherv n={n} rank={me} root={root} counts={counts:?} displs={displs:?}"
                );
                check(&what, &out, &want);
            }
        }
    }
}

fn scatter<T: Val>(comm: &Communicator, case: u64) {
    let (n, me) = (comm.size(), comm.rank());
    for counts in count_vectors(n) {
        for root in [0, n - 1, n / 2] {
            for shape in SEND_SHAPES {
                let (displs, len) = layout(&counts, shape, case ^ (root * 17 + n) as u64);
                // Overlapping blocks share elements: the value depends on the element only.
                let send: Vec<T> = match shape {
                    Shape::Overlapping => (0..len).map(|e| value(root, 99, e)).collect(),
                    _ => spread(len, &counts, &displs, |b, i| value(root, b, i)),
                };
                let want: Vec<T> = (0..counts[me])
                    .map(|i| match shape {
                        Shape::Overlapping => value(root, 99, displs[me] + i),
                        _ => value(root, me, i),
                    })
                    .collect();
                let before = send.clone();
                let mut out = vec![T::SENTINEL; counts[me]];
                comm.scatter(Parts::with_displs(&send, &counts, &displs), &mut out, root)
                    .unwrap();
                let what = format!(
                    "scatterv n={n} rank={me} root={root} counts={counts:?} displs={displs:?}"
                );
                check(&what, &out, &want);
                check(&format!("{what} (send buffer)"), &send, &before);
            }
        }
    }
}

fn reduce_scatter<T: Val>(comm: &Communicator, case: u64) {
    let (n, me) = (comm.size(), comm.rank());
    for counts in count_vectors(n) {
        for shape in SEND_SHAPES {
            // Each rank lays its send buffer out its own way.
            let (displs, len) = layout(&counts, shape, case ^ (me * 7 + n) as u64);
            let input = |rank: usize, displs: &[usize], len: usize| -> Vec<T> {
                match shape {
                    Shape::Overlapping => (0..len).map(|e| value(rank, 99, e)).collect(),
                    _ => spread(len, &counts, displs, |b, i| value(rank, b, i)),
                }
            };
            let send = input(me, &displs, len);
            let mut out = vec![T::SENTINEL; counts[me]];
            let parts = Parts::with_displs(&send, &counts, &displs);
            comm.reduce_scatter(parts, &mut out, ReduceOp::Sum).unwrap();
            // The reference: every rank's block `me`, summed in rank order.
            let mut want: Vec<T> = vec![T::of(0); counts[me]];
            for r in 0..n {
                let (d, l) = layout(&counts, shape, case ^ (r * 7 + n) as u64);
                let theirs = input(r, &d, l);
                for (i, x) in want.iter_mut().enumerate() {
                    let v = theirs[d[me] + i];
                    *x = if r == 0 { v } else { x.add(v) };
                }
            }
            let what = format!(
                "reduce_scatterv n={n} rank={me} counts={counts:?} displs={displs:?} {shape:?}"
            );
            check(&what, &out, &want);
        }
    }
}

/// Rank `r` sends `matrix(r, j)` elements to rank `j`, zeros and ones included.
fn matrix(r: usize, j: usize, k: usize) -> usize {
    const C: [usize; 6] = [0, 1, 2, 0, 3, 1];
    C[(r * 2 + j * 3 + k) % C.len()]
}

fn all_to_all<T: Val>(comm: &Communicator, case: u64) {
    let (n, me) = (comm.size(), comm.rank());
    for k in 0..3 {
        for (si, rs) in [(0, 0), (1, 2), (2, 2), (3, 2), (2, 0), (0, 2)] {
            let (sshape, rshape) = (SEND_SHAPES[si], RECV_SHAPES[rs]);
            let send_counts: Vec<usize> = (0..n).map(|j| matrix(me, j, k)).collect();
            let recv_counts: Vec<usize> = (0..n).map(|s| matrix(s, me, k)).collect();
            let seed = case ^ (me * 11 + n + k) as u64;
            let (sd, slen) = layout(&send_counts, sshape, seed);
            let (rd, rlen) = layout(&recv_counts, rshape, seed ^ 0xabc);
            // Sender `s`'s element `i` of its block for `j`.
            let sent = |s: usize, j: usize, i: usize, sd: &[usize]| -> T {
                match sshape {
                    Shape::Overlapping => value(s, 99, sd[j] + i),
                    _ => value(s, j, i),
                }
            };
            let send: Vec<T> = match sshape {
                Shape::Overlapping => (0..slen).map(|e| value(me, 99, e)).collect(),
                _ => spread(slen, &send_counts, &sd, |j, i| value(me, j, i)),
            };
            let mut out = vec![T::SENTINEL; rlen];
            comm.all_to_all(
                Parts::with_displs(&send, &send_counts, &sd),
                Parts::with_displs(&mut out, &recv_counts, &rd),
            )
            .unwrap();
            let want = spread(rlen, &recv_counts, &rd, |s, i| {
                let their_counts: Vec<usize> = (0..n).map(|j| matrix(s, j, k)).collect();
                let (their_sd, _) = layout(&their_counts, sshape, case ^ (s * 11 + n + k) as u64);
                sent(s, me, i, &their_sd)
            });
            let what = format!(
                "alltoallv n={n} rank={me} send {sshape:?} {send_counts:?}@{sd:?} recv \
                 {rshape:?} {recv_counts:?}@{rd:?}"
            );
            check(&what, &out, &want);
        }
    }
}

/// Every `v` operation with displacements on one rank of a world.
fn every_op<T: Val>(comm: &Communicator, case: u64) {
    all_gather::<T>(comm, case);
    gather::<T>(comm, case);
    scatter::<T>(comm, case);
    reduce_scatter::<T>(comm, case);
    all_to_all::<T>(comm, case);
}

fn every_type(comm: &Communicator) {
    every_op::<u8>(comm, 1);
    every_op::<i32>(comm, 2);
    every_op::<f64>(comm, 3);
    every_op::<u16>(comm, 4);
}

#[test]
fn in_process_worlds_of_one_to_nine() {
    for n in 1..=9 {
        run_world(n, |comm| every_type(&comm));
    }
}

#[test]
fn over_tcp() {
    for n in [1, 2, 3, 5] {
        run_tcp_world(n, Duration::from_secs(60), |comm| every_type(&comm));
    }
}

/// Displacements that lie back to back take the path of `Parts::new` (and may sit in a longer
/// buffer, whose tail is left alone); the same call through `Parts::new` agrees.
#[test]
fn packed_displacements_match_parts_new() {
    run_world(4, |comm| {
        let counts = [2, 0, 1, 3];
        let displs = [0, 2, 2, 3];
        let me = comm.rank();
        let mine = vec![me as u32 + 1; counts[me]];
        let mut plain = vec![0u32; 6];
        comm.all_gather(&mine, Parts::new(&mut plain, &counts))
            .unwrap();
        let mut longer = vec![7u32; 8];
        comm.all_gather(&mine, Parts::with_displs(&mut longer, &counts, &displs))
            .unwrap();
        assert_eq!(plain, [1, 1, 3, 4, 4, 4]);
        assert_eq!(longer, [1, 1, 3, 4, 4, 4, 7, 7]);
    });
}

/// Every argument error names the argument and the block, on every rank alike; nothing was sent,
/// so the communicator still works afterwards.
#[test]
fn argument_errors_name_the_block() {
    run_world(3, |comm| {
        let me = comm.rank();
        let counts = [1, 2, 1];
        let mine = vec![me as i32; counts[me]];
        let mut out = vec![0i32; 8];
        let msg = |r: accord::Result<accord::Completion>| r.unwrap_err().to_string();

        // One displacement per rank.
        let e = msg(comm.all_gather(&mine, Parts::with_displs(&mut out, &counts, &[0, 1])));
        assert!(
            e.contains("displs of the receive buffer has 2 entries") && e.contains("3 ranks"),
            "{e}"
        );
        let e = msg(comm.scatter(
            Parts::with_displs(&out, &counts, &[0, 1, 2, 3]),
            &mut [0i32; 2][..counts[me]],
            0,
        ));
        assert!(e.contains("displs of the send buffer has 4 entries"), "{e}");

        // A block past the end of its buffer.
        let e = msg(comm.all_gather(&mine, Parts::with_displs(&mut out, &counts, &[0, 7, 3])));
        assert!(
            e.contains("allgatherv") && e.contains("receive block 1") && e.contains("7..9"),
            "{e}"
        );
        assert!(e.contains("buffer of 8 elements"), "{e}");
        let big = [usize::MAX, 0, 0];
        let e = msg(comm.reduce_scatter(
            Parts::with_displs(&out, &counts, &big),
            &mut [0i32; 2][..counts[me]],
            ReduceOp::Sum,
        ));
        assert!(
            e.contains("send block 0") && e.contains("does not fit"),
            "{e}"
        );

        // Receive blocks that overlap; empty blocks may lie anywhere.
        let e = msg(comm.all_gather(&mine, Parts::with_displs(&mut out, &counts, &[5, 0, 1])));
        assert!(
            e.contains("receive blocks 1 (elements 0..2) and 2 (elements 1..2) overlap"),
            "{e}"
        );
        let e = msg(comm.all_to_all(
            Parts::with_displs(&[0i32; 3], &[1, 1, 1], &[0, 0, 0]),
            Parts::with_displs(&mut out, &[1, 1, 1], &[2, 4, 2]),
        ));
        assert!(
            e.contains("alltoallv") && e.contains("receive blocks 0"),
            "{e}"
        );

        // Displacements on a side the operation does not lay out in blocks.
        let e = msg(comm.all_gather(
            Parts::with_displs(&mine, &counts, &[0, 0, 0]),
            Parts::new(&mut out[..4], &counts),
        ));
        assert!(e.contains("given for the send buffer"), "{e}");

        // Counts still checked: one per rank.
        let e = msg(comm.all_gather(&mine, Parts::with_displs(&mut out, &[1, 2], &[0, 1])));
        assert!(e.contains("counts has 2 entries"), "{e}");

        // Nothing went out: the communicator still works, gaps untouched.
        let mut ok = vec![-7i32; 8];
        let one = [0usize, 0, 0];
        let empty: [i32; 0] = [];
        let mut none = vec![-7i32; 8];
        comm.all_gather(&empty, Parts::with_displs(&mut none, &one, &[9, 9, 9]))
            .unwrap();
        assert_eq!(none, [-7; 8]);
        comm.all_gather(&mine, Parts::with_displs(&mut ok, &counts, &[6, 2, 0]))
            .unwrap();
        assert_eq!(ok, [2, -7, 1, 1, -7, -7, 0, -7]);
    });
}

/// Off the root, gatherv's receive and scatterv's send blocks are not used: only their number is
/// checked, not where they lie (MPI ignores them there).
#[test]
fn blocks_off_the_root_are_not_checked() {
    run_world(3, |comm| {
        let me = comm.rank();
        let counts = [1, 1, 1];
        let far = [100, 200, 300];
        let mut empty: Vec<u8> = Vec::new();
        let mut out = vec![0u8; 3];
        let recv = match me {
            0 => Parts::with_displs(&mut out[..], &counts, &[2, 1, 0]),
            _ => Parts::with_displs(&mut empty[..], &counts, &far),
        };
        comm.gather(&[me as u8 + 1], recv, 0).unwrap();
        if me == 0 {
            assert_eq!(out, [3, 2, 1]);
        }
        let send = [5u8, 6, 7];
        let src = match me {
            2 => Parts::with_displs(&send[..], &counts, &[1, 1, 0]),
            _ => Parts::with_displs(&[][..], &counts, &far),
        };
        let mut got = [0u8];
        comm.scatter(src, &mut got, 2).unwrap();
        assert_eq!(got[0], [6, 6, 5][me]);
    });
}
