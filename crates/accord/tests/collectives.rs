//! Every collective, every algorithm that applies, every dtype and reduce op, world sizes 1..9,
//! counts 0, 1, primes and uneven vectors: random data checked against a sequential reference.
//! Ranks are threads over the in-process transport.

use accord::dtype::{finalize, reduce_into};
use accord::fingerprint::OpKind;
use accord::schedule::{algorithms, Algorithm, Collective};
use accord::testing::run_world;
use accord::{Communicator, DataType, ReduceOp};
use accord::{Parts, RecvBuf, SendBuf};
use half::{bf16, f16};

const WORLDS: std::ops::RangeInclusive<usize> = 1..=9;
const COUNTS: [usize; 5] = [0, 1, 7, 13, 130];

/// splitmix64: deterministic per (rank, case) so every rank can recompute every other's input.
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed;
    move || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Random elements of `dtype`. Floats come from a set whose sums and products over <= 9 ranks
/// are exact in every float type, so any reduction order gives bit-identical results.
fn data(dtype: DataType, count: usize, seed: u64) -> Vec<u8> {
    let mut r = rng(seed);
    let floats = [-2.0f64, -1.0, -0.5, 0.5, 1.0, 2.0, 4.0];
    let mut out = Vec::with_capacity(count * dtype.size());
    for _ in 0..count {
        let x = r();
        let v = floats[(x % floats.len() as u64) as usize];
        match dtype {
            DataType::F16 => out.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
            DataType::BF16 => out.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
            DataType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DataType::F64 => out.extend_from_slice(&v.to_le_bytes()),
            _ => out.extend_from_slice(&x.to_le_bytes()[..dtype.size()]),
        }
    }
    out
}

fn seed(rank: usize, case: u64) -> u64 {
    case.wrapping_mul(1_000_003).wrapping_add(rank as u64)
}

/// Sequential reference: fold every rank's contribution in rank order, then finalize.
fn reference_reduce(dtype: DataType, op: ReduceOp, inputs: &[Vec<u8>]) -> Vec<u8> {
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        reduce_into(dtype, op, &mut acc, x);
    }
    finalize(dtype, op, &mut acc, inputs.len());
    acc
}

fn uneven(n: usize, base: usize) -> Vec<usize> {
    (0..n).map(|i| (i * 7 + base) % 5).collect()
}

/// Run `body` once for every applicable algorithm of `coll` (forced), or once for the tuner
/// default when `coll` has none.
fn for_each_algo(comm: &Communicator, coll: &Collective, mut body: impl FnMut(Option<Algorithm>)) {
    body(None);
    for &a in algorithms::applicable(coll) {
        comm.force_algorithm(coll.kind(), Some(a));
        body(Some(a));
        comm.force_algorithm(coll.kind(), None);
    }
}

fn dtype_ops() -> Vec<(DataType, ReduceOp)> {
    let mut v = Vec::new();
    for d in DataType::ALL {
        for o in ReduceOp::ALL {
            if o.supports(d) {
                v.push((d, o));
            }
        }
    }
    v
}

#[test]
fn allreduce_matches_reference() {
    for n in WORLDS {
        run_world(n, |comm| {
            let me = comm.rank();
            for (case, (dtype, op)) in dtype_ops().into_iter().enumerate() {
                for count in COUNTS {
                    let coll = Collective::AllReduce { count };
                    for_each_algo(&comm, &coll, |algo| {
                        let case = (case * 1000 + count) as u64;
                        let inputs: Vec<_> =
                            (0..n).map(|r| data(dtype, count, seed(r, case))).collect();
                        let want = reference_reduce(dtype, op, &inputs);
                        let mut out = vec![0u8; count * dtype.size()];
                        comm.all_reduce(
                            (
                                SendBuf::bytes(&inputs[me], dtype),
                                RecvBuf::bytes(&mut out, dtype),
                            ),
                            op,
                        )
                        .unwrap();
                        assert_eq!(
                            out, want,
                            "allreduce n={n} {dtype} {op} count={count} algo={algo:?}"
                        );
                        let mut inplace = inputs[me].clone();
                        comm.all_reduce(RecvBuf::bytes(&mut inplace, dtype), op)
                            .unwrap();
                        assert_eq!(
                            inplace, want,
                            "in-place allreduce n={n} {dtype} {op} count={count} algo={algo:?}"
                        );
                    });
                }
            }
        });
    }
}

