//! Shared-memory collectives across real processes: this test binary re-executes itself as the
//! ranks (`SHM_TEST_SCENARIO` selects what a rank does), with a store hosted by the parent.
//! Every wait is bounded: ranks run with `ACCORD_TIMEOUT`, the parent kills children that
//! outlive their deadline.

mod common;

use accord::Parts;
use accord::{Communicator, Error, ReduceOp};
use common::{all_ok, collect, run_ok, spawn};
use std::time::{Duration, Instant};

fn same_host(_: usize) -> String {
    "shm-test-host".into()
}

/// No memfd of ours is open in this process, and /dev/shm holds no accord segment.
fn assert_no_segments() {
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let Ok(t) = std::fs::read_link(e.path()) {
            assert!(
                !t.to_string_lossy().contains("accord"),
                "open segment {t:?}"
            );
        }
    }
    if let Ok(d) = std::fs::read_dir("/dev/shm") {
        for e in d.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(!name.contains("accord"), "left in /dev/shm: {name}");
        }
    }
}

#[test]
fn every_collective_over_shared_memory_matches_the_reference() {
    for n in [2, 3, 4] {
        // Small staging halves: every size above a few KiB is pipelined over many chunks.
        run_ok(
            "matrix",
            n,
            same_host,
            &[
                ("ACCORD_SHM_CHUNK_BYTES", "4096"),
                ("ACCORD_SHM_CMA_BYTES", "65536"),
            ],
            Duration::from_secs(120),
        );
    }
    run_ok("matrix", 3, same_host, &[], Duration::from_secs(120));
    // Staged copies only (no process_vm_readv).
    run_ok(
        "matrix",
        3,
        same_host,
        &[("ACCORD_SHM_CMA", "0")],
        Duration::from_secs(120),
    );
    // Non-temporal (streaming) copies from a few KiB, at unaligned offsets and odd lengths.
    run_ok(
        "matrix",
        3,
        same_host,
        &[("ACCORD_SHM_CMA", "0"), ("ACCORD_SHM_STREAM_BYTES", "4096")],
        Duration::from_secs(120),
    );
    assert_no_segments();
}

#[test]
fn point_to_point_and_schedule_collectives_use_shared_memory_rings() {
    // Small rings: every message above 16 KiB is chunked and waits for ring space.
    for n in [2, 3, 4] {
        run_ok(
            "p2p",
            n,
            same_host,
            &[("ACCORD_SHM_RING_BYTES", "65536")],
            Duration::from_secs(120),
        );
    }
    // Default ring size, and more ranks than this machine may have cores.
    run_ok("p2p", 5, same_host, &[], Duration::from_secs(120));
    // Rings inside each simulated host, TCP between them.
    let host = |r: usize| ["a", "b", "a", "b"][r].to_string();
    run_ok(
        "p2p",
        4,
        host,
        &[("ACCORD_SHM_RING_BYTES", "65536")],
        Duration::from_secs(120),
    );
    assert_no_segments();
}

/// Messages with one tag sent from two threads at once through small rings (many frames
/// each) arrive whole and in each thread's order; nonblocking receives match in posting order.
#[test]
fn messages_with_one_tag_in_flight_arrive_whole_over_rings() {
    run_ok(
        "p2p-order",
        2,
        same_host,
        &[("ACCORD_SHM_RING_BYTES", "65536")],
        Duration::from_secs(60),
    );
}

#[test]
fn a_rank_killed_during_point_to_point_is_named_and_last_messages_arrive() {
    let t0 = Instant::now();
    let (_s, ch) = spawn(
        "p2p-kill",
        3,
        same_host,
        &[("ACCORD_SHM_RING_BYTES", "65536")],
    );
    let res = collect(ch, Duration::from_secs(60));
    assert_eq!(res[2].0, None, "rank 2 should die by SIGKILL: {:?}", res[2]);
    for (code, out) in &res[..2] {
        assert_eq!(*code, Some(0), "{out}");
        assert!(out.contains("NAMED-2"), "{out}");
    }
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t0.elapsed()
    );
    // A rank that sends and exits normally: its messages are still received.
    run_ok("p2p-exit", 2, same_host, &[], Duration::from_secs(60));
    assert_no_segments();
}

#[test]
fn point_to_point_timeouts_and_mismatches_end_waits() {
    run_ok(
        "p2p-timeout",
        2,
        same_host,
        &[("ACCORD_TIMEOUT", "2")],
        Duration::from_secs(60),
    );
}

