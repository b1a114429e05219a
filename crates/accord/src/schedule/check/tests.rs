//! Every applicable algorithm of every collective, proved on small worlds, plus proof that the
//! checker notices broken schedules.

use super::*;
use crate::schedule::algorithms::{applicable, build};

const WORLDS: std::ops::RangeInclusive<usize> = 1..=16;
const COUNTS: [usize; 6] = [0, 1, 2, 7, 13, 31];

/// A few roots per world: first, second, middle, last.
fn roots(p: usize) -> Vec<usize> {
    let mut r = vec![0, 1 % p, p / 2, p - 1];
    r.dedup();
    r.sort_unstable();
    r.dedup();
    r
}

/// Block-size vectors: uniform, uneven with zeros, one non-empty block, increasing.
fn count_vectors(p: usize) -> Vec<Vec<usize>> {
    vec![
        vec![0; p],
        vec![1; p],
        vec![3; p],
        (0..p).map(|i| (i * 7 + 3) % 5).collect(),
        (0..p).map(|i| usize::from(i == p / 2) * 5).collect(),
        (0..p).map(|i| i + 1).collect(),
    ]
}

fn check_all(coll: &Collective, p: usize) {
    for &algo in applicable(coll) {
        if let Err(e) = verify(coll, p, algo) {
            panic!("{coll:?} on {p} ranks with {algo}: {e}");
        }
    }
}

#[test]
fn barrier() {
    for p in WORLDS {
        check_all(&Collective::Barrier, p);
    }
}

#[test]
fn broadcast_and_reduce() {
    for p in WORLDS {
        for count in COUNTS {
            for root in roots(p) {
                check_all(&Collective::Broadcast { count, root }, p);
                check_all(&Collective::Reduce { count, root }, p);
            }
        }
    }
}

#[test]
fn broadcast_ring_pipelines_large_messages() {
    // Three pieces of at least 128 Ki elements: a rank inside the chain receives three times.
    let coll = Collective::Broadcast {
        count: 3 * (128 << 10) + 5,
        root: 2,
    };
    let sched = build(&coll, 5, 3, Algorithm::Ring).unwrap();
    let data = |s: &&Step| matches!(s, Step::Recv { dst, .. } if dst.len > 0);
    assert_eq!(sched.rounds.iter().flatten().filter(data).count(), 3);
    // Pipelined: it forwards one piece in the round it receives the next.
    let forwards = |s: &Step| matches!(s, Step::Send { src, .. } if src.len > 0);
    assert!(sched
        .rounds
        .iter()
        .any(|r| r.iter().any(forwards) && r.iter().filter(data).count() > 0));
    verify(&coll, 5, Algorithm::Ring).unwrap();
}

#[test]
fn allreduce() {
    for p in WORLDS {
        for count in COUNTS {
            check_all(&Collective::AllReduce { count }, p);
        }
    }
}

#[test]
fn in_place_allreduce_and_reduce() {
    for p in WORLDS {
        for count in [0, 1, 13] {
            for root in roots(p) {
                let coll = Collective::Reduce { count, root };
                for &algo in applicable(&coll) {
                    verify_in_place(&coll, p, algo).unwrap_or_else(|e| panic!("{algo}: {e}"));
                }
            }
            let coll = Collective::AllReduce { count };
            for &algo in applicable(&coll) {
                verify_in_place(&coll, p, algo).unwrap_or_else(|e| panic!("{algo}: {e}"));
            }
        }
    }
}

#[test]
fn scan_and_exscan_in_and_out_of_place() {
    for p in WORLDS.chain([16, 17, 33]) {
        for count in [0, 1, 13] {
            for exclusive in [false, true] {
                let coll = Collective::Scan { count, exclusive };
                check_all(&coll, p);
                for &algo in applicable(&coll) {
                    verify_in_place(&coll, p, algo).unwrap_or_else(|e| panic!("{algo}: {e}"));
                }
            }
        }
    }
}

#[test]
fn allgather_and_reduce_scatter() {
    for p in WORLDS {
        for counts in count_vectors(p) {
            check_all(
                &Collective::AllGather {
                    counts: counts.clone(),
                },
                p,
            );
            check_all(&Collective::ReduceScatter { counts }, p);
        }
    }
}

