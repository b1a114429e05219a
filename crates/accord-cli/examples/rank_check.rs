//! A rank program for multi-process tests and for checking an installation:
//! `accord run -n 4 target/release/examples/rank_check ops` runs every operation once with
//! random data and checks each result against a sequential reference.
//!
//! Other modes drive the failure tests: `loop` (rank `ACCORD_CHECK_KILL` kills itself with
//! SIGKILL mid-run), `skip` (rank `ACCORD_CHECK_SKIP` never enters the call), `desync` (rank 1
//! calls broadcast while the others call allreduce).

use accord::{Communicator, Parts, ReduceOp};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn value(rank: usize, i: usize) -> i64 {
    ((rank as i64 + 3) * 7919 + i as i64 * 104_729) % 1000 - 500
}

fn check(what: &str, ok: bool) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("{what}: wrong result"))
    }
}

/// Every operation once, checked.
fn ops(comm: &Communicator) -> Result<usize, Box<dyn std::error::Error>> {
    let n = comm.size();
    let me = comm.rank();
    let mut done = 0;
    for count in [0usize, 1, 13, 100_003] {
        let mine: Vec<i64> = (0..count).map(|i| value(me, i)).collect();
        let sum: Vec<i64> = (0..count)
            .map(|i| (0..n).map(|r| value(r, i)).sum())
            .collect();

        let mut v = mine.clone();
        comm.all_reduce(&mut v, ReduceOp::Sum)?;
        check("allreduce", v == sum)?;

        let f: Vec<f64> = mine.iter().map(|&x| x as f64).collect();
        let mut out = vec![0f64; count];
        comm.all_reduce((&f, &mut out), ReduceOp::Max)?;
        let max: Vec<f64> = (0..count)
            .map(|i| (0..n).map(|r| value(r, i)).max().unwrap() as f64)
            .collect();
        check("allreduce max", out == max)?;

        let root = n - 1;
        let mut out = vec![0i64; if me == root { count } else { 0 }];
        comm.reduce((&mine, &mut out), ReduceOp::Sum, root)?;
        check("reduce", me != root || out == sum)?;

        let mut b = if me == root {
            mine.clone()
        } else {
            vec![0; count]
        };
        comm.broadcast(&mut b, root)?;
        check(
            "broadcast",
            b == (0..count).map(|i| value(root, i)).collect::<Vec<_>>(),
        )?;

        let mut all = vec![0i64; count * n];
        comm.all_gather(&mine, &mut all)?;
        let want: Vec<i64> = (0..n)
            .flat_map(|r| (0..count).map(move |i| value(r, i)))
            .collect();
        check("allgather", all == want)?;

        let mut g = vec![0i64; if me == 0 { count * n } else { 0 }];
        comm.gather(&mine, &mut g, 0)?;
        check("gather", me != 0 || g == want)?;

        let mut s = vec![0i64; count];
        comm.scatter(if me == 0 { &want[..] } else { &[] }, &mut s, 0)?;
        check("scatter", s == mine)?;

        let big: Vec<i64> = (0..count * n).map(|i| value(me, i)).collect();
        let mut rs = vec![0i64; count];
        comm.reduce_scatter(&big, &mut rs, ReduceOp::Sum)?;
        let want_rs: Vec<i64> = (0..count)
            .map(|i| (0..n).map(|r| value(r, me * count + i)).sum())
            .collect();
        check("reduce_scatter", rs == want_rs)?;

        let mut a = vec![0i64; count * n];
        comm.all_to_all(&big, &mut a)?;
        let want_a: Vec<i64> = (0..n)
            .flat_map(|r| (0..count).map(move |i| value(r, me * count + i)))
            .collect();
        check("alltoall", a == want_a)?;

        // Variable counts: rank r contributes r % 3 + count % 5 elements.
        let counts: Vec<usize> = (0..n).map(|r| r % 3 + count % 5).collect();
        let vmine: Vec<i64> = (0..counts[me]).map(|i| value(me, i)).collect();
        let mut av = vec![0i64; counts.iter().sum()];
        comm.all_gather(&vmine, Parts::new(&mut av, &counts))?;
        let want_v: Vec<i64> = (0..n)
            .flat_map(|r| (0..counts[r]).map(move |i| value(r, i)))
            .collect();
        check("allgatherv", av == want_v)?;

        let mut rv = vec![0i64; 4];
        comm.sendrecv(&[me as i64; 4], (me + 1) % n, &mut rv, (me + n - 1) % n, 3)?;
        check("sendrecv", rv == [((me + n - 1) % n) as i64; 4])?;
        comm.barrier()?;
        done += 12;
    }
    let sub = comm
        .split(Some((me % 2) as u32), me as i64)?
        .expect("every rank has a color");
    let mut x = [1u32];
    sub.all_reduce(&mut x, ReduceOp::Sum)?;
    check(
        "split",
        x[0] as usize == (0..n).filter(|r| r % 2 == me % 2).count(),
    )?;
    Ok(done + 1)
}