#[test]
fn reduce_matches_reference() {
    for n in WORLDS {
        run_world(n, |comm| {
            let me = comm.rank();
            for (case, (dtype, op)) in dtype_ops().into_iter().enumerate() {
                for count in [0, 1, 13] {
                    for root in [0, n - 1, n / 2] {
                        let coll = Collective::Reduce { count, root };
                        for_each_algo(&comm, &coll, |algo| {
                            let case = (case * 1000 + count * 10 + root) as u64;
                            let inputs: Vec<_> =
                                (0..n).map(|r| data(dtype, count, seed(r, case))).collect();
                            let mut out =
                                vec![0u8; if me == root { count * dtype.size() } else { 0 }];
                            comm.reduce(
                                (
                                    SendBuf::bytes(&inputs[me], dtype),
                                    RecvBuf::bytes(&mut out, dtype),
                                ),
                                op,
                                root,
                            )
                            .unwrap();
                            if me == root {
                                let want = reference_reduce(dtype, op, &inputs);
                                assert_eq!(out, want, "reduce n={n} {dtype} {op} count={count} root={root} algo={algo:?}");
                            }
                        });
                    }
                }
            }
        });
    }
}

#[test]
fn broadcast_matches_reference() {
    for n in WORLDS {
        run_world(n, |comm| {
            let me = comm.rank();
            for dtype in DataType::ALL {
                for count in COUNTS {
                    for root in [0, n - 1, n / 2] {
                        let coll = Collective::Broadcast { count, root };
                        for_each_algo(&comm, &coll, |algo| {
                            let case = (dtype as u64) * 100_000 + (count * 10 + root) as u64;
                            let want = data(dtype, count, seed(root, case));
                            let mut buf = if me == root {
                                want.clone()
                            } else {
                                vec![0xAB; want.len()]
                            };
                            comm.broadcast(RecvBuf::bytes(&mut buf, dtype), root)
                                .unwrap();
                            assert_eq!(
                                buf, want,
                                "broadcast n={n} {dtype} count={count} root={root} algo={algo:?}"
                            );
                        });
                    }
                }
            }
        });
    }
}

fn count_vectors(n: usize) -> Vec<Vec<usize>> {
    vec![
        vec![0; n],
        vec![1; n],
        vec![13; n],
        uneven(n, 3),
        uneven(n, 0),
    ]
}

#[test]
fn allgather_and_gather_match_reference() {
    for n in WORLDS {
        run_world(n, |comm| {
            let me = comm.rank();
            for dtype in [DataType::U8, DataType::BF16, DataType::F32, DataType::I64] {
                for (ci, counts) in count_vectors(n).into_iter().enumerate() {
                    let esz = dtype.size();
                    let case = (dtype as u64) * 1000 + ci as u64;
                    let inputs: Vec<_> = (0..n)
                        .map(|r| data(dtype, counts[r], seed(r, case)))
                        .collect();
                    let want: Vec<u8> = inputs.concat();
                    let equal = counts.iter().all(|&c| c == counts[0]);
                    let coll = Collective::AllGather {
                        counts: counts.clone(),
                    };
                    for_each_algo(&comm, &coll, |algo| {
                        let mut out = vec![0u8; want.len()];
                        comm.all_gather(
                            SendBuf::bytes(&inputs[me], dtype),
                            Parts::new(RecvBuf::bytes(&mut out, dtype), &counts),
                        )
                        .unwrap();
                        assert_eq!(
                            out, want,
                            "allgatherv n={n} {dtype} counts={counts:?} algo={algo:?}"
                        );
                        if equal {
                            let mut out = vec![0u8; want.len()];
                            comm.all_gather(
                                SendBuf::bytes(&inputs[me], dtype),
                                RecvBuf::bytes(&mut out, dtype),
                            )
                            .unwrap();
                            assert_eq!(
                                out, want,
                                "allgather n={n} {dtype} counts={counts:?} algo={algo:?}"
                            );
                        }
                    });
                    for root in [0, n - 1] {
                        let coll = Collective::Gather {
                            counts: counts.clone(),
                            root,
                        };
                        for_each_algo(&comm, &coll, |algo| {
                            let mut out = vec![0u8; if me == root { want.len() } else { 0 }];
                            comm.gather(
                                SendBuf::bytes(&inputs[me], dtype),
                                Parts::new(RecvBuf::bytes(&mut out, dtype), &counts),
                                root,
                            )
                            .unwrap();
                            if me == root {
                                assert_eq!(out, want, "gatherv n={n} {dtype} counts={counts:?} root={root} algo={algo:?}");
                            }
                            if equal {
                                let mut out =
                                    vec![0u8; if me == root { counts[0] * n * esz } else { 0 }];
                                comm.gather(
                                    SendBuf::bytes(&inputs[me], dtype),
                                    RecvBuf::bytes(&mut out, dtype),
                                    root,
                                )
                                .unwrap();
                                if me == root {
                                    assert_eq!(
                                        out, want,
                                        "gather n={n} {dtype} root={root} algo={algo:?}"
                                    );
                                }
                            }
                        });
                    }
                }
            }
        });
    }
}