#[test]
fn gather_and_scatter() {
    for p in WORLDS {
        for counts in count_vectors(p) {
            for root in roots(p) {
                let counts = counts.clone();
                check_all(
                    &Collective::Gather {
                        counts: counts.clone(),
                        root,
                    },
                    p,
                );
                check_all(&Collective::Scatter { counts, root }, p);
            }
        }
    }
}

#[test]
fn alltoall_uniform() {
    for p in WORLDS {
        for c in [0, 1, 3] {
            let coll = Collective::AllToAll {
                send_counts: vec![c; p],
                recv_counts: vec![c; p],
            };
            assert!(applicable(&coll).contains(&Algorithm::Bruck));
            check_all(&coll, p);
        }
    }
}

#[test]
fn alltoallv_uneven() {
    let f = |from: usize, to: usize| (from * 3 + to * 5 + 1) % 4;
    for p in WORLDS {
        let colls: Vec<Collective> = (0..p)
            .map(|r| Collective::AllToAll {
                send_counts: (0..p).map(|j| f(r, j)).collect(),
                recv_counts: (0..p).map(|j| f(j, r)).collect(),
            })
            .collect();
        for &algo in applicable(&colls[0]) {
            if algo != Algorithm::Bruck {
                verify_each(&colls, algo).unwrap_or_else(|e| panic!("{p} ranks, {algo}: {e}"));
            }
        }
    }
}

#[test]
fn no_rank_sends_to_itself_and_inapplicable_is_refused() {
    let coll = Collective::AllToAll {
        send_counts: vec![1, 2],
        recv_counts: vec![1, 2],
    };
    assert!(build(&coll, 2, 0, Algorithm::Bruck).is_err());
    assert!(build(&Collective::Barrier, 3, 0, Algorithm::Ring).is_err());
    assert!(build(
        &Collective::AllGather { counts: vec![1] },
        2,
        0,
        Algorithm::Ring
    )
    .is_err());
    assert!(build(
        &Collective::Reduce { count: 1, root: 3 },
        3,
        0,
        Algorithm::Direct
    )
    .is_err());
}

fn ring_allreduce(p: usize) -> (Vec<Collective>, Vec<Schedule>) {
    let coll = Collective::AllReduce { count: 8 };
    let scheds = (0..p)
        .map(|r| build(&coll, p, r, Algorithm::Ring).unwrap())
        .collect();
    (vec![coll; p], scheds)
}

/// Remove the first step of rank `r` matching `pred`.
fn remove_step(s: &mut Schedule, pred: impl Fn(&Step) -> bool) {
    for round in &mut s.rounds {
        if let Some(i) = round.iter().position(&pred) {
            round.remove(i);
            return;
        }
    }
    panic!("no such step");
}

#[test]
fn catches_missing_send_as_deadlock() {
    let (colls, mut scheds) = ring_allreduce(4);
    remove_step(&mut scheds[1], |s| matches!(s, Step::Send { .. }));
    let err = verify_schedules(&colls, scheds).unwrap_err();
    assert!(err.contains("deadlock"), "{err}");
}

#[test]
fn catches_double_reduce() {
    let coll = Collective::AllReduce { count: 3 };
    let mut scheds: Vec<Schedule> = (0..3)
        .map(|r| build(&coll, 3, r, Algorithm::Direct).unwrap())
        .collect();
    let last = scheds[0].rounds.last_mut().unwrap();
    let i = last
        .iter()
        .position(|s| matches!(s, Step::Reduce { .. }))
        .unwrap();
    last.insert(i, last[i]);
    let err = verify_schedules(&vec![coll; 3], scheds).unwrap_err();
    assert!(err.contains("rank 0") && err.contains("expected"), "{err}");
}

#[test]
fn catches_missing_and_double_finalize() {
    let (colls, mut scheds) = ring_allreduce(3);
    remove_step(&mut scheds[2], |s| matches!(s, Step::Finalize { .. }));
    let err = verify_schedules(&colls, scheds).unwrap_err();
    assert!(err.contains("finalized 0x"), "{err}");

    let (colls, mut scheds) = ring_allreduce(3);
    scheds[0].rounds.push(vec![Step::Finalize {
        dst: Span::new(Buf::Out, 0, 8),
    }]);
    let err = verify_schedules(&colls, scheds).unwrap_err();
    assert!(err.contains("finalized 2x"), "{err}");
}

