//! Large allreduces as consecutive pieces.
//!
//! An allreduce of more than twice [`PIECE_BYTES`] (`ACCORD_PIECE_BYTES`) runs as consecutive
//! allreduces of the same algorithm on equal pieces of at most that size (at most
//! [`MAX_PIECES`]), one after another within one schedule. Each piece's received bytes are then still in the caches when they are reduced and
//! sent on; one schedule over the whole buffer streams every round's bytes through memory. The
//! cost is a piece's rounds of latency per piece, small beside the bytes of a piece this large.
//!
//! Only allreduce runs in pieces: its buffers are one vector that every rank splits alike (the
//! blocks of an allgather or all-to-all would split into strided sub-blocks), and it reduces
//! what it receives. A broadcast, which only forwards, measured 1.5-1.8x slower in pieces of
//! 8 MiB at 32-128 MiB (each piece pays its start, a barrier among them, and its lanes' ramp).
//!
//! Pieces run strictly in order on every rank, so between any two ranks every message of piece
//! `k` precedes every message of piece `k + 1` on both sides: the call's per-pair FIFO matching
//! stays what each piece's schedule needs. Ranks that disagree on the count or operator still
//! fail on the first frame (the call's fingerprint names the whole call); the piece size is
//! compared when a world forms.

use super::plan::Layout;
use super::tuner::{self, CostModel};
use super::{algorithms, Algorithm, Buf, Collective, Schedule, Span};
use crate::error::Result;

/// Default piece size in bytes (`ACCORD_PIECE_BYTES`): allreduces of more than twice this run
/// in pieces. Measured on 16 CPUs (300 MiB of last-level cache) over TCP against one schedule
/// over the whole buffer, alternating rounds: 4 ranks, 32-128 MiB 0.87-0.88x the time (5
/// rounds; in another run of pieces of 16 MiB 0.86-0.99x, 32 MiB 0.91-0.93x), 2 ranks
/// 0.95-0.96x; 16 MiB in pieces of 8 MiB 1.06x, so calls up to twice the piece stay whole.
pub const PIECE_BYTES: usize = 8 << 20;

/// Most pieces a call is cut into: beyond, the pieces grow instead, so that a plan (every
/// piece's rounds, kept in the communicator's cache) stays bounded whatever the count and
/// `ACCORD_PIECE_BYTES`.
pub const MAX_PIECES: usize = 256;

/// How many pieces `coll` runs in: 1 (whole) but for an allreduce of more than twice the
/// piece, which runs in as many as pieces of at most `piece_bytes` need (0: never), at most
/// [`MAX_PIECES`]. The pieces are equal but for one element, so none is a tiny remainder.
fn pieces(coll: &Collective, elem_size: usize, piece_bytes: usize) -> usize {
    let Collective::AllReduce { count } = *coll else {
        return 1;
    };
    let piece = piece_bytes / elem_size.max(1);
    match piece > 0 && count > piece.saturating_mul(2) {
        true => count.div_ceil(piece).min(MAX_PIECES),
        false => 1,
    }
}

/// The algorithm a call of `coll` runs with on `world` ranks where calls run in pieces of at
/// most `piece_bytes`: the tuner's choice for its largest piece where it runs in pieces (each
/// piece is a call of its own size), else for the whole call. The library, `accord sim` and
/// the tuner's tables all choose this way.
pub fn select(
    coll: &Collective,
    world: usize,
    elem_size: usize,
    model: &CostModel,
    piece_bytes: usize,
) -> Algorithm {
    let piece = piece_of(coll, elem_size, piece_bytes);
    tuner::select(piece.as_ref().unwrap_or(coll), world, elem_size, model)
}

/// The allreduce the largest piece of `coll` runs, where `coll` runs in pieces of at most
/// `piece_bytes` (0: never), or `None` where it runs whole.
pub fn piece_of(coll: &Collective, elem_size: usize, piece_bytes: usize) -> Option<Collective> {
    match pieces(coll, elem_size, piece_bytes) {
        1 => None,
        n => Some(Collective::AllReduce {
            count: coll.elements().div_ceil(n),
        }),
    }
}

/// `rank`'s schedule for `coll` with `algo`: in pieces of at most `piece_bytes` where
/// [`piece_of`] says so, else [`algorithms::build`]'s.
pub fn build(
    coll: &Collective,
    world: usize,
    rank: usize,
    algo: Algorithm,
    elem_size: usize,
    piece_bytes: usize,
) -> Result<Schedule> {
    let n = pieces(coll, elem_size, piece_bytes);
    if n < 2 {
        return algorithms::build(coll, world, rank, algo);
    }
    let count = coll.elements();
    let sizes = Layout::even(count, n);
    // Pieces differ by at most one element: two schedules, each built once.
    let big_len = count.div_ceil(n);
    let of = |c| algorithms::build(&Collective::AllReduce { count: c }, world, rank, algo);
    let big = of(big_len)?;
    let small = match count % n {
        0 => big.clone(),
        _ => of(count / n)?,
    };
    let mut whole = Schedule {
        rounds: Vec::new(),
        tmp_len: big.tmp_len.max(small.tmp_len),
    };
    for i in 0..n {
        let (off, len) = (sizes.off(i), sizes.len(i));
        let piece = if len == big_len { &big } else { &small };
        let moved = |span| shifted(span, off);
        whole.rounds.extend(piece.rounds.iter().map(|round| {
            round
                .iter()
                .map(|s| s.with_spans(moved))
                .collect::<Vec<_>>()
        }));
    }
    Ok(whole)
}

