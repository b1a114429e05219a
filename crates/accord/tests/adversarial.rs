//! Programs that are wrong, or legal but unusual, on every in-process engine (threads over the
//! in-process transport and over TCP on loopback): they must fail on every rank with an error
//! that names what was wrong, or work, never return wrong data.
//!
//! Bounded for CI; `ACCORD_SOAK=<n>` repeats the randomized parts `n` times as often.

use accord::testing::{run_tcp_world, run_world_with_timeout, soak};
use accord::{Communicator, Error, ReduceOp};
use accord::{Parts, SendBuf};
use std::time::{Duration, Instant};

type World = fn(usize, Duration, &(dyn Fn(Communicator) -> String + Sync)) -> Vec<String>;

fn inproc(n: usize, t: Duration, f: &(dyn Fn(Communicator) -> String + Sync)) -> Vec<String> {
    run_world_with_timeout(n, t, f)
}

fn tcp(n: usize, t: Duration, f: &(dyn Fn(Communicator) -> String + Sync)) -> Vec<String> {
    run_tcp_world(n, t, f)
}

const ENGINES: [(&str, World); 2] = [("inproc", inproc), ("tcp", tcp)];

/// Every rooted operation, run with this rank's idea of the root.
fn rooted(comm: &Communicator, op: &str, root: usize) -> accord::Result<()> {
    let n = comm.size();
    let me = comm.rank();
    let counts: Vec<usize> = (0..n).map(|r| r % 3 + 1).collect();
    let total: usize = counts.iter().sum();
    match op {
        "broadcast" => comm.broadcast(&mut [me as f32; 5], root),
        "scatter" => comm.scatter(&vec![1i32; 3 * n], &mut [0i32; 3], root),
        "scatterv" => comm.scatter(
            Parts::new(&vec![1i32; total], &counts),
            &mut vec![0; counts[me]],
            root,
        ),
        "gather" => comm.gather(&[1i64; 2], &mut vec![0i64; 2 * n], root),
        "gatherv" => comm.gather(
            &vec![1i64; counts[me]],
            Parts::new(&mut vec![0i64; total], &counts),
            root,
        ),
        "reduce" => comm.reduce(&mut [1.0f64; 7], ReduceOp::Sum, root),
        "reduce_large" => comm.reduce(&mut vec![1u32; 300_001], ReduceOp::Max, root),
        "broadcast_large" => comm.broadcast(&mut vec![me as u8; 3 << 20], root),
        _ => unreachable!(),
    }
    .map(drop)
}

const ROOTED: [&str; 8] = [
    "broadcast",
    "scatter",
    "scatterv",
    "gather",
    "gatherv",
    "reduce",
    "reduce_large",
    "broadcast_large",
];

/// The error a rank sees when the ranks disagree about a call: the desync itself, or the abort
/// of a rank that saw it, which carries its text.
fn is_desync(e: &Error) -> bool {
    match e {
        Error::Desync { .. } => true,
        Error::Aborted { reason } => reason.contains("desync"),
        _ => false,
    }
}

/// Ranks that disagree on the root all fail at once with a desync, whichever ranks disagree,
/// and the communicator stays failed.
#[test]
fn ranks_that_disagree_on_the_root_all_fail_with_a_desync() {
    // (world size, root of each rank)
    let patterns: Vec<(usize, Vec<usize>)> = vec![
        (2, vec![0, 1]),
        (3, vec![0, 0, 1]),
        (3, vec![2, 1, 2]),
        (4, vec![0, 1, 2, 3]),
        (5, vec![0, 0, 0, 0, 4]),
        (5, vec![3, 3, 0, 3, 3]),
        (9, vec![0, 0, 0, 0, 0, 0, 0, 0, 8]),
        // Beyond 16 ranks the agreement is a dissemination barrier instead of direct tokens.
        (17, (0..17).map(|r| if r == 11 { 3 } else { 0 }).collect()),
    ];
    for (engine, world) in ENGINES {
        for (n, roots) in &patterns {
            for op in ROOTED {
                let t0 = Instant::now();
                let out = world(*n, Duration::from_secs(20), &|comm| {
                    let root = roots[comm.rank()];
                    let first = match rooted(&comm, op, root) {
                        Ok(()) => return "returned Ok".to_string(),
                        Err(e) => e,
                    };
                    if !is_desync(&first) {
                        return format!("wrong error: {first}");
                    }
                    match comm.barrier() {
                        Err(e) if is_desync(&e) => String::new(),
                        other => format!("next call: {other:?}"),
                    }
                });
                let took = t0.elapsed();
                for (r, o) in out.iter().enumerate() {
                    assert!(
                        o.is_empty(),
                        "{engine} {op} n={n} roots={roots:?}: rank {r}: {o}"
                    );
                }
                assert!(
                    took < Duration::from_secs(5),
                    "{engine} {op} n={n} roots={roots:?}: took {took:?} (a timeout, not a desync)"
                );
            }
        }
    }
}