#[test]
fn two_simulated_hosts_use_shared_memory_inside_and_tcp_between() {
    // Ranks 0 and 2 on host a, 1 and 3 on host b, 4 alone on host c.
    let host = |r: usize| ["a", "b", "a", "b", "c"][r].to_string();
    run_ok(
        "mixed",
        5,
        host,
        &[("ACCORD_SHM_CHUNK_BYTES", "8192")],
        Duration::from_secs(120),
    );
    assert_no_segments();
}

#[test]
fn forced_tcp_gives_the_same_results_without_shared_memory() {
    run_ok(
        "tcp",
        3,
        same_host,
        &[("ACCORD_TRANSPORT", "tcp")],
        Duration::from_secs(120),
    );
}

#[test]
fn a_killed_rank_is_named_promptly_and_leaves_no_segment() {
    let t0 = Instant::now();
    let (_s, ch) = spawn("kill", 3, same_host, &[]);
    let res = collect(ch, Duration::from_secs(60));
    let took = t0.elapsed();
    assert_eq!(res[2].0, None, "rank 2 should die by SIGKILL: {:?}", res[2]);
    for (code, out) in &res[..2] {
        assert_eq!(*code, Some(0), "{out}");
        assert!(out.contains("NAMED-2"), "{out}");
    }
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert_no_segments();
}

/// A rank killed while its peers exchange messages and run collectives: every survivor names
/// the killed rank, never a survivor that failed first and exited (whose death a peer may see
/// before its abort notice). `ACCORD_SOAK=n` runs n times as many jobs.
#[test]
fn every_survivor_blames_the_killed_rank_not_the_messenger() {
    let soak = accord::testing::soak();
    for round in 0..3 * soak {
        let at = (7 + 13 * round % 40).to_string();
        let tcp = if round % 3 == 2 { "tcp" } else { "" };
        let extra = [("KILL_AT", at.as_str()), ("ACCORD_TRANSPORT", tcp)];
        let (_s, ch) = spawn("kill-blame", 5, same_host, &extra);
        let res = collect(ch, Duration::from_secs(60));
        assert_eq!(res[4].0, None, "rank 4 should die by SIGKILL: {:?}", res[4]);
        for (r, (code, out)) in res[..4].iter().enumerate() {
            assert_eq!(*code, Some(0), "round {round} rank {r}:\n{out}");
        }
    }
}

/// Over TCP, a rank cut off for sending more than ACCORD_MAX_UNMATCHED_BYTES that nobody has
/// received hears why at once (the abort notice still reaches it), instead of timing out.
#[test]
fn a_rank_cut_off_for_flooding_is_told_why() {
    let extra = [
        ("ACCORD_TRANSPORT", "tcp"),
        ("ACCORD_MAX_UNMATCHED_BYTES", "1048576"),
        ("ACCORD_TIMEOUT", "20"),
    ];
    run_ok("flood", 2, same_host, &extra, Duration::from_secs(60));
}

#[test]
fn desync_and_abort_end_shared_memory_waits() {
    run_ok("desync", 3, same_host, &[], Duration::from_secs(60));
    run_ok("abort", 3, same_host, &[], Duration::from_secs(60));
}

/// Ranks that disagree on the root of a rooted collective all fail with a desync at once, on
/// one host (every shared-memory broadcast and reduce variant) and across two simulated hosts
/// (where the hosts' leaders agree on the root's host but not on the root, or where only the
/// ranks of one host disagree).
#[test]
fn ranks_that_disagree_on_the_root_all_fail_over_shared_memory() {
    let ops = [
        "broadcast",
        "broadcast_large",
        "reduce",
        "reduce_large",
        "gather",
        "scatter",
    ];
    let one_host: [(usize, &str); 3] = [(2, "0,1"), (3, "0,0,1"), (3, "2,1,2")];
    for op in ops {
        for (n, roots) in one_host {
            let extra = [
                ("ROOTS", roots),
                ("ROOT_OP", op),
                ("ACCORD_SHM_CHUNK_BYTES", "8192"),
            ];
            let (_s, ch) = spawn("root-mismatch", n, same_host, &extra);
            let t0 = Instant::now();
            all_ok(&collect(ch, Duration::from_secs(60)));
            assert!(t0.elapsed() < Duration::from_secs(20), "{op} {roots}");
        }
    }
    // Ranks 0 and 2 on host a, 1 and 3 on host b: host b believes the root is rank 2; or the
    // leaders and host b agree on root 1 while rank 2 believes it is the root (host b's ranks
    // must fail too, not return).
    let host = |r: usize| ["a", "b", "a", "b"][r].to_string();
    for roots in ["0,2,0,2", "1,1,2,1"] {
        for op in ["broadcast", "broadcast_large", "reduce"] {
            let extra = [("ROOTS", roots), ("ROOT_OP", op)];
            run_ok("root-mismatch", 4, host, &extra, Duration::from_secs(60));
        }
    }
}