#[test]
fn scatter_matches_reference() {
    for n in WORLDS {
        run_world(n, |comm| {
            let me = comm.rank();
            for dtype in [DataType::U8, DataType::F16, DataType::F64, DataType::I32] {
                for (ci, counts) in count_vectors(n).into_iter().enumerate() {
                    let esz = dtype.size();
                    let equal = counts.iter().all(|&c| c == counts[0]);
                    for root in [0, n - 1, n / 2] {
                        let case = (dtype as u64) * 1000 + ci as u64 * 10 + root as u64;
                        let total: usize = counts.iter().sum();
                        let all = data(dtype, total, seed(root, case));
                        let start: usize = counts[..me].iter().sum();
                        let want = all[start * esz..(start + counts[me]) * esz].to_vec();
                        let coll = Collective::Scatter {
                            counts: counts.clone(),
                            root,
                        };
                        for_each_algo(&comm, &coll, |algo| {
                            let send = if me == root { all.clone() } else { vec![] };
                            let mut out = vec![0u8; counts[me] * esz];
                            comm.scatter(
                                Parts::new(SendBuf::bytes(&send, dtype), &counts),
                                RecvBuf::bytes(&mut out, dtype),
                                root,
                            )
                            .unwrap();
                            assert_eq!(out, want, "scatterv n={n} {dtype} counts={counts:?} root={root} algo={algo:?}");
                            if equal {
                                let mut out = vec![0u8; counts[me] * esz];
                                comm.scatter(
                                    SendBuf::bytes(&send, dtype),
                                    RecvBuf::bytes(&mut out, dtype),
                                    root,
                                )
                                .unwrap();
                                assert_eq!(
                                    out, want,
                                    "scatter n={n} {dtype} root={root} algo={algo:?}"
                                );
                            }
                        });
                    }
                }
            }
        });
    }
}

#[test]
fn reduce_scatter_matches_reference() {
    for n in WORLDS {
        run_world(n, |comm| {
            let me = comm.rank();
            for (case, (dtype, op)) in dtype_ops().into_iter().enumerate() {
                for (ci, counts) in count_vectors(n).into_iter().enumerate() {
                    let esz = dtype.size();
                    let total: usize = counts.iter().sum();
                    let case = (case * 100 + ci) as u64;
                    let inputs: Vec<_> =
                        (0..n).map(|r| data(dtype, total, seed(r, case))).collect();
                    let full = reference_reduce(dtype, op, &inputs);
                    let start: usize = counts[..me].iter().sum();
                    let want = full[start * esz..(start + counts[me]) * esz].to_vec();
                    let coll = Collective::ReduceScatter {
                        counts: counts.clone(),
                    };
                    let equal = counts.iter().all(|&c| c == counts[0]);
                    for_each_algo(&comm, &coll, |algo| {
                        let mut out = vec![0u8; counts[me] * esz];
                        comm.reduce_scatter(
                            Parts::new(SendBuf::bytes(&inputs[me], dtype), &counts),
                            RecvBuf::bytes(&mut out, dtype),
                            op,
                        )
                        .unwrap();
                        assert_eq!(
                            out, want,
                            "reduce_scatterv n={n} {dtype} {op} counts={counts:?} algo={algo:?}"
                        );
                        if equal {
                            let mut out = vec![0u8; counts[me] * esz];
                            comm.reduce_scatter(
                                SendBuf::bytes(&inputs[me], dtype),
                                RecvBuf::bytes(&mut out, dtype),
                                op,
                            )
                            .unwrap();
                            assert_eq!(
                                out, want,
                                "reduce_scatter n={n} {dtype} {op} algo={algo:?}"
                            );
                        }
                    });
                }
            }
        });
    }
}