/// Randomized: one rank at a random position picks a random other root; every rank fails.
#[test]
fn a_random_rank_with_a_random_root_fails_everyone() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |m: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % m as u64) as usize
    };
    for _ in 0..6 * soak() {
        let n = 2 + next(7);
        let (odd, root) = (next(n), next(n));
        let other = (root + 1 + next(n - 1)) % n;
        let op = ROOTED[next(6)];
        let (engine, world) = ENGINES[next(2)];
        let out = world(n, Duration::from_secs(20), &|comm| {
            let r = if comm.rank() == odd { other } else { root };
            match rooted(&comm, op, r) {
                Err(e) if is_desync(&e) => String::new(),
                other => format!("{other:?}"),
            }
        });
        for (r, o) in out.iter().enumerate() {
            assert!(
                o.is_empty(),
                "{engine} {op} n={n} root={root} rank {odd} root {other}: rank {r}: {o}"
            );
        }
    }
}

/// Agreeing ranks still get the right data from every root after the agreement step.
#[test]
fn rooted_operations_still_deliver_from_every_root() {
    for (engine, world) in ENGINES {
        for n in [1, 2, 3, 5] {
            let out = world(n, Duration::from_secs(20), &|comm| {
                let me = comm.rank();
                for root in 0..n {
                    let mut b = [me as u32 * 10 + 1; 3];
                    comm.broadcast(&mut b, root).unwrap();
                    if b != [root as u32 * 10 + 1; 3] {
                        return format!("broadcast from {root}: {b:?}");
                    }
                    let mut s = [me as f64; 2];
                    comm.reduce(&mut s, ReduceOp::Sum, root).unwrap();
                    let want = (n * (n - 1) / 2) as f64;
                    if me == root && s != [want; 2] {
                        return format!("reduce to {root}: {s:?}");
                    }
                }
                String::new()
            });
            for (r, o) in out.iter().enumerate() {
                assert!(o.is_empty(), "{engine} n={n}: rank {r}: {o}");
            }
        }
    }
}

/// Averages of 16-bit floats accumulate in f32: a sum beyond f16's range (65504) does not turn
/// a representable average into inf, on every reducing operation; bf16 keeps f32's precision
/// until the final rounding.
#[test]
fn half_precision_averages_do_not_overflow() {
    use half::{bf16, f16};
    let big = f16::from_f32(60000.0);
    for (engine, world) in ENGINES {
        for n in [2, 3, 4, 9] {
            let out = world(n, Duration::from_secs(20), &|comm| {
                let me = comm.rank();
                let mut v = vec![big; 33];
                comm.all_reduce(&mut v, ReduceOp::Avg).unwrap();
                let mut o = vec![f16::ZERO; 33];
                comm.all_reduce((&[big; 33], &mut o), ReduceOp::Avg)
                    .unwrap();
                let mut r = vec![big; 5];
                comm.reduce(&mut r, ReduceOp::Avg, n - 1).unwrap();
                let mut rs = vec![f16::ZERO; 3];
                comm.reduce_scatter(&vec![big; 3 * n], &mut rs, ReduceOp::Avg)
                    .unwrap();
                let root_ok = me != n - 1 || r.iter().all(|&x| x == big);
                if !(v.iter().chain(&o).chain(&rs).all(|&x| x == big) && root_ok) {
                    return format!("{v:?} {o:?} {r:?} {rs:?}");
                }
                // Integers summed in f32 are exact; the average is rounded once, at the end.
                let mine: Vec<f16> = (0..40)
                    .map(|i| f16::from_f32(((i * 7919 + me * 104_729) % 120_001) as f32 - 60000.0))
                    .collect();
                let mut got = mine.clone();
                comm.all_reduce(&mut got, ReduceOp::Avg).unwrap();
                let want: Vec<f16> = (0..40)
                    .map(|i| {
                        let s: f32 = (0..n)
                            .map(|r| {
                                f16::from_f32(((i * 7919 + r * 104_729) % 120_001) as f32 - 60000.0)
                                    .to_f32()
                            })
                            .sum();
                        f16::from_f32(s / n as f32)
                    })
                    .collect();
                if got != want {
                    return format!("random: {got:?} != {want:?}");
                }
                let third = bf16::from_f32(1.0 + me as f32 / 256.0);
                let mut b = vec![third; 4];
                comm.all_reduce(&mut b, ReduceOp::Avg).unwrap();
                let s: f32 = (0..n)
                    .map(|r| bf16::from_f32(1.0 + r as f32 / 256.0).to_f32())
                    .sum();
                if b[0] != bf16::from_f32(s / n as f32) {
                    return format!("bf16: {b:?}");
                }
                String::new()
            });
            for (r, o) in out.iter().enumerate() {
                assert!(o.is_empty(), "{engine} n={n}: rank {r}: {o}");
            }
        }
    }
}

