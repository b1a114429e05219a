//! A stopped rank (SIGSTOP: a hung process) is the one every timeout names, not a healthy
//! neighbour that waits for it.
//!
//! This test binary re-executes itself as 4 ranks (`STOPPED_TEST_SCENARIO` selects what a rank
//! does) with a store hosted by the parent. Ranks wait for each other in a chain — rank 0 for
//! 3, rank r for r - 1 (point-to-point receives, or a ring allreduce) — and the parent stops
//! rank 3 before the call, then lets the others start one after the other, the end of the
//! chain first: the first rank to time out is then one that waits for a healthy rank. Every
//! surviving rank's error must name rank 3, in `waiting_for` and in its text.
//!
//! Each scenario runs a few times over TCP and over shared memory; `ACCORD_SOAK=<n>` runs
//! it n times as often. Every wait is bounded: the call's timeout is 2 s, the parent kills
//! ranks that outlive their deadline, and it always resumes and kills rank 3.

mod common;

use accord::{Error, ReduceOp};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const WORLD: usize = 4;
const STOPPED: usize = 3;
/// The call's timeout (`ACCORD_TIMEOUT` stays long so that joining is never the problem).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Rank 3 of a run, resumed and killed whatever happens to the test.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let pid = self.0.id() as i32;
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(pid, libc::SIGCONT);
            libc::kill(pid, libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

/// What a surviving rank printed.
struct Outcome {
    rank: usize,
    code: Option<i32>,
    out: String,
}

/// One run: 4 ranks of `scenario`, rank 3 stopped, the others started in `order`.
fn run_once(scenario: &str, extra: &[(&str, &str)], order: &[usize]) -> Vec<Outcome> {
    // The store lives as long as this run.
    let (_store, mut children) = common::spawn_ranks(
        ("STOPPED_TEST_SCENARIO", scenario),
        WORLD,
        |_| "stopped-test-host".into(),
        extra,
        true,
    );
    let mut last = children.pop().unwrap();
    let last_out = last.stdout.take().unwrap();
    let stopped = Stopped(last);
    // Rank 3 says when the world is formed; then it is stopped before anyone calls.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(last_out).lines() {
            let Ok(line) = line else { break };
            if line.contains("READY") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("rank 3 joins the world");
    let pid = stopped.0.id() as i32;
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let t0 = Instant::now();
    while proc_state(pid) != Some('T') {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "rank 3 never stopped"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut stdins: Vec<Option<ChildStdin>> = children.iter_mut().map(|c| c.stdin.take()).collect();
    for &r in order {
        writeln!(stdins[r].as_mut().unwrap(), "go").unwrap();
        std::thread::sleep(Duration::from_millis(40));
    }
    let end = Instant::now() + Duration::from_secs(60);
    let outcomes = children
        .into_iter()
        .enumerate()
        .map(|(rank, mut c)| {
            while c.try_wait().unwrap().is_none() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let o = c.wait_with_output().unwrap();
            Outcome {
                rank,
                code: o.status.code(),
                out: String::from_utf8_lossy(&o.stdout).into_owned(),
            }
        })
        .collect();
    drop(stopped);
    outcomes
}

fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// Every surviving rank ended its call with an error that names rank 3 alone.
fn assert_blames_the_stopped_rank(what: &str, outcomes: &[Outcome]) {
    for o in outcomes {
        let ctx = format!("{what}: rank {}:\n{}", o.rank, o.out);
        assert_eq!(o.code, Some(0), "{ctx}");
        assert!(o.out.contains("RANK-OK"), "{ctx}");
        let field = o
            .out
            .lines()
            .find_map(|l| l.split_once("BLAMED ").map(|x| x.1))
            .unwrap_or_else(|| panic!("no error reported: {ctx}"));
        assert_eq!(field, format!("[{STOPPED}]"), "structured culprit: {ctx}");
        let text = o
            .out
            .lines()
            .find_map(|l| l.split_once("ERROR ").map(|x| x.1))
            .unwrap_or_else(|| panic!("no error text: {ctx}"));
        assert!(
            text.contains(&format!("waiting for rank(s) {STOPPED}")),
            "text: {ctx}"
        );
        println!("{what}: rank {}: {text}", o.rank);
        for healthy in 0..STOPPED {
            assert!(
                !text.contains(&format!("waiting for rank(s) {healthy}")),
                "blames healthy rank {healthy}: {ctx}"
            );
        }
    }
}

/// Start orders: the end of the chain first (its first timeout waits for a healthy rank),
/// then others.
fn orders(n: usize) -> Vec<Vec<usize>> {
    let all = [vec![2, 1, 0], vec![1, 2, 0], vec![0, 1, 2], vec![2, 0, 1]];
    (0..n).map(|i| all[i % all.len()].clone()).collect()
}

fn run_all(transport: &[(&str, &str)], label: &str) {
    let t0 = Instant::now();
    for order in orders(2 * accord::testing::soak()) {
        for scenario in ["chain", "ring"] {
            let mut env = transport.to_vec();
            env.push(("ACCORD_ALGO_ALLREDUCE", "ring"));
            let what = format!("{label} {scenario}, started in order {order:?}");
            assert_blames_the_stopped_rank(&what, &run_once(scenario, &env, &order));
        }
    }
    println!("{label}: {:.1?}", t0.elapsed());
}

#[test]
fn a_stopped_rank_is_blamed_over_tcp() {
    run_all(&[("ACCORD_TRANSPORT", "tcp")], "tcp");
}

#[test]
fn a_stopped_rank_is_blamed_over_shared_memory() {
    run_all(&[], "shm");
}

/// The child side: does nothing unless started by one of the tests above.
#[test]
fn rank_main() {
    let Ok(scenario) = std::env::var("STOPPED_TEST_SCENARIO") else {
        return;
    };
    let comm = accord::init().expect("init");
    let me = comm.rank();
    let tcp_only = std::env::var("ACCORD_TRANSPORT").is_ok_and(|v| v == "tcp");
    assert_eq!(comm.uses_shm(), !tcp_only, "{}", comm.transport_name());
    comm.barrier().expect("barrier");
    if me == STOPPED {
        println!("READY");
        std::io::stdout().flush().unwrap();
        // Stopped here by the parent, which kills this process at the end.
        std::thread::sleep(Duration::from_secs(120));
        std::process::exit(1);
    }
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    comm.set_timeout(CALL_TIMEOUT);
    let t = Instant::now();
    let e = match scenario.as_str() {
        "chain" => {
            let mut x = [0u32; 4];
            comm.recv(&mut x, (me + WORLD - 1) % WORLD, 5)
        }
        "ring" => {
            let mut v = vec![me as f32; 1000];
            comm.all_reduce(&mut v, ReduceOp::Sum)
        }
        s => panic!("unknown scenario {s}"),
    }
    .expect_err("rank 3 is stopped: the call cannot complete");
    let took = t.elapsed();
    let blamed = match &e {
        Error::Timeout { waiting_for, .. } => format!("{waiting_for:?}"),
        // A notice from a rank that timed out first: its reason names the culprit.
        Error::Aborted { reason } => reason
            .split("waiting for rank(s) ")
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .map_or("none".into(), |r| format!("[{r}]")),
        other => format!("unexpected {other:?}"),
    };
    println!("BLAMED {blamed}");
    println!("ERROR {e}");
    println!("TOOK {took:.2?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    println!("RANK-OK");
    std::io::stdout().flush().unwrap();
    // Leave at once: a goodbye to the stopped rank would wait for it.
    std::process::exit(0);
}