#[test]
fn catches_length_mismatch_bounds_and_self_sends() {
    let (colls, mut scheds) = ring_allreduce(2);
    for step in scheds[1].rounds.iter_mut().flatten() {
        if let Step::Recv { dst, .. } = step {
            dst.len += 1;
        }
    }
    let err = verify_schedules(&colls, scheds).unwrap_err();
    assert!(err.contains("elements, expected"), "{err}");

    let (colls, mut scheds) = ring_allreduce(2);
    scheds[0].rounds[0].push(Step::Copy {
        src: Span::new(Buf::In, 4, 8),
        dst: Span::new(Buf::Out, 0, 8),
    });
    let err = verify_schedules(&colls, scheds).unwrap_err();
    assert!(err.contains("out of bounds"), "{err}");

    let (colls, mut scheds) = ring_allreduce(2);
    scheds[1].rounds[0].push(Step::Send {
        peer: 1,
        src: Span::new(Buf::In, 0, 1),
    });
    let err = verify_schedules(&colls, scheds).unwrap_err();
    assert!(err.contains("sends to rank 1"), "{err}");
}

#[test]
fn catches_unreceived_messages() {
    let (colls, mut scheds) = ring_allreduce(2);
    scheds[0].rounds.push(vec![Step::Send {
        peer: 1,
        src: Span::new(Buf::Out, 0, 1),
    }]);
    let err = verify_schedules(&colls, scheds).unwrap_err();
    assert!(err.contains("never received"), "{err}");
}

#[test]
fn larger_worlds() {
    for p in [31, 32, 33, 48] {
        check_all(&Collective::AllReduce { count: 37 }, p);
        check_all(
            &Collective::Reduce {
                count: 37,
                root: p / 3,
            },
            p,
        );
        check_all(
            &Collective::Broadcast {
                count: 37,
                root: p - 2,
            },
            p,
        );
        let counts: Vec<usize> = (0..p).map(|i| (i * 7 + 3) % 5).collect();
        check_all(
            &Collective::AllGather {
                counts: counts.clone(),
            },
            p,
        );
        check_all(
            &Collective::ReduceScatter {
                counts: counts.clone(),
            },
            p,
        );
        check_all(
            &Collective::Gather {
                counts: counts.clone(),
                root: 5,
            },
            p,
        );
        check_all(&Collective::Scatter { counts, root: 5 }, p);
        check_all(
            &Collective::AllToAll {
                send_counts: vec![2; p],
                recv_counts: vec![2; p],
            },
            p,
        );
    }
}

#[test]
fn schedules_grow_linearly_at_most() {
    let p = 4096;
    let coll = Collective::AllReduce { count: 1 << 20 };
    let ring = build(&coll, p, 17, Algorithm::Ring).unwrap();
    assert!(ring.steps().count() <= 4 * p);
    let rd = build(&coll, p, 17, Algorithm::RecursiveDoubling).unwrap();
    assert_eq!(rd.rounds.len(), 12 + 1); // the exchanges (the first reads the input), finalize
    let counts = vec![3; p];
    let ag = build(&Collective::AllGather { counts }, p, 9, Algorithm::Bruck).unwrap();
    assert_eq!(ag.rounds.len(), 12 + 2);
}

/// The reductions that carry large vectors read the input as they add it: a pass copying the
/// whole input first cost a quarter of a 64 MiB allreduce's time over TCP.
#[test]
fn large_reductions_copy_no_input_first() {
    for p in 2..=9 {
        let count = 1000 * p + 3;
        let cases = [
            (Collective::AllReduce { count }, Algorithm::Ring),
            (Collective::AllReduce { count }, Algorithm::Rabenseifner),
            (
                Collective::AllReduce { count },
                Algorithm::RecursiveDoubling,
            ),
            (
                Collective::Reduce { count, root: 1 },
                Algorithm::Rabenseifner,
            ),
            (
                Collective::ReduceScatter {
                    counts: vec![1000; p],
                },
                Algorithm::Rabenseifner,
            ),
            (
                Collective::ReduceScatter {
                    counts: vec![1000; p],
                },
                Algorithm::Ring,
            ),
        ];
        for (coll, algo) in cases {
            for r in 0..p {
                let sched = build(&coll, p, r, algo).unwrap();
                let copies_input = |s: &Step| {
                    matches!(s, Step::Copy { src, .. } | Step::Reduce { src, .. }
                        if src.buf == Buf::In && src.len >= 1000)
                };
                assert!(
                    !sched.steps().any(copies_input),
                    "{coll:?} {algo} rank {r} of {p}"
                );
            }
        }
    }
}