/// The child side: does nothing unless started by one of the tests above.
#[test]
fn rank_main() {
    let Ok(scenario) = std::env::var("SHM_TEST_SCENARIO") else {
        return;
    };
    let comm = accord::init().expect("init");
    match scenario.as_str() {
        "matrix" => {
            assert!(comm.uses_shm(), "expected the shared-memory path");
            assert_segment_mapped_but_closed();
            matrix(&comm);
        }
        "tcp" => {
            assert!(!comm.uses_shm());
            matrix(&comm);
        }
        "mixed" => {
            assert!(comm.uses_shm());
            // Rank 4 is alone on its host.
            let want = if comm.rank() == 4 { "tcp" } else { "tcp+shm" };
            assert_eq!(comm.transport_name(), want);
            matrix(&comm);
        }
        "p2p" => {
            let local = std::env::var("ACCORD_HOST_ID").unwrap() == "shm-test-host";
            let want = if local { "shm" } else { "tcp+shm" };
            assert_eq!(comm.transport_name(), want);
            assert!(comm.uses_shm());
            p2p_matrix(&comm);
        }
        "kill-blame" => {
            let (me, n) = (comm.rank(), comm.size());
            let at: usize = std::env::var("KILL_AT").unwrap().parse().unwrap();
            let mut v = vec![1u32; 1000];
            let mut m = vec![0u32; 5000];
            for i in 0.. {
                if me == 4 && i == at {
                    unsafe { libc::raise(libc::SIGKILL) };
                }
                let r = comm.all_reduce(&mut v, ReduceOp::Max).and_then(|_| {
                    comm.sendrecv(&m.clone(), (me + 1) % n, &mut m, (me + n - 1) % n, 4)
                });
                if let Err(e) = r {
                    println!("error: {e}");
                    let blamed_other = matches!(e, Error::PeerLost { rank, .. } if rank != 4);
                    assert!(!blamed_other && e.to_string().contains("rank 4"), "{e:?}");
                    // Exit at once, as a failing program does: peers must still blame rank 4.
                    println!("RANK-OK");
                    std::process::exit(0);
                }
            }
        }
        "flood" => {
            let t = Instant::now();
            let e = if comm.rank() == 1 {
                comm.send(&vec![1u8; 2 << 20], 0, 0).unwrap();
                comm.recv(&mut [0u8], 0, 1).unwrap_err()
            } else {
                std::thread::sleep(Duration::from_millis(300));
                comm.recv(&mut vec![0u8; 2 << 20], 1, 0).unwrap_err()
            };
            println!("error: {e}");
            assert!(
                e.to_string().contains("ACCORD_MAX_UNMATCHED_BYTES"),
                "{e:?}"
            );
            assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        }
        "p2p-order" => {
            let me = comm.rank();
            let len = 100_003usize;
            if me == 0 {
                std::thread::scope(|s| {
                    for th in 0..2u64 {
                        let comm = &comm;
                        s.spawn(move || {
                            for i in 0..4u64 {
                                let m: Vec<u64> =
                                    (0..len as u64).map(|k| th << 48 | i << 32 | k).collect();
                                comm.send(&m, 1, 5).unwrap();
                            }
                        });
                    }
                });
            } else {
                let mut bufs = vec![vec![0u64; len]; 8];
                std::thread::scope(|s| {
                    let reqs: Vec<_> = bufs.iter_mut().map(|b| comm.irecv(s, b, 0, 5)).collect();
                    reqs.into_iter().for_each(|r| r.wait().unwrap());
                });
                let mut next = [0u64; 2];
                for b in &bufs {
                    let (th, i) = (b[0] >> 48, (b[0] >> 32) & 0xffff);
                    assert!(
                        (0..len).all(|k| b[k] == th << 48 | i << 32 | k as u64),
                        "message {th}/{i} mixed with another"
                    );
                    assert_eq!(i, next[th as usize], "thread {th}: overtaken");
                    next[th as usize] += 1;
                }
            }
            comm.barrier().unwrap();
        }
        "p2p-kill" => {
            // Rank 2 streams to rank 0 and dies; rank 1 waits for it on a receive.
            let big = vec![7u8; 1 << 20];
            let me = comm.rank();
            if me == 2 {
                for _ in 0..3 {
                    comm.send(&big, 0, 1).unwrap();
                }
                unsafe { libc::raise(libc::SIGKILL) };
            }
            let mut buf = vec![0u8; 1 << 20];
            let peer_err = |e: Error| {
                let s = e.to_string();
                println!("error: {s}");
                if matches!(e, Error::PeerLost { rank: 2, .. }) || s.contains("rank 2") {
                    println!("NAMED-2");
                }
            };
            let t = Instant::now();
            // Rank 1 waits on rank 2 only once rank 0 holds rank 2's messages: otherwise rank
            // 1 may see the death first and abort the world while rank 0 still drains them.
            let mut token = [0u8];
            if me == 0 {
                for _ in 0..3 {
                    comm.recv(&mut buf, 2, 1).unwrap();
                    assert!(buf.iter().all(|&b| b == 7));
                }
                comm.send(&token, 1, 3).unwrap();
            } else if let Err(e) = comm.recv(&mut token, 0, 3) {
                peer_err(e);
            }
            match comm.recv(&mut buf, 2, 1) {
                Ok(_) => panic!("received from a dead rank"),
                Err(e) => peer_err(e),
            }
            assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        }
        "p2p-exit" => {
            let me = comm.rank();
            if me == 1 {
                let data: Vec<u64> = (0..300_000).collect();
                comm.send(&data, 0, 9).unwrap();
                comm.send(&[42u32], 0, 10).unwrap();
            } else {
                std::thread::sleep(Duration::from_millis(500));
                let mut got = vec![0u64; 300_000];
                comm.recv(&mut got, 1, 9).unwrap();
                assert!(got.iter().enumerate().all(|(i, &x)| x == i as u64));
                let mut x = [0u32];
                comm.recv(&mut x, 1, 10).unwrap();
                assert_eq!(x[0], 42);
            }
        }
        "p2p-timeout" => {
            let me = comm.rank();
            let mut x = [0u32; 4];
            // A size mismatch is an argument error and leaves the communicator usable.
            if me == 1 {
                comm.send(&[1u32; 3], 0, 5).unwrap();
                comm.recv(&mut x, 0, 6).unwrap();
            } else {
                let e = comm.recv(&mut x, 1, 5).unwrap_err();
                println!("error: {e}");
                assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
                comm.send(&[0u32; 4], 1, 6).unwrap();
            }
            // Nobody sends with this tag: the receive times out (or hears the peer's timeout).
            let t = Instant::now();
            let e = comm.recv(&mut x, 1 - me, 77).unwrap_err();
            println!("error: {e}");
            assert!(
                matches!(e, Error::Timeout { .. } | Error::Aborted { .. }),
                "{e:?}"
            );
            assert!(t.elapsed() < Duration::from_secs(10));
        }
        "kill" => {
            let mut v = vec![1.0f32; 100_000];
            for i in 0.. {
                if comm.rank() == 2 && i == 50 {
                    unsafe { libc::raise(libc::SIGKILL) };
                }
                match comm.all_reduce(&mut v, ReduceOp::Max) {
                    Ok(_) => {}
                    Err(e) => {
                        let s = e.to_string();
                        println!("error: {s}");
                        let named =
                            matches!(e, Error::PeerLost { rank: 2, .. }) || s.contains("rank 2");
                        if named {
                            println!("NAMED-2");
                        }
                        break;
                    }
                }
            }
        }
        "root-mismatch" => {
            let roots: Vec<usize> = std::env::var("ROOTS")
                .unwrap()
                .split(',')
                .map(|r| r.parse().unwrap())
                .collect();
            let (me, n) = (comm.rank(), comm.size());
            let root = roots[me];
            let t = Instant::now();
            let r = match std::env::var("ROOT_OP").unwrap().as_str() {
                "broadcast" => comm.broadcast(&mut [me as f32; 16], root),
                "broadcast_large" => comm.broadcast(&mut vec![me as u8; 100_000], root),
                "reduce" => comm.reduce(&mut [1.0f64; 9], ReduceOp::Sum, root),
                "reduce_large" => comm.reduce(&mut vec![1i32; 50_000], ReduceOp::Max, root),
                "gather" => comm.gather(&[1u64; 3], &mut vec![0u64; 3 * n], root),
                "scatter" => comm.scatter(&vec![1u32; 2 * n], &mut [0u32; 2], root),
                op => panic!("unknown op {op}"),
            };
            let e = r.expect_err("ranks disagree on the root: the call must fail");
            println!("error: {e}");
            let desync = |e: &Error| match e {
                Error::Desync { .. } => true,
                Error::Aborted { reason } => reason.contains("desync"),
                _ => false,
            };
            assert!(desync(&e), "{e:?}");
            assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
            let again = comm.barrier().expect_err("the communicator stays failed");
            assert!(desync(&again), "{again:?}");
        }
        "desync" => {
            let mut v = vec![1.0f32; if comm.rank() == 1 { 5 } else { 4 }];
            let e = comm.all_reduce(&mut v, ReduceOp::Sum).unwrap_err();
            println!("error: {e}");
            assert!(
                matches!(e, Error::Desync { .. } | Error::Aborted { .. }),
                "{e:?}"
            );
        }
        "abort" => {
            if comm.rank() == 0 {
                std::thread::sleep(Duration::from_millis(300));
                comm.abort("test abort");
            } else {
                let t = Instant::now();
                let mut v = vec![1.0f32; 16];
                let e = comm.all_reduce(&mut v, ReduceOp::Sum).unwrap_err();
                println!("error: {e}");
                assert!(matches!(e, Error::Aborted { .. }), "{e:?}");
                assert!(t.elapsed() < Duration::from_secs(10));
            }
        }
        s => panic!("unknown scenario {s}"),
    }
    println!("RANK-OK");
}