/// Point-to-point traffic that MPI allows: several messages with one tag in flight between the
/// same pair (from several threads, or nonblocking), matched in order (non-overtaking), whole.
fn p2p_in_flight(comm: Communicator) -> String {
    // Three chunks per message, so that frames of two messages could interleave.
    let len = 3 * accord::transport::chunk_bytes() / 8 + 5;
    let per_thread = 3 * soak();
    let me = comm.rank();
    let n = comm.size();
    if n < 2 {
        return String::new();
    }
    // Rank 0 sends from two threads at once; rank 1 receives with requests posted up front.
    if me == 0 {
        std::thread::scope(|s| {
            for th in 0..2u64 {
                let comm = &comm;
                s.spawn(move || {
                    for i in 0..per_thread as u64 {
                        let msg: Vec<u64> =
                            (0..len as u64).map(|k| th << 48 | i << 32 | k).collect();
                        comm.send(&msg, 1, 5).unwrap();
                    }
                });
            }
        });
    } else if me == 1 {
        let mut bufs = vec![vec![0u64; len]; 2 * per_thread];
        let results: Vec<accord::Result<()>> = std::thread::scope(|s| {
            let reqs: Vec<_> = bufs.iter_mut().map(|b| comm.irecv(s, b, 0, 5)).collect();
            reqs.into_iter().map(|r| r.wait()).collect()
        });
        if let Some(e) = results.iter().find_map(|r| r.as_ref().err()) {
            return format!("receive failed: {e}");
        }
        let mut next = [0u64; 2];
        for b in &bufs {
            let (th, i) = (b[0] >> 48, (b[0] >> 32) & 0xffff);
            if (0..len).any(|k| b[k] != th << 48 | i << 32 | k as u64) {
                return format!("message from thread {th} #{i} arrived mixed with another");
            }
            if i != next[th as usize] {
                return format!("thread {th}: message #{i} overtook #{}", next[th as usize]);
            }
            next[th as usize] += 1;
        }
    }
    // Nonblocking sends of different sizes with one tag, received in the order posted.
    if me == 0 {
        let (a, b) = (vec![1.5f32; len], vec![2.5f32; 7]);
        std::thread::scope(|s| {
            let r1 = comm.isend(s, &a, 1, 9);
            let r2 = comm.isend(s, &b, 1, 9);
            r1.wait().and(r2.wait())
        })
        .unwrap();
    } else if me == 1 {
        let (mut a, mut b) = (vec![0f32; len], vec![0f32; 7]);
        // A receive of the wrong size is refused and takes nothing.
        let e = comm.recv(&mut [0f32; 3], 0, 9).unwrap_err();
        if !matches!(e, Error::InvalidArgument(_)) {
            return format!("size mismatch: {e:?}");
        }
        std::thread::scope(|s| {
            let r1 = comm.irecv(s, &mut a, 0, 9);
            let r2 = comm.irecv(s, &mut b, 0, 9);
            r1.wait().and(r2.wait())
        })
        .unwrap();
        if a.iter().any(|&x| x != 1.5) || b.iter().any(|&x| x != 2.5) {
            return "nonblocking messages matched out of order".into();
        }
    }
    // Receives do not take a collective's place: a collective after them still matches up.
    let mut v = [me as u32; 4];
    match comm.all_reduce(&mut v, ReduceOp::Sum) {
        Ok(_) if v == [(n * (n - 1) / 2) as u32; 4] => String::new(),
        other => format!("allreduce after point-to-point: {other:?} {v:?}"),
    }
}