fn env_rank(var: &str) -> Option<usize> {
    std::env::var(var).ok()?.parse().ok()
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "ops".into());
    let comm = match accord::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("init failed: {e}");
            return ExitCode::from(2);
        }
    };
    let me = comm.rank();
    let result: Result<String, Box<dyn std::error::Error>> = match mode.as_str() {
        "ops" => ops(&comm).map(|n| {
            let shm = if comm.uses_shm() {
                " with shared-memory collectives"
            } else {
                ""
            };
            format!(
                "ok: {n} checks on {} ranks over {}{shm}",
                comm.size(),
                comm.transport_name()
            )
        }),
        "loop" => {
            let kill = env_rank("ACCORD_CHECK_KILL");
            let start = Instant::now();
            let mut v = vec![1.0f32; 1 << 16];
            let mut i = 0;
            loop {
                if Some(me) == kill && i == 20 {
                    // SAFETY: raising a signal on ourselves.
                    unsafe { libc::raise(libc::SIGKILL) };
                }
                if let Err(e) = comm.all_reduce(&mut v, ReduceOp::Sum) {
                    break Err(e.into());
                }
                v.iter_mut().for_each(|x| *x = 1.0);
                i += 1;
                if start.elapsed() > Duration::from_secs(60) {
                    break Ok(format!("ok: {i} iterations"));
                }
            }
        }
        "latency" => {
            // ACCORD_CHECK_OP: allreduce (default), broadcast, barrier, sendrecv (to the next
            // rank, from the previous one) or gather (to rank 0), 4 bytes, back to back.
            let op = std::env::var("ACCORD_CHECK_OP").unwrap_or_else(|_| "allreduce".into());
            let mut v = [1.0f32];
            let n = comm.size();
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            let mut all = vec![0.0f32; if me == 0 { n } else { 0 }];
            let iters = 20_000;
            let start = Instant::now();
            let mut r = Ok(());
            for _ in 0..iters {
                r = r.and_then(|_| match op.as_str() {
                    "barrier" => comm.barrier(),
                    "broadcast" => comm.broadcast(&mut v, 0).map(drop),
                    "sendrecv" => {
                        let out = v;
                        comm.sendrecv(&out, next, &mut v, prev, 0).map(drop)
                    }
                    "gather" => comm.gather(&v, &mut all, 0).map(drop),
                    _ => comm.all_reduce(&mut v, ReduceOp::Sum).map(drop),
                });
            }
            let us = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
            r.map(|_| format!("4-byte {op}: {us:.2} us"))
                .map_err(Into::into)
        }
        "skip" => {
            if Some(me) == env_rank("ACCORD_CHECK_SKIP") {
                std::thread::sleep(Duration::from_secs(20));
                Ok("skipped".into())
            } else {
                let mut v = [1.0f32; 16];
                comm.all_reduce(&mut v, ReduceOp::Sum)
                    .map(|_| "ok".into())
                    .map_err(Into::into)
            }
        }
        "desync" => {
            let mut v = vec![0f32; 1024];
            let r = if me == 1 {
                comm.broadcast(&mut v, 0)
            } else {
                comm.all_reduce(&mut v, ReduceOp::Sum)
            };
            r.and_then(|_| comm.barrier())
                .map(|_| "ok".into())
                .map_err(Into::into)
        }
        // Five good allreduces, then rank ACCORD_CHECK_RANK stalls (`stall`: sleeps, as a hung
        // rank) or broadcasts from the wrong root (`wrong-root`): flight records explain both.
        "stall" | "wrong-root" => {
            let odd = env_rank("ACCORD_CHECK_RANK");
            let mut v = [1.0f32; 16];
            let warm: Result<(), accord::Error> =
                (0..5).try_for_each(|_| comm.all_reduce(&mut v, ReduceOp::Sum).map(drop));
            warm.and_then(|()| match (mode.as_str(), Some(me) == odd) {
                ("stall", true) => {
                    std::thread::sleep(Duration::from_secs(30));
                    Ok(())
                }
                ("stall", false) => comm.all_reduce(&mut v, ReduceOp::Sum).map(drop),
                (_, wrong) => comm.broadcast(&mut v, wrong as usize).map(drop),
            })
            .map(|()| "ok".into())
            .map_err(Into::into)
        }
        other => Err(format!("unknown mode {other:?}").into()),
    };
    match result {
        Ok(msg) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rank {me}: error: {e}");
            ExitCode::from(3)
        }
    }
}