fn assert_segment_mapped_but_closed() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(maps.contains("memfd:accord-shm"), "no segment mapped");
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let Ok(t) = std::fs::read_link(e.path()) {
            assert!(
                !t.to_string_lossy().contains("accord-shm"),
                "descriptor left open"
            );
        }
    }
}

/// Value rank `r` contributes at `i`: small integers, exact in every type.
fn v(r: usize, i: usize) -> f64 {
    ((r * 7 + i * 3) % 11) as f64 + 1.0
}

fn matrix(comm: &Communicator) {
    let n = comm.size();
    let me = comm.rank();
    for &count in &[0usize, 1, 3, 17, 1000, 5000, 70_000, 300_001] {
        // allreduce: sum, max, avg (f64), sum (i32), in place and not.
        let mine: Vec<f64> = (0..count).map(|i| v(me, i)).collect();
        let sum = |i: usize| (0..n).map(|r| v(r, i)).sum::<f64>();
        let max = |i: usize| (0..n).map(|r| v(r, i)).fold(0.0, f64::max);
        let mut out = vec![0.0f64; count];
        comm.all_reduce((&mine, &mut out), ReduceOp::Sum).unwrap();
        assert!(
            out.iter().enumerate().all(|(i, &x)| x == sum(i)),
            "allreduce sum {count}"
        );
        let mut b = mine.clone();
        comm.all_reduce(&mut b, ReduceOp::Max).unwrap();
        assert!(
            b.iter().enumerate().all(|(i, &x)| x == max(i)),
            "allreduce max {count}"
        );
        let mut b = mine.clone();
        comm.all_reduce(&mut b, ReduceOp::Avg).unwrap();
        assert!(
            b.iter()
                .enumerate()
                .all(|(i, &x)| (x - sum(i) / n as f64).abs() < 1e-9),
            "allreduce avg {count}"
        );
        // f16 averages accumulate in f32: 60000 on every rank stays 60000, not inf.
        let big = half::f16::from_f32(60000.0);
        let mut h = vec![big; count];
        comm.all_reduce(&mut h, ReduceOp::Avg).unwrap();
        assert!(h.iter().all(|&x| x == big), "allreduce f16 avg {count}");
        let mut h = vec![big; count];
        comm.reduce(&mut h, ReduceOp::Avg, n - 1).unwrap();
        assert!(
            me != n - 1 || h.iter().all(|&x| x == big),
            "reduce f16 avg {count}"
        );
        let mut bi: Vec<i32> = mine.iter().map(|&x| x as i32).collect();
        comm.all_reduce(&mut bi, ReduceOp::Sum).unwrap();
        assert!(
            bi.iter().enumerate().all(|(i, &x)| x == sum(i) as i32),
            "i32 {count}"
        );

        // reduce to every root.
        for root in 0..n {
            let mut r = vec![0.0f64; count];
            comm.reduce((&mine, &mut r), ReduceOp::Sum, root).unwrap();
            if me == root {
                assert!(
                    r.iter().enumerate().all(|(i, &x)| x == sum(i)),
                    "reduce {count}"
                );
            }
        }
        // broadcast from every root.
        for root in 0..n {
            let mut b: Vec<f32> = if me == root {
                (0..count).map(|i| v(root, i) as f32).collect()
            } else {
                vec![-1.0; count]
            };
            comm.broadcast(&mut b, root).unwrap();
            assert!(
                b.iter().enumerate().all(|(i, &x)| x == v(root, i) as f32),
                "bcast"
            );
        }
        // allgather.
        let send: Vec<u32> = (0..count).map(|i| v(me, i) as u32).collect();
        let mut all = vec![0u32; count * n];
        comm.all_gather(&send, &mut all).unwrap();
        for r in 0..n {
            for i in 0..count {
                assert_eq!(all[r * count + i], v(r, i) as u32, "allgather");
            }
        }
        // reduce_scatter.
        let send: Vec<f32> = (0..count * n).map(|i| v(me, i) as f32).collect();
        let mut recv = vec![0.0f32; count];
        comm.reduce_scatter(&send, &mut recv, ReduceOp::Sum)
            .unwrap();
        for (i, &got) in recv.iter().enumerate() {
            let want: f64 = (0..n).map(|r| v(r, me * count + i)).sum();
            assert_eq!(got, want as f32, "reduce_scatter");
        }
        // alltoall: rank r sends block j = 1000 r + j + i.
        let send: Vec<i64> = (0..count * n)
            .map(|k| (1000 * me + (k / count.max(1)) * 100 + k % count.max(1)) as i64)
            .collect();
        let mut recv = vec![0i64; count * n];
        comm.all_to_all(&send, &mut recv).unwrap();
        for j in 0..n {
            for i in 0..count {
                assert_eq!(
                    recv[j * count + i],
                    (1000 * j + me * 100 + i) as i64,
                    "alltoall"
                );
            }
        }
        comm.barrier().unwrap();
    }
    // Schedule-path operations still work alongside.
    let mut g = vec![0u32; if me == 0 { n } else { 0 }];
    comm.gather(&[me as u32], &mut g, 0).unwrap();
    if me == 0 {
        assert_eq!(g, (0..n as u32).collect::<Vec<_>>());
    }
    let mut r = [0u32];
    comm.sendrecv(&[me as u32], (me + 1) % n, &mut r, (me + n - 1) % n, 3)
        .unwrap();
    assert_eq!(r[0] as usize, (me + n - 1) % n);
    if let Some(sub) = comm.split(Some((me % 2) as u32), 0).unwrap() {
        let mut x = [1u64];
        sub.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x[0] as usize, sub.size());
    }
}

