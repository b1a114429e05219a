//! Shared-memory collectives across real processes: this test binary re-executes itself as the
//! ranks (`SHM_TEST_SCENARIO` selects what a rank does), with a store hosted by the parent.
//! Every wait is bounded: ranks run with `ACCORD_TIMEOUT`, the parent kills children that
//! outlive their deadline.

use accord::auth::Token;
use accord::rendezvous::StoreServer;
use accord::{Communicator, Error, ReduceOp};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "shm-test-token";

/// Start `n` ranks of `scenario`; `host(r)` gives each rank's simulated host id.
fn spawn(
    scenario: &str,
    n: usize,
    host: impl Fn(usize) -> String,
    extra: &[(&str, &str)],
) -> (StoreServer, Vec<Child>) {
    let server = StoreServer::bind("127.0.0.1:0", Token::new(TOKEN)).unwrap();
    let exe = std::env::current_exe().unwrap();
    let children = (0..n)
        .map(|r| {
            let mut c = Command::new(&exe);
            c.args(["rank_main", "--exact", "--nocapture", "--test-threads=1"])
                .env("SHM_TEST_SCENARIO", scenario)
                .env("ACCORD_RANK", r.to_string())
                .env("ACCORD_WORLD_SIZE", n.to_string())
                .env("ACCORD_STORE", server.addr().to_string())
                .env("ACCORD_STORE_EXTERNAL", "1")
                .env("ACCORD_TOKEN", TOKEN)
                .env("ACCORD_TIMEOUT", "30")
                .env("ACCORD_HOST_ID", host(r))
                .env_remove("ACCORD_TRANSPORT")
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            for (k, v) in extra {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    (server, children)
}

/// Wait for every child (killing those still running after `limit`); their outputs.
fn collect(children: Vec<Child>, limit: Duration) -> Vec<(Option<i32>, String)> {
    let end = Instant::now() + limit;
    let mut out = Vec::new();
    for mut c in children {
        loop {
            if c.try_wait().unwrap().is_some() || Instant::now() > end {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let o = c.wait_with_output().unwrap();
        out.push((
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        ));
    }
    out
}

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

fn all_ok(res: &[(Option<i32>, String)]) {
    for (r, (code, out)) in res.iter().enumerate() {
        assert_eq!(*code, Some(0), "rank {r} failed:\n{out}");
        assert!(out.contains("RANK-OK"), "rank {r} did not finish:\n{out}");
    }
}

#[test]
fn every_collective_over_shared_memory_matches_the_reference() {
    for n in [2, 3, 4] {
        // Small staging halves: every size above a few KiB is pipelined over many chunks.
        let (_s, ch) = spawn(
            "matrix",
            n,
            same_host,
            &[
                ("ACCORD_SHM_CHUNK_BYTES", "4096"),
                ("ACCORD_SHM_CMA_BYTES", "65536"),
            ],
        );
        all_ok(&collect(ch, Duration::from_secs(120)));
    }
    let (_s, ch) = spawn("matrix", 3, same_host, &[]);
    all_ok(&collect(ch, Duration::from_secs(120)));
    // Staged copies only (no process_vm_readv).
    let (_s, ch) = spawn("matrix", 3, same_host, &[("ACCORD_SHM_CMA", "0")]);
    all_ok(&collect(ch, Duration::from_secs(120)));
    assert_no_segments();
}

#[test]
fn two_simulated_hosts_use_shared_memory_inside_and_tcp_between() {
    // Ranks 0 and 2 on host a, 1 and 3 on host b, 4 alone on host c.
    let host = |r: usize| ["a", "b", "a", "b", "c"][r].to_string();
    let (_s, ch) = spawn("mixed", 5, host, &[("ACCORD_SHM_CHUNK_BYTES", "8192")]);
    all_ok(&collect(ch, Duration::from_secs(120)));
    assert_no_segments();
}

#[test]
fn forced_tcp_gives_the_same_results_without_shared_memory() {
    let (_s, ch) = spawn("tcp", 3, same_host, &[("ACCORD_TRANSPORT", "tcp")]);
    all_ok(&collect(ch, Duration::from_secs(120)));
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

#[test]
fn desync_and_abort_end_shared_memory_waits() {
    let (_s, ch) = spawn("desync", 3, same_host, &[]);
    all_ok(&collect(ch, Duration::from_secs(60)));
    let (_s, ch) = spawn("abort", 3, same_host, &[]);
    all_ok(&collect(ch, Duration::from_secs(60)));
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
            matrix(&comm);
        }
        "kill" => {
            let mut v = vec![1.0f32; 100_000];
            for i in 0.. {
                if comm.rank() == 2 && i == 50 {
                    unsafe { libc::raise(libc::SIGKILL) };
                }
                match comm.all_reduce(&mut v, ReduceOp::Max) {
                    Ok(()) => {}
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
    for &count in &[0usize, 1, 3, 17, 1000, 5000, 70_000] {
        // allreduce: sum, max, avg (f64), sum (i32), in place and not.
        let mine: Vec<f64> = (0..count).map(|i| v(me, i)).collect();
        let sum = |i: usize| (0..n).map(|r| v(r, i)).sum::<f64>();
        let max = |i: usize| (0..n).map(|r| v(r, i)).fold(0.0, f64::max);
        let mut out = vec![0.0f64; count];
        comm.all_reduce_into(&mine, &mut out, ReduceOp::Sum)
            .unwrap();
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
        let mut bi: Vec<i32> = mine.iter().map(|&x| x as i32).collect();
        comm.all_reduce(&mut bi, ReduceOp::Sum).unwrap();
        assert!(
            bi.iter().enumerate().all(|(i, &x)| x == sum(i) as i32),
            "i32 {count}"
        );

        // reduce to every root.
        for root in 0..n {
            let mut r = vec![0.0f64; count];
            comm.reduce_into(&mine, &mut r, ReduceOp::Sum, root)
                .unwrap();
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