/// `span` of a piece's schedule in the whole call's buffers: the caller's buffers hold the
/// piece at `off`; scratch is the piece's own (pieces run one after another).
fn shifted(span: Span, off: usize) -> Span {
    match span.buf {
        Buf::Tmp => span,
        buf => Span::new(buf, span.off + off, span.len),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::check;

    fn pieced(coll: &Collective, world: usize, algo: Algorithm, piece: usize) -> Vec<Schedule> {
        (0..world)
            .map(|r| build(coll, world, r, algo, 4, piece * 4).unwrap())
            .collect()
    }

    #[test]
    fn a_call_in_pieces_takes_the_algorithm_of_a_piece() {
        // 800 KiB over 4 ranks in 100 pieces of 8 KiB: the tuner sees 8 KiB calls, not an
        // 800 KiB one (a latency algorithm where the whole would take a bandwidth one).
        let m = CostModel::tcp();
        let big = Collective::AllReduce { count: 100 << 11 };
        let piece = Collective::AllReduce { count: 2 << 10 };
        let (whole, per_piece) = (
            tuner::select(&big, 4, 4, &m),
            tuner::select(&piece, 4, 4, &m),
        );
        assert_ne!(
            whole, per_piece,
            "the sizes must choose differently for the test to tell"
        );
        assert_eq!(select(&big, 4, 4, &m, 8 << 10), per_piece);
        assert_eq!(select(&big, 4, 4, &m, 0), whole, "never in pieces");
        let gather = Collective::AllGather {
            counts: vec![4 << 20; 4],
        };
        let g = tuner::select(&gather, 4, 4, &m);
        assert_eq!(
            select(&gather, 4, 4, &m, 8 << 10),
            g,
            "only allreduces run in pieces"
        );
    }

    #[test]
    fn only_allreduces_above_twice_the_piece_run_in_pieces() {
        let ar = |count| Collective::AllReduce { count };
        assert_eq!(piece_of(&ar(16), 4, 32), None);
        // Three pieces of at most 8 elements, equal but for one element: 6, 6 and 5.
        assert_eq!(piece_of(&ar(17), 4, 32), Some(ar(6)));
        assert_eq!(piece_of(&ar(1 << 30), 4, 0), None);
        // At most MAX_PIECES: the pieces grow instead.
        assert_eq!(
            piece_of(&ar(1 << 30), 4, 4),
            Some(ar((1 << 30) / MAX_PIECES))
        );
        let bc = Collective::Broadcast {
            count: 100,
            root: 3,
        };
        assert_eq!(piece_of(&bc, 4, 4), None);
        assert_eq!(
            piece_of(
                &Collective::Reduce {
                    count: 100,
                    root: 0
                },
                4,
                4
            ),
            None
        );
        let ag = Collective::AllGather {
            counts: vec![100; 4],
        };
        assert_eq!(piece_of(&ag, 4, 4), None);
    }

    #[test]
    fn pieced_schedules_compute_their_collective() {
        // Pieces of two sizes, pieces smaller than the world, more pieces than MAX_PIECES
        // would allow (600 elements: 88 pieces of 3 and 168 of 2), odd worlds.
        for world in 1..=7 {
            for algo in algorithms::applicable(&Collective::AllReduce { count: 1 })
                .iter()
                .copied()
            {
                for (count, piece) in [(7, 3), (20, 6), (3, 1), (64, 8), (600, 1)] {
                    let coll = Collective::AllReduce { count };
                    let colls = vec![coll.clone(); world];
                    check::verify_schedules(&colls, pieced(&coll, world, algo, piece))
                        .unwrap_or_else(|e| panic!("{world} ranks, {algo}, {count}/{piece}: {e}"));
                    check::verify_schedules_in_place(&colls, pieced(&coll, world, algo, piece))
                        .unwrap_or_else(|e| panic!("in place, {world} ranks, {algo}: {e}"));
                }
            }
        }
    }

    #[test]
    fn pieces_run_one_after_another_over_their_own_ranges() {
        // 10 elements in pieces of at most 3: 3, 3, 2 and 2.
        let coll = Collective::AllReduce { count: 10 };
        let whole = build(&coll, 3, 0, Algorithm::Ring, 4, 12).unwrap();
        let of = |c| algorithms::build(&Collective::AllReduce { count: c }, 3, 0, Algorithm::Ring);
        let (big, small) = (of(3).unwrap(), of(2).unwrap());
        let (b, s) = (big.rounds.len(), small.rounds.len());
        assert_eq!(whole.rounds.len(), 2 * b + 2 * s);
        assert_eq!(whole.tmp_len, big.tmp_len.max(small.tmp_len));
        // The third piece covers elements 6..8 of the caller's buffers.
        for step in whole.rounds[2 * b..2 * b + s].iter().flatten() {
            step.with_spans(|sp| {
                if sp.buf != Buf::Tmp {
                    assert!(sp.off >= 6 && sp.off + sp.len <= 8, "{sp:?}");
                }
                sp
            });
        }
    }
}