#[test]
fn messages_with_one_tag_in_flight_arrive_whole_and_in_order() {
    for (engine, world) in ENGINES {
        for n in [2, 3] {
            let out = world(n, Duration::from_secs(30), &p2p_in_flight);
            for (r, o) in out.iter().enumerate() {
                assert!(o.is_empty(), "{engine} n={n}: rank {r}: {o}");
            }
        }
    }
}

/// A peer that sends more than the cap of data nobody receives (a bug, or a peer that knows
/// the token and floods) is reported lost with the reason, and what it sent is freed.
#[test]
fn a_peer_flooding_unmatched_messages_is_cut_off_and_named() {
    use accord::transport::inproc::InProcess;
    use accord::transport::Transport;
    use std::sync::Arc;
    let cap = 1 << 20;
    let ts = InProcess::world_with_cap(2, cap);
    let transports: Vec<Arc<dyn Transport>> = ts.iter().map(|t| t.clone() as _).collect();
    let out = accord::testing::run_world_on(transports, Duration::from_secs(10), |comm| {
        let chunk = vec![7u8; 300_000];
        if comm.rank() == 1 {
            // Within the cap: received normally.
            comm.send(&chunk, 0, 1).unwrap();
            comm.send(&chunk, 0, 1).unwrap();
            comm.barrier().unwrap();
            // Once rank 0 is past the barrier (its token is no longer waiting here), beyond
            // the cap: nobody posts tag 2.
            comm.recv(&mut [0u8], 0, 4).unwrap();
            for _ in 0..40 {
                if comm.send(&chunk, 0, 2).is_err() {
                    break;
                }
            }
            comm.send(&[1u8], 0, 3).ok();
            return String::new();
        }
        let mut b = vec![0u8; 300_000];
        comm.recv(&mut b, 1, 1).unwrap();
        comm.recv(&mut b, 1, 1).unwrap();
        comm.barrier().unwrap();
        comm.send(&[0u8], 1, 4).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        match comm.recv(&mut [0u8], 1, 3) {
            Err(Error::PeerLost { rank: 1, cause }) if cause.contains("ACCORD_MAX_UNMATCHED") => {
                String::new()
            }
            other => format!("{other:?}"),
        }
    });
    assert!(out[0].is_empty(), "{}", out[0]);
    assert_eq!(ts[0].mailbox().buffered(1), 0, "the flood was freed");
}

/// Point-to-point edge cases: a send to oneself larger than the cap of untaken bytes still
/// arrives (it cannot flood anyone); a turn taken on one communicator is refused by another; in
/// a sub-communicator a lost peer is named by its world rank, as the transports name it.
#[test]
fn point_to_point_edges_fail_clearly_or_work() {
    use accord::transport::inproc::InProcess;
    use accord::transport::Transport;
    use std::sync::Arc;
    let ts = InProcess::world_with_cap(3, 1024);
    let transports: Vec<Arc<dyn Transport>> = ts.iter().map(|t| t.clone() as _).collect();
    let killer = ts[0].clone();
    let out = accord::testing::run_world_on(transports, Duration::from_secs(10), |comm| {
        let me = comm.rank();
        let data: Vec<u32> = (0..4096).collect();
        comm.send(&data, me, 1).unwrap();
        let mut back = vec![0u32; 4096];
        if let Err(e) = comm.recv(&mut back, me, 1) {
            return format!("self-send beyond the cap: {e}");
        }
        if back != data {
            return "self-send arrived wrong".into();
        }
        // Reversed sub-communicator: its rank 2 is world rank 0.
        let sub = comm.subgroup(&[2, 1, 0]).unwrap().unwrap();
        let turn = comm.post_send((me + 1) % 3, 7).unwrap();
        match sub.send_posted(turn, SendBuf::bytes(&[0u8; 4], accord::DataType::U8)) {
            Err(Error::InvalidArgument(_)) => {}
            other => return format!("turn of another communicator: {other:?}"),
        }
        comm.barrier().unwrap();
        if me == 0 {
            killer.kill();
            return String::new();
        }
        if me == 1 {
            // Sub rank 2 (world rank 0) never sends.
            return match sub.recv(&mut [0u8; 4], 2, 9) {
                Err(Error::PeerLost { rank: 0, .. }) => String::new(),
                other => format!("lost peer in a sub-communicator: {other:?}"),
            };
        }
        String::new()
    });
    for (r, o) in out.iter().enumerate() {
        assert!(o.is_empty(), "rank {r}: {o}");
    }
}