/// Everything that runs message schedules, over the rings.
fn p2p_matrix(comm: &Communicator) {
    let n = comm.size();
    let me = comm.rank();
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    // send/recv and sendrecv, from empty to many times the ring.
    for &count in &[0usize, 1, 5, 2047, 2048, 9000, 70_000, 1 << 20] {
        let send: Vec<u32> = (0..count).map(|i| (me * 1_000_003 + i) as u32).collect();
        let mut recv = vec![0u32; count];
        comm.sendrecv(&send, next, &mut recv, prev, 4).unwrap();
        assert!(
            recv.iter()
                .enumerate()
                .all(|(i, &x)| x == (prev * 1_000_003 + i) as u32),
            "sendrecv {count}"
        );
    }
    // Several messages with different tags, received in the opposite order.
    for t in 0..5u32 {
        comm.send(&vec![t as u64; 10_000 * (t as usize + 1)], next, 100 + t)
            .unwrap();
    }
    for t in (0..5u32).rev() {
        let mut b = vec![0u64; 10_000 * (t as usize + 1)];
        comm.recv(&mut b, prev, 100 + t).unwrap();
        assert!(b.iter().all(|&x| x == t as u64), "tag {t}");
    }
    // gather/scatter and their v variants, every root.
    let counts: Vec<usize> = (0..n).map(|r| 1000 * r + 3).collect();
    let total: usize = counts.iter().sum();
    let displ = |r: usize| counts[..r].iter().sum::<usize>();
    for root in 0..n {
        let mine: Vec<f64> = (0..40_000).map(|i| v(me, i)).collect();
        let mut all = vec![0.0f64; if me == root { 40_000 * n } else { 0 }];
        comm.gather(&mine, &mut all, root).unwrap();
        if me == root {
            for r in 0..n {
                assert!(
                    (0..40_000).all(|i| all[r * 40_000 + i] == v(r, i)),
                    "gather"
                );
            }
        }
        let src: Vec<f64> = (0..40_000 * n).map(|i| v(root, i)).collect();
        let mut part = vec![0.0f64; 40_000];
        comm.scatter(&src, &mut part, root).unwrap();
        assert!(
            (0..40_000).all(|i| part[i] == v(root, me * 40_000 + i)),
            "scatter"
        );

        let mine: Vec<i32> = (0..counts[me]).map(|i| (me * 7 + i) as i32).collect();
        let mut all = vec![0i32; if me == root { total } else { 0 }];
        comm.gather(&mine, Parts::new(&mut all, &counts), root)
            .unwrap();
        if me == root {
            for r in 0..n {
                assert!(
                    (0..counts[r]).all(|i| all[displ(r) + i] == (r * 7 + i) as i32),
                    "gatherv"
                );
            }
        }
        let src: Vec<i32> = (0..total).map(|i| (root + 3 * i) as i32).collect();
        let mut part = vec![0i32; counts[me]];
        comm.scatter(Parts::new(&src, &counts), &mut part, root)
            .unwrap();
        assert!(
            (0..counts[me]).all(|i| part[i] == (root + 3 * (displ(me) + i)) as i32),
            "scatterv"
        );
    }
    let mut all = vec![0i32; total];
    let mine: Vec<i32> = (0..counts[me]).map(|i| (me * 7 + i) as i32).collect();
    comm.all_gather(&mine, Parts::new(&mut all, &counts))
        .unwrap();
    for r in 0..n {
        assert!(
            (0..counts[r]).all(|i| all[displ(r) + i] == (r * 7 + i) as i32),
            "allgatherv"
        );
    }
    // alltoallv: rank r sends (r + 1) * (j + 1) * 500 elements to rank j.
    let sc: Vec<usize> = (0..n).map(|j| (me + 1) * (j + 1) * 500).collect();
    let rc: Vec<usize> = (0..n).map(|r| (r + 1) * (me + 1) * 500).collect();
    let send: Vec<u64> = (0..n)
        .flat_map(|j| (0..sc[j]).map(move |i| (me * 1_000_000 + j * 10_000 + i) as u64))
        .collect();
    let mut recv = vec![0u64; rc.iter().sum()];
    comm.all_to_all(Parts::new(&send, &sc), Parts::new(&mut recv, &rc))
        .unwrap();
    let mut k = 0;
    for (r, &c) in rc.iter().enumerate() {
        for i in 0..c {
            assert_eq!(
                recv[k],
                (r * 1_000_000 + me * 10_000 + i) as u64,
                "alltoallv"
            );
            k += 1;
        }
    }
    // Sub-communicators run schedules over the same transport.
    if let Some(sub) = comm.split(Some((me % 2) as u32), -(me as i64)).unwrap() {
        let mut x = vec![me as u64 + 1; 100_000];
        sub.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        let want: usize = (0..n).filter(|r| r % 2 == me % 2).map(|r| r + 1).sum();
        assert!(x.iter().all(|&y| y as usize == want), "split allreduce");
        let mut b = vec![0u8; 300_000];
        if sub.rank() == 0 {
            b.fill(5);
        }
        sub.broadcast(&mut b, 0).unwrap();
        assert!(b.iter().all(|&y| y == 5), "split broadcast");
    }
    // Nonblocking requests: a receive posted before the matching send.
    let mut got = vec![0u32; 50_000];
    std::thread::scope(|s| {
        let r = comm.irecv(s, &mut got, prev, 8);
        comm.send(&vec![me as u32; 50_000], next, 8).unwrap();
        r.wait().unwrap();
    });
    assert!(got.iter().all(|&x| x as usize == prev), "irecv");
    comm.barrier().unwrap();
}