#[test]
fn alltoall_matches_reference() {
    for n in WORLDS {
        run_world(n, |comm| {
            let me = comm.rank();
            for dtype in [DataType::U8, DataType::BF16, DataType::F32, DataType::U64] {
                let esz = dtype.size();
                // Equal blocks.
                for block in [0, 1, 13] {
                    let case = (dtype as u64) * 100 + block as u64;
                    let sends: Vec<_> = (0..n)
                        .map(|r| data(dtype, block * n, seed(r, case)))
                        .collect();
                    let want: Vec<u8> = (0..n)
                        .flat_map(|src| {
                            sends[src][me * block * esz..(me + 1) * block * esz].to_vec()
                        })
                        .collect();
                    let coll = Collective::AllToAll {
                        send_counts: vec![block; n],
                        recv_counts: vec![block; n],
                    };
                    for_each_algo(&comm, &coll, |algo| {
                        let mut out = vec![0u8; block * n * esz];
                        comm.all_to_all(
                            SendBuf::bytes(&sends[me], dtype),
                            RecvBuf::bytes(&mut out, dtype),
                        )
                        .unwrap();
                        assert_eq!(
                            out, want,
                            "alltoall n={n} {dtype} block={block} algo={algo:?}"
                        );
                    });
                }
                // Variable blocks: rank r sends (r + 2 * j) % 4 elements to rank j.
                let c = |r: usize, j: usize| (r + 2 * j) % 4;
                let send_counts: Vec<usize> = (0..n).map(|j| c(me, j)).collect();
                let recv_counts: Vec<usize> = (0..n).map(|r| c(r, me)).collect();
                let case = (dtype as u64) * 100 + 99;
                let sends: Vec<_> = (0..n)
                    .map(|r| data(dtype, (0..n).map(|j| c(r, j)).sum(), seed(r, case)))
                    .collect();
                let want: Vec<u8> = (0..n)
                    .flat_map(|src| {
                        let off: usize = (0..me).map(|j| c(src, j)).sum();
                        sends[src][off * esz..(off + c(src, me)) * esz].to_vec()
                    })
                    .collect();
                let coll = Collective::AllToAll {
                    send_counts: send_counts.clone(),
                    recv_counts: recv_counts.clone(),
                };
                for_each_algo(&comm, &coll, |algo| {
                    let mut out = vec![0u8; want.len()];
                    comm.all_to_all(
                        Parts::new(SendBuf::bytes(&sends[me], dtype), &send_counts),
                        Parts::new(RecvBuf::bytes(&mut out, dtype), &recv_counts),
                    )
                    .unwrap();
                    assert_eq!(out, want, "alltoallv n={n} {dtype} algo={algo:?}");
                });
            }
        });
    }
}

#[test]
fn barrier_and_point_to_point() {
    for n in WORLDS {
        run_world(n, |comm| {
            let me = comm.rank();
            let coll = Collective::Barrier;
            for_each_algo(&comm, &coll, |_| comm.barrier().unwrap());
            // Ring exchange with tags, including to self when n == 1.
            let next = (me + 1) % n;
            let prev = (me + n - 1) % n;
            let send: Vec<u32> = (0..100).map(|i| (me * 1000 + i) as u32).collect();
            let mut got = vec![0u32; 100];
            comm.sendrecv(&send, next, &mut got, prev, 5).unwrap();
            assert_eq!(
                got,
                (0..100)
                    .map(|i| (prev * 1000 + i) as u32)
                    .collect::<Vec<_>>()
            );
            // Tags keep messages apart even when sent out of order.
            comm.send(&[1u8], next, 1).unwrap();
            comm.send(&[2u8], next, 2).unwrap();
            let mut b = [0u8];
            comm.recv(&mut b, prev, 2).unwrap();
            assert_eq!(b, [2]);
            comm.recv(&mut b, prev, 1).unwrap();
            assert_eq!(b, [1]);
        });
    }
}

#[test]
fn avg_is_rejected_for_integers_and_bitwise_for_floats() {
    run_world(2, |comm| {
        let mut v = [1i32; 4];
        let e = comm.all_reduce(&mut v, ReduceOp::Avg).unwrap_err();
        assert!(e.to_string().contains("avg"), "{e}");
        let mut f = [1f32; 4];
        assert!(comm.all_reduce(&mut f, ReduceOp::BXor).is_err());
        // Nothing was sent, so the communicator still works.
        comm.all_reduce(&mut f, ReduceOp::Sum).unwrap();
        assert_eq!(f, [2.0; 4]);
    });
}

#[test]
fn force_algorithm_is_per_kind() {
    run_world(3, |comm| {
        comm.force_algorithm(OpKind::AllReduce, Some(Algorithm::Direct));
        let mut v = [comm.rank() as f64; 5];
        comm.all_reduce(&mut v, ReduceOp::Max).unwrap();
        assert_eq!(v, [2.0; 5]);
    });
}
